"""Render Table 19 (one Gated DeltaNet sequence mixer alone, prefill: speedup and peak-memory ratio against the
unreduced layer) from bench mixer results, with the paper's H100 numbers beside ours; kernel-friendly budgets
(d_k 96/80/77 with the power of two fla would pad them to) are extra rows. When a bench recurrence result exists, a
second table gives one decode step at recurrence, layer and model level with the Amdahl bound.

Reads results/<profile>/speed/mixer_*.json (and recurrence_*.json) and reference_data/table19.json; writes
paper_tables/out/table19_<profile>.tex and .md."""

from __future__ import annotations

from pathlib import Path

from paper_tables import writers
from paper_tables.speed.common import ROOT, fmt, load_results, reference, tex_escape, write


def mixer_rows(results: list[dict]) -> tuple[list[list[str]], list[str]]:
    paper = {(r["batch"], r["ratio"]): r for r in reference(19)["rows"]}
    rows, notes = [], []
    for r in results:
        c = r["config"]
        notes.append(f"{r['extra']['hardware']} ({r['extra']['backend']}, {c['dtype']}): T {c['seq_len']}, "
                     f"{c['num_heads']} heads, hidden {c['hidden_size']}, d_v {c['d_v']}")
        for row in r["extra"]["rows"]:
            if row["label"] == "base":
                continue
            p = paper.get((row["batch"], row["ratio"]), {}) if row["label"].startswith("r") else {}
            rows.append([str(row["batch"]), f"{row['ratio'] * 100:.0f}%", str(row["d_k"]), str(row["d_k_padded"]),
                         fmt(p.get("speedup"), suffix="x"), fmt(p.get("vram_ratio"), suffix="x"),
                         fmt(row["speedup"], suffix="x"), fmt(row["peak_ratio"], suffix="x"), fmt(row["ms"], ".1f")])
    ours_batches = {int(x[0]) for x in rows}
    for (b, ratio), p in sorted(paper.items()):  # paper rows at batch sizes we did not run
        if b not in ours_batches:
            rows.append([str(b), f"{ratio * 100:.0f}%", str(round(128 * (1 - ratio))), "--",
                         fmt(p["speedup"], suffix="x"), fmt(p["vram_ratio"], suffix="x"), "--", "--", "--"])
    return rows, notes


def recurrence_rows(results: list[dict]) -> tuple[list[list[str]], list[str]]:
    rows, notes = [], []
    for r in results:
        c = r["config"]
        notes.append(f"{r['extra']['hardware']} ({r['extra']['backend']}): batch {c['batch']}, {c['num_heads']} heads, "
                     f"d_v {c['d_v']}; model = {c['model']} with {c['layers']} layers; allocator {c.get('malloc', 'default')}")
        for row in r["extra"]["rows"]:
            level = row["level"] + (" (heap malloc)" if c.get("malloc", "default") != "default" else "")
            rows.append([level, str(row["d_k"]), fmt(row["ms"], ".3f"), fmt(row["speedup"], suffix="x"),
                         fmt(row["state_bound"], ".1f", "x"), fmt(row["recurrence_share"], ".3f"),
                         fmt(row["amdahl_bound"], suffix="x")])
    return rows, notes


def _tex(cell: str) -> str:
    """Numbers' "x" (speedups) as a LaTeX times."""
    return tex_escape(cell).replace("x", r"$\times$") if cell[:1].isdigit() else tex_escape(cell)


def table(caption: str, head: list[str], rows: list[list[str]]) -> tuple[str, str]:
    tex = writers.latex(None, head, rows, "r" * len(head), text=_tex, header_text=tex_escape, caption=caption,
                        small=True)
    return tex, writers.markdown(head, rows, rule=" --- ")


def render(profile: str, results_root=None, out_dir=None):
    mixer, notes = mixer_rows(load_results(profile, "mixer", "table19", results_root))
    head = ["B", "reduction", "d_k", "d_k padded (fla)", "paper speedup", "paper VRAM ratio", "our speedup",
            "our peak ratio", "our ms"]
    cap = (f"Gated DeltaNet sequence mixer alone, prefill, against the unreduced layer at the same batch. Paper: "
           f"1.3B shape on an NVIDIA H100 (T 2048). Ours ({profile} profile): {'; '.join(notes)}.")
    tex, md = table(tex_escape(cap), head, mixer)
    md = f"Table 19 ({profile}): {cap}\n\n{md}"
    if list((Path(results_root or ROOT / "results") / profile / "speed").glob("recurrence_*.json")):
        rec, rnotes = recurrence_rows(load_results(profile, "recurrence", "table19", results_root))
        rhead = ["level", "d_k", "ms/step", "speedup", "state bound", "recurrence share", "Amdahl bound"]
        rcap = ("One decode step, baseline vs reduced d_k, measured side by side: the gated-delta-rule recurrence "
                "alone (state update and readout), one mixer layer, the whole model; Amdahl bound = "
                "1/((1-s)+s/(d_k/d_k')) from the measured recurrence share s. " + "; ".join(rnotes))
        rtex, rmd = table(tex_escape(rcap), rhead, rec)
        tex += "\n" + rtex
        md += f"\nDecode step ({profile}): {rcap}\n\n{rmd}"
    return write(f"table19_{profile}", tex, md, out_dir)
