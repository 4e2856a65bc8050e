"""Render the pruning ablations (Table 2, Table 7: calibration sensitivity; Table 16: coupled selection) from
result JSON.

Reads only result files (results/<profile>/<experiment>/*.json through state_reduction.pipeline.collect), the
experiment's config.yaml (which cells a table has) and the paper's numbers (reference_data/tableN.json).
Writes per table paper_tables/out/<profile>/<table>.{tex,md} (ours) and <table>_vs_paper.md (ours beside the
paper). Every value is WikiText-2 word perplexity before RFT (tiny profile: the `wiki` test split). Missing runs
are rendered as holes ("--") and listed.
"""

from __future__ import annotations

import math
from pathlib import Path

from paper_tables.lm_tables import (
    METHOD_NAMES,
    rank_marks,
    reference_rows,
    report,
    write_outputs,
)
from paper_tables import spec as table_spec
from paper_tables import writers
from paper_tables.collect import CELL, results_frame, runs
from paper_tables.writers import fmt as _fmt
from state_reduction.pipeline import load_experiment, profile_spec, table_cells
from state_reduction.pipeline.spec import table_seeds
from state_reduction.stats import mean_ci

ROOT = Path(__file__).resolve().parents[1]
SELECT_NAMES = {"kq": "K,Q", "k": "K", "q": "Q"}
SELECT_TEX = {"kq": "$\\mathbf{K},\\mathbf{Q}$", "k": "$\\mathbf{K}$", "q": "$\\mathbf{Q}$"}
WIKI = "wiki_word_perplexity"


class AblationTable:
    """Wiki perplexity by (model, method, ratio, vary) of one table on one profile, its holes and the paper's rows."""

    def __init__(self, table: str, profile: str, experiment: str | None = None, results_root=None):
        self.table, self.profile = table, profile
        self.experiment = table_spec.owner(table, experiment)
        self.spec = load_experiment(self.experiment)
        self.models, self.cells, _ = table_cells(self.spec, table, profile)
        self.p = profile_spec(self.spec, profile)
        self.defaults = {"select": self.spec.get("select", "kq"), **self.p["prune"]}
        frame = results_frame(self.experiment, profile, results_root)
        frame = frame[(frame["kind"] == "evaluate") & frame["rft"].eq(False)]
        self.values = {(*cell, vary): metrics for cell, replicates in runs(frame, CELL).items()
                       for vary, metrics in replicates.items()}
        self.missing = [f"{m}-baseline-r0-eval" for m in self.models if self.get(m, "baseline", 0.0, ()) is None]
        self.missing += [f"{c.name}-eval-pre" for c in self.cells if self.get(c.model, c.method, c.ratio, c.vary) is None]
        self.paper = reference_rows(table)
        self.seeds = table_seeds(self.spec, table, profile)
        self.replicate_counts: set[int] = set()
        self.caption_notes = ""  # what a layout adds to the replicate caption

    def replicated(self, model, method, ratio, **settings) -> tuple[float | None, float | None, int]:
        """Mean, 95% t half-width (None below two replicates) and count over the table's replicate seeds of the
        cell with these pruning settings; a setting that names its own seed is that one draw. The count is recorded
        for the caption (replicate_counts)."""
        seeds = [settings.get("seed")] if settings.get("seed") is not None else self.seeds
        vals = [self.get(model, method, ratio, self.our_vary(**{**settings, "seed": s})) for s in seeds]
        present = [v for v in vals if v is not None]
        if not present:
            return None, None, 0
        ci = mean_ci(present)
        self.replicate_counts.add(len(present))
        return ci.mean, ci.half_width, len(present)

    def get(self, model, method, ratio, vary=()):
        ratio, vary = (0.0, ()) if method == "baseline" else (ratio, vary)
        v = self.values.get((model, method, ratio, tuple(vary)), {}).get(WIKI)
        return None if v is None or not math.isfinite(v) else v

    def our_vary(self, **settings) -> tuple:
        """Overrides of a cell with these pruning settings (None or the profile's own value: no override)."""
        return tuple(sorted((k, v) for k, v in settings.items() if v is not None and v != self.defaults.get(k)))

    def our_model(self, paper_model: str) -> str | None:
        return next((k for k in self.models if paper_model in self.p["models"][k]["stands_for"]), None)

    def model_label(self, key: str) -> str:
        names = self.p["models"][key]["stands_for"]
        return f"tiny {key} (for {', '.join(names)})" if self.profile == "tiny" else names[0]

    def corpus_map(self) -> dict:
        """The paper's calibration corpora -> this profile's, in the order the tables list them."""
        out = {profile_spec(self.spec, "paper")["prune"]["calib"]: self.p["prune"]["calib"]}
        for t in self.spec["tables"].values():
            vary = t.get("vary") or []
            for block in vary if isinstance(vary, list) else [vary]:
                calib = block.get("calib")
                if isinstance(calib, dict) and "paper" in calib and self.profile in calib:
                    out.update(zip(calib["paper"], calib[self.profile]))
        return out


