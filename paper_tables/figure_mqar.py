"""Render the recall figure of experiments/mqar_recall from its result JSON: MQAR accuracy against the number of
key-value pairs, dense / 50% / 75% key reduction, one panel per (family or model, selector).

`state-reduction render figure_mqar [--profile tiny]` writes figures/<profile>/figure_mqar.png/.pdf (one row per
family, its pretraining seeds pooled), figures/<profile>/figure_mqar_models.png/.pdf (one row per model) and
paper_tables/out/<profile>/figure_mqar.md: the numbers behind both, and per family (and per model) and selector the
largest loss at 75% against the dense model, with whether it reaches 10 points.

Two levels of replicates. A model's cell has one result per calibration seed; its ± is a 95% t-interval over them
(one binomial standard error over the cell's queries where it has one, e.g. the dense model, which has no
calibration). A family is the models whose `stands_for` name is the family's plus " (pretraining seed N)"
(experiments/mqar_recall/config.yaml); its cell is the mean over its pretraining seeds of each model's mean over
calibration seeds, with a 95% t-interval over the pretraining seeds. Each table row says which.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections import defaultdict
from pathlib import Path

from paper_tables import writers
from paper_tables.figures import save_figure
from state_reduction.evaluation.mqar import CELL_PAIRS, cell_name
from state_reduction.pipeline import collect, load_experiment, profile_spec
from state_reduction.stats import mean_ci

ROOT = Path(__file__).resolve().parents[1]

EXPERIMENT = "mqar_recall"
METHOD_NAMES = {"rand": "Rand", "l1": "L1", "wanda": "S-Wanda", "grad": "Grad", "drrqr": "DRRQR"}
DISCRIMINATES = 0.10  # the bar: a selector that loses >= 10 points at 75% on some cell
PRETRAINING_SEED = re.compile(r"^(?P<family>.+) \(pretraining seed \d+\)$")


def family_name(stands_for: str) -> str:
    """The family a model's paper name belongs to: the name less its " (pretraining seed N)" suffix."""
    match = PRETRAINING_SEED.match(stands_for)
    return match["family"] if match else stands_for


def gather(profile: str, results_root=None):
    """{(model, method, ratio): {cell: [accuracy per calibration seed]}} and the per-seed standard errors, from eval
    results; the model is its paper name (`stands_for`)."""
    spec = load_experiment(EXPERIMENT)
    name_of = {k: m["stands_for"][0] for k, m in profile_spec(spec, profile)["models"].items()}
    acc, se = defaultdict(lambda: defaultdict(list)), defaultdict(lambda: defaultdict(list))
    for r in collect(EXPERIMENT, profile, results_root):
        if r["kind"] != "evaluate" or r["config"].get("suite") != "tiny_mqar":
            continue
        c = r["config"]
        key = (name_of[c["model"]], c["method"], 0.0 if c["method"] == "baseline" else float(c["ratio"]))
        for name in (cell_name(p, n) for n, ps in CELL_PAIRS.items() for p in ps):
            if f"{name}_acc" in r["metrics"]:
                acc[key][name].append(r["metrics"][f"{name}_acc"])
                se[key][name].append(r["metrics"][f"{name}_acc_se"])
    return spec, acc, se


def summary(values: list[float], ses: list[float], unit: str = "calibration seeds") -> tuple[float, float, str]:
    """(mean, half-width, what the half-width is); `ses`: one standard error per value, used when there is one value
    (None where the values are means, which have none)."""
    n = len(values)
    mean = sum(values) / n
    if n == 1:
        if ses is None or ses[0] is None:
            return mean, float("nan"), f"one {unit[:-1]}: no interval"
        return mean, ses[0], "1 SE over queries (one result)"
    return mean, mean_ci(values).half_width, f"95% t-CI over {n} {unit}"


