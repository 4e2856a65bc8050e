"""Render experiments/state_vs_structure (issue 16) from result JSON: key-channel state reduction vs Mamba-Shedder
mixer removal vs both, at equal recurrent-state budgets.

`state-reduction render state_vs_structure [--profile tiny|paper]` writes
paper_tables/out/<profile>/state_vs_structure.md (per model, method and ratio: state, parameters and FLOPs kept,
decode speedup, perplexity pre-/post-RFT as mean [95% t-interval] over calibration seeds),
state_vs_structure_vs_paper.md (the paper's and Mamba-Shedder's own headline numbers beside ours) and the Pareto
figures figures/<profile>/state_vs_structure_{state,decode}.{png,pdf} (perplexity vs state bytes, vs decode time
relative to dense).
Reads only result files (state_reduction.pipeline.collect) and reference_data/*.json.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from paper_tables import writers
from paper_tables.collect import by_seed
from paper_tables.figures import save_figure
from state_reduction.pipeline import CONTROL, load_experiment, profile_spec, table_cells
from state_reduction.stats import mean_ci


EXPERIMENT = TABLE = "state_vs_structure"
REFERENCE = Path(__file__).resolve().parent / "reference_data"
METRIC = {"tiny": ("ptb_word_perplexity", "PTB word ppl"), "paper": ("wiki_word_perplexity", "WikiText-2 word ppl")}
MARKERS = {"drrqr": "o", "grad": "s", "shed-mixer": "^", "shed-mixer+drrqr": "D"}
COLORS = {"drrqr": "tab:blue", "grad": "tab:orange", "shed-mixer": "tab:green", "shed-mixer+drrqr": "tab:red"}
PAPER_ROWS = {  # the paper's table holding each stand-in's model at its ratios (reference_data)
    "Gated DeltaNet 1.3B": "table20", "Mamba-Codestral-7B": "table3", "Qwen3.5 9B": "table13"}
PAPER_NAMES = {"Mamba-Codestral-7B": "Mamba-Codestral 7B"}


def gather(profile: str, results_root=None) -> dict:
    spec = load_experiment(EXPERIMENT)
    keys, cells, rft_states = table_cells(spec, TABLE, profile)
    default_seed = profile_spec(spec, profile)["prune"]["seed"]
    metric = METRIC[profile][0]
    prune, evals, baseline = by_seed(EXPERIMENT, profile, metric, default_seed, results_root)
    table_cells_ = {t: table_cells(spec, t, profile)[1] for t in spec["tables"]}
    seeds = {t: sorted({dict(c.vary).get("seed", default_seed) for c in cs}) for t, cs in table_cells_.items()}
    post = TABLE + "_rft"
    control = any(c.method == CONTROL for c in table_cells_.get(post, []))
    return {"seeds_pre": seeds[TABLE], "seeds_post": seeds.get(post, []), "spec": spec, "profile": profile,
            "default_seed": default_seed, "models": keys, "cells": cells, "rft": rft_states, "prune": prune,
            "evals": evals, "baseline": baseline, "metric": metric, "control": control}


def control_values(g: dict, model: str) -> list:
    """The dense+RFT control's post-RFT metric per post-RFT seed ([] when the post-RFT table has no control)."""
    if not g["control"]:
        return []
    return [g["evals"].get((model, CONTROL, 0.0, s, True)) for s in g["seeds_post"]]


def _ci(values) -> str:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return "--"
    return mean_ci(values).format(4) if len(values) > 1 else f"{values[0]:.4g} (n=1)"


def rows(g: dict) -> list[dict]:
    out = []
    groups = {}
    for c in g["cells"]:
        groups.setdefault((c.model, c.method, c.ratio), []).append(dict(c.vary).get("seed", None))
    default_seed = g["default_seed"]
    for (model, method, ratio), seeds in groups.items():
        seeds = [default_seed if s is None else s for s in seeds]
        pr = [g["prune"][(model, method, ratio, s)] for s in seeds if (model, method, ratio, s) in g["prune"]]

        def kept(name):
            vals = [m[f"{name}_after"] / m[f"{name}_before"] for m in pr if m.get(f"{name}_before")]
            return sum(vals) / len(vals) if vals else None

        speed = [m["decode_speedup"] for m in pr if m.get("decode_speedup") is not None]
        ms = [m["decode_ms_per_token"] for m in pr if m.get("decode_ms_per_token") is not None]
        out.append({
            "model": model, "method": method, "ratio": ratio, "n_seeds": len(pr),
            "state_kept": kept("state_bytes"), "params_kept": kept("parameters"), "flops_kept": kept("flops_per_token"),
            "state_bytes": [m.get("state_bytes_after") for m in pr], "decode_ms": ms,
            "decode_speedup": sum(speed) / len(speed) if speed else None,
            "pre": [g["evals"].get((model, method, ratio, s, False)) for s in seeds],
            "post": [g["evals"].get((model, method, ratio, s, True)) for s in g["seeds_post"]],
        })
    return out


