"""Render experiments/joint_compression (issue 18 part 4) from result JSON: key-channel state reduction alone, MLP
linearization alone, and both, per tiny family.

`state-reduction render joint_compression [--profile tiny|paper]` writes paper_tables/out/<profile>/joint_compression.md
(per model, method and ratio: pre- and post-RFT perplexity as mean [95% t-interval] over seeds, parameters, state bytes and
FLOPs per token kept, decode time of the reduced and the dense model measured side by side and their paired speedup,
the local fit's relative error of the replaced MLPs; where the tables have `control: true`, the dense+RFT control's row and
each cell's post-RFT perplexity relative to the control of the same seed) and the Pareto figure figures/<profile>/joint_compression_pareto
.{png,pdf} (perplexity vs parameters, state bytes and decode time, each relative to dense; the non-dominated cells
joined). The recall tables (those whose suite is a RECALL_COLUMNS suite: the MQAR testbed's models) get their own
section (accuracy per number of pairs before RFT) and figure figures/<profile>/joint_compression_recall.{png,pdf}.
Reads only result files (state_reduction.pipeline.collect).
"""

from __future__ import annotations

import math
from pathlib import Path

from paper_tables import writers
from paper_tables.collect import by_seed
from paper_tables.figures import save_figure
from state_reduction.evaluation.mqar import CELL_PAIRS, CELLS, MIN_QUERIES, cell_name
from state_reduction.pipeline import CONTROL, load_experiment, profile_spec, table_cells, table_evaluate
from state_reduction.ralimp.linearize import parse_linearize_method
from state_reduction.stats import mean_ci

EXPERIMENT = "joint_compression"
METRIC = {"tiny": ("wiki_word_perplexity", "wiki word ppl (tiny_wiki)"),
          "paper": ("wiki_word_perplexity", "WikiText-2 word ppl")}
# The recall figure's panels per row (one per recall model; more models wrap onto further rows).
RECALL_PANELS_PER_ROW = 4
# The suites whose tables are recall tables, and the metrics their rows show (MQAR accuracy by number of pairs at the
# recall models' training length); every other suite's rows show the profile's perplexity METRIC.
RECALL_COLUMNS = {"tiny_mqar": tuple(f"{cell_name(p, 32)}_acc" for p in CELL_PAIRS[32])}
GROUPS = {"state": ("o", "tab:blue"), "mlp": ("s", "tab:orange"), "both": ("D", "tab:red"),
          "baseline": ("v", "tab:gray")}
AXES = (("params_kept", "parameters / dense"), ("state_kept", "state bytes per sequence / dense"),
        ("decode_rel", "decode time per token / dense (paired, batch 1, CPU)"))


def group(method: str) -> str:
    """state (key channels alone), mlp (RaLiMP alone), both, baseline (EUGen / SNNK alone), or control (the dense
    model after the same RFT)."""
    if method == CONTROL:
        return "control"
    parsed = parse_linearize_method(method)
    if parsed is None:
        return "state"
    if parsed.selector is not None:
        return "both"
    return "mlp" if parsed.method == "ralimp" else "baseline"


def tables_of(spec: dict, profile: str) -> list[str]:
    """The experiment's tables that run on `profile` (the tiny per-family tables, or the paper plan)."""
    return [t for t in spec["tables"] if t.startswith("joint_paper") == (profile == "paper")]


def gather(profile: str, results_root=None) -> dict:
    """The experiment's cells split by what their tables evaluate: `models`/`cells` (perplexity) and
    `recall_models`/`recall_cells` (a RECALL_COLUMNS suite); `evals` and `baseline` hold each evaluation's whole
    metrics mapping."""
    spec = load_experiment(EXPERIMENT)
    default = profile_spec(spec, profile)["prune"]["seed"]
    split = {False: ([], []), True: ([], [])}
    recall_suite = None
    for t in tables_of(spec, profile):
        keys, cs, _ = table_cells(spec, t, profile)
        suite = table_evaluate(spec, t, profile)[0]["suite"]
        recall = suite in RECALL_COLUMNS
        recall_suite = suite if recall else recall_suite
        models, cells = split[recall]
        models += [k for k in keys if k not in models]
        cells += [c for c in cs if c not in cells]
    prune, evals, baseline = by_seed(EXPERIMENT, profile, None, default, results_root)
    return {"models": split[False][0], "cells": split[False][1], "recall_models": split[True][0],
            "recall_cells": split[True][1], "recall_suite": recall_suite, "prune": prune, "evals": evals,
            "baseline": baseline, "default_seed": default, "profile": profile}


def _mean(values):
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else None