def pool_families(acc, se, models):
    """The family level over `models` (those with a dense result): {(family, method, ratio): {cell: [per-model mean
    over calibration seeds]}}, one value per pretraining seed (model), and the standard errors where a model has one
    result (else None)."""
    pooled, pooled_se = defaultdict(lambda: defaultdict(list)), defaultdict(lambda: defaultdict(list))
    for (model, method, ratio), cells in acc.items():
        if model not in models:
            continue
        key = (family_name(model), method, ratio)
        for cell, values in cells.items():
            pooled[key][cell].append(sum(values) / len(values))
            pooled_se[key][cell].append(se[(model, method, ratio)][cell][0] if len(values) == 1 else None)
    return pooled, pooled_se


def _panels(plt, groups, methods, ratios, acc, se, unit, members=None):
    """One row of panels per group (model or family), one column per selector; the Markdown sections, the rows of
    the largest-loss table, and the figure. `members`: (per-model acc, {family: [model, ...]}) to draw each model's
    mean over calibration seeds as a thin line under its family's mean and interval."""
    fig, axes = plt.subplots(len(groups), len(methods), figsize=(3.0 * len(methods), 2.6 * len(groups)),
                             squeeze=False, sharey=True)
    styles = {0.0: ("black", "dense")} | {r: (c, f"{round(r * 100)}%") for r, c in zip(ratios, ("tab:blue", "tab:red", "tab:green"))}
    sections, verdict_rows = [], []
    for i, group in enumerate(groups):
        base = (group, "baseline", 0.0)
        cells = [cell_name(p, n) for n, ps in CELL_PAIRS.items() for p in ps if cell_name(p, n) in acc[base]]
        header = ["method", "ratio"] + [c.replace("mqar_", "L").replace("_p", " p") for c in cells] + ["interval"]
        dense = {c: summary(acc[base][c], se[base][c], unit) for c in cells}
        rows = [["dense", "0"] + [_cell(dense[c]) for c in cells] + [next(iter(dense.values()))[2]]]
        for j, method in enumerate(methods):
            ax = axes[i][j]
            for ratio in [0.0] + ratios:
                key = base if ratio == 0.0 else (group, method, ratio)
                if key not in acc:
                    continue
                color, label = styles[ratio]
                for model in (members[1][group] if members else []):
                    cells_of = members[0].get((model, *key[1:]), {})
                    for n, ls in zip(CELL_PAIRS, ("-", "--")):
                        pts = [(p, cells_of[cell_name(p, n)]) for p in CELL_PAIRS[n] if cell_name(p, n) in cells_of]
                        ax.plot([p for p, _ in pts], [100 * sum(v) / len(v) for _, v in pts], color=color, ls=ls,
                                lw=0.7, alpha=0.35)
                for n, ls in zip(CELL_PAIRS, ("-", "--")):
                    pts = [(p, summary(acc[key][cell_name(p, n)], se[key][cell_name(p, n)], unit))
                           for p in CELL_PAIRS[n] if cell_name(p, n) in acc[key]]
                    if pts:
                        ax.errorbar([p for p, _ in pts], [100 * s[0] for _, s in pts],
                                    yerr=[0.0 if math.isnan(s[1]) else 100 * s[1] for _, s in pts],
                                    color=color, ls=ls, marker="o", ms=3, capsize=2,
                                    label=f"{label}, L={n}" if (i, j) == (0, 0) else None)
                if ratio == 0.0:
                    continue
                row = {c: summary(acc[key][c], se[key][c], unit) for c in cells if c in acc[key]}
                rows.append([METHOD_NAMES.get(method, method), f"{round(ratio * 100)}%"]
                            + [_cell(row[c]) if c in row else "–" for c in cells]
                            + [next(iter(row.values()))[2]])
                if ratio == max(ratios):
                    drop, where = max((dense[c][0] - row[c][0], c) for c in row)
                    verdict_rows.append((group, method, drop, where, dense[where], row[where]))
            # wrapped: a long model name (e.g. a recipe with its pretraining seed) would run into the next panel's
            ax.set_title(textwrap.fill(f"{group}: {METHOD_NAMES.get(method, method)}", 34), fontsize=9)
            ax.set_ylim(0, 105)
            ax.grid(alpha=0.3)
            if i == len(groups) - 1:
                ax.set_xlabel("key-value pairs")
            if j == 0:
                ax.set_ylabel("MQAR accuracy (%)")
        sections += [f"### {group}", "", writers.markdown(header, rows)]
    fig.legend(loc="upper center", ncol=2 * (len(ratios) + 1), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.05 * 5 / max(len(groups), 5)))
    return fig, sections, verdict_rows


