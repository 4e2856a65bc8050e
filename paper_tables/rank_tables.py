"""Render the rank analysis (experiments/rank_analysis) from `analyze` result JSON: Figures 2, 3, 5, 6, 7, Tables 5
and 6, and the channel overlap of appendix C.2 (tableC2).

Reads only result files (results/<profile>/rank_analysis/*-analyze.json, named by
state_reduction.analysis.experiment.analysis_name), the experiment's config.yaml (which cells a target has) and the
paper's numbers (reference_data/table5.json, table6.json, tableC2.json). Writes per target
  paper_tables/out/<profile>/<target>.{tex,md}   ours (for a figure: the numbers the figure shows, summarised)
  paper_tables/out/<profile>/<target>_vs_paper.md ours beside the paper (its numbers, or its claim for a figure)
  figures/<profile>/<target>.png and .pdf        (figures)
Missing runs are holes ("--") and listed; a degenerate head (all-zero state or activations) is a dash with a note.
Where a target has replicate seeds (the tiny profile: 0, 1, 2), a number is the mean over seeds with the half-width of
its 95% t-interval ("0.160 ± 0.004"; one seed: no ±, and the caption says so), per-head spectra and values are the
mean over seeds, and the figures' bands are the 95% t-interval over seeds where they compare methods.
"""

from __future__ import annotations

import math
from pathlib import Path

from paper_tables import writers
from paper_tables.lm_tables import METHOD_NAMES, rank_marks, reference_rows, replicate_span, report, write_outputs
from paper_tables.figures import save_figure as _save_figure

from state_reduction.analysis.experiment import EXPERIMENT, analysis_name, overlap_pairs
from state_reduction.analysis.rank import spectral_gap
from state_reduction.analysis.selection import median, pearson
from state_reduction.pipeline import (
    CONTROL,
    load_experiment,
    profile_spec,
    replicate_varies,
    table_cells,
    table_methods,
    table_seeds,
)
from state_reduction.results import read_result, results_dir
from state_reduction.stats import mean_ci

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("figure2", "figure3", "figure5", "figure6", "figure7", "table5", "table6", "tableC2")
DASH = "--"
SCALE_NOTE = ("sigma: singular values of the kept columns of M = [Q_h; K_h] per head, ours at RMS scale "
              "(divided by sqrt(rows)); the authors used 5000 + 5000 subsampled rows, i.e. ours x 100. kappa is "
              "scale-free and is the median of per-head ratios.")


