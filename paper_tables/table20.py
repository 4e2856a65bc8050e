"""Render Table 20 (50% state reduction, pre/post RFT, all families) from result JSON.

Reads results/<profile>/table20/*.json only; writes paper_tables/out/table20_<profile>.tex and .md and
figures/table20_<profile>.png. Cells without a result are shown as "--"."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAMILY_NAMES = {"deltanet": "DeltaNet", "gated_deltanet": "Gated DeltaNet", "mamba2": "Mamba-2", "qwen3_5": "Qwen3.5 hybrid"}
METHODS = ["l1", "rand", "drrqr", "grad", "wanda", "baseline"]
METHOD_NAMES = {"l1": "L1", "rand": "Rand", "drrqr": "DRRQR", "grad": "Grad", "wanda": "S-Wanda", "baseline": "Baseline"}
COLUMNS = [("wiki_ppl", "Wiki $\\downarrow$"), ("lambada_ppl", "LMB $\\downarrow$"), ("zero_shot_avg", "LM Evals Avg $\\uparrow$")]


def load_results(profile: str) -> list[dict]:
    folder = ROOT / "results" / profile / "table20"
    if not folder.is_dir():
        raise FileNotFoundError(f"no results in {folder}; run `make table20 PROFILE={profile}`")
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def cell_values(results: list[dict]) -> dict[tuple[str, str, bool], dict]:
    cells = {}
    for r in results:
        c = r["config"]
        cells[(c["family"], c["method"], c["rft"])] = r["metrics"]
        if c["method"] == "baseline":  # the dense model is its own post-RFT row, as in the paper
            cells[(c["family"], c["method"], True)] = r["metrics"]
    return cells


def _fmt(v) -> str:
    return "--" if v is None else f"{v:.1f}"


def render_rows(cells) -> list[list[str]]:
    families = [f for f in FAMILY_NAMES if any(k[0] == f for k in cells)]
    rows = []
    for fam in families:
        for i, m in enumerate(METHODS):
            pre, post = cells.get((fam, m, False), {}), cells.get((fam, m, True), {})
            rows.append([FAMILY_NAMES[fam] if i == 0 else "", METHOD_NAMES[m]]
                        + [_fmt(pre.get(k)) for k, _ in COLUMNS] + [_fmt(post.get(k)) for k, _ in COLUMNS])
    return rows


def to_latex(rows, profile: str) -> str:
    head = " & ".join(["Model", "Method"] + [h for _, h in COLUMNS] * 2)
    body = "\n".join(" & ".join(r) + r" \\" for r in rows)
    return (f"% Table 20 ({profile} profile), rendered by paper_tables/table20.py from results/{profile}/table20\n"
            "\\begin{tabular}{llrrrrrr}\n\\toprule\n"
            " & & \\multicolumn{3}{c}{Pre-RFT} & \\multicolumn{3}{c}{Post-RFT} \\\\\n"
            f"{head} \\\\\n\\midrule\n{body}\n\\bottomrule\n\\end{{tabular}}\n")


def to_markdown(rows) -> str:
    head = ["Model", "Method"] + [f"pre {k}" for k, _ in COLUMNS] + [f"post {k}" for k, _ in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def plot(cells, path: Path, profile: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = [f for f in FAMILY_NAMES if any(k[0] == f for k in cells)]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / len(METHODS)
    colors = plt.get_cmap("tab10")
    for j, m in enumerate(METHODS):
        ys = [cells.get((f, m, False), {}).get("wiki_ppl") for f in families]
        xs = [i + j * width for i, y in enumerate(ys) if y is not None]
        if xs:
            ax.bar(xs, [y for y in ys if y is not None], width, label=METHOD_NAMES[m], color=colors(j))
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(families))], [FAMILY_NAMES[f] for f in families])
    ax.set_yscale("log")
    ax.set_ylabel("Wiki perplexity (pre-RFT)")
    ax.set_title(f"Table 20, {profile} profile: 50% state reduction")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--profile", default="tiny", choices=["tiny", "paper"])
    args = p.parse_args(argv)
    cells = cell_values(load_results(args.profile))
    rows = render_rows(cells)
    out = ROOT / "paper_tables" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"table20_{args.profile}.tex").write_text(to_latex(rows, args.profile))
    md = to_markdown(rows)
    (out / f"table20_{args.profile}.md").write_text(md)
    plot(cells, ROOT / "figures" / f"table20_{args.profile}.png", args.profile)
    print(md)
    missing = sorted({f"{METHOD_NAMES[m]} {'post' if rft else 'pre'}-RFT" for f in FAMILY_NAMES for m in METHODS
                      for rft in (False, True) if (f, m, rft) not in cells})
    if missing:
        print(f"not measured yet: {', '.join(missing)}")
    if any(("lambada_ppl" not in v or "zero_shot_avg" not in v) for v in cells.values()):
        print("LMB and LM Evals Avg columns need the lm-eval tiny suite (not built yet)")
    print(f"wrote {out}/table20_{args.profile}.tex, .md and figures/table20_{args.profile}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
