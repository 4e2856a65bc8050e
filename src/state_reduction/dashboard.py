"""A static HTML dashboard of every result file of a profile: works offline, one self-contained file.

    python -m state_reduction.dashboard --profile tiny      (or `make dashboard`)

writes results/<profile>/dashboard.html: per experiment, a table of its runs (kind, stage, model, method,
ratio, RFT, the main metrics, wall time, git commit) and, where evaluation results exist, Wiki perplexity
against compression per method (PNG embedded as base64). Reads only result JSON.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import math
from collections import defaultdict
from pathlib import Path

from state_reduction.atomic import write_text_atomic
from state_reduction.provenance import REPO_ROOT
from state_reduction.results import ResultsError, read_result, results_dir

MAIN_METRICS = ("wiki_word_perplexity", "lambada_ppl", "zero_shot_avg", "key_dim_after", "final_loss",
                "tokens_per_s")


def collect_profile(profile: str, root=None) -> tuple[dict[str, list[dict]], list[str]]:
    """experiment -> its results; and the files that are not results of this schema (listed, not fatal)."""
    base = results_dir(profile, "x", root).parent
    by_experiment, skipped = defaultdict(list), []
    for path in sorted(base.glob("*/*.json")) if base.is_dir() else []:
        try:
            by_experiment[path.parent.name].append(read_result(path))
        except ResultsError as e:
            skipped.append(str(e))
    return dict(by_experiment), skipped


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "--"
    if isinstance(v, float):
        return f"{v:.4g}"
    return html.escape(str(v))


def _plot(results: list[dict]) -> str | None:
    points = defaultdict(list)
    for r in results:
        c, m = r["config"], r["metrics"]
        if r["kind"] == "evaluate" and c.get("method") not in (None, "baseline") and "wiki_word_perplexity" in m \
                and not c.get("vary"):
            points[(c["model"], c["method"], bool(c.get("rft")))].append((c["ratio"] * 100, m["wiki_word_perplexity"]))
    if not points:
        return None
    # lazy: start-up time (matplotlib only when a plot is drawn)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({k[0] for k in points})
    fig, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 3.2), squeeze=False)
    for ax, model in zip(axes[0], models):
        for (mdl, method, rft), pts in sorted(points.items()):
            if mdl == model:
                pts = sorted(pts)
                ax.plot(*zip(*pts), marker="o", ls="-" if rft else "--", label=f"{method} {'post' if rft else 'pre'}")
        ax.set_yscale("log")
        ax.set_title(model, fontsize=9)
        ax.set_xlabel("key channels removed (%)")
        ax.set_ylabel("Wiki word perplexity")
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def render_html(profile: str, by_experiment: dict[str, list[dict]], skipped: list[str]) -> str:
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>state-reduction results ({profile})</title>",
             ("<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
              "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}th{background:#eee}"
              "td:nth-child(-n+6){text-align:left}</style></head><body>"),
             f"<h1>state-reduction results, profile <code>{html.escape(profile)}</code></h1>",
             f"<p>{sum(len(v) for v in by_experiment.values())} result files in {len(by_experiment)} experiments.</p>"]
    for experiment, results in sorted(by_experiment.items()):
        parts.append(f"<h2 id='{html.escape(experiment)}'>{html.escape(experiment)} ({len(results)} runs)</h2>")
        image = _plot(results)
        if image:
            parts.append(f"<img alt='Wiki perplexity vs compression' src='data:image/png;base64,{image}'>")
        head = ["kind", "stage", "model", "method", "ratio", "RFT", *MAIN_METRICS, "wall s", "commit"]
        parts.append("<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>")
        for r in sorted(results, key=lambda r: (r["kind"], str(r["config"].get("model")), str(r["config"].get("method")),
                                                 str(r["config"].get("ratio")))):
            c = r["config"]
            row = [r["kind"], c.get("stage", c.get("mode")), c.get("model"), c.get("method"), c.get("ratio"),
                   c.get("rft"), *(r["metrics"].get(k) for k in MAIN_METRICS), r["wall_time_s"],
                   (r["provenance"].get("git_commit") or "")[:8]]
            parts.append("<tr>" + "".join(f"<td>{_fmt(v)}</td>" for v in row) + "</tr>")
        parts.append("</table>")
    if skipped:
        parts.append("<h2>Files skipped</h2><ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in skipped) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)


def build_dashboard(profile: str = "tiny", root=None, out: Path | None = None) -> Path:
    by_experiment, skipped = collect_profile(profile, root)
    out = Path(out) if out else results_dir(profile, "x", root).parent / "dashboard.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, render_html(profile, by_experiment, skipped))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", choices=["tiny", "paper"], default="tiny")
    p.add_argument("--results-root", default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    path = build_dashboard(args.profile, args.results_root, args.out)
    shown = path.relative_to(REPO_ROOT) if path.resolve().is_relative_to(REPO_ROOT) else path
    print(f"wrote {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
