"""Render experiments/layer_adaptive_budgets (issue 17 part 4) from result JSON: uniform vs layer-adaptive
(global-AIRE, global-LAST) key-dimension budgets at equal total state.

`state-reduction render TABLE [--profile tiny|paper]` (TABLE one of the experiment's tables) writes
paper_tables/out/<profile>/<TABLE>.md (per model, selector, ratio and budget: channels kept against the uniform
budget's total, state kept, each layer's K' (first seed), perplexity pre-/post-RFT as mean [95% t-interval] over
calibration seeds, and the paired difference to the uniform budget of the same seeds) and the per-layer K' figure
figures/<profile>/<TABLE>_key_dims.{png,pdf}. Reads only result files (state_reduction.pipeline.collect).
"""

from __future__ import annotations

import math
from pathlib import Path

from paper_tables import writers
from paper_tables.collect import by_seed
from paper_tables.figures import save_figure
from state_reduction.atomic import write_text_atomic
from state_reduction.pipeline import CONTROL, load_experiment, profile_spec, table_cells
from state_reduction.stats import diff_ci, mean_ci

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = "layer_adaptive_budgets"
METRIC = {"tiny": ("ptb_word_perplexity", "PTB word ppl"), "paper": ("wiki_word_perplexity", "WikiText-2 word ppl")}
UNIFORM = "uniform"
COLORS = {"uniform": "tab:gray", "global-aire": "tab:blue", "global-last": "tab:orange"}


def gather(table: str, profile: str, results_root=None) -> dict:
    spec = load_experiment(EXPERIMENT)
    keys, cells, rft_states = table_cells(spec, table, profile)
    default_seed = profile_spec(spec, profile)["prune"]["seed"]
    metric = METRIC[profile][0]
    prune, evals, baseline = by_seed(
        EXPERIMENT, profile, metric, default_seed, results_root, prune_value=lambda r: r,
        cell=lambda c: (c["model"], c["method"], c["ratio"], (c.get("vary") or {}).get("budget", UNIFORM)))
    groups, controls = {}, {}
    for c in cells:
        v = dict(c.vary)
        if c.method == CONTROL:  # the dense+RFT control: no budget, one per seed
            controls.setdefault(c.model, []).append(v.get("seed", default_seed))
            continue
        groups.setdefault((c.model, c.method, c.ratio, v.get("budget", UNIFORM)), []).append(v.get("seed", default_seed))
    return {"models": keys, "groups": groups, "controls": controls, "rft": rft_states, "prune": prune,
            "evals": evals, "baseline": baseline, "metric": metric}


def layer_dims(result: dict) -> dict[int, int] | None:
    """Each reducible layer's K' from a prune result of a global budget (None for the uniform budget)."""
    budget = (result.get("extra") or {}).get("budget")
    return {int(k): v for k, v in budget["layer_key_dims"].items()} if budget else None


def _finite(values) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def _ci(values) -> str:
    values = _finite(values)
    if not values:
        return "--"
    return mean_ci(values).format(4) if len(values) > 1 else f"{values[0]:.4g} (n=1)"


def _paired(g: dict, key: tuple, seeds: list[int], rft: bool) -> str:
    if key[3] == UNIFORM:
        return ""
    pairs = [(g["evals"].get((*key, s, rft)), g["evals"].get((*key[:3], UNIFORM, s, rft))) for s in seeds]
    pairs = [(a, b) for a, b in pairs if a is not None and b is not None and math.isfinite(a) and math.isfinite(b)]
    if len(pairs) < 2:
        return "--" if not pairs else f"{pairs[0][0] - pairs[0][1]:+.4g} (n=1)"
    return diff_ci([a for a, _ in pairs], [b for _, b in pairs], paired=True).format(4)


