"""Render Figure 4: (a) full-model decode speedup against batch size, (b) full-model prefill speedup against batch
size at each measured length, 50% and 75% state reduction; our measurements (solid) beside the paper's H100 Gated
DeltaNet 1.3B numbers from Tables 17/18 (dashed; the paper gives the figure's values only through those tables).

Reads results/<profile>/speed/decode_*.json and prefill_*.json and reference_data/table17.json, table18.json;
writes figures/figure4_<profile>.png and .pdf."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from paper_tables.figures import save_figure
from paper_tables.speed.common import FIGURES, label_of, load_results, merge_by_model, reference

COLOURS = {"r50": "tab:blue", "r75": "tab:red"}
NAMES = {"r50": "50%", "r75": "75%"}


def render(profile: str, results_root=None, out_dir=None):
    decode = merge_by_model(load_results(profile, "decode", "figure4", results_root))
    prefill = merge_by_model(load_results(profile, "prefill", "figure4", results_root))
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))

    p17 = reference(17)["rows"]
    for label, key in (("r50", "gdn_speedup_50"), ("r75", "gdn_speedup_75")):
        a.plot([r["batch"] for r in p17], [r[key] for r in p17], "--", color=COLOURS[label], alpha=0.6,
               label=f"paper GDN 1.3B, H100, {NAMES[label]}")
    markers = "os^vD"
    for i, r in enumerate(decode):
        for label in ("r50", "r75"):
            rows = sorted((x["batch"], x["speedup"]) for x in r["extra"]["rows"] if x["label"] == label)
            if rows:
                a.plot(*zip(*rows), "-", marker=markers[i % 5], color=COLOURS[label],
                       label=f"{label_of(r)}, {NAMES[label]}")
    a.set_xscale("log", base=2)
    a.set_xlabel("batch size")
    a.set_ylabel("decode speedup (x)")
    a.set_title("(a) decode, prompt 512")

    p18 = reference(18)["rows"]
    for t, style in ((2048, "--"), (8192, ":")):
        for label, key in (("r50", "gdn_speedup_50"), ("r75", "gdn_speedup_75")):
            pts = sorted((r["batch"], r[key]) for r in p18 if r["seq_len"] == t)
            b.plot(*zip(*pts), style, color=COLOURS[label], alpha=0.6, label=f"paper GDN, {t // 1024}K, {NAMES[label]}")
    for i, r in enumerate(prefill):
        lengths = sorted({x["seq_len"] for x in r["extra"]["rows"]})
        for t in lengths:
            for label in ("r50", "r75"):
                rows = sorted((x["batch"], x["speedup"]) for x in r["extra"]["rows"]
                              if x["label"] == label and x["seq_len"] == t)
                if rows:
                    b.plot(*zip(*rows), "-", marker=markers[(i + lengths.index(t)) % 5], color=COLOURS[label],
                           label=f"{label_of(r)}, T {t}, {NAMES[label]}")
    b.set_xscale("log", base=2)
    b.set_xlabel("batch size")
    b.set_ylabel("prefill speedup (x)")
    b.set_title("(b) prefill")
    for ax in (a, b):
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.legend(fontsize=6)
    hardware = "; ".join(sorted({r["extra"]["hardware"] for r in decode + prefill}))
    fig.suptitle(f"Figure 4 ({profile} profile). Ours: {hardware}. Paper: H100-SXM", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, Path(out_dir or FIGURES) / f"figure4_{profile}", dpi=150)
