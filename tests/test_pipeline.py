"""The table pipeline end to end on a tiny model: every stage writes a schema result, a rerun does nothing,
a changed setting reruns exactly the stages downstream of it, and bad requests are clear errors."""

import os
from pathlib import Path

import pytest
import torch
import yaml

from state_reduction.pipeline import (
    PipelineError,
    load_experiment,
    run_table,
    table_cells,
)
from state_reduction.results import read_result

ROOT = Path(__file__).resolve().parents[1]
STAGE_FILES = ["deltanet-baseline-r0-eval", "deltanet-l1-r50-prune", "deltanet-l1-r50-eval-pre",
               "deltanet-l1-r50-rft", "deltanet-l1-r50-eval-post"]


def spec(limit=2):
    return {
        "experiment": "pipeline_test", "methods": ["l1"], "select": "kq",
        "profiles": {"tiny": {
            "models": {"deltanet": {"path": "experiments/tiny_models/checkpoints/deltanet",
                                    "stands_for": ["DeltaNet 370M"]}},
            "prune": {"calib": "ptb", "n_calib": 2, "seq_len": 32, "seed": 0, "batch_size": 2},
            "rft": {"preset": "tiny", "steps": 2, "batch_size": 2, "seq_len": 32, "save_every": 1},
            "evaluate": {"suite": "tiny", "batch_size": 8, "max_length": 128, "limit": limit}}},
        "tables": {"table20": {"models": ["DeltaNet 370M"], "ratios": [0.5], "rft": [False, True]}},
    }


def write_spec(tmp_path, **kw):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(spec(**kw)))
    return str(path)


def mtimes(folder):
    return {name: os.stat(folder / f"{name}.json").st_mtime_ns for name in STAGE_FILES}


@pytest.mark.slow
def test_pipeline_runs_each_stage_once_and_reruns_only_downstream_of_a_change(tmp_path):
    torch.set_num_threads(1)
    results = tmp_path / "results"
    config = write_spec(tmp_path)
    paths = run_table(config, "table20", "tiny", results_root=results)
    folder = results / "tiny" / "pipeline_test"
    assert sorted(p.stem for p in paths) == sorted(STAGE_FILES)
    records = {n: read_result(folder / f"{n}.json") for n in STAGE_FILES}
    assert [records[n]["kind"] for n in STAGE_FILES] == ["evaluate", "prune", "evaluate", "rft", "evaluate"]
    assert records["deltanet-l1-r50-prune"]["metrics"]["key_dim_after"] == 32
    pre, post = records["deltanet-l1-r50-eval-pre"], records["deltanet-l1-r50-eval-post"]
    assert pre["config"]["of"] == records["deltanet-l1-r50-prune"]["config_key"]
    assert post["config"]["of"] == records["deltanet-l1-r50-rft"]["config_key"]
    assert pre["model"]["weights_sha256"] != post["model"]["weights_sha256"]  # RFT changed the weights
    assert all(r["provenance"]["git_commit"] and r["model"]["weights_sha256"] for r in records.values())
    assert all(len(h) == 64 for h in pre["data"].values()) and pre["data"]

    before = mtimes(folder)
    run_table(config, "table20", "tiny", results_root=results)
    assert mtimes(folder) == before  # nothing reran

    config = write_spec(tmp_path, limit=3)  # an evaluation setting: only the three evaluations rerun
    run_table(config, "table20", "tiny", results_root=results)
    after = mtimes(folder)
    changed = {n for n in STAGE_FILES if after[n] != before[n]}
    assert changed == {"deltanet-baseline-r0-eval", "deltanet-l1-r50-eval-pre", "deltanet-l1-r50-eval-post"}
    assert read_result(folder / "deltanet-l1-r50-eval-pre.json")["extra"]["n_examples"]["tiny_lambada"] == 3


def test_table_cells_map_paper_models_onto_stand_ins():
    spec = load_experiment("deltanet_gdn")
    models, cells, rft = table_cells(spec, "table20", "tiny")
    assert models == ["deltanet", "gated_deltanet"] and rft == (False, True)
    pruned = [c for c in cells if c.method != "dense"]
    assert len(pruned) == 2 * 5 and {c.ratio for c in pruned} == {0.5}
    assert [(c.model, c.ratio) for c in cells if c.method == "dense"] == [("deltanet", 0.0), ("gated_deltanet", 0.0)]
    models, cells, rft = table_cells(spec, "table1", "paper")
    # the paper profile runs one seed; the dense+RFT control is one more cell
    assert models == ["gated_deltanet-1.3b"] and rft == (True,) and len(cells) == 3 * 5 + 1
    assert [c.name for c in cells if c.method == "dense"] == ["gated_deltanet-1.3b-dense-r0"]
    models, cells, rft = table_cells(spec, "table1", "tiny")  # 3 seeds on the tiny profile
    assert len(cells) == (3 * 5 + 1) * 3 and {dict(c.vary).get("seed", 0) for c in cells} == {0, 1, 2}


