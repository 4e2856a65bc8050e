"""Render Tables 14 and 15 (appendix C.6: DeltaNet with and without shared q/k conv filters) from result JSON.

Reads only result files (results/<profile>/pca_vs_shared_conv/*.json through state_reduction.pipeline.collect),
the experiment's config.yaml and the paper's numbers (reference_data/table14.json, table15.json). Only results
evaluated with the table's own settings count (Table 14 uses the zero-shot suite, Table 15 perplexity only; see
pipeline.table_evaluate). Writes paper_tables/out/<profile>/<table>.{tex,md}, <table>_vs_paper.md and
figures/<profile>/<table>.{png,pdf}. Missing runs are rendered as holes ("--") and listed.

Table 14: one row per pretrained variant (×× no sharing, ×✓ one filter per head, ✓✓ one filter for all heads),
Wiki and LAMBADA perplexity, the suite's accuracies and their mean. Table 15: Wiki perplexity before RFT of
adversarial PCA, proper PCA and Grad at 75/50% on the non-shared and the per-head-shared model.
"""

from __future__ import annotations

import math
from pathlib import Path

from paper_tables.lm_tables import (
    METHOD_NAMES,
    WIKI,
    Table,
    _fmt,
    comparison,
    rank_marks,
    reference_rows,
    replicate_span,
    report,
    to_latex,
    to_markdown,
    write_outputs,
)
from paper_tables.collect import in_cells, results_frame, runs, where_config
from paper_tables.figures import save_figure
from paper_tables import spec as table_spec
from paper_tables import writers
from paper_tables.metrics import Metric
from state_reduction.pipeline import table_evaluate, table_seeds

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = "pca_vs_shared_conv"
NAMES = {**METHOD_NAMES, "pca": "PCA (prop.)", "pca-adv": "PCA (adv.)"}
# the paper's model names (experiment config `stands_for`) -> Table 14's "Shared Conv" marks (across heads, within)
SHARING = {"DeltaNet 370M (no shared conv)": ("×", "×"), "DeltaNet 370M (conv shared within heads)": ("×", "✓"),
           "DeltaNet 370M (conv shared within and across heads)": ("✓", "✓")}
TABLE15_COLUMNS = ["DeltaNet 370M (no shared conv)", "DeltaNet 370M (conv shared within heads)"]


class SharedConvTable(Table):
    """lm_tables.Table of the pca_vs_shared_conv experiment, reading only results evaluated with the table's own
    settings (the experiment's two tables evaluate the same dense models with different suites)."""

    def __init__(self, table: str, profile: str, results_root=None):
        super().__init__(EXPERIMENT, table, profile, results_root)
        settings, suffix = table_evaluate(self.spec, table, profile)
        self.suite = settings["suite"]
        frame = results_frame(EXPERIMENT, profile, results_root)
        frame = where_config(frame[frame["kind"] == "evaluate"], settings, strict=True)
        # the dense rows and the replicates (calibration seeds) of the table's cells, not those of another seed set
        wanted = {(c.model, c.method, c.ratio, c.vary) for c in self.cells}
        frame = frame[(frame["method"] == "baseline") | in_cells(frame, wanted)]
        self.values = runs(frame, ["model", "method", "ratio", "rft"])
        self.missing = [f"{m}-baseline-r0-eval{suffix}" for m in self.models
                        if (m, "baseline", 0.0, False) not in self.values]
        self.missing += [f"{c.name}-eval-pre{suffix}" for c in self.cells
                         if c.vary not in self.values.get((c.model, c.method, c.ratio, False), {})]

    def key_of(self, paper_model: str) -> str | None:
        return next((k for k in self.models if paper_model in self.p["models"][k]["stands_for"]), None)

    def sharing(self, key: str) -> tuple[str, str]:
        return SHARING[self.p["models"][key]["stands_for"][0]]


def layout_variants(t: SharedConvTable, metrics: list[Metric]):
    """Table 14: one row per pretrained variant (the dense models, one deterministic evaluation each); best bold,
    second underlined among the variants in each column."""
    header = ["Model", "Shared Conv"] + [m.label for m in metrics]
    columns = [[t.get(k, "baseline", 0.0, False, m) for k in t.models] for m in metrics]
    marks = [rank_marks(col, m.lower_is_better) for col, m in zip(columns, metrics)]
    rows = []
    for i, key in enumerate(t.models):
        rows.append([t.model_label(key), "".join(t.sharing(key))] + [(col[i], mk[i]) for col, mk in zip(columns, marks)])
    return header, rows