def rows(g: dict, cells: list | None = None) -> list[dict]:
    """One row per (model, method, ratio) of `cells` (default: the perplexity cells): costs from the reduction
    results, and `post` / `pre` the evaluations' metrics mappings per seed (None where a seed has none)."""
    groups = {}
    for c in (g["cells"] if cells is None else cells):
        groups.setdefault((c.model, c.method, c.ratio), []).append(dict(c.vary).get("seed", g["default_seed"]))
    out = []
    for (model, method, ratio), seeds in groups.items():
        pr = [g["prune"][(model, method, ratio, s)] for s in seeds if (model, method, ratio, s) in g["prune"]]

        def kept(name):
            return _mean([m[f"{name}_after"] / m[f"{name}_before"] for m in pr if m.get(f"{name}_before")])

        speed = [m["decode_speedup"] for m in pr if m.get("decode_speedup") is not None]
        out.append({
            "model": model, "method": method, "ratio": ratio, "group": group(method), "n_prune": len(pr),
            "params_kept": kept("parameters"), "state_kept": kept("state_bytes"), "flops_kept": kept("flops_per_token"),
            "decode_ms": _mean([m.get("decode_ms_per_token") for m in pr]),
            "decode_ms_dense": _mean([m.get("decode_ms_per_token_dense") for m in pr]),
            "speedup": speed, "decode_rel": (1 / _mean(speed)) if speed else None,
            "fit_error": _mean([m.get("mlp_rel_error_fit") for m in pr]),
            "seeds": seeds, "post": [g["evals"].get((model, method, ratio, s, True)) for s in seeds],
            "pre": [g["evals"].get((model, method, ratio, s, False)) for s in seeds],
        })
    return out


def vs_control(r: dict, control: dict | None, metric: str) -> list[float]:
    """Post-RFT `metric` of row `r` relative to the dense+RFT control of its model, per seed both have (the control
    of a seed is fine-tuned with that seed): value / control - 1."""
    if control is None:
        return []
    ref = dict(zip(control["seeds"], metric_of(control["post"], metric)))
    return [v / ref[s] - 1 for s, v in zip(r["seeds"], metric_of(r["post"], metric))
            if v is not None and ref.get(s) and math.isfinite(v)]


def metric_of(values: list, metric: str) -> list:
    """`metric` of each evaluation's metrics mapping (None where a seed has no evaluation or lacks it)."""
    return [None if v is None else v.get(metric) for v in values]


def _ci(values) -> str:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return "--"
    return mean_ci(values).format(4) if len(values) > 1 else f"{values[0]:.4g} (n=1)"


def _pct(x) -> str:
    return "--" if x is None else f"{100 * x:.1f}%"


def _num(x, digits=3) -> str:
    return "--" if x is None else f"{x:.{digits}g}"


def markdown(g: dict, rs: list[dict]) -> str:
    profile = g["profile"]
    metric, label = METRIC[profile]
    pre = any(v is not None for r in rs for v in metric_of(r["pre"], metric))
    control = {r["model"]: r for r in rs if r["group"] == "control"}
    lines = [f"# Joint compression ({profile} profile)", "",
             f"{label} after RFT (lower is better), mean [95% t-interval] over seeds (n = seeds with a result); kept = "
             "reduced / dense: parameters (the linearized MLPs in their deployed, folded form), recurrent-state bytes "
             "per sequence, matmul FLOPs per token. Decode: batch-1 cached CPU decode, ms per token of the reduced and "
             "of the dense model timed side by side in the same process (interleaved), and their paired speedup "
             "(dense / reduced). fit err: relative squared error of the replaced MLPs against the dense ones on the "
             "calibration inputs after the local fit (mean over replaced layers and seeds)."
             + (" dense+RFT: the dense model fine-tuned with the same RFT recipe and budget, one run per seed (the "
                "control); vs dense+RFT: post-RFT perplexity over the control's of the same seed, minus 1, in % "
                "(mean [95% t-interval] over seeds): recovery read against the control." if control else ""), ""]
    header = ["model", "method", "ratio", "params kept", "state kept", "FLOPs kept", "decode ms (dense)",
              "speedup", "fit err"] + (["pre-RFT"] if pre else []) + ["post-RFT"] + (["vs dense+RFT"] if control else [])
    table = []
    for model in g["models"]:
        base = (g["baseline"].get(model) or {}).get(metric)
        ctrl = control.get(model)
        table.append([model, "dense", "0", "100%", "100%", "100%", "--", "1", "--"] + (["--"] if pre else [])
                     + [_ci([base])] + (["--"] if control else []))
        if control:
            table.append([model, "dense+RFT", "0", "100%", "100%", "100%", "--", "--", "--"] + (["--"] if pre else [])
                         + [_ci(metric_of(ctrl["post"], metric)) if ctrl else "--", "--"])
        for r in (r for r in rs if r["model"] == model and r["group"] != "control"):
            speed = _ci(r["speedup"]) if r["speedup"] else "--"
            dec = "--" if r["decode_ms"] is None else f"{r['decode_ms']:.2f} ({r['decode_ms_dense']:.2f})"
            table.append([model, r["method"], f"{r['ratio']:g}", _pct(r["params_kept"]), _pct(r["state_kept"]),
                          _pct(r["flops_kept"]), dec, speed, _num(r["fit_error"])]
                         + ([_ci(metric_of(r["pre"], metric))] if pre else []) + [_ci(metric_of(r["post"], metric))]
                         + ([_pct_ci(vs_control(r, ctrl, metric))] if control else []))
    lines.append(writers.markdown(header, table, rule=" --- ").rstrip("\n"))
    lines += ["", "Cells without a post-RFT result: " + _missing(rs, "post", metric) + "."]
    return "\n".join(lines) + "\n"