def rows(g: dict) -> list[list]:
    out = []
    for key, seeds in g["groups"].items():
        model, method, ratio, budget = key
        pr = [g["prune"][(*key, s)] for s in seeds if (*key, s) in g["prune"]]
        m = pr[0]["metrics"] if pr else {}
        dims = layer_dims(pr[0]) if pr else None
        kept = f"{m['kept_channels']}/{m['requested_channels']}" if dims else ("=" if m else "--")
        state = f"{100 * m['state_bytes_after'] / m['state_bytes_before']:.1f}%" if m else "--"
        dims_text = (", ".join(str(dims[k]) for k in sorted(dims)) if dims
                     else (f"{m['key_dim_after']} in every layer" if m else "--"))
        pre = [g["evals"].get((*key, s, False)) for s in seeds]
        post = [g["evals"].get((*key, s, True)) for s in seeds]
        row = [model, method, f"{ratio:g}", budget, kept, state, dims_text, _ci(pre), _paired(g, key, seeds, False)]
        if True in g["rft"]:
            row += [_ci(post), _paired(g, key, seeds, True)]
        out.append(row)
    for model, seeds in g.get("controls", {}).items():  # the dense model fine-tuned with the same recipe and seeds
        post = [g["evals"].get((model, CONTROL, 0.0, UNIFORM, s, True)) for s in seeds]
        out.append([model, "dense+RFT", "0", "--", "all", "100%", "--", "", "", _ci(post), ""])
    return out


def markdown(table: str, g: dict, profile: str) -> str:
    label = METRIC[profile][1]
    header = ["model", "selector", "ratio", "budget", "channels kept / uniform total", "state kept",
              "K' per layer (first seed)", "pre-RFT", "vs uniform (paired)"]
    if True in g["rft"]:
        header += ["post-RFT", "vs uniform post (paired)"]
    lines = [f"# Layer-adaptive budgets: {table} ({profile} profile)", "",
             f"{label} (lower is better), mean [95% t-interval] over calibration seeds; 'vs uniform': the paired "
             "difference (budget - uniform, same seeds; negative = the adaptive budget is better) with its 95% "
             "t-interval. Dense: " + ", ".join(f"{k} {v:.4g}" for k, v in g["baseline"].items() if v is not None)
             + "." + (" dense+RFT: the dense model fine-tuned with the same RFT recipe and seeds (the control post-RFT "
                      "cells are read against)." if g.get("controls") else ""), ""]
    lines.append(writers.markdown(header, rows(g), rule=" --- ").rstrip("\n"))
    return "\n".join(lines) + "\n"


def figure(table: str, g: dict, out_dir: Path) -> list[Path]:
    """Per-layer K' of each budget (first seed), one panel per model and selector at each ratio."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(k[0], k[1], k[2]) for k in g["groups"]}, key=lambda p: (g["models"].index(p[0]), p[1], p[2]))
    if not panels:
        return []
    cols = min(4, len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.6 * cols, 2.8 * nrows), squeeze=False)
    for ax, (model, method, ratio) in zip(axes.flat, panels):
        budgets = [b for (m, s, r, b) in g["groups"] if (m, s, r) == (model, method, ratio)]
        adaptive = [b for b in budgets if b != UNIFORM]
        width = 0.8 / max(1, len(adaptive))
        for budget in budgets:
            key = (model, method, ratio, budget)
            pr = g["prune"].get((*key, g["groups"][key][0]))
            if pr is None:
                continue
            dims = layer_dims(pr)
            if dims is None:  # the uniform budget: one K' for every layer
                ax.axhline(pr["metrics"]["key_dim_after"], color=COLORS[UNIFORM], linestyle="--", label=UNIFORM)
                continue
            i = adaptive.index(budget)
            xs = sorted(dims)
            ax.bar([j + (i - (len(adaptive) - 1) / 2) * width for j in range(len(xs))], [dims[x] for x in xs],
                   width=width, color=COLORS.get(budget), label=budget)
            ax.set_xticks(range(len(xs)), [str(x) for x in xs])
        ax.set_title(f"{model} {method} {int(round(ratio * 100))}%", fontsize=8)
        ax.set_xlabel("layer", fontsize=7)
        ax.set_ylabel("K' (kept channels per head)", fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    return save_figure(fig, out_dir / f"{table}_key_dims", dpi=130)


def render(table: str, profile: str = "tiny", experiment=None, results_root=None, out_root: Path | None = None,
           figures_root: Path | None = None, quiet: bool = False) -> list[Path]:
    g = gather(table, profile, results_root)
    out = (out_root or ROOT / "paper_tables" / "out") / profile
    fig_dir = (figures_root or ROOT / "figures") / profile
    out.mkdir(parents=True, exist_ok=True)
    fig_dir.mkdir(parents=True, exist_ok=True)
    path = out / f"{table}.md"
    write_text_atomic(path, markdown(table, g, profile))
    return [path, *figure(table, g, fig_dir)]

