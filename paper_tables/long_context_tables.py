"""Render the long-context tables (Table 4: GDN vs the Qwen3.5 hybrid after RFT at 50%; Table 11: Gated DeltaNet
after RFT at 20/30/50%) from result JSON of experiments/long_context.

Reads only result files (through lm_tables.Table) and the experiment's config.yaml; writes, like lm_tables,
paper_tables/out/<profile>/<table>.tex, .md, _vs_paper.md and figures/<profile>/<table>.png/.pdf.

Columns: the paper profile's suite (paper_longctx) measures the paper's columns (RULER and single-needle NIAH
at 2K and 4K, SQuAD, SWDE). The tiny suite (tiny_longctx) measures synthetic retrieval at the tiny models'
training length (256 tokens, in the place of the paper's 2K training length) and twice that (512, for 4K);
it has no SQuAD or SWDE counterpart, so the tiny tables have no such columns.
"""

from __future__ import annotations

from pathlib import Path

from paper_tables import spec as table_spec
from paper_tables import writers
from paper_tables.figures import save_figure
from paper_tables.lm_tables import (
    LONG_CONTEXT,
    METHOD_NAMES,
    REFERENCE_METHODS,
    ROOT,
    Table,
    _column_marks,
    _configuration,
    _fmt,
    _plain,
    ci_caption,
    companion_caption,
    data_caption,
    reference_order,
    reference_rows,
    report,
    to_latex,
    to_markdown,
    write_outputs,
)
from paper_tables.metrics import Metric
from state_reduction.pipeline import CONTROL, load_experiment

def _cells(t: Table, model, method, ratio, metrics) -> list:
    """(mean, mark, CI half-width) per column; the half-width is None for a single replicate."""
    return [t.cell(model, method, ratio, True, m, "" if method in REFERENCE_METHODS else
                   _column_marks(t, model, ratio, True, m)[method]) for m in metrics]


def layout_table11(t: Table, metrics: list[Metric]):
    """Baseline (and the dense+RFT control), then per ratio (ascending) each method, as the paper's rows 'DRRQR 20%',
    'Grad 20%', ..."""
    header = ["Model", "Configuration"] + [m.label for m in metrics]
    rows = []
    for model in t.models:
        order = reference_order(t, True) + [(m, r) for r in sorted(t.ratios) for m in t.methods]
        for method, ratio in order:
            rows.append([t.model_label(model), _configuration(method, ratio)] + _cells(t, model, method, ratio, metrics))
    return header, rows


def _table4_order(t: Table) -> list[tuple[str, float]]:
    """Table 4's rows (and bars) per model: Baseline (and the dense+RFT control), then each method at its ratio."""
    return reference_order(t, True) + [(m, t.ratios[0]) for m in t.methods]


def layout_table4(t: Table, metrics: list[Metric]):
    """Per model Baseline (and the dense+RFT control), then each method at the table's ratio."""
    header = ["Model", "Method"] + [m.label for m in metrics]
    rows = []
    for model in t.models:
        for i, (method, _) in enumerate(_table4_order(t)):
            rows.append([t.model_label(model) if i == 0 else "", METHOD_NAMES[method]]
                        + _cells(t, model, method, t.ratios[0], metrics))
    return header, rows


LAYOUTS = {"table4": layout_table4, "table11": layout_table11}
BAR_COLOURS = {"baseline": "tab:gray", CONTROL: "silver"}


def comparison(t: Table, metrics) -> str:
    """Our value beside the paper's for every published row whose model our profile stands in for."""
    paper_heads = {c.id: _plain(c.label).split(" ↑")[0] for c in LONG_CONTEXT}
    metrics = [m for m in metrics if (m.paper_key or m.id) in paper_heads]  # MQAR columns have no paper column
    heads = [_plain(m.label).split(" ↑")[0] for m in metrics]
    lines = [f"# {t.table}: ours ({t.profile} profile) vs the paper", "",
             "Paper values are the published ones (paper_tables/reference_data), in percent."]
    if t.suite == "tiny_longctx":
        lines.append("Tiny profile: ~2M-parameter stand-ins trained at 256 tokens, on synthetic retrieval in held-out "
                     "text scored as a 4-way choice (chance 25%); 256 stands for the paper's 2K (the training length), "
                     "512 for 4K. RULER = mean of passkey and key-value retrieval, NIAH = passkey. Compare orderings, "
                     "not magnitudes.")
    header = ["paper model", "ours", "method", "compr."] + [
        x for h, m in zip(heads, metrics) for x in (f"{h} ours", f"{paper_heads[m.paper_key or m.id]} paper")]
    rows = []
    for row in reference_rows(t.table):
        model = next((k for k in t.models if row["model"] in t.p["models"][k]["stands_for"]), None)
        if model is None:
            continue
        cells = [row["model"], model, METHOD_NAMES[row["method"]], f"{round(row['ratio'] * 100)}%"]
        for m in metrics:
            cells += [_fmt(t.get(model, row["method"], row["ratio"], True, m)), _fmt(row.get(m.paper_key or m.id))]
        rows.append(cells)
    if not rows:
        lines.append(f"No published row of {t.table} is on a model this profile stands in for: nothing to compare "
                     "(a tiny-only table's paper values are in its claims' `paper` fields).")
        return "\n".join(lines)
    return "\n".join(lines + ["", writers.markdown(header, rows)])