def _pct(x) -> str:
    return "--" if x is None else f"{100 * x:.1f}%"


def markdown(g: dict, rs: list[dict], profile: str) -> str:
    label = METRIC[profile][1]
    lines = [f"# State vs structure ({profile} profile)", "",
             f"{label} (lower is better), mean [95% t-interval] over calibration seeds; kept = pruned / dense "
             "(state: recurrent-state bytes per sequence; FLOPs: matmul FLOPs per token); decode speedup: batch-1 "
             "cached decode, dense / pruned, paired over interleaved repetitions on this machine.", ""]
    table = []
    for model in g["models"]:
        base = g["baseline"].get(model)
        table.append([model, "dense", "0", "100%", "100%", "100%", "1.00", _ci([base]), None])
        if g["control"]:  # LoRA merged into the dense weights: the same shapes, state and cost as dense
            table.append([model, "dense+RFT", "0", "100%", "100%", "100%", "1.00", None,
                          _ci(control_values(g, model))])
        for r in (r for r in rs if r["model"] == model):
            sp = "--" if r["decode_speedup"] is None else f"{r['decode_speedup']:.2f}"
            table.append([model, r["method"], f"{r['ratio']:g}", _pct(r["state_kept"]), _pct(r["params_kept"]),
                          _pct(r["flops_kept"]), sp, _ci(r["pre"]), _ci(r["post"])])
    lines.append(writers.markdown(["model", "method", "ratio", "state kept", "params kept", "FLOPs kept",
                                   "decode speedup", "pre-RFT", "post-RFT"], table, rule=" --- ").rstrip("\n"))
    lines += ["", "Samples per cell (calibration seeds with a result): "
              + ", ".join(f"{r['model']}-{r['method']}: pre {_n(r['pre'])}, post {_n(r['post'])}" for r in rs)
              + "".join(f", {m}-dense+RFT: post {_n(control_values(g, m))}" for m in g["models"] if g["control"])
              + f"; the table asks for {len(g['seeds_pre'])} pre-RFT and {len(g['seeds_post'])} post-RFT seeds."]
    if g["control"]:
        lines += ["", "dense+RFT: the dense model fine-tuned with the same RFT recipe, budget and seeds as the pruned "
                  "cells (the control); post-RFT cells are read against it, not against the dense model."]
    return "\n".join(lines) + "\n"


def _n(values) -> int:
    return sum(v is not None and math.isfinite(v) for v in values)


def vs_paper(g: dict, rs: list[dict], profile: str) -> str:
    label = METRIC[profile][1]
    lines = ["# State vs structure: ours beside the papers", "",
             "The paper we reproduce (state reduction) never compares with structure removal, and Mamba-Shedder "
             "never compares with state reduction, so neither has a number for the other's method; each side below "
             "is its own headline. Ours: the tiny stand-ins, " + label + ".", "",
             "## The paper (state reduction, key channels), WikiText-2 perplexity pre-RFT", ""]
    paper = []
    spec_models = profile_spec(g["spec"], "tiny")["models"]
    for key, m in spec_models.items():
        for paper_model in m["stands_for"]:
            table = PAPER_ROWS.get(paper_model)
            if table is None:
                continue
            ref = json.loads((REFERENCE / f"{table}.json").read_text())["rows"]
            name = PAPER_NAMES.get(paper_model, paper_model)
            dense = next((r["wiki_ppl"] for r in ref if r["model"] == name and r["method"] == "baseline"), None)
            for r in ref:
                if r["model"] == name and r["method"] in ("drrqr", "grad") and not r["rft"]:
                    paper.append([f"{paper_model} ({table})", r["method"], f"{r['ratio']:g}", str(r["wiki_ppl"]),
                                  str(dense if dense is not None else "--")])
    lines.append(writers.markdown(["model", "method", "ratio", "paper ppl", "paper dense"], paper,
                                  rule=" --- ").rstrip("\n"))
    shed = json.loads((REFERENCE / "mamba_shedder.json").read_text())
    lines += ["", "## Mamba-Shedder (structure removal), its README's headline", "",
              writers.markdown(["model", "removed", "RFT", "relative accuracy", "speedup"],
                               [[r["model"], str(r["removed"]), "yes" if r["rft"] else "no",
                                 f"{r['relative_accuracy']}%", f"~{r['speedup']}x"] for r in shed["rows"]],
                               rule=" --- ").rstrip("\n")]
    lines += ["", f"## Ours ({profile} profile): perplexity relative to dense (dense / pruned, higher is better)", ""]
    ours = []
    for model in g["models"] if g["control"] else []:
        base = g["baseline"].get(model)
        vals = [base / v for v in control_values(g, model) if v and base and math.isfinite(v)]
        ours.append([model, "dense+RFT", "0", "100%", "--",
                     f"{100 * sum(vals) / len(vals):.1f}%" if vals else "--", "1.00x"])
    for r in rs:
        base = g["baseline"].get(r["model"])

        def rel(vals):
            vals = [base / v for v in vals if v and base and math.isfinite(v)]
            return f"{100 * sum(vals) / len(vals):.1f}%" if vals else "--"

        sp = "--" if r["decode_speedup"] is None else f"{r['decode_speedup']:.2f}x"
        ours.append([r["model"], r["method"], f"{r['ratio']:g}", _pct(r["state_kept"]), rel(r["pre"]), rel(r["post"]),
                     sp])
    lines.append(writers.markdown(["model", "method", "ratio", "state kept", "pre-RFT", "post-RFT", "decode speedup"],
                                  ours, rule=" --- ").rstrip("\n"))
    lines += ["", "Mamba-Shedder reports relative zero-shot accuracy; the tiny models score near chance on zero-shot "
              "tasks, so ours is relative perplexity, which is not the same scale."]
    return "\n".join(lines) + "\n"