def _missing(rs: list[dict], stage: str, metric: str) -> str:
    """The cells of `rs` with no `metric` in any seed's `stage` ("pre" / "post") evaluation, or "none"."""
    missing = [f"{r['model']}-{r['method']}-r{round(100 * r['ratio'])}" for r in rs
               if not any(v is not None for v in metric_of(r[stage], metric))]
    return ", ".join(missing) if missing else "none"


def _pct_ci(values) -> str:
    return _ci([None if v is None else 100 * v for v in values])


def _pairs(column: str) -> int:
    return CELLS[column.removesuffix("_acc")][0]


def recall_markdown(g: dict, rs: list[dict]) -> str:
    """The recall section: each recall model's reductions scored by the recall suite before RFT, accuracy in %
    per number of key-value pairs (RECALL_COLUMNS), mean [95% t-interval] over seeds."""
    if not g["recall_models"]:
        return ""
    columns = RECALL_COLUMNS[g["recall_suite"]]
    lines = ["", "## Recall (the MQAR testbed)", "",
             f"`{g['recall_suite']}` accuracy in % of the queried keys answered (higher is better), at 32 tokens (the "
             f"recall models' training length) by number of key-value pairs, before RFT (the recall tables run no RFT: "
             f"its text data would retrain the skill measured), mean [95% t-interval] over seeds (n = seeds with a "
             f"result); dense: one deterministic evaluation. At least {MIN_QUERIES} queries per cell and evaluation. "
             "The recall models have 2 decoder layers, so k = all replaces both MLPs.", ""]
    header = ["model", "method", "ratio", "params kept", "state kept"] + [f"{_pairs(c)} pairs" for c in columns]
    table = []
    for model in g["recall_models"]:
        base = g["baseline"].get(model) or {}
        table.append([model, "dense", "0", "100%", "100%"] + [_pct_ci([base.get(c)]) for c in columns])
        for r in (r for r in rs if r["model"] == model):
            table.append([model, r["method"], f"{r['ratio']:g}", _pct(r["params_kept"]), _pct(r["state_kept"])]
                         + [_pct_ci(metric_of(r["pre"], c)) for c in columns])
    lines.append(writers.markdown(header, table, rule=" --- ").rstrip("\n"))
    lines += ["", "Recall cells without a result: " + _missing(rs, "pre", columns[-1]) + "."]
    return "\n".join(lines) + "\n"