@pytest.mark.parametrize("call, message", [
    (lambda c: run_table("no_such_experiment", "table20"), "known: .*deltanet_gdn"),
    (lambda c: run_table(c, "table99"), "tables: table20"),
    (lambda c: run_table(c, "table20", "paper"), "profiles: tiny"),
])
def test_bad_requests_are_clear_errors(tmp_path, call, message):
    with pytest.raises(PipelineError, match=message):
        call(write_spec(tmp_path))


def test_a_path_needing_an_unset_variable_names_it(monkeypatch):
    from state_reduction.pipeline import resolve_model_path

    monkeypatch.delenv("SR_CHECKPOINTS", raising=False)
    with pytest.raises(PipelineError, match="SR_CHECKPOINTS"):
        resolve_model_path("${SR_CHECKPOINTS}/delta_net-370M")


def test_rft_key_holds_the_recipes_real_values(monkeypatch):
    """Issue 22: the key held `preset_values: {}` for the paper preset; it now holds every value RFT computes with,
    so the dry-run plan shows them and editing a default of RFTConfig reruns RFT."""
    import dataclasses

    import state_reduction.rft as rft
    from state_reduction.pipeline import plan_table
    from state_reduction.results import config_key

    def rft_jobs():
        return plan_table("deltanet_gdn", "table22", "paper", stages=("rft",))["stages"]["rft"]

    jobs = rft_jobs()
    values = jobs[0][1]["preset_values"]
    assert values["lr"] == 1e-4 and values["steps"] == 2000 and values["rank"] == 32 and values["alpha"] == 64.0
    assert values["batch_size"] == 16 and values["seq_len"] == 2048 and values["corpora"] == ["fineweb-edu"]
    assert values["kd_temperature"] == 2.0 and values["profile"] == "paper"

    @dataclasses.dataclass
    class EditedDefault(rft.RFTConfig):
        kd_temperature: float = 3.0

    monkeypatch.setattr("state_reduction.pipeline.stages.RFTConfig", EditedDefault)
    edited = rft_jobs()
    assert edited[0][1]["preset_values"]["kd_temperature"] == 3.0
    assert config_key(edited[0][1]) != config_key(jobs[0][1])


def _write_plan(config, results, seeds=None):
    """Results (empty metrics) for every stage the table plans, under the keys the config gives now."""
    from state_reduction.pipeline.spec import table_evaluate
    from state_reduction.pipeline.stages import STAGES, Runner, stage_jobs
    from state_reduction.results import build_result, write_result

    s = load_experiment(config)
    keys, cells, rft_states = table_cells(s, "table20", "tiny", seeds)
    runner = Runner(s, "tiny", results, evaluate=table_evaluate(s, "table20", "tiny"))
    names = []
    for stage, jobs, _ in stage_jobs(runner, keys, cells, rft_states, STAGES):
        kind = {"baseline": "evaluate", "eval-pre": "evaluate", "eval-post": "evaluate"}.get(stage, stage)
        for name, cfg in jobs:
            write_result(results / "tiny" / "pipeline_test" / f"{name}.json",
                         build_result(kind, profile="tiny", experiment="pipeline_test", config=cfg, metrics={},
                                      wall_time_s=0.0))
            names.append(name)
    return names


def test_stale_results_are_the_files_the_config_now_plans_under_another_key(tmp_path):
    """A result written before a setting changed is named (with the table that reruns it) until its table reruns;
    a replicate seed run with --seeds is judged too; a file no table plans is not."""
    from state_reduction.pipeline.stages import stale_results

    results = tmp_path / "results"
    config = write_spec(tmp_path)
    assert stale_results(config, "tiny", results) == []  # no results: nothing to judge
    names = _write_plan(config, results, seeds=[0, 1])
    assert len(names) == 9 and "deltanet-l1-r50-seed_1-eval-post" in names
    folder = results / "tiny" / "pipeline_test"
    (folder / "notes.json").write_text("{}")  # not a result: skipped
    # a result no table plans (a removed table's, another tool's): not judged, whatever its key
    (folder / "deltanet-rand-r50-eval-pre.json").write_text((folder / "deltanet-l1-r50-eval-pre.json").read_text())
    assert stale_results(config, "tiny", results) == []

    config = write_spec(tmp_path, limit=3)  # an evaluation setting: every evaluation, seed 1's included, is stale
    stale = stale_results(config, "tiny", results)
    assert [name for name, *_ in stale] == sorted(
        ["deltanet-baseline-r0-eval", "deltanet-l1-r50-eval-pre", "deltanet-l1-r50-eval-post",
         "deltanet-l1-r50-seed_1-eval-pre", "deltanet-l1-r50-seed_1-eval-post"])
    assert all(old != new and table == "table20" for _, old, new, table in stale)
    _write_plan(config, results, seeds=[0, 1])  # the table rerun under the new setting: nothing stale
    assert stale_results(config, "tiny", results) == []