def figures(g: dict, rs: list[dict], profile: str, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for axis, xlabel, xs in (("state", "state bytes per sequence / dense", "state_kept"),
                             ("decode", "decode time per token / dense (paired, batch 1)",
                              "decode_rel")):
        fig, axes = plt.subplots(1, len(g["models"]), figsize=(4 * len(g["models"]), 3.4), squeeze=False)
        for ax, model in zip(axes[0], g["models"]):
            for method, marker in MARKERS.items():
                for rft, fill in ((False, "none"), (True, None)):
                    pts = []
                    for r in (r for r in rs if r["model"] == model and r["method"] == method):
                        ys = [v for v in (r["post"] if rft else r["pre"]) if v is not None and math.isfinite(v)]
                        # absolute ms differ between runs on a shared machine; the paired ratio does not
                        x = r[xs] if xs == "state_kept" else (1 / r["decode_speedup"] if r["decode_speedup"] else None)
                        if ys and x is not None:
                            pts.append((x, sum(ys) / len(ys)))
                    if pts:
                        pts.sort()
                        ax.plot(*zip(*pts), marker=marker, color=COLORS[method], linestyle="none",
                                fillstyle="none" if fill == "none" else "full",
                                label=f"{method} ({'post' if rft else 'pre'}-RFT)")
            base = g["baseline"].get(model)
            if base is not None:
                ax.plot([1.0], [base], marker="*", color="k", markersize=10, linestyle="none", label="dense")
            ctrl = [v for v in control_values(g, model) if v is not None and math.isfinite(v)]
            if ctrl:
                ax.plot([1.0], [sum(ctrl) / len(ctrl)], marker="P", color="0.4", markersize=8, linestyle="none",
                        label="dense+RFT (control)")
            ax.set_yscale("log")
            ax.set_title(model)
            ax.set_xlabel(xlabel)
        axes[0][0].set_ylabel(METRIC[profile][1] + " (hollow: pre-RFT, filled: post-RFT)")
        axes[0][-1].legend(fontsize=6, loc="best")
        fig.tight_layout()
        paths += save_figure(fig, out_dir / f"state_vs_structure_{axis}", dpi=130)
    return paths


def render(profile: str = "tiny", results_root=None, out_root: Path | None = None,
           figures_root: Path | None = None) -> list[Path]:
    """paper_tables/out/<profile>/state_vs_structure{,_vs_paper}.md and the two Pareto figures."""
    g = gather(profile, results_root)
    rs = rows(g)
    out, fig_dir = writers.output_dirs(profile, out_root, figures_root)
    (out / "state_vs_structure.md").write_text(markdown(g, rs, profile))
    (out / "state_vs_structure_vs_paper.md").write_text(vs_paper(g, rs, profile))
    return [out / "state_vs_structure.md", out / "state_vs_structure_vs_paper.md", *figures(g, rs, profile, fig_dir)]