def fmt(v, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return DASH
    if v != 0 and (abs(v) >= 1e4 or abs(v) < 10 ** -digits):
        return f"{v:.2e}"
    return f"{v:.{digits}f}"


def ci_cell(values, digits: int = 3) -> str:
    """Mean over replicates with the half-width of its 95% t-interval; one value: the value alone (no CI)."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return DASH
    ci = mean_ci(vals)
    return fmt(ci.mean, digits) if ci.low is None else f"{fmt(ci.mean, digits)} ± {fmt(ci.half_width, digits)}"


def mean_of(values) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


class RankResults:
    """The analyses one target reads on one profile: records by name, the target's cells, its replicate seeds and
    its holes."""

    def __init__(self, target: str, profile: str = "tiny", experiment: str | None = None, results_root=None):
        self.target, self.profile = target, profile
        self.experiment = experiment or EXPERIMENT
        self.spec = load_experiment(self.experiment)
        self.models, self.cells, self.rft_states = table_cells(self.spec, target, profile)
        self.methods = table_methods(self.spec, target)
        self.control = any(c.method == CONTROL for c in self.cells)  # the dense+RFT control (`control: true`)
        self.p = profile_spec(self.spec, profile)
        self.ratio = self.cells[0].ratio if self.cells else float(self.spec["tables"][target]["ratios"][0])
        self.pairs = overlap_pairs(self.spec, target)
        self.seeds = table_seeds(self.spec, target, profile)
        self.varies = replicate_varies(self.spec, target, profile)
        self.counts: set[int] = set()  # replicates found per (model, method, rft, compare), for the caption
        folder = results_dir(profile, self.spec["experiment"], results_root)
        self.records = {p.name[:-len(".json")]: read_result(p) for p in sorted(folder.glob("*-analyze.json"))} \
            if folder.is_dir() else {}
        self.missing: list[str] = []
        self.paper = reference_rows(target)

    def replicates(self, model: str, method: str | None = None, rft: bool = False,
                   compare: str | None = None) -> list[tuple[int, dict]]:
        """(seed, `extra`) of each replicate's analysis that exists, the first seed first; missing ones are listed.
        method CONTROL: the dense+RFT control's (ratio 0, post-RFT)."""
        out = []
        ratio = 0.0 if method == CONTROL else self.ratio
        for seed, vary in zip(self.seeds, self.varies):
            name = analysis_name(model, method, ratio, rft, compare, vary)
            record = self.records.get(name)
            if record is None:
                if name not in self.missing:
                    self.missing.append(name)
            else:
                out.append((seed, record["extra"]))
        if out:
            self.counts.add(len(out))
        return out

    def get(self, model: str, method: str | None = None, rft: bool = False, compare: str | None = None) -> dict | None:
        """The `extra` of the first replicate's analysis, or None (missing ones are listed)."""
        reps = self.replicates(model, method, rft, compare)
        return reps[0][1] if reps else None

    def states_of(self, model: str, method: str | None = None, rft: bool = False) -> list[dict]:
        """Per-layer state statistics of each replicate: the dense model's, or those after pruning (and RFT) with
        `method`."""
        key = "dense" if method is None else "selection"
        return [x[key]["states"] for _, x in self.replicates(model, method, rft)]

    def states(self, model: str, method: str | None = None, rft: bool = False) -> dict | None:
        """The per-layer state statistics averaged over replicates (mean_states), or None where none exists."""
        reps = self.states_of(model, method, rft)
        return mean_states(reps) if reps else None

    def ci_note(self) -> str:
        """What a ± means, and how many seeds it is over; one seed says it has no CI."""
        n = replicate_span(sorted(self.counts))
        if n is None:
            return (f"One seed (seed {self.seeds[0]}: calibration draw, analysis windows and RFT run) per cell: no CI."
                    if len(self.seeds) == 1 else
                    f"The target asks for seeds {', '.join(map(str, self.seeds))} but each cell has one so far: no CI.")
        return (f"Mean over seeds ± half-width of the 95% t-interval over {n} seeds per cell (seeds "
                f"{', '.join(map(str, self.seeds))}; a seed draws the calibration sequences for pruning and the analysis "
                f"windows, and drives the RFT run); per-head values and spectra are means over the seeds.")

    def model_label(self, key: str) -> str:
        names = self.p["models"][key]["stands_for"]
        return f"tiny {key} (for {', '.join(names)})" if self.profile == "tiny" else names[0]

    def kept(self, model: str) -> int | None:
        for c in self.cells:
            s = self.states(c.model, c.method) if c.model == model and c.method != CONTROL else None
            if s:
                return next(iter(s.values()))["d_k"]
        return None


def mean_states(reps: list[dict]) -> dict:
    """Per-layer state statistics averaged over replicates, head by head: u, spectrum and u_by_position are the means
    over the replicates where the head is not degenerate; a head degenerate in every replicate stays degenerate.
    One replicate is returned as it is."""
    if len(reps) == 1:
        return reps[0]
    out = {}
    for layer, first in reps[0].items():
        heads = []
        for h, head in enumerate(first["heads"]):
            alive = [rep[layer]["heads"][h] for rep in reps if not rep[layer]["heads"][h]["degenerate"]]
            if not alive:
                heads.append(head)
                continue
            n = min(len(x["spectrum"]) for x in alive)
            heads.append({**alive[0], "u": mean_of([x["u"] for x in alive]),
                          "spectrum": [sum(x["spectrum"][i] for x in alive) / len(alive) for i in range(n)],
                          "u_by_position": [mean_of(c) for c in zip(*(x["u_by_position"] for x in alive))],
                          "degenerate": False})
        out[layer] = {**first, "heads": heads,
                      "degenerate_heads": [h for h, x in enumerate(heads) if x["degenerate"]]}
    return out


def heads_of(states: dict) -> list[tuple[int, int, dict]]:
    """(layer, head, statistics) over every (layer, head) pair, in order."""
    return [(int(layer), h, x) for layer, s in sorted(states.items(), key=lambda kv: int(kv[0]))
            for h, x in enumerate(s["heads"])]


def tail_share(spectrum: list[float] | None, k: int) -> float | None:
    """Share of sum sigma_i^2 beyond the first k singular values (the 'tail' a k-channel state cannot hold)."""
    if not spectrum:
        return None
    total = sum(x * x for x in spectrum)
    return None if total <= 0 else sum(x * x for x in spectrum[k:]) / total


# -- writing --------------------------------------------------------------------------------------------------
def markdown(header: list[str], rows: list[list[str]]) -> str:
    return writers.markdown(header, rows)


def latex(caption: str, header: list[str], rows: list[list[str]]) -> str:
    """The table's cells are Markdown text (the best `**bold**`)."""
    return writers.latex(caption, header, rows, "l" + "r" * (len(header) - 1), text=writers.tex_markdown,
                         header_text=writers.tex_markdown)


def vs_paper(r: RankResults, intro: str, header: list[str], rows: list[list[str]], notes=()) -> str:
    return writers.comparison(f"{r.target}: ours ({r.profile} profile) vs the paper", intro, header, rows, notes)


# -- Table 5 ----------------------------------------------------------------------------------------------------
def layout_table5(r: RankResults):
    """Per-head rank utilisation over all (layer, head): mean, std, min, max, rho with the baseline (each the mean over
    seeds ± 95% CI); then the per-head values (mean over seeds; degenerate heads as dashes)."""
    header = ["Method", "Mean", "Std", "Min", "Max", "rho", "heads"]
    rows, per_head, paper_rows, notes = [], {}, [], []
    for model in r.models:
        dense = r.replicates(model)
        base_u = [x["u"] for _, _, x in heads_of(dense[0][1]["dense"]["states"])] if dense else []
        d_k = next(iter(dense[0][1]["dense"]["states"].values()))["d_k"] if dense else "?"
        summaries = [("baseline", False, f"Baseline (d_k={d_k})", [x["utilization_summary"]["dense"] for _, x in dense],
                      [pearson(base_u, base_u)] if dense else [], [x["dense"]["states"] for _, x in dense])]
        if r.control:  # the dense model after the same RFT, at full width, on the baseline's windows
            sels = [x["selection"] for _, x in r.replicates(model, CONTROL, True)]
            summaries.append((CONTROL, True, f"{METHOD_NAMES[CONTROL]} (d_k={sels[0]['kept'] if sels else d_k})",
                              [x["utilization_summary"] for x in sels], [x["pearson_u"] for x in sels],
                              [x["states"] for x in sels]))
        for method in r.methods:
            for rft in r.rft_states:
                sels = [x["selection"] for _, x in r.replicates(model, method, rft)]
                label = f"{METHOD_NAMES[method]} (d_k={sels[0]['kept'] if sels else '?'})" + (" post-RFT" if rft else "")
                summaries.append((method, rft, label, [x["utilization_summary"] for x in sels],
                                  [x["pearson_u"] for x in sels], [x["states"] for x in sels]))
        n_total = len(base_u) or None
        for method, rft, label, s, rho, states in summaries:
            cells = {k: ci_cell([x.get(k) for x in s]) for k in ("mean", "std", "min", "max")}
            rows.append([label, *cells.values(), ci_cell(rho, 2), f"{s[0].get('n', 0)}/{n_total or '?'}" if s else DASH])
            if states:
                per_head[label] = {(layer, h): x for layer, h, x in heads_of(mean_states(states))}
                degenerate = sorted({f"L{layer}H{h}" for st in states for layer, h, x in heads_of(st) if x["degenerate"]})
                if degenerate:
                    notes.append(f"{label}: degenerate heads (all-zero states; no rank): {', '.join(degenerate)}"
                                 + (" (in some seed)" if len(states) > 1 else ""))
            ref = next((p for p in r.paper if p["method"] == method and not rft), None)
            if ref:
                paper_rows.append([label] + [f"{cells[k]} / {fmt(ref['u_' + k])}" for k in ("mean", "std", "min", "max")]
                                  + [f"{ci_cell(rho, 2)} / {fmt(ref['pearson'], 2)}"])
    labels = list(per_head)
    keys = sorted({k for v in per_head.values() for k in v})
    detail_rows = [[f"L{layer} H{h}"] + [fmt(per_head[lab][(layer, h)]["u"]) if (layer, h) in per_head[lab] else DASH
                                          for lab in labels] for layer, h in keys]
    return header, rows, ["head"] + labels, detail_rows, paper_rows, notes


def render_table5(r: RankResults) -> tuple[str, str, str]:
    header, rows, dh, drows, paper_rows, notes = layout_table5(r)
    caption = (f"Table 5 ({r.profile} profile): per-head rank utilisation u = er(S)/d_k over all (layer, head) at "
               f"{round(r.ratio * 100)}% state reduction; rho: Pearson correlation with the baseline per head")
    md = markdown(header, rows) + f"\n{r.ci_note()}\n"
    md += "\nPer head (u, mean over seeds; -- = degenerate head or missing run):\n\n" + markdown(dh, drows)
    md += "".join(f"\n- {n}" for n in notes)
    if r.control:
        md += (f"\n- {METHOD_NAMES[CONTROL]}: the dense model fine-tuned with the same RFT recipe and budget (one run "
               "per seed), every channel kept, on the baseline's windows; rho is with the baseline per head.")
    intro = ("ours / paper per cell (paper: DeltaNet 370M, d_k 128 -> 32, FineWeb; ours: the tiny DeltaNet, "
             "d_k 64 -> 16, ptb). u is relative to each model's own d_k, so the levels are comparable in kind.")
    return latex(f"{caption}. {r.ci_note()}", header, rows), md, vs_paper(
        r, intro, ["Method", "Mean", "Std", "Min", "Max", "rho"], paper_rows, [r.ci_note(), *notes])


# -- Table 6 ----------------------------------------------------------------------------------------------------
def mark_ci(samples: list[list[float]], lower_is_better: bool, digits: int = 3) -> list[str]:
    """Mean ± CI per entry (ci_cell), the best mean bold."""
    return [f"**{c}**" if m == "best" else c for c, m in
            zip([ci_cell(v, digits) for v in samples], rank_marks([mean_of(v) for v in samples], lower_is_better))]


def layout_table6(r: RankResults):
    header = ["Selection", "sigma_min", "sigma_max", "kappa", "degenerate heads"]
    rows, paper_rows = [], []
    for model in r.models:
        dense = r.replicates(model)
        d_k = next(iter(dense[0][1]["dense"]["states"].values()))["d_k"] if dense else "?"
        entries = [("baseline", f"Baseline (d_k={d_k})", [x["dense"]["conditioning"] for _, x in dense])]
        entries += [(m, METHOD_NAMES[m], [x["selection"]["conditioning"] for _, x in r.replicates(model, m)])
                    for m in r.methods]
        cols = {k: [[c["median"].get(k) for c in conds] for _, _, conds in entries]
                for k in ("sigma_min", "sigma_max", "kappa")}
        marked = {"sigma_min": mark_ci(cols["sigma_min"][1:], False, 4), "kappa": mark_ci(cols["kappa"][1:], True, 1)}
        for i, (method, label, conds) in enumerate(entries):
            smin = ci_cell(cols["sigma_min"][i], 4) if i == 0 else marked["sigma_min"][i - 1]
            kap = ci_cell(cols["kappa"][i], 1) if i == 0 else marked["kappa"][i - 1]
            rows.append([label, smin, ci_cell(cols["sigma_max"][i], 4), kap,
                         "/".join(str(c["degenerate_heads"]) for c in conds) if conds else DASH])
            ref = next((p for p in r.paper if p["method"] == method), None)
            if ref:
                scaled = lambda v: None if v is None else 100 * v
                paper_rows.append([label, fmt(scaled(mean_of(cols["sigma_min"][i])), 2), fmt(ref["sigma_min"], 2),
                                   fmt(scaled(mean_of(cols["sigma_max"][i])), 1), fmt(ref["sigma_max"], 1),
                                   fmt(mean_of(cols["kappa"][i]), 0), fmt(ref["kappa"], 0)])
    return header, rows, paper_rows


def render_table6(r: RankResults) -> tuple[str, str, str]:
    header, rows, paper_rows = layout_table6(r)
    caption = (f"Table 6 ({r.profile} profile): kept key/query subspace at {round(r.ratio * 100)}% state reduction, "
               "medians over heads; best sigma_min (highest) and kappa (lowest) among the selections bold")
    md = markdown(header, rows) + f"\n{r.ci_note()} Degenerate heads: per seed.\n\n{SCALE_NOTE}\n"
    intro = ("Ours scaled x100 to the authors' row count (see below); kappa needs no scaling. Ours: the mean over "
             "seeds.")
    ph = ["Selection", "sigma_min ours x100", "sigma_min paper", "sigma_max ours x100", "sigma_max paper",
          "kappa ours", "kappa paper"]
    return latex(f"{caption}. {r.ci_note()}", header, rows), md, vs_paper(r, intro, ph, paper_rows,
                                                                       [r.ci_note(), SCALE_NOTE])


# -- appendix C.2 overlap ---------------------------------------------------------------------------------------
def render_tableC2(r: RankResults) -> tuple[str, str, str]:
    header = ["Selections", "median shared", "kept", "shared / kept", "random expectation", "min", "max"]
    rows, paper_rows, detail = [], [], []
    for model in r.models:
        for a, b in r.pairs:
            reps = [(seed, x) for seed, x in r.replicates(model, a, compare=b) if x.get("overlap")]
            label = f"{METHOD_NAMES[a]} & {METHOD_NAMES[b]}"
            if not reps:
                rows.append([label] + [DASH] * 6)
            else:
                kept, d_k = reps[0][1]["overlap"]["kept"][0], reps[0][1]["key_dim"]
                medians = [x["overlap"]["median"] for _, x in reps]
                flat = [c for _, x in reps for v in x["overlap"]["per_layer"].values() for c in v]
                rows.append([label, ci_cell(medians, 1), str(kept), ci_cell([m / kept for m in medians], 2),
                             fmt(kept * kept / d_k, 1), str(min(flat)), str(max(flat))])
                detail += [[label, str(seed), f"L{layer}", ", ".join(map(str, v))] for seed, x in reps
                           for layer, v in sorted(x["overlap"]["per_layer"].items(), key=lambda kv: int(kv[0]))]
            ref = next((p for p in r.paper if (p["method"], p["compare"]) == (a, b)), None)
            if ref:
                ours = rows[-1]
                paper_rows.append([label, f"{ours[1]} of {ours[2]}", ours[3], f"{ref['median_shared']} of {ref['kept']}",
                                   fmt(ref["median_shared"] / ref["kept"], 2), ours[4],
                                   fmt(ref["kept"] ** 2 / (ref["kept"] / (1 - ref["ratio"])), 1)])
    caption = (f"Appendix C.2 ({r.profile} profile): kept channels per head shared by two selections at "
               f"{round(r.ratio * 100)}% state reduction (median over heads); random expectation kept^2/d_k; "
               f"min, max over heads and seeds. {r.ci_note()}")
    md = (markdown(header, rows) + f"\n{r.ci_note()}\n\nPer seed and layer, shared channels per head:\n\n"
          + markdown(["Selections", "seed", "layer", "heads"], detail))
    ph = ["Selections", "ours", "ours / kept", "paper", "paper / kept", "random exp. ours", "random exp. paper"]
    intro = "The paper's two numbers are from the prose of appendix C.2 (DeltaNet 370M, 32 of 128 channels kept)."
    return latex(caption, header, rows), md, vs_paper(r, intro, ph, paper_rows, [r.ci_note()])


# -- figures ----------------------------------------------------------------------------------------------------
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, r: RankResults, figures_root: Path | None, plt) -> list[Path]:
    return _save_figure(fig, (figures_root or ROOT / "figures") / r.profile / r.target, dpi=130)


