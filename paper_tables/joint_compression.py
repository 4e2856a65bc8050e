"""Render experiments/joint_compression (issue 18 part 4) from result JSON: key-channel state reduction alone, MLP
linearization alone, and both, per tiny family.

`state-reduction render joint_compression [--profile tiny|paper]` writes paper_tables/out/<profile>/joint_compression.md
(per model, method and ratio: post-RFT perplexity as mean [95% t-interval] over seeds, parameters, state bytes and
FLOPs per token kept, decode time of the reduced and the dense model measured side by side and their paired speedup,
the local fit's relative error of the replaced MLPs) and the Pareto figure figures/<profile>/joint_compression_pareto
.{png,pdf} (perplexity vs parameters, state bytes and decode time, each relative to dense; the non-dominated cells
joined). Reads only result files (state_reduction.pipeline.collect).
"""

from __future__ import annotations

import math
from pathlib import Path

from paper_tables import writers
from paper_tables.collect import by_seed
from paper_tables.figures import save_figure
from state_reduction.pipeline import load_experiment, profile_spec, table_cells
from state_reduction.ralimp.linearize import parse_linearize_method
from state_reduction.stats import mean_ci

EXPERIMENT = "joint_compression"
METRIC = {"tiny": ("wiki_word_perplexity", "wiki word ppl (tiny_wiki)"),
          "paper": ("wiki_word_perplexity", "WikiText-2 word ppl")}
GROUPS = {"state": ("o", "tab:blue"), "mlp": ("s", "tab:orange"), "both": ("D", "tab:red"),
          "baseline": ("v", "tab:gray")}
AXES = (("params_kept", "parameters / dense"), ("state_kept", "state bytes per sequence / dense"),
        ("decode_rel", "decode time per token / dense (paired, batch 1, CPU)"))


def group(method: str) -> str:
    """state (key channels alone), mlp (RaLiMP alone), both, or baseline (EUGen / SNNK alone)."""
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
    spec = load_experiment(EXPERIMENT)
    default = profile_spec(spec, profile)["prune"]["seed"]
    metric = METRIC[profile][0]
    models, cells = [], []
    for t in tables_of(spec, profile):
        keys, cs, _ = table_cells(spec, t, profile)
        models += [k for k in keys if k not in models]
        cells += [c for c in cs if c not in cells]
    prune, evals, baseline = by_seed(EXPERIMENT, profile, metric, default, results_root)
    return {"models": models, "cells": cells, "prune": prune, "evals": evals, "baseline": baseline,
            "default_seed": default, "profile": profile}


def _mean(values):
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else None


def rows(g: dict) -> list[dict]:
    groups = {}
    for c in g["cells"]:
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
            "post": [g["evals"].get((model, method, ratio, s, True)) for s in seeds],
            "pre": [g["evals"].get((model, method, ratio, s, False)) for s in seeds],
        })
    return out


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
    label = METRIC[profile][1]
    pre = any(v is not None for r in rs for v in r["pre"])
    lines = [f"# Joint compression ({profile} profile)", "",
             f"{label} after RFT (lower is better), mean [95% t-interval] over seeds (n = seeds with a result); kept = "
             "reduced / dense: parameters (the linearized MLPs in their deployed, folded form), recurrent-state bytes "
             "per sequence, matmul FLOPs per token. Decode: batch-1 cached CPU decode, ms per token of the reduced and "
             "of the dense model timed side by side in the same process (interleaved), and their paired speedup "
             "(dense / reduced). fit err: relative squared error of the replaced MLPs against the dense ones on the "
             "calibration inputs after the local fit (mean over replaced layers and seeds).", ""]
    header = ["model", "method", "ratio", "params kept", "state kept", "FLOPs kept", "decode ms (dense)",
              "speedup", "fit err"] + (["pre-RFT"] if pre else []) + ["post-RFT"]
    table = []
    for model in g["models"]:
        base = g["baseline"].get(model)
        table.append([model, "dense", "0", "100%", "100%", "100%", "--", "1", "--"] + (["--"] if pre else [])
                     + [_ci([base])])
        for r in (r for r in rs if r["model"] == model):
            speed = _ci(r["speedup"]) if r["speedup"] else "--"
            dec = "--" if r["decode_ms"] is None else f"{r['decode_ms']:.2f} ({r['decode_ms_dense']:.2f})"
            table.append([model, r["method"], f"{r['ratio']:g}", _pct(r["params_kept"]), _pct(r["state_kept"]),
                          _pct(r["flops_kept"]), dec, speed, _num(r["fit_error"])] + ([_ci(r["pre"])] if pre else [])
                         + [_ci(r["post"])])
    lines.append(writers.markdown(header, table, rule=" --- ").rstrip("\n"))
    missing = [f"{r['model']}-{r['method']}-r{round(100 * r['ratio'])}" for r in rs
               if not any(v is not None for v in r["post"])]
    lines += ["", "Cells without a post-RFT result: " + (", ".join(missing) if missing else "none") + "."]
    return "\n".join(lines) + "\n"


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

    models = g["models"]
    fig, axes = plt.subplots(len(models), len(AXES), figsize=(4.2 * len(AXES), 3.3 * len(models)), squeeze=False)
    for row, model in zip(axes, models):
        base = g["baseline"].get(model)
        for ax, (key, xlabel) in zip(row, AXES):
            pts = []
            for name, (marker, color) in GROUPS.items():
                xs, ys, errs = [], [], []
                for r in (r for r in rs if r["model"] == model and r["group"] == name):
                    vals = [v for v in r["post"] if v is not None and math.isfinite(v)]
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
    """paper_tables/out/<profile>/joint_compression.md and the Pareto figure."""
    g = gather(profile, results_root)
    rs = rows(g)
    out, fig_dir = writers.output_dirs(profile, out_root, figures_root)
    (out / "joint_compression.md").write_text(markdown(g, rs))
    return [out / "joint_compression.md", *figure(g, rs, fig_dir)]
