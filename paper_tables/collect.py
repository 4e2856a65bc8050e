"""Result JSON as a pandas DataFrame, and the pivots the tables read.

`results_frame` turns the results of one experiment on one profile (state_reduction.pipeline.collect) into one
row per result: its `kind`, the config's keys as columns (`vary` as a sorted tuple of
(key, value) pairs, () for none; a key a result's config lacks is missing, not a value) and the metrics as
`metric.<id>` columns (NaN where a result has no such metric, as for a NaN metric: both are holes in a table),
and `extra.n_examples`: the examples per task an evaluation scored.
"""

from __future__ import annotations

import math

import pandas as pd

from state_reduction.pipeline import collect

METRIC = "metric."
N_EXAMPLES = "extra.n_examples"
# the config keys every table pivot groups by
CELL = ["model", "method", "ratio"]


def _vary(config: dict) -> tuple:
    return tuple(sorted((config.get("vary") or {}).items()))


def results_frame(experiment: str, profile: str, results_root=None) -> pd.DataFrame:
    """One row per result file of `experiment` on `profile`, in file-name order."""
    records = collect(experiment, profile, results_root)
    configs = pd.DataFrame.from_records([{**r["config"], "vary": _vary(r["config"])} for r in records])
    # the keys a table groups by are columns even when no result has them (an experiment without results)
    configs = configs.reindex(columns=[*configs.columns, *(k for k in CELL + ["rft", "vary"] if k not in configs)])
    metrics = pd.DataFrame.from_records([r["metrics"] for r in records]).add_prefix(METRIC)
    # the examples per task an evaluation scored ({task: n}, after any limit; None where a result has none)
    kinds = pd.DataFrame({"kind": [r["kind"] for r in records],
                          N_EXAMPLES: [(r.get("extra") or {}).get("n_examples") for r in records]})
    return pd.concat([kinds, configs.astype(object), metrics], axis=1)


def where_config(frame: pd.DataFrame, settings: dict, strict: bool = False) -> pd.DataFrame:
    """The rows whose config agrees with `settings`; a row whose config lacks a key agrees unless `strict` (then
    only where the setting is None, as `config.get(key) == value`)."""
    keep = pd.Series(True, index=frame.index)
    for key, value in settings.items():
        absent = not strict or value is None
        if key not in frame:
            keep &= absent
            continue
        keep &= frame[key].map(lambda v: v == value if _present(v) else absent).astype(bool)
    return frame[keep]


def _present(v) -> bool:
    return not (isinstance(v, float) and math.isnan(v))


def metric_dicts(frame: pd.DataFrame) -> list[dict]:
    """Each row's metrics as {id: value} (ids without the `metric.` prefix)."""
    columns = [c for c in frame.columns if c.startswith(METRIC)]
    values = frame[columns].rename(columns=lambda c: c[len(METRIC):])
    return values.to_dict("records")


def runs(frame: pd.DataFrame, keys: list[str]) -> dict:
    """{tuple of `keys`' values: {vary: metrics}}: every replicate of each cell (a later file of the same cell and
    replicate wins, as the files are read in name order)."""
    out: dict = {}
    if frame.empty:
        return out
    index = list(zip(*(frame[k].tolist() for k in keys)))
    for key, vary, metrics in zip(index, frame["vary"].tolist(), metric_dicts(frame)):
        out.setdefault(key, {})[vary] = metrics
    return out


def in_cells(frame: pd.DataFrame, wanted: set) -> pd.Series:
    """True per row whose (model, method, ratio, vary) is one of `wanted`."""
    keys = zip(*(frame[k].tolist() for k in CELL + ["vary"]))
    return pd.Series([k in wanted for k in keys], index=frame.index, dtype=bool)


def by_seed(experiment: str, profile: str, metric: str | None, default_seed: int, results_root=None,
            cell=lambda config: (config["model"], config["method"], config["ratio"]),
            prune_value=lambda record: record["metrics"]) -> tuple[dict, dict, dict]:
    """The replicate-seed renderers' index of an experiment's results: (prune, evals, baseline) with
    prune[(*cell, seed)] = prune_value(record), evals[(*cell, seed, rft)] = the evaluation's `metric` and
    baseline[model] = the dense baseline's `metric` (metric None: the whole metrics mapping, for a renderer of
    several metrics). `cell(config)` is the cell's key (model, method, ratio by default; a renderer may add a
    varied setting), the seed a `vary` seed or the profile's own."""
    prune, evals, baseline = {}, {}, {}

    def value(record):
        return record["metrics"] if metric is None else record["metrics"].get(metric)

    for r in collect(experiment, profile, results_root):
        c = r["config"]
        seed = (c.get("vary") or {}).get("seed", default_seed)
        if r["kind"] == "prune":
            prune[(*cell(c), seed)] = prune_value(r)
        elif r["kind"] == "evaluate" and c["method"] == "baseline":
            baseline[c["model"]] = value(r)
        elif r["kind"] == "evaluate":
            evals[(*cell(c), seed, c["rft"])] = value(r)
    return prune, evals, baseline
