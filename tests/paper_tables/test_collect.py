"""The pandas collector (paper_tables/collect.py): one row per result, config keys and metrics as columns, the
filters and the pivot the tables read."""

import math

import pytest

from paper_tables.collect import in_cells, results_frame, runs, where_config
from state_reduction.results import build_result, results_dir, write_result


def _write(root, name, kind, config, metrics):
    record = build_result(kind, profile="tiny", experiment="exp", config=config, metrics=metrics, wall_time_s=0.0)
    write_result(results_dir("tiny", "exp", root) / f"{name}.json", record)


@pytest.fixture()
def root(tmp_path):
    base = {"model": "m", "ratio": 0.5, "rft": False, "suite": "tiny_ppl"}
    _write(tmp_path, "a", "evaluate", {**base, "method": "grad", "vary": {"seed": 1}}, {"ppl": 10.0, "acc": 0.5})
    _write(tmp_path, "b", "evaluate", {**base, "method": "grad"}, {"ppl": float("nan")})
    _write(tmp_path, "c", "evaluate", {"model": "m", "method": "baseline", "ratio": 0.0, "rft": False}, {"ppl": 5.0})
    _write(tmp_path, "d", "prune", {**base, "method": "grad", "suite": "other"}, {"kept": 4})
    return tmp_path


def test_one_row_per_result_config_and_metrics_as_columns(root):
    frame = results_frame("exp", "tiny", root)
    assert frame["kind"].tolist() == ["evaluate", "evaluate", "evaluate", "prune"]
    assert frame["vary"].tolist() == [(("seed", 1),), (), (), ()]
    assert frame["metric.ppl"].tolist()[0] == 10.0 and math.isnan(frame["metric.ppl"].tolist()[1])
    assert math.isnan(frame["metric.acc"].tolist()[1])  # no such metric: a hole, as NaN is
    assert frame["metric.kept"].tolist()[3] == 4


def test_filters_on_settings_and_cells(root):
    frame = results_frame("exp", "tiny", root)
    # the baseline has no suite: it agrees with any unless strict
    assert len(where_config(frame, {"suite": "tiny_ppl"})) == 3
    assert len(where_config(frame, {"suite": "tiny_ppl"}, strict=True)) == 2
    assert len(where_config(frame, {"absent_key": 1}, strict=True)) == 0
    assert in_cells(frame, {("m", "grad", 0.5, (("seed", 1),))}).tolist() == [True, False, False, False]


def test_runs_pivots_replicates_by_cell(root):
    frame = results_frame("exp", "tiny", root)
    values = runs(frame[frame["kind"] == "evaluate"], ["model", "method", "ratio", "rft"])
    assert set(values) == {("m", "grad", 0.5, False), ("m", "baseline", 0.0, False)}
    assert set(values[("m", "grad", 0.5, False)]) == {(("seed", 1),), ()}
    assert values[("m", "baseline", 0.0, False)][()]["ppl"] == 5.0


def test_an_experiment_without_results_is_an_empty_frame(tmp_path):
    frame = results_frame("exp", "tiny", tmp_path)
    assert frame.empty and {"model", "method", "ratio", "rft", "vary"} <= set(frame.columns)
    assert runs(frame, ["model", "method", "ratio", "rft"]) == {}