def plot(t: Table, metrics, stem: Path, bars: bool = False) -> list[Path]:
    """Retrieval accuracy vs compression per method (one panel per column), the dense baseline dashed and
    chance (25%, tiny_longctx suite) dotted; `bars` (Table 4's layout): bars, baseline vs reduced, per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width_per_panel = max(3.3, 0.45 * len(t.models)) if bars else 3.3  # room for every model's bars and its name
    fig, axes = plt.subplots(1, len(metrics), figsize=(width_per_panel * len(metrics), 3.2 + 0.6 * bars),
                             squeeze=False)
    multi = len(t.models) > 1  # several models (pretraining seeds): a colour per model, a line style per method
    for ax, m in zip(axes[0], metrics):
        for j, model in enumerate(t.models):
            base = t.get(model, "baseline", 0.0, True, m)
            if bars:
                order = _table4_order(t)
                width = 0.8 / len(order)
                for i, (meth, ratio) in enumerate(order):
                    y = t.get(model, meth, ratio, True, m)
                    if y is not None:
                        hw = t.half_width(model, meth, ratio, True, m)
                        ax.bar(j + (i - (len(order) - 1) / 2) * width, y, width, yerr=hw, capsize=2,
                               color=BAR_COLOURS.get(meth, "tab:green"),
                               label=_configuration(meth, ratio) if j == 0 else None)
                continue
            for k, method in enumerate(t.methods):  # error bars: the 95% t-interval over seeds (none for one)
                pts = [(r * 100, t.get(model, method, r, True, m), t.half_width(model, method, r, True, m) or 0.0)
                       for r in sorted(t.ratios)]
                pts = [(0.0, base, 0.0)] * (base is not None) + [p for p in pts if p[1] is not None]
                if pts:
                    xs, ys, hws = zip(*pts)
                    ax.errorbar(xs, ys, yerr=hws, marker="o", capsize=2,
                                label=f"{model}: {METHOD_NAMES[method]}" if multi else METHOD_NAMES[method],
                                color=plt.get_cmap("tab10")(j if multi else k),
                                ls=("-", "--", ":")[k % 3] if multi else "-")
            if base is not None:
                ax.axhline(base, color=plt.get_cmap("tab10")(j) if multi else "k", ls="--", lw=1,
                           label=("Baseline (model's colour)" if multi else "Baseline") if j == 0 else None)
            control = t.get(model, CONTROL, 0.0, True, m) if t.control else None
            if control is not None:
                ax.axhline(control, color=plt.get_cmap("tab10")(j) if multi else "tab:gray", ls="-.", lw=1,
                           label=(f"{METHOD_NAMES[CONTROL]} (model's colour)" if multi else METHOD_NAMES[CONTROL])
                           if j == 0 else None)
        if bars:
            ax.set_xticks(range(len(t.models)), t.models, fontsize=7,
                          rotation=45 if len(t.models) > 3 else 0, ha="right" if len(t.models) > 3 else "center")
        else:
            ax.set_xlabel("key channels removed (%)")
            ax.legend(fontsize=5 if multi else 7)
        ax.set_ylim(0, 100)  # percent: a one-point change looks like one
        if t.suite == "tiny_longctx" and m.table is None:  # chance of the 4-way choice (MQAR's is 1/16)
            ax.axhline(25.0, color="tab:red", ls=":", lw=1)
        ax.set_title(_plain(m.label) + (f" ({m.table})" if m.table else ""), fontsize=9)
    fig.suptitle(f"{t.table}, {t.profile} profile ({t.suite} suite), after RFT", fontsize=10)
    if bars:  # one legend for all panels, below them: bars reach 100% and a legend would hide them
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=max(1, len(labels)), fontsize=8)
        fig.tight_layout(rect=(0, 0.08, 1, 1))
    else:
        fig.tight_layout()
    return save_figure(fig, stem)


def render(table: str, profile: str = "tiny", experiment: str | None = None, results_root=None,
           out_root: Path | None = None, figures_root: Path | None = None, quiet: bool = False) -> dict:
    experiment = table_spec.owner(table, experiment)
    layout = table_spec.render_spec(load_experiment(experiment), table, profile, LAYOUTS, experiment)
    t = Table(experiment, table, profile, results_root)
    metrics = layout["columns"]
    header, rows = LAYOUTS[layout["layout"]](t, metrics)
    md, tex = to_markdown(header, rows), to_latex(t, header, rows)
    for caption in (ci_caption(t), companion_caption(t, metrics), data_caption(t, metrics)):
        if caption:
            md += "\n" + caption + "\n"
            tex += "% " + caption + "\n"
    written = write_outputs(table, profile, out_root, tex, md, comparison(t, metrics))
    written["figures"] = plot(t, metrics, (figures_root or ROOT / "figures") / profile / table,
                              bars=layout["layout"] == "table4")
    if not quiet:
        report(written, md, t.missing)
    written["missing"] = t.missing
    return written