def _band(curves: list[list[float]]):
    """Per index: the mean over curves of equal length (truncated to the shortest), and the band: the 95% t-interval
    over the curves (one per seed)."""
    n = min(len(c) for c in curves)
    cols = [[c[i] for c in curves] for i in range(n)]
    cis = [mean_ci(c) for c in cols]
    return [c.mean for c in cis], [c.low for c in cis], [c.high for c in cis]


def _over_heads(states: dict) -> list[float]:
    """The mean spectrum sigma_i / sigma_1 over the non-degenerate heads of one replicate."""
    spectra = [x["spectrum"] for _, _, x in heads_of(states) if not x["degenerate"]]
    n = min(len(sp) for sp in spectra)
    return [sum(sp[i] for sp in spectra) / len(spectra) for i in range(n)]


def _mean_u(states: dict) -> float | None:
    return mean_of([x["u"] for _, _, x in heads_of(states)])


def selected_heads(states: dict, limit: int = 8) -> list[tuple[int, int]]:
    """Up to `limit` (layer, head) pairs spread evenly over the model (all of them on the tiny models)."""
    pairs = [(layer, h) for layer, h, _ in heads_of(states)]
    if len(pairs) <= limit:
        return pairs
    step = len(pairs) / limit
    return [pairs[int(i * step)] for i in range(limit)]


