"""Render the recall figure of experiments/mqar_recall from its result JSON: MQAR accuracy against the number of
key-value pairs, dense / 50% / 75% key reduction, one panel per (family, selector).

`state-reduction render figure_mqar [--profile tiny]` writes figures/<profile>/figure_mqar.png/.pdf and
paper_tables/out/<profile>/figure_mqar.md (the numbers behind the figure, and per family and selector the largest
loss at 75% against the dense model, with whether it reaches 10 points).

Error bars: with one pretraining seed per family, one binomial standard error over the cell's queries; with more,
a 95% t-interval over seeds (the header says which).
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from paper_tables import writers
from paper_tables.figures import save_figure
from state_reduction.evaluation.mqar import CELL_PAIRS, cell_name
from state_reduction.pipeline import collect, load_experiment, profile_spec

ROOT = Path(__file__).resolve().parents[1]

EXPERIMENT = "mqar_recall"
METHOD_NAMES = {"rand": "Rand", "l1": "L1", "wanda": "S-Wanda", "grad": "Grad", "drrqr": "DRRQR"}
DISCRIMINATES = 0.10  # the bar: a selector that loses >= 10 points at 75% on some cell


def _t95(n: int) -> float:
    from scipy.stats import t

    return float(t.ppf(0.975, n - 1))


def gather(profile: str, results_root=None):
    """{(family, method, ratio): {cell: [accuracy per seed]}} and the per-seed standard errors, from eval results."""
    spec = load_experiment(EXPERIMENT)
    family_of = {k: m["stands_for"][0] for k, m in profile_spec(spec, profile)["models"].items()}
    acc, se = defaultdict(lambda: defaultdict(list)), defaultdict(lambda: defaultdict(list))
    for r in collect(EXPERIMENT, profile, results_root):
        if r["kind"] != "evaluate" or r["config"].get("suite") != "tiny_mqar":
            continue
        c = r["config"]
        key = (family_of[c["model"]], c["method"], 0.0 if c["method"] == "baseline" else float(c["ratio"]))
        for name in (cell_name(p, n) for n, ps in CELL_PAIRS.items() for p in ps):
            if f"{name}_acc" in r["metrics"]:
                acc[key][name].append(r["metrics"][f"{name}_acc"])
                se[key][name].append(r["metrics"][f"{name}_acc_se"])
    return spec, acc, se


def summary(values: list[float], ses: list[float]) -> tuple[float, float, str]:
    """(mean, half-width, what the half-width is)."""
    n = len(values)
    mean = sum(values) / n
    if n == 1:
        return mean, ses[0], "1 SE over queries (one seed)"
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, _t95(n) * sd / math.sqrt(n), f"95% t-CI over {n} seeds"


def render(profile: str, results_root=None, out_root: Path | None = None, figures_root: Path | None = None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec, acc, se = gather(profile, results_root)
    families = list(dict.fromkeys(m["stands_for"][0] for m in profile_spec(spec, profile)["models"].values()))
    families = [f for f in families if (f, "baseline", 0.0) in acc]
    if not families:
        raise SystemExit(f"figure_mqar: no tiny_mqar results in results/{profile}/{EXPERIMENT}; "
                         f"run `state-reduction run-table figure_mqar --experiment {EXPERIMENT}` first")
    methods = spec["methods"]
    ratios = sorted({k[2] for k in acc if k[1] != "baseline"})
    lines = [f"# MQAR recall under key reduction ({profile} profile)", "",
             "Accuracy (%) of greedy value recall per cell (context length L, pairs p); "
             "± as stated per row. No RFT.", ""]
    fig, axes = plt.subplots(len(families), len(methods), figsize=(3.0 * len(methods), 2.6 * len(families)),
                             squeeze=False, sharey=True)
    styles = {0.0: ("black", "dense")} | {r: (c, f"{round(r * 100)}%") for r, c in zip(ratios, ("tab:blue", "tab:red", "tab:green"))}
    verdict_rows = []
    for i, fam in enumerate(families):
        cells = [cell_name(p, n) for n, ps in CELL_PAIRS.items() for p in ps if cell_name(p, n) in acc[(fam, "baseline", 0.0)]]
        header = ["method", "ratio"] + [c.replace("mqar_", "L").replace("_p", " p") for c in cells] + ["±"]
        dense = {c: summary(acc[(fam, "baseline", 0.0)][c], se[(fam, "baseline", 0.0)][c]) for c in cells}
        rows = [["dense", "0"] + [f"{100 * dense[c][0]:.1f}" for c in cells] + [next(iter(dense.values()))[2]]]
        for j, method in enumerate(methods):
            ax = axes[i][j]
            for ratio in [0.0] + ratios:
                key = (fam, "baseline" if ratio == 0.0 else method, ratio)
                if key not in acc:
                    continue
                color, label = styles[ratio]
                for n, ls in zip(CELL_PAIRS, ("-", "--")):
                    pts = [(p, summary(acc[key][cell_name(p, n)], se[key][cell_name(p, n)]))
                           for p in CELL_PAIRS[n] if cell_name(p, n) in acc[key]]
                    if pts:
                        ax.errorbar([p for p, _ in pts], [100 * s[0] for _, s in pts], yerr=[100 * s[1] for _, s in pts],
                                    color=color, ls=ls, marker="o", ms=3, capsize=2,
                                    label=f"{label}, L={n}" if (i, j) == (0, 0) else None)
                if ratio == 0.0:
                    continue
                row = {c: summary(acc[key][c], se[key][c]) for c in cells if c in acc[key]}
                rows.append([METHOD_NAMES.get(method, method), f"{round(ratio * 100)}%"]
                            + [f"{100 * row[c][0]:.1f}" if c in row else "–" for c in cells]
                            + [next(iter(row.values()))[2]])
                if ratio == max(ratios):
                    drop, where = max((dense[c][0] - row[c][0], c) for c in row)
                    verdict_rows.append((fam, method, ratio, drop, where, dense[where], row[where]))
            ax.set_title(f"{fam}: {METHOD_NAMES.get(method, method)}", fontsize=9)
            ax.set_ylim(0, 105)
            ax.grid(alpha=0.3)
            if i == len(families) - 1:
                ax.set_xlabel("key-value pairs")
            if j == 0:
                ax.set_ylabel("MQAR accuracy (%)")
        lines += [f"## {fam}", "", writers.markdown(header, rows)]
    fig.legend(loc="upper center", ncol=2 * (len(ratios) + 1), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    paths = save_figure(fig, (figures_root or ROOT / "figures") / profile / "figure_mqar", dpi=130)
    if verdict_rows:
        top = max(ratios)
        lines += [f"## Does the testbed discriminate? Largest loss at {round(top * 100)}% against dense", "",
                  writers.markdown(["family", "selector", "largest loss (points)", "cell", "dense", "pruned",
                                    ">= 10 points"],
                                   [[fam, METHOD_NAMES.get(method, method), f"{100 * drop:.1f}", where,
                                     f"{100 * d[0]:.1f} ± {100 * d[1]:.1f}", f"{100 * r[0]:.1f} ± {100 * r[1]:.1f}",
                                     "yes" if drop >= DISCRIMINATES else "no"]
                                    for fam, method, ratio, drop, where, d, r in verdict_rows]).rstrip("\n")]
        hits = [v for v in verdict_rows if v[3] >= DISCRIMINATES]
        lines += ["", f"{len(hits)} of {len(verdict_rows)} (family, selector) pairs lose >= 10 points at "
                  f"{round(top * 100)}% on at least one cell."]
    out_md = (out_root or ROOT / "paper_tables" / "out") / profile / "figure_mqar.md"
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text("\n".join(lines) + "\n")
    return paths + [out_md]