def _half(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.1f}"


def _cell(s: tuple[float, float, str]) -> str:
    """A table cell: mean ± half-width in points."""
    return f"{100 * s[0]:.1f} ± {_half(s[1])}"


def _largest_losses(level: str, top: float, verdict_rows) -> list[str]:
    rows = [[group, METHOD_NAMES.get(method, method), f"{100 * drop:.1f}", where,
             _cell(d), _cell(r),
             "yes" if drop >= DISCRIMINATES else "no"] for group, method, drop, where, d, r in verdict_rows]
    hits = [v for v in verdict_rows if v[2] >= DISCRIMINATES]
    return [f"### Does the testbed discriminate? Largest loss at {round(top * 100)}% against dense, per {level}", "",
            writers.markdown([level, "selector", "largest loss (points)", "cell", "dense", "pruned", ">= 10 points"],
                             rows).rstrip("\n"), "",
            f"{len(hits)} of {len(verdict_rows)} ({level}, selector) pairs lose >= 10 points at "
            f"{round(top * 100)}% on at least one cell (a loss of means; the ± columns are the rows' intervals)."]


def render(profile: str, results_root=None, out_root: Path | None = None, figures_root: Path | None = None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec, acc, se = gather(profile, results_root)
    models = list(dict.fromkeys(m["stands_for"][0] for m in profile_spec(spec, profile)["models"].values()))
    models = [m for m in models if (m, "baseline", 0.0) in acc]
    if not models:
        raise SystemExit(f"figure_mqar: no tiny_mqar results in results/{profile}/{EXPERIMENT}; "
                         f"run `state-reduction run-table figure_mqar --experiment {EXPERIMENT}` first")
    methods = spec["methods"]
    ratios = sorted({k[2] for k in acc if k[1] != "baseline"})
    top = max(ratios)
    pooled, pooled_se = pool_families(acc, se, set(models))
    families = list(dict.fromkeys(family_name(m) for m in models))
    figures = (figures_root or ROOT / "figures") / profile
    members = {f: [m for m in models if family_name(m) == f] for f in families}
    fam_fig, fam_sections, fam_rows = _panels(plt, families, methods, ratios, pooled, pooled_se, "pretraining seeds",
                                              members=(acc, members))
    paths = save_figure(fam_fig, figures / "figure_mqar", dpi=130)
    model_fig, model_sections, model_rows = _panels(plt, models, methods, ratios, acc, se, "calibration seeds")
    paths += save_figure(model_fig, figures / "figure_mqar_models", dpi=110)
    lines = [f"# MQAR recall under key reduction ({profile} profile)", "",
             "Accuracy (%) of greedy value recall per cell (context length L, pairs p): mean ± half-width, the interval as "
             "the last column states. No RFT.",
             "", "## Per family (figure `figure_mqar`)", "",
             "Each family's cell is the mean over its pretraining seeds (models) of each model's mean over its "
             "calibration seeds; ± is a 95% t-interval over the pretraining seeds.", "",
             *fam_sections, *_largest_losses("family", top, fam_rows), "",
             "## Per model (figure `figure_mqar_models`)", "",
             "Each model's cell is the mean over its calibration seeds; ± is a 95% t-interval over them (the dense "
             "model, which has no calibration: one binomial standard error over the cell's queries).", "",
             *model_sections, *_largest_losses("model", top, model_rows)]
    out_md = (out_root or ROOT / "paper_tables" / "out") / profile / "figure_mqar.md"
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text("\n".join(lines) + "\n")
    return paths + [out_md]