# -- layouts: (header, rows, paper header, paper rows); a cell is a string or (value, mark) -----------------------
def layout_coupled(t: AblationTable):
    """Table 16: method rows; per model K,Q | K | Q; best bold, second underlined among the three selections (by the
    mean over the table's replicate seeds, with its 95% half-width where there are two or more)."""
    selects = ["kq", "k", "q"]
    short = {m: m if t.profile == "tiny" else t.p["models"][m]["stands_for"][0] for m in t.models}
    header = ["Method"] + [f"{short[m]} {SELECT_TEX[s]}" for m in t.models for s in selects]
    rows = []
    means = {}
    for method in t.spec["methods"]:
        cells = [METHOD_NAMES[method]]
        for model in t.models:
            reps = [t.replicated(model, method, t.cells[0].ratio, select=s) for s in selects]
            vals = [v for v, _, _ in reps]
            means.update({(model, method, s): v for s, v in zip(selects, vals)})
            cells += replicate_cells(reps, rank_marks(vals, True))
        rows.append(cells)
    rows.append(["Baseline"] + [(t.get(m, "baseline", 0.0), "") if s == "kq" else "" for m in t.models for s in selects])
    paper_header = ["paper model", "ours", "method", "selection", "Wiki ours", "Wiki paper"]
    paper_rows = []
    for r in t.paper:
        model = t.our_model(r["model"])
        if model is None:
            continue
        select = r["select"] or t.defaults["select"]
        ours = t.get(model, "baseline", 0.0) if r["method"] == "baseline" else means.get((model, r["method"], select))
        paper_rows.append([r["model"], model, METHOD_NAMES[r["method"]], SELECT_NAMES.get(r["select"], "--"),
                           _fmt(ours), _fmt(r["wiki_ppl"])])
    return header, rows, paper_header, paper_rows


def _calibration_label(calib, n, seed, with_n: bool) -> str:
    label = calib + (f", n={n}" if with_n else "")
    return label + (f", seed {seed}" if seed is not None else "")


def layout_calibration(t: AblationTable):
    """Tables 2 and 7: one row per calibration setting of the paper, DRRQR and Grad; the better of the two bold.
    A last row gives each method's spread across the rows (max/min)."""
    with_n = t.table != "table2"
    t.caption_notes = " A row that names its seed is that one draw. The spread row is max/min of the means."
    corpora = t.corpus_map()
    settings = []
    for r in t.paper:
        key = (r["calib"], r.get("n_calib", 128), r.get("seed"))
        if key not in settings:
            settings.append(key)
    header = ["Calibration", "DRRQR", "Grad"]
    rows, paper_rows, columns = [], [], {"drrqr": [], "grad": []}
    for calib, n, seed in settings:
        ours_calib = corpora.get(calib, calib)
        cells = [t.replicated(m, meth, t.cells[0].ratio, calib=ours_calib, n_calib=n, seed=seed)
                 for m in t.models for meth in ("drrqr", "grad")]
        vals = [c[0] for c in cells]
        for meth, v in zip(("drrqr", "grad"), vals):
            columns[meth].append(v)
        marks = [m if m == "best" else "" for m in rank_marks(vals, True)]
        rows.append([_calibration_label(ours_calib, n, seed, with_n)]
                    + replicate_cells(cells, marks))
        paper = {r["method"]: r["wiki_ppl"] for r in t.paper if (r["calib"], r.get("n_calib", 128), r.get("seed")) == (calib, n, seed)}
        paper_rows.append([_calibration_label(calib, n, seed, with_n), _calibration_label(ours_calib, n, seed, with_n),
                           _fmt(vals[0]), _fmt(paper.get("drrqr")), _fmt(vals[1]), _fmt(paper.get("grad"))])
    rows.append(["spread (max/min)"] + [_ratio(spread(columns[m])) for m in ("drrqr", "grad")])
    paper_rows.append(["spread (max/min)", ""] + [
        x for m in ("drrqr", "grad")
        for x in (_ratio(spread(columns[m])), _ratio(spread([r["wiki_ppl"] for r in t.paper if r["method"] == m])))])
    paper_header = ["paper calibration", "ours", "DRRQR ours", "DRRQR paper", "Grad ours", "Grad paper"]
    return header, rows, paper_header, paper_rows