def render_figure2(r: RankResults, figures_root=None):
    """Figure 2: singular values of the state, mean sigma_i / sigma_1 over all (layer, head), dense vs DRRQR (band:
    95% t-interval over seeds, or min-max over heads with one seed); the tail beyond the kept dimension is what
    pruning must not need."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    rows = []
    for model in r.models:
        series = [("Dense", r.states_of(model))] + [(METHOD_NAMES[m], r.states_of(model, m)) for m in r.methods]
        k = r.kept(model)
        for (label, reps), color in zip(series, ("k", "tab:red", "tab:blue", "tab:green")):
            if not reps:
                rows.append([label] + [DASH] * 4)
                continue
            if len(reps) > 1:
                mean, lo, hi = _band([_over_heads(s) for s in reps])
            else:
                spectra = [x["spectrum"] for _, _, x in heads_of(reps[0]) if not x["degenerate"]]
                mean = _over_heads(reps[0])
                lo = [min(sp[i] for sp in spectra) for i in range(len(mean))]
                hi = [max(sp[i] for sp in spectra) for i in range(len(mean))]
            xs = range(1, len(mean) + 1)
            ax.plot(xs, mean, color=color, label=f"{label} (d_k={len(mean)})")
            ax.fill_between(xs, lo, hi, color=color, alpha=0.15)
            d = next(iter(reps[0].values()))["d_k"]
            tails = [median([tail_share(x["spectrum"], k) for _, _, x in heads_of(s) if not x["degenerate"]])
                     for s in reps] if k and d > k else []
            rows.append([label, str(d), ci_cell([_mean_u(s) for s in reps]),
                         ci_cell([_over_heads(s)[-1] for s in reps], 4), ci_cell(tails) if tails else DASH])
        if k:
            ax.axvline(k, color="grey", ls=":", lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("index i")
    ax.set_ylabel("sigma_i / sigma_1 (mean over tokens and heads)")
    band = "95% CI over seeds" if len(r.counts) and max(r.counts) > 1 else "min-max over heads"
    ax.set_title(f"Figure 2 ({r.profile}): state spectrum, {', '.join(map(r.model_label, r.models))}; band: {band}",
                 fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    header = ["Model", "d_k", "u mean", "sigma_last / sigma_1", f"tail share beyond {r.kept(r.models[0]) or '?'}"]
    claim = ("Paper (2.2, Figure 2; DeltaNet 370M): the state's singular values have a characteristic long tail "
             "(low rank utilisation, u = 0.053 on average, Table 5); DRRQR removes the tail (Section 5).")
    return header, rows, claim, save_figure(fig, r, figures_root, plt)


def _u_curve(states: dict) -> tuple[list[float], list[float]]:
    """Mean and std over (layer, head) of u at each position of one replicate (nan where every head is degenerate)."""
    positions = next(iter(states.values()))["positions"]
    curves = [x["u_by_position"] for _, _, x in heads_of(states)]
    means, stds = [], []
    for i in range(len(positions)):
        vals = [c[i] for c in curves if c[i] is not None]
        m = sum(vals) / len(vals) if vals else float("nan")
        means.append(m)
        stds.append((sum((v - m) ** 2 for v in vals) / len(vals)) ** 0.5 if vals else float("nan"))
    return means, stds


def render_figure3(r: RankResults, figures_root=None):
    """Figure 3: rank utilisation along the sequence, mean over (layer, head) (band: 95% t-interval over seeds, or
    +-1 std over heads with one seed)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.6, 3.6))
    rows = []
    colors = plt.get_cmap("tab10")
    for model in r.models:
        series = [("Dense", r.states_of(model))] + [(METHOD_NAMES[m], r.states_of(model, m)) for m in r.methods]
        for j, (label, reps) in enumerate(series):
            if not reps:
                rows.append([label, DASH, DASH, DASH])
                continue
            positions = next(iter(reps[0].values()))["positions"]
            curves = [_u_curve(s) for s in reps]
            if len(reps) > 1:
                means, lo, hi = _band([m for m, _ in curves])
            else:
                means, stds = curves[0]
                lo, hi = [m - s for m, s in zip(means, stds)], [m + s for m, s in zip(means, stds)]
            color = "k" if j == 0 else colors(j)
            ax.plot(positions, means, color=color, label=label)
            ax.fill_between(positions, lo, hi, color=color, alpha=0.1)
            rows.append([label, str(next(iter(reps[0].values()))["d_k"]), ci_cell([_mean_u(s) for s in reps]),
                         ci_cell([m[-1] for m, _ in curves])])
    ax.set_xlabel("token position t")
    ax.set_ylabel("rank utilisation u(S_t)")
    band = "95% CI over seeds" if len(r.counts) and max(r.counts) > 1 else "+-1 std over heads"
    ax.set_title(f"Figure 3 ({r.profile}): u during a forward pass, {round(r.ratio * 100)}% reduction; band: {band}",
                 fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    order = sorted((x for x in rows if x[2] != DASH and x[0] != "Dense"), key=lambda x: -float(x[2].split(" ")[0]))
    rows.append(["order (u mean)", "", " > ".join(x[0] for x in order), ""])
    header = ["Model", "d_k", "u mean over tokens and heads", "u at the last token"]
    claim = ("Paper (Section 5, Figure 3; DeltaNet 370M): during a forward pass, Grad and DRRQR, the two best "
             "performing methods, have the highest rank utilisation.")
    return header, rows, claim, save_figure(fig, r, figures_root, plt)


def _spectrum_grid(r: RankResults, series: list[tuple[str, dict | None, str, str]], title: str, figures_root):
    """One panel per selected head: sigma_i / sigma_1 of each series (label, states, color, linestyle)."""
    plt = _plt()
    base = next((s for _, s, _, _ in series if s), None)
    heads = selected_heads(base) if base else []
    cols = min(4, max(1, len(heads)))
    nrows = max(1, math.ceil(len(heads) / cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(3.0 * cols, 2.5 * nrows), squeeze=False)
    for ax, (layer, h) in zip(axes.flat, heads):
        for label, states, color, ls in series:
            x = states and states[str(layer)]["heads"][h]
            if not x:
                continue
            if x["degenerate"]:
                ax.text(0.5, 0.5, f"{label}: degenerate", transform=ax.transAxes, fontsize=6, ha="center")
                continue
            ax.plot(range(1, len(x["spectrum"]) + 1), x["spectrum"], color=color, ls=ls, label=label, lw=1.2)
        ax.set_yscale("log")
        ax.set_title(f"layer {layer}, head {h}", fontsize=8)
        ax.tick_params(labelsize=6)
    for ax in list(axes.flat)[len(heads):]:
        ax.axis("off")
    if heads:
        axes.flat[0].legend(fontsize=6)
        axes.flat[0].set_ylabel("sigma_i / sigma_1")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return save_figure(fig, r, figures_root, plt), heads


def _gap_stats(states: dict, k: int | None) -> tuple[float | None, float | None, float | None, list[str]]:
    """One replicate: median and max spectral gap over heads among the first k values, median sigma_k / sigma_1, and
    the heads with a gap >= 3 (L<layer>H<head>@i)."""
    gaps = [spectral_gap(x["spectrum"], k) for _, _, x in heads_of(states)]
    ratios = [g for g, _ in gaps if g is not None]
    where = [f"L{layer}H{h}@{i}" for (layer, h, _), (g, i) in zip(heads_of(states), gaps) if g is not None and g >= 3]
    at_k = [x["spectrum"][:k][-1] for _, _, x in heads_of(states) if not x["degenerate"]]
    return median(ratios), max(ratios) if ratios else None, median(at_k), where


def _gap_row(label: str, reps: list[dict], k: int | None) -> list[str]:
    """The gap statistics of a series: medians as mean ± CI over seeds, the max over seeds; the heads with a gap
    listed (one seed) or counted per seed."""
    if not reps:
        return [label, DASH, DASH, DASH, DASH]
    stats = [_gap_stats(s, k) for s in reps]
    heads = (", ".join(stats[0][3]) or "none") if len(stats) == 1 else \
        "per seed: " + ", ".join(f"{len(w)} of {len(heads_of(s))}" for s, (_, _, _, w) in zip(reps, stats))
    return [label, ci_cell([x[0] for x in stats], 2), fmt(max((x[1] for x in stats if x[1] is not None), default=None), 2),
            ci_cell([x[2] for x in stats], 4), heads]


def _seeds_title(r: RankResults) -> str:
    return f"; mean over {replicate_span(sorted(r.counts))} seeds" if replicate_span(sorted(r.counts)) else ""


GAP_HEADER = ["Model", "median gap", "max gap", "median sigma_k / sigma_1", "heads with gap >= 3 (@i)"]
NO_NUMBERS = "The paper gives this figure no numbers; the rows are ours."
GAP_NOTE = ("gap: the largest ratio sigma_i / sigma_(i+1) of consecutive mean singular values of a head's state "
            "among its first k (k = the channels the reduced model keeps, for every row, the dense one included: "
            "the dense spectrum's own steep end beyond k is left out); a spectral gap is a large ratio.")


def render_figure5(r: RankResults, figures_root=None):
    """Figure 5: the spectrum of single heads, dense vs DRRQR, Grad and L1 (pre-RFT)."""
    colors = ("k", "tab:red", "tab:blue", "tab:green", "tab:purple")
    rows, paths = [], []
    for model in r.models:
        reps = [("Dense", r.states_of(model), "k")] + [
            (METHOD_NAMES[m], r.states_of(model, m), c) for m, c in zip(r.methods, colors[1:])]
        series = [(label, mean_states(x) if x else None, c, "-") for label, x, c in reps]
        paths, _ = _spectrum_grid(r, series, f"Figure 5 ({r.profile}): per-head state spectra, "
                                  f"{round(r.ratio * 100)}% reduction, pre-RFT{_seeds_title(r)}", figures_root)
        rows += [_gap_row(label, x, r.kept(model)) for label, x, _ in reps]
    claim = ("Paper (C.5, Figure 5; DeltaNet 370M, 75%, pre-RFT): the uncompressed model has a heavy tail of "
             "singular values, the compressed ones a much sharper spectral truncation; some heads develop a "
             "spectral gap.")
    return GAP_HEADER, rows, claim, paths


def render_figure6(r: RankResults, figures_root=None):
    """Figure 6: per-head spectra before (dashed) and after (solid) RFT."""
    colors = ("tab:red", "tab:blue", "tab:green", "tab:purple", "tab:orange")
    rows, paths = [], []
    for model in r.models:
        series, gap_rows = [], []
        if r.control:  # the dense model before (dashed) and after (solid) the same RFT: what fine-tuning alone does
            for label, reps, ls in (("Dense", r.states_of(model), "--"),
                                    (METHOD_NAMES[CONTROL], r.states_of(model, CONTROL, True), "-")):
                series.append((label, mean_states(reps) if reps else None, "k", ls))
                gap_rows.append(_gap_row(label, reps, r.kept(model)))
        for m, c in zip(r.methods, colors):
            for rft in r.rft_states:
                label = f"{METHOD_NAMES[m]} {'post' if rft else 'pre'}-RFT"
                reps = r.states_of(model, m, rft)
                series.append((label, mean_states(reps) if reps else None, c, "-" if rft else "--"))
                gap_rows.append(_gap_row(label, reps, r.kept(model)))
        paths, _ = _spectrum_grid(r, series, f"Figure 6 ({r.profile}): per-head state spectra before (dashed) and "
                                  f"after (solid) RFT, {round(r.ratio * 100)}% reduction{_seeds_title(r)}",
                                  figures_root)
        rows += gap_rows
    claim = ("Paper (C.5, Figure 6): a spectral gap can also develop during recovery fine-tuning."
             + (f" {METHOD_NAMES[CONTROL]} (ours): the dense model fine-tuned with the same RFT, its gap among the same "
                "k values as the reduced models'." if r.control else ""))
    return GAP_HEADER, rows, claim, paths


def render_figure7(r: RankResults, figures_root=None):
    """Figure 7: the learned q/k short-conv filters of the dense model per layer (channels x taps, head boundaries
    red), and their cosine similarity within and across heads."""
    plt = _plt()
    rows, paths = [], []
    for model in r.models:
        extra = r.get(model)  # the filters are the dense model's weights: every seed's analysis has the same
        conv = (extra or {}).get("conv_similarity") or {}
        layers = sorted(conv, key=int)
        if not layers:
            rows.append([model, DASH, DASH, DASH, DASH])
            continue
        fig, axes = plt.subplots(len(layers), 2, figsize=(5.0, 1.9 * len(layers)), squeeze=False)
        for row, layer in zip(axes, layers):
            for ax, name in zip(row, "qk"):
                c = conv[layer][name]
                filt = c["filters"]  # [H][K][W]
                img = [ch[::-1] for head in filt for ch in head]  # newest tap first, as the authors plot
                lim = max(abs(v) for ch in img for v in ch) or 1.0
                ax.imshow(img, aspect="auto", cmap="RdBu_r", vmin=-lim, vmax=lim, interpolation="nearest")
                for h in range(1, len(filt)):
                    ax.axhline(h * len(filt[0]) - 0.5, color="red", lw=1)
                ax.set_title(f"layer {layer} {name}: within {fmt(median(c['within_head']), 2)}, "
                             f"across {fmt(c['across_heads'], 2)}", fontsize=7)
                ax.set_xticks(range(len(img[0])))
                ax.set_xlabel("tap (newest first)", fontsize=6)
                ax.tick_params(labelsize=5)
                rows.append([f"L{layer} {name}", ", ".join(fmt(w, 3) for w in c["within_head"]),
                             fmt(c["across_heads"], 3), str(c["dead_filters"]),
                             "yes" if all(w is not None and c["across_heads"] is not None and w > c["across_heads"]
                                          for w in c["within_head"]) else "no"])
        fig.suptitle(f"Figure 7 ({r.profile}): q/k conv filters, {r.model_label(model)}", fontsize=8)
        fig.tight_layout()
        paths = save_figure(fig, r, figures_root, plt)
    header = ["layer conv", "within-head cosine per head", "across heads", "zero filters", "within > across"]
    claim = ("Paper (C.6.1, Figure 7; a standard DeltaNet with per-channel filters): filters within specific heads "
             "are highly similar, which would justify sharing one filter per head.")
    return header, rows, claim, paths


FIGURES = {"figure2": render_figure2, "figure3": render_figure3, "figure5": render_figure5,
           "figure6": render_figure6, "figure7": render_figure7}
TABLES = {"table5": render_table5, "table6": render_table6, "tableC2": render_tableC2}


def render(target: str, profile: str = "tiny", experiment: str | None = None, results_root=None,
           out_root: Path | None = None, figures_root: Path | None = None, quiet: bool = False) -> dict:
    if target not in TARGETS:
        raise ValueError(f"rank analysis renders {', '.join(TARGETS)}; got {target!r}")
    r = RankResults(target, profile, experiment, results_root)
    if target in TABLES:
        tex, md, cmp = TABLES[target](r)
        written = write_outputs(target, profile, out_root, tex, md, cmp)
    else:
        header, rows, claim, figures = FIGURES[target](r, figures_root)
        caption = f"{target} ({profile} profile): the numbers the figure shows"
        extra = ([GAP_NOTE] if header is GAP_HEADER else []) + [
            "The conv filters are the dense model's weights: they do not depend on the seed (the first seed's "
            "analysis is shown)." if target == "figure7" else r.ci_note()]
        md = markdown(header, rows) + "".join(f"\n- {n}" for n in extra)
        written = write_outputs(target, profile, out_root, latex(caption, header, rows), md,
                                vs_paper(r, claim, header, rows, [NO_NUMBERS, *extra]))
        written["figures"] = figures
    if not quiet:
        report(written, md, r.missing)
    written["missing"] = r.missing
    return written
