"""Render Table 17 (full-model decode, prompt 512: ms/token of the baseline and speedup of 50%/75% state reduction
per batch size) from bench decode results, with the paper's H100 numbers beside ours.

Reads results/<profile>/speed/decode_*.json and reference_data/table17.json; writes
paper_tables/out/table17_<profile>.tex and .md."""

from __future__ import annotations

from paper_tables import writers
from paper_tables.speed.common import (
    fmt,
    label_of,
    load_results,
    merge_by_model,
    reference,
    tex_escape,
    write,
)


def measured(r: dict) -> dict[int, dict[str, float]]:
    """batch -> {'base_ms', 'r50', 'r75', ...}."""
    out: dict[int, dict] = {}
    for row in r["extra"]["rows"]:
        cell = out.setdefault(row["batch"], {})
        if row["label"] == "base":
            cell["base_ms"] = row["ms_per_token"]
        else:
            cell[row["label"]] = row["speedup"]
    return out


def render(profile: str, results_root=None, out_dir=None):
    results = merge_by_model(load_results(profile, "decode", "table17", results_root))
    paper = {row["batch"]: row for row in reference(17)["rows"]}
    ours = [(r, measured(r)) for r in results]
    batches = sorted(set(paper) | {b for _, m in ours for b in m})
    head_md = ["B", "paper GDN Base (ms)", "50%", "75%", "paper DN Base (ms)", "50%", "75%"]
    for r, _ in ours:
        head_md += [f"{label_of(r)} Base (ms)", "50%", "75%"]
    rows = []
    for b in batches:
        p = paper.get(b, {})
        cells = [str(b), fmt(p.get("gdn_base_ms")), fmt(p.get("gdn_speedup_50"), suffix="x"),
                 fmt(p.get("gdn_speedup_75"), suffix="x"), fmt(p.get("dn_base_ms")),
                 fmt(p.get("dn_speedup_50"), suffix="x"), fmt(p.get("dn_speedup_75"), suffix="x")]
        for _, m in ours:
            c = m.get(b, {})
            cells += [fmt(c.get("base_ms")), fmt(c.get("r50"), suffix="x"), fmt(c.get("r75"), suffix="x")]
        rows.append(cells)
    hardware = "; ".join(sorted({f"{label_of(r)}: {r['extra']['hardware']} ({r['extra']['backend']}, "
                                 f"prompt {r['config']['prompt_len']}, {r['config']['protocol']['warmup']}+"
                                 f"{r['config']['protocol']['steps']} steps, median of {r['config']['protocol']['repeats']}"
                                 f"{', CUDA graphs' if r['config']['cuda_graphs'] else ''})" for r in results}))
    caption = (f"Full-model decode, ms/token of the baseline and speedup at 50\\%/75\\% state reduction. "
               f"Paper: 1.3B models on an H100-SXM (CUDA graphs). Ours ({profile} profile): {tex_escape(hardware)}.")
    ncol = len(head_md)
    groups = ([r"\multicolumn{3}{c}{Paper GDN (H100)}", r"\multicolumn{3}{c}{Paper DN (H100)}"]
              + [rf"\multicolumn{{3}}{{c}}{{{tex_escape(label_of(r))}}}" for r, _ in ours])
    sub = ["Base", r"50\%", r"75\%"] * (ncol // 3)
    tex = writers.latex(None, [["", *groups], ["$B$", *sub]], rows, "r" + "rrr" * (ncol // 3),
                        text=lambda c: c.replace("x", r"$\times$"), caption=caption, small=True)
    md_text = "\n".join([f"Table 17 ({profile}): full-model decode. {hardware}. Paper: H100-SXM.", "",
                         writers.markdown(head_md, rows, rule=" --- ")])
    return write(f"table17_{profile}", tex, md_text, out_dir)
