"""Render Table 18 (full-model prefill speedup over a B x T grid) from bench prefill results, with the paper's H100
grid beside ours; cells the benchmark skipped are listed with the reason.

Reads results/<profile>/speed/prefill_*.json and reference_data/table18.json; writes
paper_tables/out/table18_<profile>.tex and .md."""

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


def tokens(t: int) -> str:
    return f"{t // 1024}K" if t % 1024 == 0 else str(t)


def render(profile: str, results_root=None, out_dir=None):
    results = merge_by_model(load_results(profile, "prefill", "table18", results_root))
    paper = {(r["batch"], r["seq_len"]): r for r in reference(18)["rows"]}
    ours = []
    for r in results:
        cells = {}
        for row in r["extra"]["rows"]:
            if row["label"] != "base":
                cells.setdefault((row["batch"], row["seq_len"]), {})[row["label"]] = row["speedup"]
            else:
                cells.setdefault((row["batch"], row["seq_len"]), {})["base_ms"] = row["ms"]
        ours.append((r, cells))
    keys = sorted(set(paper) | {k for _, c in ours for k in c}, key=lambda k: (k[1], k[0]))
    head = ["B x T", "paper GDN 50%", "paper GDN 75%", "paper DN 50%", "paper DN 75%"]
    for r, _ in ours:
        head += [f"{label_of(r)} base ms", "50%", "75%"]
    rows, tex_rows = [], []
    for b, t in keys:
        p = paper.get((b, t), {})
        cells = [f"{b} x {tokens(t)}"] + [fmt(p.get(k), suffix="x") for k in
                                          ("gdn_speedup_50", "gdn_speedup_75", "dn_speedup_50", "dn_speedup_75")]
        for _, c in ours:
            v = c.get((b, t), {})
            cells += [fmt(v.get("base_ms"), ".1f"), fmt(v.get("r50"), suffix="x"), fmt(v.get("r75"), suffix="x")]
        rows.append(cells)
        tex_rows.append([f"${b}\\times {tokens(t)}$"] + cells[1:])
    skipped = [f"{label_of(r)}: {s['batch']} x {tokens(s['seq_len'])} skipped: {s['reason']}"
               for r in results for s in r["extra"]["skipped"]]
    hardware = "; ".join(sorted({f"{label_of(r)}: {r['extra']['hardware']} ({r['extra']['backend']})" for r in results}))
    caption = (f"Full-model prefill speedup at 50\\%/75\\% state reduction over batch $B$ and length $T$. Paper: 1.3B "
               f"models on an H100-SXM; absent cells exceeded device memory. Ours ({profile} profile): "
               f"{tex_escape(hardware)}; -- = not measured.")
    n_ours = 3 * len(ours)
    tex_head = ([r"$B\times T$", r"GDN 50\%", r"GDN 75\%", r"DN 50\%", r"DN 75\%"]
                + [x for r, _ in ours for x in (tex_escape(label_of(r)) + " ms", r"50\%", r"75\%")])
    # the B x T cell is already math; elsewhere a speedup's "x" is a LaTeX times
    tex = writers.latex(None, tex_head, tex_rows, "l" + "rrrr" + "r" * n_ours,
                        text=lambda c: c if c.startswith("$") else c.replace("x", r"$\times$"), caption=caption,
                        small=True, footnote=tex_escape("; ".join(skipped)) if skipped else None)
    md_text = "\n".join([f"Table 18 ({profile}): full-model prefill speedup. {hardware}. Paper: H100-SXM.", "",
                         writers.markdown(head, rows, rule=" --- "), *[f"- {s}" for s in skipped], ""])
    return write(f"table18_{profile}", tex, md_text, out_dir)