def recall_figure(g: dict, rs: list[dict], out_dir: Path) -> list[Path]:
    """Recall vs number of pairs, one panel per recall model: dense and every reduction (colour: the method,
    marker: what is reduced, line style: the state ratio), mean and 95% t-interval over seeds."""
    if not g["recall_models"]:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = RECALL_COLUMNS[g["recall_suite"]]
    pairs = [_pairs(c) for c in columns]
    styles = {0.0: "-", 0.5: "--", 0.75: ":"}
    models = g["recall_models"]
    methods = list(dict.fromkeys(r["method"] for r in rs))
    colours = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(methods)}
    ncols = min(RECALL_PANELS_PER_ROW, len(models))
    nrows = -(-len(models) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.4 * ncols, 3.6 * nrows), squeeze=False)
    for ax in axes.flat[len(models):]:
        ax.set_visible(False)
    for ax, model in zip(axes.flat, models):
        base = g["baseline"].get(model) or {}
        if all(base.get(c) is not None for c in columns):
            ax.plot(pairs, [100 * base[c] for c in columns], color="k", linewidth=2, marker="*", label="dense")
        for r in (r for r in rs if r["model"] == model):
            cis = [[100 * v for v in metric_of(r["pre"], c) if v is not None] for c in columns]
            if not all(cis):
                continue
            cis = [mean_ci(v) for v in cis]
            ax.errorbar(pairs, [c.mean for c in cis], yerr=[c.half_width or 0.0 for c in cis],
                        color=colours[r["method"]], marker=GROUPS[r["group"]][0], markersize=3, capsize=2,
                        linestyle=styles.get(r["ratio"], "-."), linewidth=1,
                        label=f"{r['method']} @ {r['ratio']:g}")
        ax.set_xticks(pairs)
        ax.set_ylim(0, 102)
        ax.set_xlabel("key-value pairs (32 tokens)", fontsize=7)
        ax.set_title(model, fontsize=8)
        ax.grid(alpha=0.3)
    for row in axes:
        row[0].set_ylabel("MQAR accuracy (%), before RFT", fontsize=7)
    last = axes.flat[len(models) - 1]
    if last.get_legend_handles_labels()[0]:
        last.legend(fontsize=5, loc="lower left")
    fig.tight_layout()
    return save_figure(fig, out_dir / "joint_compression_recall", dpi=130)


def pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The non-dominated points (lower x and lower y are better), sorted by x."""
    front = []
    for x, y in sorted(points):
        if not front or y < front[-1][1]:
            front.append((x, y))
    return front


def figure(g: dict, rs: list[dict], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models, metric = g["models"], METRIC[g["profile"]][0]
    fig, axes = plt.subplots(len(models), len(AXES), figsize=(4.2 * len(AXES), 3.3 * len(models)), squeeze=False)
    for row, model in zip(axes, models):
        base = (g["baseline"].get(model) or {}).get(metric)
        for ax, (key, xlabel) in zip(row, AXES):
            pts = []
            for name, (marker, color) in GROUPS.items():
                xs, ys, errs = [], [], []
                for r in (r for r in rs if r["model"] == model and r["group"] == name):
                    vals = [v for v in metric_of(r["post"], metric) if v is not None and math.isfinite(v)]
                    if not vals or r[key] is None:
                        continue
                    ci = mean_ci(vals)
                    xs.append(r[key])
                    ys.append(ci.mean)
                    errs.append(ci.half_width or 0.0)
                    ax.annotate(r["method"].replace("drrqr+", "d+").replace("ralimp", "R") + f"@{r['ratio']:g}",
                                (r[key], ci.mean), fontsize=5, xytext=(2, 2), textcoords="offset points")
                if xs:
                    ax.errorbar(xs, ys, yerr=errs, fmt=marker, color=color, label=name, markersize=4, capsize=2)
                    pts += list(zip(xs, ys))
            if base is not None:
                ax.plot([1.0], [base], marker="*", color="k", markersize=10, linestyle="none", label="dense")
                pts.append((1.0, base))
            ctrl = [v for r in rs if r["model"] == model and r["group"] == "control"
                    for v in metric_of(r["post"], metric) if v is not None and math.isfinite(v)]
            if ctrl:  # the dense model after the same RFT: what fine-tuning alone reaches
                ax.axhline(sum(ctrl) / len(ctrl), color="k", linewidth=0.8, linestyle=":", label="dense+RFT")
            front = pareto(pts)
            if len(front) > 1:
                ax.plot(*zip(*front), color="k", linewidth=0.6, linestyle="--", label="Pareto front")
            ax.set_yscale("log")
            ax.set_xlabel(xlabel, fontsize=7)
            ax.set_title(model, fontsize=8)
        row[0].set_ylabel(METRIC[g["profile"]][1] + ", post-RFT", fontsize=7)
    labelled = [ax for row in axes for ax in row if ax.get_legend_handles_labels()[0]]
    if labelled:
        labelled[-1].legend(fontsize=6, loc="best")
    fig.tight_layout()
    return save_figure(fig, out_dir / "joint_compression_pareto", dpi=130)


def render(profile: str = "tiny", results_root=None, out_root: Path | None = None,
           figures_root: Path | None = None) -> list[Path]:
    """paper_tables/out/<profile>/joint_compression.md, the Pareto figure and, where the experiment has recall
    tables, the recall figure."""
    g = gather(profile, results_root)
    rs, recall = rows(g), rows(g, g["recall_cells"])
    out, fig_dir = writers.output_dirs(profile, out_root, figures_root)
    (out / "joint_compression.md").write_text(markdown(g, rs) + recall_markdown(g, recall))
    return [out / "joint_compression.md", *figure(g, rs, fig_dir), *recall_figure(g, recall, fig_dir)]