def layout_table15(t: SharedConvTable, metrics: list[Metric] | None = None):
    """(ratio, method) rows as in the paper, then the dense 0% row; one column per model; best bold, second
    underlined among the methods at a ratio (by the mean over the calibration seeds, with its 95% half-width where a
    cell has two or more)."""
    keys = [t.key_of(name) for name in TABLE15_COLUMNS]
    labels = {TABLE15_COLUMNS[0]: "Non Shared", TABLE15_COLUMNS[1]: "Shared"}
    header = ["Comp.", "Method"] + [f"{labels[n]} ({k})" if t.profile == "tiny" else labels[n]
                                    for n, k in zip(TABLE15_COLUMNS, keys)]
    rows = []
    for ratio in t.ratios:
        vals = {k: [t.get(k, m, ratio, False, WIKI) for m in t.methods] for k in keys}
        marks = {k: rank_marks(v, True) for k, v in vals.items()}
        for i, method in enumerate(t.methods):
            rows.append([f"{round(ratio * 100)}%" if i == 0 else "", NAMES[method]]
                        + [t.cell(k, method, ratio, False, WIKI, marks[k][i]) for k in keys])
    rows.append(["0%", "--"] + [(t.get(k, "baseline", 0.0, False, WIKI), "") for k in keys])
    return header, rows


def claims_table15(t: SharedConvTable) -> str:
    """The paper's two claims (appendix C.6.2), ours and the paper's, cell by cell: proper PCA beats adversarial
    PCA (only with shared filters, the paper says), and Grad beats proper PCA. Orderings of the means only; the
    verdicts with confidence intervals are the experiment's claims (`state-reduction verdicts pca_vs_shared_conv`)."""
    paper = {(r["model"], r["method"], r["ratio"]): r["wiki_ppl"] for r in reference_rows(t.table)}
    rows = []

    def verdict(a, b) -> str:
        return "--" if a is None or b is None else f"{'yes' if a < b else 'no'} ({_fmt(a)} vs {_fmt(b)})"

    for name in TABLE15_COLUMNS:
        key = t.key_of(name)
        for ratio in t.ratios:
            ours = {m: t.get(key, m, ratio, False, WIKI) for m in ("pca", "pca-adv", "grad")}
            pub = {m: paper.get((name, m, ratio)) for m in ("pca", "pca-adv", "grad")}
            rows.append([f"{name} ({key})", f"{round(ratio * 100)}%", verdict(ours["pca"], ours["pca-adv"]),
                         verdict(pub["pca"], pub["pca-adv"]), verdict(ours["grad"], ours["pca"]),
                         verdict(pub["grad"], pub["pca"])])
    return writers.markdown(["model", "compr.", "PCA prop. < PCA adv. (ours)", "(paper)", "Grad < PCA prop. (ours)",
                             "(paper)"], rows)


def comparison_table15(t: SharedConvTable) -> str:
    lines = [f"# {t.table}: ours ({t.profile} profile) vs the paper", "",
             ("WikiText-2 word perplexity before RFT (tiny profile: the `wiki` test split); paper values from "
              "paper_tables/reference_data/table15.json. Tiny-profile models are ~2M-parameter stand-ins on offline "
              "data: compare orderings, not magnitudes."), ""]
    rows = []
    for r in reference_rows(t.table):
        key = t.key_of(r["model"])
        if key is None:
            continue
        rows.append([r["model"], key, NAMES[r["method"]], f"{round(r['ratio'] * 100)}%",
                     _fmt(t.get(key, r["method"], r["ratio"], False, WIKI)), _fmt(r["wiki_ppl"])])
    lines += [writers.markdown(["paper model", "ours", "method", "compr.", "Wiki ours", "Wiki paper"], rows),
              "## The paper's claims (appendix C.6.2), cell by cell", "",
              ("Orderings of the means over the calibration seeds; `state-reduction verdicts pca_vs_shared_conv` "
               "decides each claim with its 95% CI."), "", claims_table15(t)]
    return "\n".join(lines)


