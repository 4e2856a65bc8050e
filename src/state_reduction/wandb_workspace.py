"""The wandb dashboard as code: a workspace of the project's mirrored runs (state_reduction.tracking) with
perplexity vs compression per method, the zero-shot average, RFT loss curves and speedups.

    state-reduction wandb workspace --entity ME        # creates it (online; needs `wandb login`)
    state-reduction wandb workspace --print            # the panels as JSON, offline

Every panel reads keys that the mirror logs (tests check them against offline runs): summary metrics of the
evaluate, rft and bench results, config keys `ratio`, `method`, `model`, and the RFT history `rft/*`.
"""

from __future__ import annotations

import os

from state_reduction.tracking import PROJECT, TrackingError, logged_in

# (section, [(panel kind, title, x, y)]): x/y "config:<key>", "summary:<key>" or a history key
PANELS = [
    ("Perplexity vs compression", [
        ("scatter", "Wiki word perplexity vs ratio (evaluate runs; group by method)", "config:ratio", "summary:wiki_word_perplexity"),
        ("scatter", "PTB word perplexity vs ratio", "config:ratio", "summary:ptb_word_perplexity"),
        ("scatter", "LAMBADA perplexity vs ratio", "config:ratio", "summary:lambada_ppl"),
    ]),
    ("Zero-shot", [
        ("scatter", "Zero-shot average vs ratio", "config:ratio", "summary:zero_shot_avg"),
        ("bar", "Zero-shot average per run", None, "summary:zero_shot_avg"),
    ]),
    ("RFT", [
        ("line", "RFT loss (distillation + CE)", "Step", "rft/loss"),
        ("line", "RFT cross-entropy", "Step", "rft/ce"),
        ("line", "RFT KL to the dense teacher", "Step", "rft/kl"),
        ("bar", "RFT final loss", None, "summary:final_loss"),
    ]),
    ("Speed", [
        ("bar", "Recurrence speedup 50%", None, "summary:recurrence_speedup_r50"),
        ("bar", "Recurrence speedup 75%", None, "summary:recurrence_speedup_r75"),
        ("bar", "Decode speedup, batch 4 (50%)", None, "summary:speedup_b4_r50"),
        ("bar", "Decode speedup, batch 4 (75%)", None, "summary:speedup_b4_r75"),
    ]),
]


def panel_keys() -> dict[str, set[str]]:
    """The config, summary and history keys the panels read."""
    keys = {"config": {"method", "model", "ratio"}, "summary": set(), "history": set()}
    for _, panels in PANELS:
        for _, _, x, y in panels:
            for ref in (x, y):
                if ref and ref != "Step":
                    kind, _, key = ref.partition(":") if ":" in ref else ("history", "", ref)
                    keys[kind].add(key)
    return keys


def _ref(ref: str | None):
    # lazy: start-up time (wandb_workspaces only when a report block is built)
    import wandb_workspaces.reports.v2 as wr

    if ref is None or ref == "Step":
        return ref
    if ref.startswith("config:"):
        return wr.Config(ref.split(":", 1)[1])
    if ref.startswith("summary:"):
        return wr.SummaryMetric(ref.split(":", 1)[1])
    return ref


def build_workspace(entity: str, project: str = PROJECT, name: str = "state reduction"):
    """The wandb_workspaces.Workspace (not saved); runs grouped by method, filtered by nothing."""
    # lazy: start-up time (wandb_workspaces only when a workspace is built)
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    sections = []
    for title, panels in PANELS:
        built = []
        for kind, ptitle, x, y in panels:
            if kind == "scatter":
                built.append(wr.ScatterPlot(title=ptitle, x=_ref(x), y=_ref(y)))
            elif kind == "line":
                built.append(wr.LinePlot(title=ptitle, x=x, y=[_ref(y)], smoothing_factor=0.0))
            else:
                built.append(wr.BarPlot(title=ptitle, metrics=[_ref(y)], groupby=wr.Config("method")))
        sections.append(ws.Section(name=title, panels=built, is_open=True))
    return ws.Workspace(entity=entity, project=project, name=name, sections=sections,
                        runset_settings=ws.RunsetSettings(groupby=[ws.Config("method")]))


def create(entity: str | None, project: str = PROJECT, name: str = "state reduction") -> str:
    """Save the workspace to wandb (online) and return its URL."""
    if not logged_in():
        raise TrackingError("creating the wandb workspace needs credentials: `wandb login` (or $WANDB_API_KEY); "
                            "`state-reduction wandb workspace --print` shows the panels offline")
    entity = entity or os.environ.get("WANDB_ENTITY")
    if not entity:
        raise TrackingError("pass --entity (your wandb user or team) or set $WANDB_ENTITY")
    workspace = build_workspace(entity, project, name).save()
    return workspace.url
