"""A table's layout as data: the `render:` mapping under `tables.<table>` in the owning experiments/*/config.yaml.

    render:
      layout: pre_post                 # one of LAYOUT_NAMES (how rows and ratios are arranged)
      columns: [wiki_word_perplexity, lambada_ppl, zero_shot_avg]    # metric ids (paper_tables/metrics.py)
      # or per profile:  columns: {tiny: [...], paper: [...]}
      # a column may rename its header:  {metric: zero_shot_avg, label: "Avg $\\uparrow$"}
      # or read another table's cells:   {metric: mqar_32_p8_acc, table: recall_table4}
      #   (a companion table of the same experiment defined on the profile, e.g. tiny-only with `profiles: [tiny]`,
      #   whose models stand in row for row, in the same order, for the table's models)

The pipeline treats `render` as opaque; this module validates it. Which experiment owns a table comes from the
configs only (state_reduction.pipeline.find_experiment).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from paper_tables.metrics import Metric, TableSpecError, closest, metric
from state_reduction.pipeline import (
    EXPERIMENTS_DIR,
    PipelineError,
    find_experiment,
    load_experiment,
    profile_tables,
)

RENDER_KEYS = ("layout", "columns", "paper")  # paper: the published table compared with (default: the same name)
COLUMN_KEYS = ("metric", "label", "table")


def config_path(experiment: str) -> Path:
    path = Path(experiment)
    return path if path.suffix in (".yaml", ".yml") else EXPERIMENTS_DIR / experiment / "config.yaml"


def declared_tables() -> dict[str, str]:
    """table -> the experiment whose config.yaml declares it, over every experiments/*/config.yaml."""
    out = {}
    for path in sorted(EXPERIMENTS_DIR.glob("*/config.yaml")):
        for table in (yaml.safe_load(path.read_text()) or {}).get("tables") or {}:
            out.setdefault(table, path.parent.name)
    return out


def owner(table: str, experiment: str | None = None) -> str:
    """The experiment that declares `table` (`experiment` when given); a table no config declares is a
    TableSpecError naming the closest declared tables."""
    if experiment is not None:
        return experiment
    declared = declared_tables()
    if table not in declared:
        raise TableSpecError(f"{EXPERIMENTS_DIR}/*/config.yaml: no experiment declares table {table!r} under "
                             f"`tables:`; {closest(table, sorted(declared, key=lambda t: (len(t), t)))}")
    try:
        return find_experiment(table)
    except PipelineError as e:  # declared by two experiments
        raise TableSpecError(str(e)) from None


def render_spec(spec: dict, table: str, profile: str, layouts, experiment: str | None = None) -> dict:
    """{"layout": name, "columns": [Metric, ...], "paper": the published table it is compared with} of `table` on
    `profile`, from its `render:` mapping."""
    where = f"{config_path(experiment or spec['experiment'])}: tables.{table}.render"
    render = (spec.get("tables") or {}).get(table, {}).get("render")
    if not isinstance(render, dict):
        raise TableSpecError(f"{where}: missing (a mapping with {', '.join(RENDER_KEYS)})")
    unknown = [k for k in render if k not in RENDER_KEYS]
    if unknown:
        raise TableSpecError(f"{where}: unknown key {unknown[0]!r}; {closest(unknown[0], RENDER_KEYS)}")
    layout = render.get("layout")
    if layout not in layouts:
        raise TableSpecError(f"{where}.layout: {layout!r} is not a layout; {closest(layout, layouts)}")
    columns = render.get("columns")
    if isinstance(columns, dict):
        if profile not in columns:
            raise TableSpecError(f"{where}.columns: no columns for profile {profile!r}; "
                                 f"profiles: {', '.join(columns)}")
        columns, where = columns[profile], f"{where}.columns.{profile}"
    else:
        where = f"{where}.columns"
    if not isinstance(columns, list) or not columns:
        raise TableSpecError(f"{where}: a non-empty list of metric ids, got {columns!r}")
    paper = render.get("paper", table)
    if not isinstance(paper, str):
        raise TableSpecError(f"{where.split('.columns')[0]}.paper: the name of a published table, got {paper!r}")
    return {"layout": layout, "paper": paper,
            "columns": [_column(c, f"{where}[{i}]", spec, table, profile) for i, c in enumerate(columns)]}


def companions(spec: dict, table: str, profile: str) -> list[str]:
    """The other tables whose cells `table`'s columns on `profile` read (`{metric: ..., table: ...}`), in column
    order; none for a table without a `render:` mapping."""
    render = (spec.get("tables") or {}).get(table, {}).get("render") or {}
    columns = render.get("columns") or []
    columns = columns.get(profile, []) if isinstance(columns, dict) else columns
    return list(dict.fromkeys(c["table"] for c in columns if isinstance(c, dict) and c.get("table") is not None))


def readers(spec: dict, table: str) -> list[str]:
    """The tables of the experiment whose columns, on some profile, read `table`'s cells (companions)."""
    return [t for t in spec.get("tables") or {} if any(table in companions(spec, t, p) for p in spec["profiles"])]


def _column(entry, where: str, spec: dict, table: str, profile: str) -> Metric:
    if isinstance(entry, str):
        return metric(entry, where)
    if not isinstance(entry, dict) or "metric" not in entry:
        raise TableSpecError(f"{where}: a metric id or a mapping with `metric` (and `label`, `table`), got {entry!r}")
    unknown = [k for k in entry if k not in COLUMN_KEYS]
    if unknown:
        raise TableSpecError(f"{where}: unknown key {unknown[0]!r}; {closest(unknown[0], COLUMN_KEYS)}")
    m = metric(entry["metric"], where)
    if "table" in entry:
        other, defined = entry["table"], profile_tables(spec, profile)
        if other == table or other not in defined:
            raise TableSpecError(f"{where}.table: {other!r} is not another table of experiment "
                                 f"{spec['experiment']!r} defined on profile {profile!r}; "
                                 f"{closest(other, [t for t in defined if t != table])}")
        m = m.of_table(other)
    return m.with_label(entry["label"]) if "label" in entry else m


def load(table: str, profile: str, layouts, experiment: str | None = None) -> tuple[dict, dict]:
    """(the owning experiment's spec, the table's render spec)."""
    experiment = owner(table, experiment)
    spec = load_experiment(experiment)
    return spec, render_spec(spec, table, profile, layouts, experiment)
