"""Tables that vary RFT settings (`vary: {rft_<field>: ...}`, pipeline.spec.RFT_VARY; issue 15 item 4): cells, names and
keys, the plan and its tasks, bad budgets, and the rft_budget layout with the rule that picks a budget."""

import copy

import pytest

from state_reduction.pipeline import (
    CONTROL,
    PipelineError,
    Runner,
    load_experiment,
    plan_table,
    plan_tasks,
    table_cells,
)
from state_reduction.pipeline.spec import parse_spec


@pytest.fixture(scope="module")
def spec():
    return load_experiment("rft")


def _variant(spec, tmp_path, **table):
    raw = copy.deepcopy(spec)
    raw["tables"]["rft_budget"].update(table)
    parse_spec(raw, "test")
    path = tmp_path / "config.yaml"
    import yaml

    path.write_text(yaml.safe_dump(raw))
    return raw, str(path)


def test_budget_cells_share_the_plain_cells_pruned_model_and_keep_its_name(spec):
    keys, cells, states = table_cells(spec, "rft_budget", "tiny")
    assert keys == ["deltanet", "gated_deltanet"] and states == (False, True)
    # 2 families x (DRRQR + control) x 8 budgets x 3 seeds
    assert len(cells) == 96 and len({c.name for c in cells}) == 96
    plain = [c for c in cells if not c.rft_overrides()]
    assert {c.name for c in plain} >= {"deltanet-drrqr-r50", "deltanet-dense-r0", "deltanet-drrqr-r50-seed_1"}
    kd = next(c for c in cells if c.rft_overrides() == {"ce_weight": 0.0, "steps": 96} and c.method == "drrqr")
    assert kd.name == "deltanet-drrqr-r50-ce_0.0-steps_96" and kd.pruning().name == "deltanet-drrqr-r50"


def test_plan_prunes_and_evaluates_pre_rft_once_per_replicate_and_fine_tunes_every_budget(spec):
    plan = plan_table("rft", "rft_budget", "tiny")["stages"]
    assert {k: len(v) for k, v in plan.items()} == {"baseline": 2, "prune": 6, "eval-pre": 6, "rft": 96,
                                                     "eval-post": 96}
    rft = dict(plan["rft"])
    runner = Runner(spec, "tiny", dry_run=True)
    kd = rft["deltanet-drrqr-r50-ce_0.0-steps_96-rft"]
    plain = rft["deltanet-drrqr-r50-rft"]
    assert kd["steps"] == 96 and kd["ce_weight"] == 0.0 and kd["preset_values"]["steps"] == 96
    assert kd["pruned"] == plain["pruned"]  # one pruned model for every budget of a seed
    assert "vary" not in plain and "steps" not in plain and "ce_weight" not in plain["preset_values"]
    lr = rft["gated_deltanet-dense-r0-lr_0.0003-seed_2-rft"]
    assert lr["pruned"] == CONTROL and lr["lr"] == 0.0003 and lr["seed"] == 2
    assert runner.prune_config(runner.cell_of(kd)) == runner.prune_config(runner.cell_of(plain))


def test_tasks_of_budget_cells_are_rft_and_post_rft_evaluation_only():
    tasks = {t.name: t for t in plan_tasks("rft", "tiny")}
    assert tasks["deltanet-drrqr-r50"].stages == ("prune", "eval-pre", "rft", "eval-post")
    kd = tasks["deltanet-drrqr-r50-ce_0.0-steps_96"]
    assert kd.stages == ("rft", "eval-post")
    assert kd.result_names == ["deltanet-drrqr-r50-ce_0.0-steps_96-rft", "deltanet-drrqr-r50-ce_0.0-steps_96-eval-post"]
    assert len(tasks) == 2 + 96


def test_bad_budgets_are_refused_naming_the_table_and_the_setting(spec, tmp_path):
    raw, _ = _variant(spec, tmp_path, rft=[True])
    with pytest.raises(PipelineError, match=r"rft_budget of experiment 'rft' \(tiny\) varies RFT settings .*rft: \[false, true\]"):
        table_cells(raw, "rft_budget", "tiny")
    raw, _ = _variant(spec, tmp_path, vary={"rft_steps": [0, 32]})
    with pytest.raises(PipelineError, match=r"rft_budget .*RFT budget rft_steps=0: steps must be >= 1"):
        table_cells(raw, "rft_budget", "tiny")
    raw, _ = _variant(spec, tmp_path, vary={"rft_ce_weight": [0.0], "rft_kd_weight": [0.0]})
    with pytest.raises(PipelineError, match="needs a teacher and kd_weight > 0"):
        table_cells(raw, "rft_budget", "tiny")
    raw, _ = _variant(spec, tmp_path, vary={"rft_stepz": [8]})
    with pytest.raises(PipelineError, match="varies \\['rft_stepz'\\].*rft_steps"):
        table_cells(raw, "rft_budget", "tiny")