def replicate_cells(reps, marks) -> list[tuple]:
    """Table cells of `replicated` results: (mean, mark), with the half-width where there are two or more."""
    return [(v, mark) if hw is None else (v, mark, hw) for (v, hw, _), mark in zip(reps, marks)]


def _ratio(v) -> str:
    return "--" if v is None else f"{v:.3f}"


def spread(values) -> float | None:
    """max/min of the present values (1.0: the same perplexity whatever the calibration); None if fewer than two."""
    present = [v for v in values if v is not None]
    return max(present) / min(present) if len(present) > 1 else None


LAYOUTS = {"table2": layout_calibration, "table7": layout_calibration, "table16": layout_coupled}


def replicate_caption(t: AblationTable) -> str:
    """What the ± means, when some cell has two or more replicates ("" otherwise: single-draw output unchanged)."""
    if not t.replicate_counts or max(t.replicate_counts) < 2:
        return ""
    counts = sorted(t.replicate_counts)
    n = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    return (f"\nMean ± half-width of the 95% t-interval over {n} calibration draws per cell (seeds "
            f"{', '.join(map(str, t.seeds))}; a cell without ± has one draw).{t.caption_notes}\n")


def to_latex(t: AblationTable, header, rows) -> str:
    return writers.latex(f"{t.table} ({t.profile} profile) rendered by paper_tables/ablation_tables.py from "
                         f"results/{t.profile}/{t.experiment}/; WikiText-2 word perplexity, pre-RFT",
                         [h.replace("_", "\\_") for h in header], rows, "l" + "r" * (len(header) - 1))


def to_markdown(header, rows) -> str:
    return writers.markdown([h.replace("$\\mathbf{K},\\mathbf{Q}$", "K,Q").replace("$\\mathbf{K}$", "K")
                             .replace("$\\mathbf{Q}$", "Q") for h in header], rows)


def comparison(t: AblationTable, header, rows) -> str:
    lines = [f"# {t.table}: ours ({t.profile} profile) vs the paper", "",
             ("WikiText-2 word perplexity before RFT; paper values from paper_tables/reference_data. Tiny-profile "
              "models are ~2M-parameter stand-ins on offline data: compare orderings and spreads, not magnitudes."), "",
             writers.markdown(header, rows)]
    return "\n".join(lines)


def render(table: str, profile: str = "tiny", experiment: str | None = None, results_root=None,
           out_root: Path | None = None, quiet: bool = False, figures_root: Path | None = None) -> dict:
    """Tables only (no figure): `figures_root` is accepted for the common renderer command line."""
    t = AblationTable(table, profile, experiment, results_root)
    header, rows, paper_header, paper_rows = LAYOUTS[table](t)
    md = to_markdown(header, rows) + replicate_caption(t)
    written = write_outputs(table, profile, out_root, to_latex(t, header, rows), md,
                            comparison(t, paper_header, paper_rows))
    if not quiet:
        report(written, md, t.missing)
    written["missing"] = t.missing
    return written