def plot(t: SharedConvTable, stem: Path) -> list[Path]:
    """Table 14: Wiki perplexity per variant. Table 15: Wiki perplexity (log) per method and ratio, one panel per
    model, the dense model dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if t.table == "table14":
        fig, ax = plt.subplots(figsize=(4.8, 3.4))
        vals = [t.get(k, "baseline", 0.0, False, WIKI) for k in t.models]
        ax.bar(range(len(t.models)), [v if v is not None else math.nan for v in vals], color="tab:gray")
        ax.set_xticks(range(len(t.models)), ["".join(t.sharing(k)) for k in t.models])
        ax.set_xlabel("shared conv (across heads, within a head)")
        ax.set_ylabel("Wiki word perplexity")
    else:
        keys = [t.key_of(n) for n in TABLE15_COLUMNS]
        fig, axes = plt.subplots(1, len(keys), figsize=(4.6 * len(keys), 3.6), squeeze=False, sharey=True)
        width = 0.8 / max(1, len(t.methods))
        for ax, key in zip(axes[0], keys):
            for j, method in enumerate(t.methods):
                ys = [t.get(key, method, r, False, WIKI) for r in t.ratios]
                errs = [t.half_width(key, method, r, False, WIKI) or 0.0 for r in t.ratios]
                ax.bar([i + (j - (len(t.methods) - 1) / 2) * width for i in range(len(t.ratios))],
                       [y if y is not None else math.nan for y in ys], width, yerr=errs, capsize=2,
                       label=NAMES[method])
            base = t.get(key, "baseline", 0.0, False, WIKI)
            if base is not None:
                ax.axhline(base, color="k", ls="--", lw=1, label="dense")
            ax.set_xticks(range(len(t.ratios)), [f"{round(r * 100)}%" for r in t.ratios])
            ax.set_yscale("log")
            ax.set_title(key, fontsize=9)
            ax.set_ylabel("Wiki word perplexity")
            ax.legend(fontsize=7)
    fig.suptitle(f"{t.table}, {t.profile} profile ({t.suite} suite)", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, stem)


def replicate_caption(t: SharedConvTable) -> str:
    """What the ± means, when some cell has two or more replicates ("" otherwise: single-draw output unchanged)."""
    reps = t.replicates()
    n = replicate_span(reps)
    if n is None:
        return ""
    return (f"Mean ± half-width of the 95% t-interval over {n} calibration draws per cell (seeds "
            f"{', '.join(map(str, table_seeds(t.spec, t.table, t.profile)))}"
            f"{'; a cell without ± has one draw' if min(reps) < 2 else ''}); the dense rows are one deterministic "
            f"evaluation each.")


# `render: {layout: variants}` (Table 14's data in its config); Table 15's layout is code (models as columns,
# Wiki only, with the paper's claims beside it)
LAYOUTS = {"variants": layout_variants}


def render(table: str, profile: str = "tiny", experiment: str | None = None, results_root=None,
           out_root: Path | None = None, figures_root: Path | None = None, quiet: bool = False) -> dict:
    if experiment not in (None, EXPERIMENT):
        raise ValueError(f"{table} is rendered from experiment {EXPERIMENT!r}, not {experiment!r}")
    t = SharedConvTable(table, profile, results_root)
    if "render" in t.spec["tables"][table]:
        layout = table_spec.render_spec(t.spec, table, profile, LAYOUTS, EXPERIMENT)
        header, rows = LAYOUTS[layout["layout"]](t, layout["columns"])
    else:
        header, rows = layout_table15(t)
    md = to_markdown(header, rows)
    caption = replicate_caption(t)
    vs_paper = comparison(t) if table == "table14" else comparison_table15(t)
    tex = to_latex(t, header, rows).replace("paper_tables/lm_tables.py", "paper_tables/shared_conv_tables.py")
    if caption:
        md += "\n" + caption + "\n"
        tex += "% " + caption + "\n"
    written = write_outputs(table, profile, out_root, tex, md, vs_paper)
    written["figures"] = plot(t, (figures_root or ROOT / "figures") / profile / table)
    seeds = table_seeds(t.spec, table, profile)
    notes = ([f"the table asks for {len(seeds)} seeds but each cell has one replicate so far: no CI shown"]
             if len(seeds) > 1 and t.replicates() == [1] else [])
    if not quiet:
        report(written, md, t.missing, notes)
    written["missing"] = t.missing
    return written
