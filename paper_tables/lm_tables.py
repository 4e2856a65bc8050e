"""Render the language-modelling tables (Tables 1, 3, 8, 9, 10, 12, 13, 20-24) from result JSON.

Reads only result files (results/<profile>/<experiment>/*.json, through state_reduction.pipeline.collect)
and the experiment's config.yaml (which cells a table has, and under `tables.<table>.render` its layout and
columns by metric id: paper_tables/spec.py; the experiment is the one that declares the table unless given).
Writes, per table:
  paper_tables/out/<profile>/<table>.tex   the paper's layout; best bold, second underlined among methods
  paper_tables/out/<profile>/<table>.md    the same as Markdown
  paper_tables/out/<profile>/<table>_vs_paper.md   our numbers beside the paper's published ones
  figures/<profile>/<table>.png and .pdf
Missing runs are rendered as holes ("--") and listed.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pandas as pd

from paper_tables import spec as table_spec
from paper_tables import writers
from paper_tables.collect import N_EXAMPLES, in_cells, results_frame, runs, where_config
from paper_tables.figures import save_figure
from paper_tables.metrics import METRICS, Metric, TableSpecError
from paper_tables.writers import fmt as _fmt
from state_reduction.pipeline import (
    CONTROL,
    RFT_VARY,
    load_experiment,
    profile_spec,
    rft_settings,
    table_cells,
    table_evaluate,
    table_methods,
    table_seeds,
)
from state_reduction.evaluation.run import metric_tasks
from state_reduction.evaluation.tiny_suite import task_sizes
from state_reduction.stats import diff_ci, mean_ci

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "paper_tables" / "reference_data"
METHOD_ORDER = ["l1", "rand", "drrqr", "grad", "wanda"]
METHOD_NAMES = {"l1": "L1", "rand": "Rand", "drrqr": "DRRQR", "grad": "Grad", "wanda": "S-Wanda", "baseline": "Baseline",
                CONTROL: "Dense+RFT", "qkscore": "QK-score (ours)", "taylor": "Taylor", "think": "ThinK",
                "energy": "Energy", "ghost": "GHOST", "pca": "PCA"}
# the unreduced rows every reduced cell is read against: the dense model and the dense+RFT control (no ratio, no mark)
REFERENCE_METHODS = ("baseline", CONTROL)
WIKI, LMB, ZS = (METRICS[k] for k in ("wiki_word_perplexity", "lambada_ppl", "zero_shot_avg"))
# the accuracies each suite measures (the comparison with the paper shows the paper's that the suite runs)
ACCURACIES = {
    "paper": ["arc_easy_acc_norm", "arc_challenge_acc_norm", "hellaswag_acc_norm", "winogrande_acc", "piqa_acc_norm",
              "lambada_acc"],
    "tiny": ["continuation_acc_norm", "next_sentence_acc", "lambada_acc"],
}
# long context (Table 12; experiments/long_context): the paper's suite, and the tiny suite (tiny_longctx), whose
# training length (256) stands for the paper's 2K and twice it for 4K; RULER = mean of passkey and key-value
# retrieval, NIAH = passkey; no SQuAD or SWDE
LONG_CONTEXT = [METRICS[k] for k in ("ruler_2k_acc", "ruler_4k_acc", "niah_2k_acc", "niah_4k_acc", "squad_acc",
                                     "swde_acc")]
TINY_LONG_CONTEXT = [METRICS[k] for k in ("ruler_256_acc", "ruler_512_acc", "niah_256_acc", "niah_512_acc")]


class Table:
    """The cells of one table on one profile: values by (model, method, ratio, rft) and the holes."""

    def __init__(self, experiment: str | None, table: str, profile: str, results_root=None, seeds=None,
                 split: tuple[str, ...] = ()):
        experiment = table_spec.owner(table, experiment)
        self.experiment, self.table, self.profile, self.seeds = experiment, table, profile, seeds
        self.split = split  # varied settings the layout shows as rows (LAYOUT_SPLITS): replicates count per value
        self.results_root, self._companions = results_root, {}
        self.spec = load_experiment(experiment)
        self.models, self.cells, self.rft_states = table_cells(self.spec, table, profile, seeds)
        self.methods = table_methods(self.spec, table)  # in the config's order, which is the paper's row order
        self.p = profile_spec(self.spec, profile)
        self.evaluate = table_evaluate(self.spec, table, profile)[0]  # the profile's, or the table's own (Table 12)
        self.suite = self.evaluate["suite"]
        self.control = any(c.method == CONTROL for c in self.cells)
        self.rft_defaults = {f"rft_{k}": v for k, v in rft_settings(self.spec, profile).items()}
        # a cell with an RFT budget of its own (vary: rft_<field>) reads its pre-RFT row from the plain cell's
        wanted = {(c.model, c.method, c.ratio, v) for c in self.cells for v in (c.vary, c.pruning().vary)}
        # (model, method, ratio, rft) -> {replicate (the cell's vary): metrics}; one replicate per seed
        frame = results_frame(self.spec["experiment"], profile, results_root)
        # evaluated with the table's settings (not those of another table of the experiment), and a cell, replicate
        # or variation this table shows
        frame = where_config(frame[frame["kind"] == "evaluate"], self.evaluate)
        frame = frame[(frame["method"] == "baseline") | in_cells(frame, wanted)]
        # the dense model is its own post-RFT row, as in the paper
        baseline = frame[frame["method"] == "baseline"].assign(rft=True)
        self.values = runs(pd.concat([frame, baseline]) if len(baseline) else frame, ["model", "method", "ratio", "rft"])
        # {task: {examples scored}} over the evaluations the table reads (one value when every cell scored the same)
        self.n_examples: dict[str, set] = {}
        for counts in frame[N_EXAMPLES].tolist():
            for task, n in (counts if isinstance(counts, dict) else {}).items():
                self.n_examples.setdefault(task, set()).add(int(n))
        self.ratios = sorted({c.ratio for c in self.cells if c.method != CONTROL}, reverse=True)
        self.missing = []
        for m in self.models:
            if (m, "baseline", 0.0, False) not in self.values:
                self.missing.append(f"{m}-baseline-r0-eval")
            for c in self.cells:
                for rft in (True,) if c.method == CONTROL else self.rft_states:
                    cell = c if rft else c.pruning()
                    name = f"{cell.name}-eval-{'post' if rft else 'pre'}"
                    if c.model == m and cell.vary not in self.values.get((c.model, c.method, c.ratio, rft), {}) \
                            and name not in self.missing:
                        self.missing.append(name)

    def companion(self, table: str) -> Table:
        """The companion table whose cells a column reads (Metric.table), built once with its own seeds; its holes
        join this table's. Its models stand in row for row for this table's, so it lists as many."""
        if table not in self._companions:
            other = Table(self.experiment, table, self.profile, self.results_root, split=self.split)
            if len(other.models) != len(self.models):
                raise TableSpecError(f"{table_spec.config_path(self.experiment)}: tables.{table} stands in row for "
                                     f"row for tables.{self.table}'s models, so it needs {len(self.models)} models "
                                     f"({', '.join(self.models)}), got {len(other.models)} ({', '.join(other.models)})")
            self._companions[table] = other
            self.missing += other.missing
        return self._companions[table]

    def samples(self, model, method, ratio, rft, metric, where: dict | None = None) -> list[float]:
        """The metric of every replicate of the cell (scaled), in replicate order; finite values only. A column read
        from a companion table (Metric.table) takes the same cell of the companion's model in this model's place.
        `where` keeps the replicates whose pruning settings have these values (a setting a replicate does not vary
        is the profile's own), e.g. {"calib": "books"}: one calibration source of a table that varies it; RFT
        settings (rft_steps: 96, spec.RFT_VARY) select the dense+RFT control's replicates too."""
        if metric.table is not None:
            other = self.companion(metric.table)
            return other.samples(other.models[self.models.index(model)], method, ratio, rft, metric.of_table(None),
                                 where)
        ratio = 0.0 if method in REFERENCE_METHODS else ratio
        key, scale = metric.id, metric.scale
        runs = self.values.get((model, method, ratio, rft), {})
        if method == CONTROL:  # no pruning settings, but one replicate per RFT budget
            where = {k: v for k, v in (where or {}).items() if k in RFT_VARY}
        kept = sorted((v for v in runs if method == "baseline" or self._agrees(v, where)), key=str)
        values = [runs[v].get(key) for v in kept]
        return [v * scale for v in values if v is not None and math.isfinite(v)]

    def setting(self, vary: tuple, name: str):
        """A replicate's value of a pruning or RFT setting: its `vary` override, else the profile's own."""
        return dict(vary).get(name, self.rft_defaults.get(name) if name in RFT_VARY else self.p["prune"].get(name))

    def _agrees(self, vary: tuple, where: dict | None) -> bool:
        return all(self.setting(vary, k) == v for k, v in (where or {}).items())

    def get(self, model, method, ratio, rft, metric, where: dict | None = None):
        """The mean over the cell's replicates (None: no result)."""
        values = self.samples(model, method, ratio, rft, metric, where)
        return sum(values) / len(values) if values else None

    def half_width(self, model, method, ratio, rft, metric, where: dict | None = None):
        """Half-width of the 95% t-interval over replicates; None with fewer than two."""
        values = self.samples(model, method, ratio, rft, metric, where)
        return mean_ci(values).half_width if len(values) > 1 else None

    def replicates(self) -> list[int]:
        """The number of replicates behind each cell that has results (the dense baseline excluded); with `split`,
        those of each value of the split settings apart (a row of the calibration_sources layout)."""
        counts = set()
        for (m, method, r, rft), runs in self.values.items():
            if method != "baseline":
                counts.update(Counter(tuple(self.setting(v, k) for k in self.split) for v in runs).values())
        return sorted(counts)

    def cell(self, model, method, ratio, rft, metric, mark="", where: dict | None = None):
        """A table cell: (mean, mark, CI half-width or None)."""
        return (self.get(model, method, ratio, rft, metric, where), mark,
                self.half_width(model, method, ratio, rft, metric, where))

    def model_label(self, key: str) -> str:
        names = self.p["models"][key]["stands_for"]
        return f"tiny {key} (for {', '.join(names)})" if self.profile == "tiny" else names[0]


def rank_marks(values: list, lower_is_better: bool) -> list[str]:
    """'best' / 'second' / '' per value (None never ranks); ties share the mark."""
    present = sorted({v for v in values if v is not None}, reverse=not lower_is_better)
    best = present[0] if present and len(values) > 1 else None  # one method (Table 12) is no comparison
    second = present[1] if len(present) > 1 and len(values) > 2 else None  # of two, the other is simply worse
    return ["best" if v is not None and v == best else "second" if v is not None and v == second else ""
            for v in values]


def _column_marks(t: Table, model, ratio, rft, metric) -> dict:
    vals = [t.get(model, m, ratio, rft, metric) for m in t.methods]
    return dict(zip(t.methods, rank_marks(vals, metric.lower_is_better)))


# -- layouts -----------------------------------------------------------------------------------------------
def layout_pre_post(t: Table, metrics: list[Metric]):
    """Table 20: model x method rows; pre- and post-RFT columns; methods ranked at the table's ratio."""
    header = ["Model", "Method"] + [f"{'Pre' if not rft else 'Post'}-RFT {m.label}" for rft in (False, True) for m in metrics]
    rows = []
    for model in t.models:
        for i, method in enumerate(t.methods + ["baseline"] + ([CONTROL] if t.control else [])):
            cells = [t.model_label(model) if i == 0 else "", METHOD_NAMES[method]]
            for rft in (False, True):
                for metric in metrics:
                    ranked = method not in REFERENCE_METHODS
                    mark = _column_marks(t, model, t.ratios[0], rft, metric)[method] if ranked else ""
                    cells.append(t.cell(model, method, t.ratios[0], rft, metric, mark))
            rows.append(cells)
    return header, rows


def layout_ratios_post(t: Table, metrics: list[Metric]):
    """Table 1: method rows; per ratio the post-RFT columns; the dense baseline and, with a control, dense+RFT."""
    header = ["Model", "Method"] + [f"{round(r * 100)}% {m.label}" for r in t.ratios for m in metrics]
    rows = []
    for model in t.models:
        for i, method in enumerate(t.methods + [m for m, _ in reference_order(t, True)]):
            cells = [t.model_label(model) if i == 0 else "", METHOD_NAMES[method]]
            for ratio in t.ratios:
                for metric in metrics:
                    mark = "" if method in REFERENCE_METHODS else _column_marks(t, model, ratio, True, metric)[method]
                    cells.append(t.cell(model, method, ratio, True, metric, mark))
            rows.append(cells)
    return header, rows


def layout_zero_shot(t: Table, metrics: list[Metric]):
    """Tables 21-24: (RFT, method, ratio) rows, then the dense baseline and, with a control, dense+RFT."""
    header = ["Model", "RFT", "Method", "Compr."] + [m.label for m in metrics]
    rows = []
    for model in t.models:
        for ratio in t.ratios:
            for rft in t.rft_states:
                for method in t.methods:
                    cells = [t.model_label(model), "yes" if rft else "no", METHOD_NAMES[method], f"{round(ratio * 100)}%"]
                    for metric in metrics:
                        cells.append(t.cell(model, method, ratio, rft, metric,
                                            _column_marks(t, model, ratio, rft, metric)[method]))
                    rows.append(cells)
        cells = [t.model_label(model), "--", "Baseline", "0%"]
        rows.append(cells + [t.cell(model, "baseline", 0.0, False, m) for m in metrics])
        if t.control:  # a table has the control only where it has post-RFT rows (spec.table_cells)
            cells = [t.model_label(model), "yes", METHOD_NAMES[CONTROL], "0%"]
            rows.append(cells + [t.cell(model, CONTROL, 0.0, True, m) for m in metrics])
    return header, rows


def _pct(ratio: float) -> str:
    return f"{round(ratio * 100)}%"


def _configuration(method: str, ratio: float) -> str:
    return METHOD_NAMES[method] if method in REFERENCE_METHODS else f"{METHOD_NAMES[method]} {_pct(ratio)}"


def reference_order(t: Table, rft: bool) -> list[tuple[str, float]]:
    """The rows every method is read against: the dense baseline, and the dense+RFT control where the table has one
    and the rows are post-RFT."""
    return [("baseline", 0.0)] + ([(CONTROL, 0.0)] if t.control and rft else [])


def reference_method(t: Table, rft: bool) -> str:
    """The one row a state's increase is measured from: the dense+RFT control for post-RFT rows of a table with one,
    else the dense baseline (the last of reference_order)."""
    return reference_order(t, rft)[-1][0]


def _method_rows(t: Table, model, metrics, rft: bool, first, order):
    """Rows `first + labels(method, ratio) + metric cells` for (method, ratio) in `order`, marks among the
    methods at the same ratio; the dense baseline has no mark."""
    rows = []
    for method, ratio in order:
        cells = list(first(method, ratio))
        for metric in metrics:
            mark = "" if method in REFERENCE_METHODS else _column_marks(t, model, ratio, rft, metric)[method]
            cells.append(t.cell(model, method, ratio, rft, metric, mark))
        rows.append(cells)
    return rows


def layout_method_columns(t: Table, metrics: list[Metric]):
    """Tables 3 and 8: one ratio; per model Baseline, then one row per method (pre-RFT)."""
    header = ["Model", "Method"] + [m.label for m in metrics]
    order = [("baseline", 0.0)] + [(m, t.ratios[0]) for m in t.methods]
    rows = []
    for model in t.models:
        block = _method_rows(t, model, metrics, False, lambda m, r: ["", METHOD_NAMES[m]], order)
        block[0][0] = t.model_label(model)
        rows += block
    return header, rows


def layout_models_ratios(t: Table, metrics: list[Metric]):
    """Table 9: per model Baseline 0%, then per ratio (ascending) each method (pre-RFT)."""
    header = ["Model", "Method", "Compression"] + [m.label for m in metrics]
    rows = []
    for model in t.models:
        order = [("baseline", 0.0)] + [(m, r) for r in sorted(t.ratios) for m in t.methods]
        block = _method_rows(t, model, metrics, False, lambda m, r: ["", METHOD_NAMES[m], _pct(r)], order)
        block[0][0] = t.model_label(model)
        rows += block
    return header, rows


def layout_ratio_zero_shot(t: Table, metrics: list[Metric]):
    """Table 10: per ratio (ascending) each method, then Baseline 0%."""
    header = ["Model", "Method", "Compr."] + [m.label for m in metrics]
    rows = []
    for model in t.models:
        order = [(m, r) for r in sorted(t.ratios) for m in t.methods] + [("baseline", 0.0)]
        label = t.model_label(model)
        rows += _method_rows(t, model, metrics, t.rft_states[0], lambda m, r, label=label: [label, METHOD_NAMES[m], _pct(r)],
                             order)
    return header, rows


def layout_configurations(t: Table, metrics: list[Metric]):
    """Tables 12 and 13: 'Configuration' rows (Baseline, then 'DRRQR 25%', 'DRRQR 50%', 'L1 25%', ...)."""
    header = ["Model", "Configuration"] + [m.label for m in metrics]
    rows = []
    for model in t.models:
        order = reference_order(t, t.rft_states[0]) + [(m, r) for m in t.methods for r in sorted(t.ratios)]
        name = t.model_label(model)
        rows += _method_rows(t, model, metrics, t.rft_states[0],
                             lambda m, r, name=name: [name, _configuration(m, r)], order)
    return header, rows


def layout_selector_increase(t: Table, metrics: list[Metric]):
    """The selector benchmark: per model the dense baseline, then per ratio each method with each metric and its
    increase over the dense model (mean ± 95% CI over the calibration seeds; the dense model is one deterministic
    evaluation, so the increase has the metric's interval); methods ranked per ratio. A table with post-RFT cells
    adds Post-RFT columns, whose increase is over the dense+RFT control where the table has one (else over dense),
    and a Dense+RFT row."""
    states = t.rft_states
    both = len(states) > 1

    def prefix(rft):
        return (f"{'Post' if rft else 'Pre'}-RFT " if both else "")

    header = ["Model", "Compr.", "Method"] + [
        h for rft in states for m in metrics
        for h in (prefix(rft) + m.label, prefix(rft) + f"{'increase' if m.lower_is_better else 'change'} {m.label}"
                  + (" over dense+RFT" if reference_method(t, rft) == CONTROL else ""))]
    rows = []
    for model in t.models:
        ref = {(rft, m.id): t.get(model, reference_method(t, rft), 0.0, rft, m) for rft in states for m in metrics}
        dense = [t.model_label(model), "0%", "Baseline"]
        for rft in states:
            for m in metrics:
                shown = reference_method(t, rft) == "baseline"  # a post-RFT column over dense+RFT shows that row instead
                dense += [t.cell(model, "baseline", 0.0, False, m), (0.0, "", None)] if shown else ["--", "--"]
        rows.append(dense)
        if t.control and True in states:
            control = ["", "0%", METHOD_NAMES[CONTROL]]
            for rft in states:
                for m in metrics:
                    control += [t.cell(model, CONTROL, 0.0, True, m), (0.0, "", None)] if rft else ["--", "--"]
            rows.append(control)
        for ratio in sorted(t.ratios):
            for method in t.methods:
                cells = ["", _pct(ratio), METHOD_NAMES[method]]
                for rft in states:
                    for m in metrics:
                        value, mark, hw = t.cell(model, method, ratio, rft, m,
                                                 _column_marks(t, model, ratio, rft, m)[method])
                        base = ref[(rft, m.id)]
                        rise, rise_hw = (None, None) if value is None or base is None else (value - base, hw)
                        if rise is not None and reference_method(t, rft) == CONTROL:
                            # the control is replicated by seed too: the interval of the seed-paired difference
                            rise, rise_hw = _paired_increase(t, model, method, ratio, m)
                        cells += [(value, mark, hw), (rise, mark, rise_hw)]
                rows.append(cells)
    return header, rows


def _paired_increase(t: Table, model, method, ratio, metric) -> tuple[float, float | None]:
    """A post-RFT cell minus the dense+RFT control: mean and 95% half-width of the difference, paired by replicate
    (the same seed drives both RFT runs) when both have the same replicates, else Welch's."""
    a, b = t.samples(model, method, ratio, True, metric), t.samples(model, CONTROL, 0.0, True, metric)
    ci = diff_ci(a, b, paired=len(a) == len(b) > 1) if len(a) > 1 and len(b) > 1 else None
    if ci is None:
        return sum(a) / len(a) - sum(b) / len(b), None
    return ci.mean, ci.half_width


MAX_PANELS_PER_ROW = 8  # plot_increase: 4 families x 2 ratios fit one row


def panel_rows(panels: list, n_ratios: int, states: list) -> list[tuple]:
    """plot_increase's rows, [(rft state, [(model, ratio), ...])]: one row per RFT state; over MAX_PANELS_PER_ROW
    panels (many models) they wrap into rows of whole models (all `n_ratios` ratios each), as many as fit."""
    per_row = (len(panels) if len(panels) <= MAX_PANELS_PER_ROW
               else n_ratios * max(1, MAX_PANELS_PER_ROW // n_ratios))
    return [(rft, panels[i:i + per_row]) for rft in states for i in range(0, len(panels), per_row)]


def plot_increase(t: Table, stem: Path) -> list[Path]:
    """The table's first metric (wiki perplexity) minus the dense model's, by selector, one panel per (model, ratio),
    bars with the 95% t-interval over the calibration seeds; a table with post-RFT cells adds a row of panels for
    them, measured from the dense+RFT control where the table has one. Over MAX_PANELS_PER_ROW panels, the panels
    wrap into rows of whole models."""
    metric = table_spec.render_spec(t.spec, t.table, t.profile, LAYOUTS, t.experiment)["columns"][0]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(m, r) for m in t.models for r in sorted(t.ratios)]
    states = t.rft_states
    rows = panel_rows(panels, len(t.ratios), states)
    per_row = max(len(p) for _, p in rows)
    fig, axes = plt.subplots(len(rows), per_row, figsize=(2.6 * per_row, 3.4 * len(rows)), squeeze=False)
    for row, (rft, row_panels) in zip(axes, rows):
        ref = reference_method(t, rft)
        for ax, (model, ratio) in zip(row, row_panels):
            base = t.get(model, ref, 0.0, rft and ref == CONTROL, metric)
            bars = []
            for m in t.methods:
                value = t.get(model, m, ratio, rft, metric)
                if value is None or base is None:
                    continue
                rise, hw = (_paired_increase(t, model, m, ratio, metric) if ref == CONTROL
                            else (value - base, t.half_width(model, m, ratio, rft, metric)))
                bars.append((METHOD_NAMES[m], rise, hw or 0.0))
            if bars:
                names, rises, errs = zip(*bars)
                ax.bar(range(len(bars)), rises, yerr=errs, capsize=3,
                       color=["tab:red" if n.endswith("(ours)") else "tab:gray" for n in names])
                ax.set_xticks(range(len(bars)), names, rotation=60, ha="right", fontsize=7)
                clip_outlier(ax, rises, errs)
            ax.axhline(0, color="k", lw=0.8)
            ax.set_title(f"{model}, {_pct(ratio)}" + ((", post-RFT" if rft else ", pre-RFT") if len(states) > 1 else ""),
                         fontsize=8)
        row[0].set_ylabel(f"{_plain(metric.label)}: change from " + ("dense+RFT" if ref == CONTROL else "dense"))
        for ax in row[len(row_panels):]:
            ax.set_visible(False)  # a wrapped row's empty places
    fig.suptitle(f"{t.table}, {t.profile} profile ({t.suite} suite), mean ± 95% CI over seeds", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / (3.4 * len(rows))))  # room for the title
    return save_figure(fig, stem)


def clip_outlier(ax, rises, errs, factor: float = 3.0, headroom: float = 1.25) -> float | None:
    """A bar whose top is over `factor` times the next tallest (Rand's, often) would flatten the others: the axis
    then stops at `headroom` times the next tallest and the clipped bar carries its value. The limit, or None."""
    tops = sorted(r + e for r, e in zip(rises, errs))
    if len(tops) < 3 or tops[-2] <= 0 or tops[-1] <= factor * tops[-2]:
        return None
    limit = headroom * tops[-2]
    # the clipped bar's own interval does not set the bottom either
    ax.set_ylim(min(0.0, *(r - e for r, e in zip(rises, errs) if r + e <= limit)) * 1.1, limit)
    for i, (r, e) in enumerate(zip(rises, errs)):
        if r + e > limit:
            ax.text(i, 0.97 * limit, f"{r:+,.0f} (clipped)", ha="center", va="top", rotation=90, fontsize=6)
    return limit


def calibration_sources(t: Table) -> list[str]:
    """The calibration sources of the table's cells (its `vary: calib`, else the profile's corpus), in order."""
    default = t.p["prune"]["calib"]
    return list(dict.fromkeys(dict(c.vary).get("calib", default) for c in t.cells))


def layout_calibration_sources(t: Table, metrics: list[Metric]):
    """Distribution shift (issue 15 item 6): per model the dense baseline, then per ratio and calibration source each
    method (pre-RFT). Each column is one evaluation domain, so the rows calibrated on one source read as evaluated on
    the others; mean ± 95% CI over the replicate seeds (calibration draws); best bold among the methods of a row
    group."""
    header = ["Model", "Compr.", "Calibration", "Method"] + [m.label for m in metrics]
    rows = []
    for model in t.models:
        rows.append([t.model_label(model), "0%", "--", "Baseline"]
                    + [t.cell(model, "baseline", 0.0, False, m) for m in metrics])
        for ratio in sorted(t.ratios):
            for source in calibration_sources(t):
                where = {"calib": source}
                marks = {m.id: dict(zip(t.methods, rank_marks([t.get(model, meth, ratio, False, m, where)
                                                                for meth in t.methods], m.lower_is_better)))
                         for m in metrics}
                for method in t.methods:
                    rows.append(["", _pct(ratio), source, METHOD_NAMES[method]]
                                + [t.cell(model, method, ratio, False, m, marks[m.id][method], where) for m in metrics])
    return header, rows


def plot_calibration_sources(t: Table, stem: Path) -> list[Path]:
    """One panel per (column, model, ratio): the column's value by calibration source, a bar per method with the
    95% t-interval over the calibration draws, the dense model dashed."""
    metrics = table_spec.render_spec(t.spec, t.table, t.profile, LAYOUTS, t.experiment)["columns"]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sources = calibration_sources(t)
    panels = [(model, ratio) for model in t.models for ratio in sorted(t.ratios)]
    fig, axes = plt.subplots(len(metrics), len(panels), figsize=(3.0 * len(panels), 2.5 * len(metrics)),
                             squeeze=False)
    width = 0.8 / len(t.methods)
    for row, metric in zip(axes, metrics):
        for ax, (model, ratio) in zip(row, panels):
            for j, method in enumerate(t.methods):
                xs, ys, errs = [], [], []
                for i, source in enumerate(sources):
                    v = t.get(model, method, ratio, False, metric, {"calib": source})
                    if v is not None:
                        xs.append(i + (j - (len(t.methods) - 1) / 2) * width)
                        ys.append(v)
                        errs.append(t.half_width(model, method, ratio, False, metric, {"calib": source}) or 0.0)
                if xs:
                    ax.bar(xs, ys, width, yerr=errs, capsize=3, label=METHOD_NAMES[method])
            base = t.get(model, "baseline", 0.0, False, metric)
            if base is not None:
                ax.axhline(base, color="k", ls="--", lw=1, label="dense")
            ax.set_xticks(range(len(sources)), sources)
            ax.set_xlabel("calibrated on", fontsize=7)
            ax.set_title(f"{model}, {_pct(ratio)}: {_plain(metric.label)}", fontsize=7)
            if metric.lower_is_better:
                ax.set_yscale("log")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{t.table}, {t.profile} profile: mean ± 95% CI over calibration draws", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, stem)

def rft_budgets(t: Table) -> list[dict]:
    """The RFT budgets of a table that varies RFT settings (spec.RFT_VARY), each {rft_<field>: value} over the varied
    fields (the recipe's own value where a cell keeps it), in config order."""
    keys = sorted({k for c in t.cells for k, _ in c.vary if k in RFT_VARY})
    return [dict(b) for b in dict.fromkeys(tuple((k, t.setting(c.vary, k)) for k in keys) for c in t.cells)]


def budget_label(budget: dict) -> str:
    names = {"rft_steps": "steps", "rft_lr": "lr", "rft_ce_weight": "CE weight"}
    return ", ".join(f"{names.get(k, k[len('rft_'):])} {v:g}" if isinstance(v, (int, float)) else f"{k} {v}"
                     for k, v in budget.items())


def by_seed(t: Table, model, method, ratio, rft, metric, where: dict | None = None) -> dict:
    """{seed: value} of a cell's replicates that agree with `where` (the seed of a replicate: its vary, else the
    profile's)."""
    ratio = 0.0 if method in REFERENCE_METHODS else ratio
    runs = t.values.get((model, method, ratio, rft), {})
    if method == CONTROL:
        where = {k: v for k, v in (where or {}).items() if k in RFT_VARY}
    out = {}
    for vary, metrics in runs.items():
        value = metrics.get(metric.id)
        if t._agrees(vary, where) and value is not None and math.isfinite(value):
            out[t.setting(vary, "seed")] = value * metric.scale
    return out


def _relative_change(a: dict, b: dict | float) -> tuple[float | None, float | None]:
    """Mean and 95% half-width (t, over seeds) of 100 * (a - b) / b in percent; `b` a number (the dense model, one
    deterministic evaluation) or {seed: value} paired with `a` by seed."""
    if isinstance(b, dict):
        seeds = sorted(set(a) & set(b))
        rel = [100 * (a[s] - b[s]) / b[s] for s in seeds]
    else:
        rel = [100 * (v - b) / b for v in a.values()] if b else []
    if not rel:
        return None, None
    ci = mean_ci(rel)
    return ci.mean, ci.half_width


# The rule that picks the tiny RFT budget (experiments/rft/README.md, written before the sweep's numbers were read):
# a budget is admissible when its dense+RFT control stays within +-ADMISSIBLE_PCT of the dense model on the held-out
# corpus (the whole 95% CI), i.e. fine-tuning alone neither gains nor loses there: a recovery step, not continued
# pretraining. Among the admissible budgets, the one with the lowest mean post-RFT value of the reduced cell, except
# that a cheaper budget (fewer steps, then lower lr) whose paired-by-seed difference from it has a CI containing 0
# is preferred.
ADMISSIBLE_PCT = 1.0


def pick_budget(t: Table, model, method, ratio, metric, budgets: list[dict]) -> tuple[dict | None, list[dict]]:
    """(the chosen budget or None, the admissible budgets) of `model` by the rule above."""
    dense = t.get(model, "baseline", 0.0, False, metric)
    admissible = []
    for b in budgets:
        mean, hw = _relative_change(by_seed(t, model, CONTROL, 0.0, True, metric, b), dense)
        if mean is not None and hw is not None and abs(mean) + hw <= ADMISSIBLE_PCT:
            admissible.append(b)
    post = {tuple(b.items()): by_seed(t, model, method, ratio, True, metric, b) for b in admissible}
    ranked = [b for b in admissible if post[tuple(b.items())]]
    if not ranked:
        return None, admissible
    sign = 1 if metric.lower_is_better else -1
    best = min(ranked, key=lambda b: sign * sum(post[tuple(b.items())].values()) / len(post[tuple(b.items())]))
    cost = lambda b: (b.get("rft_steps", t.rft_defaults.get("rft_steps")), b.get("rft_lr", t.rft_defaults.get("rft_lr")))  # noqa: E731
    for b in sorted(ranked, key=cost):
        if cost(b) >= cost(best):
            break
        a, c = post[tuple(b.items())], post[tuple(best.items())]
        seeds = sorted(set(a) & set(c))
        if len(seeds) > 1:
            ci = diff_ci([a[s] for s in seeds], [c[s] for s in seeds], paired=True)
            if ci.low <= 0 <= ci.high:
                return b, admissible
    return best, admissible


def layout_rft_budget(t: Table, metrics: list[Metric]):
    """The RFT budget sweep (issue 15 item 4): per model the dense model and the reduced cell pre-RFT, then per budget
    the dense+RFT control and the reduced cell post-RFT, each with its change over the dense model in percent, and
    the reduced cell's paired change over the control of the same budget and seed (mean ± 95% t-interval over the
    replicate seeds); the last column marks the admissible budgets and the one pick_budget chooses."""
    metric = metrics[0]
    method, ratio = t.methods[0], t.ratios[0]
    name = f"{METHOD_NAMES.get(method, method)} {_pct(ratio)}"
    label = metric.label
    header = ["Model", "RFT budget", f"Dense+RFT {label}", "Dense+RFT change over dense (%)",
              f"{name} {label}", f"{name} change over dense (%)", f"{name} change over dense+RFT (%)", "Pick"]
    budgets = rft_budgets(t)
    rows = []
    for model in t.models:
        dense = t.get(model, "baseline", 0.0, False, metric)
        pre = by_seed(t, model, method, ratio, False, metric)
        hole = (None, "", None)
        rows.append([t.model_label(model), "none (dense)", hole, hole, t.cell(model, "baseline", 0.0, False, metric),
                     (0.0, "", None), hole, ""])
        pre_mean, pre_hw = _relative_change(pre, dense)
        rows.append(["", "none (pre-RFT)", hole, hole, t.cell(model, method, ratio, False, metric),
                     (pre_mean, "", pre_hw), hole, ""])
        chosen, admissible = pick_budget(t, model, method, ratio, metric, budgets)
        for b in budgets:
            control = by_seed(t, model, CONTROL, 0.0, True, metric, b)
            post = by_seed(t, model, method, ratio, True, metric, b)
            c_mean, c_hw = _relative_change(control, dense)
            p_mean, p_hw = _relative_change(post, dense)
            r_mean, r_hw = _relative_change(post, control)
            pick = "chosen" if b == chosen else "admissible" if b in admissible else ""
            rows.append(["", budget_label(b), t.cell(model, CONTROL, 0.0, True, metric, where=b), (c_mean, "", c_hw),
                         t.cell(model, method, ratio, True, metric, where=b), (p_mean, "", p_hw), (r_mean, "", r_hw),
                         pick])
    return header, rows


def plot_rft_budget(t: Table, stem: Path) -> list[Path]:
    """One panel per model: per RFT budget the change over the dense model (percent) of the dense+RFT control and of
    the reduced cell post-RFT, bars with the 95% t-interval over seeds; the reduced cell pre-RFT dashed, the
    admissible band (±ADMISSIBLE_PCT) shaded."""
    metric = table_spec.render_spec(t.spec, t.table, t.profile, LAYOUTS, t.experiment)["columns"][0]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    method, ratio = t.methods[0], t.ratios[0]
    budgets = rft_budgets(t)
    fig, axes = plt.subplots(1, len(t.models), figsize=(0.9 * len(budgets) + 2.5, 3.8) if len(t.models) == 1
                             else (4.5 * len(t.models), 4.2), squeeze=False)
    for ax, model in zip(axes[0], t.models):
        dense = t.get(model, "baseline", 0.0, False, metric)
        for j, (who, colour) in enumerate(((CONTROL, "tab:gray"), (method, "tab:blue"))):
            xs, ys, errs = [], [], []
            for i, b in enumerate(budgets):
                mean, hw = _relative_change(by_seed(t, model, who, ratio, True, metric, b), dense)
                if mean is not None:
                    xs.append(i + (j - 0.5) * 0.4)
                    ys.append(mean)
                    errs.append(hw or 0.0)
            ax.bar(xs, ys, 0.4, yerr=errs, capsize=2, color=colour,
                   label=f"{METHOD_NAMES.get(who, who)}{'' if who == CONTROL else ' ' + _pct(ratio)} post-RFT")
        pre, _ = _relative_change(by_seed(t, model, method, ratio, False, metric), dense)
        if pre is not None:
            ax.axhline(pre, color="tab:blue", ls="--", lw=1, label="pre-RFT")
        ax.axhspan(-ADMISSIBLE_PCT, ADMISSIBLE_PCT, color="tab:green", alpha=0.15, label=f"±{ADMISSIBLE_PCT:g}%")
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xticks(range(len(budgets)), [budget_label(b).replace("CE weight 1", "CE+KL").replace("CE weight 0", "KL only")
                                          .replace(", ", "\n") for b in budgets], fontsize=6)
        ax.set_title(f"{model}", fontsize=8)
        ax.set_ylabel(f"{_plain(metric.label)}: change from dense (%)", fontsize=7)
    axes[0][0].legend(fontsize=6)
    fig.suptitle(f"{t.table}, {t.profile} profile ({t.suite} suite), mean ± 95% CI over seeds", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, stem)

# the layouts a table's `render: {layout: ...}` may name (paper_tables/spec.py)
LAYOUTS = {"pre_post": layout_pre_post, "ratios_post": layout_ratios_post, "zero_shot": layout_zero_shot,
           "method_columns": layout_method_columns, "models_ratios": layout_models_ratios,
           "ratio_zero_shot": layout_ratio_zero_shot, "configurations": layout_configurations,
           "selector_increase": layout_selector_increase, "calibration_sources": layout_calibration_sources,
           "rft_budget": layout_rft_budget}
# layouts whose rows are the values of a varied setting (the others average a cell over all its replicates)
LAYOUT_SPLITS = {"calibration_sources": ("calib",), "rft_budget": tuple(RFT_VARY)}
# layouts with their own figure (the others: `plot`)
PLOTS = {"selector_increase": plot_increase, "calibration_sources": plot_calibration_sources,
         "rft_budget": plot_rft_budget}
# the metrics set beside the paper's, where the paper's rows have them
COMPARED = [WIKI, LMB, ZS] + [METRICS[k] for k in ACCURACIES["paper"]] + LONG_CONTEXT + TINY_LONG_CONTEXT


def to_latex(t: Table, header, rows) -> str:
    n_text = sum(1 for c in rows[0] if isinstance(c, str))
    return writers.latex(f"{t.table} ({t.profile} profile) rendered by paper_tables/lm_tables.py from "
                         f"results/{t.profile}/{t.experiment}/; suite {t.suite}; best bold, second underlined among "
                         "methods", header, rows, "l" * n_text + "r" * (len(header) - n_text))


def _plain(header: str) -> str:
    return header.replace(" $\\downarrow$", " ↓").replace(" $\\uparrow$", " ↑").replace("\\_", "_")


def to_markdown(header, rows) -> str:
    return writers.markdown([_plain(h) for h in header], rows)


# -- comparison with the published numbers -------------------------------------------------------------------
def reference_rows(table: str) -> list[dict]:
    path = REFERENCE / f"{table}.json"
    return json.loads(path.read_text())["rows"] if path.exists() else []


def _short(metric: Metric) -> str:
    """A comparison column's name: the label's first word, with the context length for long context."""
    if metric in LONG_CONTEXT + TINY_LONG_CONTEXT:
        return metric.label.split(" $")[0]
    return metric.label.split(" ")[0]


def _paper_metric(metric):
    """The paper's column that `metric` is compared with (e.g. tiny RULER 256 with the paper's RULER 2K)."""
    return next((m for m in LONG_CONTEXT if m.id == _paper_key(metric)), metric)


def _paper_key(metric: Metric) -> str:
    """The key of `metric` in reference_data/*.json."""
    return metric.paper_key or metric.id


def comparison(t: Table, paper: str | None = None) -> str:
    """Our value beside the paper's for every published row (of table `paper`, default the table's own name) whose
    model our profile stands in for."""
    ref = reference_rows(paper or t.table)
    metrics = [m for m in COMPARED if any(_paper_key(m) in row for row in ref)] or [WIKI, LMB, ZS]
    ours = set(ACCURACIES.get(t.suite, []))
    # the paper's tasks that this profile's suite does not run would be columns of holes only
    metrics = [m for m in metrics if m.id not in ACCURACIES["paper"] or m.id in ours]
    metrics = [m for m in metrics if m not in (TINY_LONG_CONTEXT if t.profile == "paper" else LONG_CONTEXT)]
    header = ["paper model", "ours", "method", "compr.", "RFT"] + [
        h for m in metrics for h in (f"{_short(m)} ours", f"{_short(_paper_metric(m))} paper")]
    rows, seen = [], set()
    for row in ref:
        model = next((k for k in t.models if row["model"] in t.p["models"][k]["stands_for"]), None)
        key = (row["model"], row["method"], row["ratio"], row["rft"])
        if model is None or key in seen:  # the paper repeats the dense row in each block
            continue
        seen.add(key)
        cells = [row["model"], model, METHOD_NAMES[row["method"]], f"{round(row['ratio'] * 100)}%",
                 "yes" if row["rft"] else "no"]
        for m in metrics:
            cells += [_fmt(t.get(model, row["method"], row["ratio"], row["rft"], m)),
                      _fmt(row.get(_paper_key(m)))]
        rows.append(cells)
    return "\n".join([f"# {t.table}: ours ({t.profile} profile) vs the paper", "",
                      ("Paper values are the published ones (paper_tables/reference_data). Tiny-profile models are "
                       "~2M-parameter stand-ins on offline data and a different task suite: compare orderings, not "
                       "magnitudes."), "", writers.markdown(header, rows)])


# -- figure -----------------------------------------------------------------------------------------------------
def plot(t: Table, stem: Path) -> list[Path]:
    """Wiki perplexity vs compression ratio per method (mean, with the 95% CI over replicates as error bars), one
    panel per model and RFT state, the dense baseline as a dashed line and, on post-RFT panels of a table with a
    control, the dense+RFT control as a dotted one with its CI shaded (all ratios of this experiment that have
    results, not only the table's); a table of one ratio gets bars instead."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    all_ratios = sorted({k[2] for k in t.values if k[1] != "baseline"} | set(t.ratios))
    if len(all_ratios) == 1:
        return _plot_bars(t, stem, all_ratios[0], plt)
    panels = [(m, rft) for m in t.models for rft in t.rft_states]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    colors = plt.get_cmap("tab10")
    for ax, (model, rft) in zip(axes[0], panels):
        for j, method in enumerate(t.methods):
            pts = [(r * 100, t.get(model, method, r, rft, WIKI), t.half_width(model, method, r, rft, WIKI))
                   for r in all_ratios]
            pts = [(x, v, hw or 0.0) for x, v, hw in pts if v is not None]
            if pts:
                xs, ys, errs = zip(*pts)
                ax.errorbar(xs, ys, yerr=errs if any(errs) else None, marker="o", capsize=2,
                            label=METHOD_NAMES[method], color=colors(j))
        base = t.get(model, "baseline", 0.0, False, WIKI)
        if base is not None:
            ax.axhline(base, color="k", ls="--", lw=1, label="Baseline")
        control = t.get(model, CONTROL, 0.0, True, WIKI) if rft and t.control else None
        if control is not None:
            ax.axhline(control, color="tab:gray", ls=":", lw=1.2, label=METHOD_NAMES[CONTROL])
            hw = t.half_width(model, CONTROL, 0.0, True, WIKI)
            if hw:
                ax.axhspan(control - hw, control + hw, color="tab:gray", alpha=0.2, lw=0)
        ax.set_yscale("log")
        ax.set_xlabel("key channels removed (%)")
        ax.set_ylabel("Wiki word perplexity")
        ax.set_title(f"{model}, {'post' if rft else 'pre'}-RFT", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(f"{t.table}, {t.profile} profile ({t.suite} suite)", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, stem)


def _plot_bars(t: Table, stem: Path, ratio: float, plt) -> list[Path]:
    """One compression ratio (Table 20): Wiki perplexity per method (mean, 95% CI over replicates as error bars),
    pre- and post-RFT side by side, one panel per model, the dense baseline dashed and the dense+RFT control
    dotted; the y axis starts near the smallest value so differences show."""
    fig, axes = plt.subplots(1, len(t.models), figsize=(5.2 * len(t.models), 3.6), squeeze=False)
    width = 0.38
    for ax, model in zip(axes[0], t.models):
        values = []
        for i, rft in enumerate((False, True)):
            bars = [(j + (i - 0.5) * width, t.get(model, m, ratio, rft, WIKI),
                     t.half_width(model, m, ratio, rft, WIKI) or 0.0) for j, m in enumerate(t.methods)]
            bars = [b for b in bars if b[1] is not None]
            if bars:
                xs, ys, errs = zip(*bars)
                values += [y + e for y, e in zip(ys, errs)] + [y - e for y, e in zip(ys, errs)]
                ax.bar(xs, ys, width, yerr=errs if any(errs) else None, capsize=2,
                       label="post-RFT" if rft else "pre-RFT", color="tab:green" if rft else "tab:gray")
        base = t.get(model, "baseline", 0.0, False, WIKI)
        if base is not None:
            ax.axhline(base, color="k", ls="--", lw=1, label="Baseline (dense)")
            values.append(base)
        control = t.get(model, CONTROL, 0.0, True, WIKI) if t.control else None
        if control is not None:
            ax.axhline(control, color="tab:green", ls=":", lw=1.2, label=METHOD_NAMES[CONTROL])
            values.append(control)
        if values:
            lo, hi = min(values), max(values)
            ax.set_ylim(lo - 0.15 * (hi - lo + 1e-9), hi + 0.1 * (hi - lo + 1e-9))
        ax.set_xticks(range(len(t.methods)), [METHOD_NAMES[m] for m in t.methods])
        ax.set_ylabel("Wiki word perplexity")
        ax.set_title(f"{model}, {round(ratio * 100)}% of key channels removed", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(f"{t.table}, {t.profile} profile ({t.suite} suite)", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, stem)


def render(table: str, profile: str = "tiny", experiment: str | None = None, results_root=None,
           out_root: Path | None = None, figures_root: Path | None = None, quiet: bool = False, seeds=None) -> dict:
    experiment = table_spec.owner(table, experiment)
    layout = table_spec.render_spec(load_experiment(experiment), table, profile, LAYOUTS, experiment)
    t = Table(experiment, table, profile, results_root, seeds, split=LAYOUT_SPLITS.get(layout["layout"], ()))
    header, rows = LAYOUTS[layout["layout"]](t, layout["columns"])
    # e.g. Table 12's long-context columns, until a suite measures them
    empty = [h for j, h in enumerate(header)
             if all(not isinstance(r[j], str) and r[j][0] is None for r in rows)]
    md = to_markdown(header, rows)
    tex = to_latex(t, header, rows)
    for caption in (ci_caption(t), companion_caption(t, layout["columns"]), data_caption(t, layout["columns"])):
        if caption:
            md += "\n" + caption + "\n"
            tex += "% " + caption + "\n"
    written = write_outputs(table, profile, out_root, tex, md, comparison(t, layout["paper"]))
    written["figures"] = PLOTS.get(layout["layout"], plot)(t, (figures_root or ROOT / "figures") / profile / table)
    notes = [f"no result has these columns (rendered as --): {', '.join(map(_plain, empty))}"] if empty else []
    seeds = table_seeds(t.spec, table, profile, seeds)
    if len(seeds) > 1 and t.replicates() == [1]:
        notes.append(f"the table asks for {len(seeds)} seeds but each cell has one replicate so far: no CI shown")
    if not quiet:
        report(written, md, t.missing, notes)
    written["missing"], written["empty_columns"] = t.missing, empty
    return written


def replicate_span(reps: list[int]) -> str | None:
    """The replicates per cell as a caption says it ("3", "1-3"); None when no cell has two (no CI to explain)."""
    if not reps or max(reps) < 2:
        return None
    return f"{reps[0]}" if len(reps) == 1 else f"{reps[0]}-{reps[-1]}"


def ci_caption(t: Table) -> str:
    """What the ± means, when some cell has two or more replicates ("" otherwise: single-seed output unchanged)."""
    n = replicate_span(t.replicates())
    if n is None:
        return ""
    return (f"Mean ± half-width of the 95% t-interval over {n} replicates per cell; a replicate is one seed, which "
            f"draws the calibration sequences and drives the RFT run (data order, LoRA initialisation). The dense "
            f"baseline is one deterministic evaluation."
            + (" Dense+RFT: the dense model fine-tuned with the same RFT recipe and budget." if t.control else ""))


def companion_caption(t: Table, metrics: list[Metric]) -> str:
    """Where the columns read from companion tables come from ("" when none does: other outputs unchanged)."""
    lines = []
    for table in dict.fromkeys(m.table for m in metrics if m.table is not None):
        other = t.companion(table)
        labels = ", ".join(_plain(m.label) for m in metrics if m.table == table)
        stand_ins = ", ".join(f"{o} for {m}" for m, o in zip(t.models, other.models))
        n = replicate_span(other.replicates())
        spread = (f"mean ± half-width of the 95% t-interval over {n} replicates per reduced cell (a replicate is one "
                  f"seed: calibration draw and RFT run); the dense baseline is one deterministic evaluation"
                  if n is not None else "one replicate per cell")
        lines.append(f"{labels}: table {table} ({other.suite} suite; models {stand_ins}), {spread}.")
    return " ".join(lines)


def data_caption(t: Table, metrics: list[Metric], sizes: dict | None = None) -> str:
    """The data behind each column: its task(s), the examples each evaluation scored (documents for a perplexity)
    and, on the tiny profile, of how many the task holds and the words of a perplexity task's documents (`sizes`:
    tiny_suite.task_sizes). "" when no result the table reads records its counts (older results; the fixtures)."""
    if not t.n_examples and not any(t.companion(m.table).n_examples for m in metrics if m.table is not None):
        return ""
    if sizes is None:
        sizes = task_sizes() if t.profile == "tiny" else {}
    parts = []
    for metric in metrics:
        source = t if metric.table is None else t.companion(metric.table)  # a companion's column: what it scored
        tasks = [task for task in metric_tasks(source.suite, metric.id) if task in source.n_examples]
        described = []
        for task in tasks:
            scored = sorted(source.n_examples[task])
            n = str(scored[0]) if len(scored) == 1 else f"{scored[0]}-{scored[-1]}"
            size = sizes.get(task, {})
            whole = size.get("n_examples")
            unit = "documents" if task.endswith("_ppl") else "queries" if source.suite == "tiny_mqar" else "examples"
            text = f"{task}: {n} {unit}"
            if whole is not None:
                text += " (the whole test split" if scored == [whole] else f" (of {whole}"
                text += f", {size['n_words']:,} words)" if "n_words" in size and scored == [whole] else ")"
            described.append(text)
        if described:
            parts.append(f"{_plain(metric.label)} = {'; '.join(described)}")
    return ("Data per evaluation: " + " | ".join(parts) + ".") if parts else ""


def write_outputs(table: str, profile: str, out_root: Path | None, tex: str, md: str, vs_paper: str) -> dict:
    """paper_tables/out/<profile>/<table>.tex, .md and _vs_paper.md (the renderers' common outputs)."""
    out = (out_root or ROOT / "paper_tables" / "out") / profile
    out.mkdir(parents=True, exist_ok=True)
    written = {"tex": out / f"{table}.tex", "md": out / f"{table}.md", "vs_paper": out / f"{table}_vs_paper.md"}
    for key, text in (("tex", tex), ("md", md), ("vs_paper", vs_paper)):
        written[key].write_text(text)
    return written


def report(written: dict, md: str, missing: list[str], notes=()) -> None:
    """Print the table, the comparison with the paper, the holes and where the files are."""
    print(md)
    print(written["vs_paper"].read_text())
    if missing:
        print(f"{len(missing)} runs missing (rendered as --): {', '.join(missing)}")
    for note in notes:
        print(note)
    print("wrote " + ", ".join(str(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p)
                              for v in written.values() for p in (v if isinstance(v, list) else [v])))
