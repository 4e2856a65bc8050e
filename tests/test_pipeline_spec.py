"""The pipeline package (issue 14 part 4): the typed experiment spec and its errors, the stage registry, and the
invariant of the split: planned result names, config keys and Slurm task lists equal those recorded with the
single-module pipeline before it (tests/fixtures/pipeline_plans.json)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from state_reduction import cli
from state_reduction.errors import Error
from state_reduction.pipeline import (
    STAGE_REGISTRY,
    ExperimentSpec,
    PipelineError,
    SpecError,
    get_stage,
    load_experiment,
    load_spec,
    pipeline_experiments,
    plan_table,
    plan_tasks,
    register_stage,
)
from state_reduction.results import config_key

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "pipeline_plans.json"
PIPELINE_CONFIGS = pipeline_experiments()


# deltanet_gdn's tables declared after the fixture was recorded: their tasks are left out of the comparison
ADDED_SINCE = ("table20_full",)
# deltanet_gdn's tasks added since the fixture was recorded, by a tag of their names: Tables 1 and 21-24 gained the
# dense+RFT control (issue 15 item 4) and, on the tiny profile, seeds 1 and 2; every recorded task stays as it was
TASKS_ADDED = ("-dense-r0", "-seed_")
# configs changed on purpose since the fixture was recorded, per table/profile and stage: "rft preset" (the RFT
# settings, hence the config keys of rft and eval-post, changed; the result names did not) or "seeds added" (the
# recorded jobs are all still planned, with the same keys; the extra ones are other seeds'). Everything else must
# still equal the fixture.
CHANGED_SINCE = {
    ("table20/tiny", "rft"): "rft preset", ("table20/tiny", "eval-post"): "rft preset",  # preset tiny-recovery
    ("table16/tiny", "prune"): "seeds added", ("table16/tiny", "eval-pre"): "seeds added",  # seeds 0, 1, 2
    ("table3/tiny", "prune"): "seeds added", ("table3/tiny", "eval-pre"): "seeds added",  # seeds 0, 1, 2
    ("table13/tiny", "prune"): "seeds added", ("table13/tiny", "eval-pre"): "seeds added",  # seeds 0, 1, 2
}


def snapshot() -> dict:
    """What the fixture records: per table and profile the planned (result name, config key) pairs of each stage;
    per profile deltanet_gdn's tasks (name, stages, result names, evaluations; of the tables the fixture knew) and
    its generated sbatch script."""
    from state_reduction.slurm import render_script

    known = [t for t in load_experiment("deltanet_gdn")["tables"] if t not in ADDED_SINCE]

    out = {"plans": {}, "tasks": {}, "scripts": {}}
    for table in ("table20", "table3", "table13", "table16"):
        for profile in ("tiny", "paper"):
            plan = plan_table(None, table, profile)
            out["plans"][f"{table}/{profile}"] = {
                stage: [[name, config_key(cfg)] for name, cfg in jobs] for stage, jobs in plan["stages"].items()}
    for profile in ("tiny", "paper"):
        out["tasks"][profile] = [[t.name, list(t.stages), t.result_names, [list(e) for e in t.evals]]
                                 for t in plan_tasks("deltanet_gdn", profile, known)]
        out["scripts"][profile] = render_script("deltanet_gdn", profile)
    return out


def test_plans_keys_and_slurm_tasks_are_those_of_the_single_module_pipeline(monkeypatch):
    monkeypatch.delenv("SR_CHECKPOINTS", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    before, now = json.loads(FIXTURE.read_text()), snapshot()
    assert sum(len(jobs) for plan in before["plans"].values() for jobs in plan.values()) > 300
    assert now["plans"].keys() == before["plans"].keys()
    for table, plan in before["plans"].items():
        assert now["plans"][table].keys() == plan.keys(), table
        for stage, jobs in plan.items():
            got, change = now["plans"][table][stage], CHANGED_SINCE.get((table, stage))
            if change == "rft preset":
                assert [n for n, _ in got] == [n for n, _ in jobs], (table, stage)
                assert all(a != b for (_, a), (_, b) in zip(got, jobs)), (table, stage)
            elif change == "seeds added":
                extra = [n for n, key in got if [n, key] not in jobs]
                assert all(j in got for j in jobs) and extra and all("-seed_" in n for n in extra), (table, stage)
            else:
                assert got == jobs, (table, stage)
    def untagged(names: list, name=lambda n: n) -> list:
        return [n for n in names if not any(tag in name(n) for tag in TASKS_ADDED)]

    for profile, tasks in before["tasks"].items():  # TASKS_ADDED: recorded tasks unchanged, the extra ones named
        got = now["tasks"][profile]
        assert all(t in got for t in tasks), profile
        assert untagged(got, lambda t: t[0]) == untagged(tasks, lambda t: t[0]), profile  # the rest in recorded order
        old_script, new_script = split_script(before["scripts"][profile]), split_script(now["scripts"][profile])
        assert new_script[0] == old_script[0] and set(old_script[1]) <= set(new_script[1]), profile
        assert untagged(new_script[1]) == untagged(old_script[1]), profile


def split_script(script: str) -> tuple[list[str], list[str]]:
    """(the sbatch script's lines outside its TASKS array, task counts blanked; the task names in it)."""
    lines = [re.sub(r"\d+ tasks|--array=0-\d+", "<count>", line) for line in script.splitlines()]
    start = lines.index("TASKS=(")
    end = lines.index(")", start)
    return lines[:start] + lines[end:], [line.split("#")[0].strip() for line in lines[start + 1:end]]


@pytest.mark.parametrize("name", PIPELINE_CONFIGS)
def test_every_experiment_config_validates(name):
    spec = load_spec(name)
    assert isinstance(spec, ExperimentSpec) and spec.experiment == name
    assert spec.source == Path("experiments") / name / "config.yaml"
    assert load_experiment(name) == yaml.safe_load((ROOT / "experiments" / name / "config.yaml").read_text())
    for profile in spec.profiles.values():
        assert profile.prune.n_calib > 0 and profile.evaluate.suite


def test_the_typed_spec_reads_the_settings():
    spec = load_spec("deltanet_gdn")
    tiny = spec.profiles["tiny"]
    raw = spec.raw["profiles"]["tiny"]
    assert tiny.prune.calib == raw["prune"]["calib"] and tiny.prune.seed == raw["prune"]["seed"]
    assert tiny.models["deltanet"].stands_for == raw["models"]["deltanet"]["stands_for"]
    assert spec.tables["table20"].rft == [False, True]


def _write(tmp_path, edit, name="deltanet_gdn") -> Path:
    spec = yaml.safe_load((ROOT / "experiments" / name / "config.yaml").read_text())
    edit(spec)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_a_typo_in_a_key_names_the_file_the_key_and_the_closest_names(tmp_path):
    def typo(spec):
        spec["profiles"]["tiny"]["prune"]["n_calb"] = spec["profiles"]["tiny"]["prune"].pop("n_calib")

    path = _write(tmp_path, typo)
    with pytest.raises(SpecError) as e:
        load_experiment(str(path))
    msg = str(e.value)
    assert isinstance(e.value, Error) and isinstance(e.value, PipelineError)
    assert str(path) in msg and "unknown key 'profiles.tiny.prune.n_calb'" in msg
    assert "did you mean n_calib" in msg


@pytest.mark.parametrize("edit, expected", [
    (lambda s: s.update(tabels=s.pop("tables")), r"unknown key 'tabels'; did you mean tables"),
    (lambda s: s["tables"]["table20"].update(ratio=[0.5]), r"unknown key 'tables\.table20\.ratio'; did you mean ratios"),
    (lambda s: s["profiles"]["tiny"]["evaluate"].update(suit="tiny"), r"'profiles\.tiny\.evaluate\.suit'; did you mean suite"),
    (lambda s: s["profiles"]["tiny"]["rft"].update(stesp=3), r"'profiles\.tiny\.rft\.stesp'; did you mean steps"),
    (lambda s: s["profiles"]["tiny"]["models"]["deltanet"].update(stand_for=["x"]), r"did you mean stands_for"),
    (lambda s: s["profiles"]["tiny"]["prune"].update(n_calib="128"), r"profiles\.tiny\.prune\.n_calib must be int, got str '128'"),
    (lambda s: s["profiles"]["tiny"]["rft"].update(steps=2.5), r"profiles\.tiny\.rft\.steps must be int, got float"),
    (lambda s: s["tables"]["table20"].update(rft="yes"), r"tables\.table20\.rft must be a list of bool"),
    (lambda s: s["tables"]["table20"].update(ratios=[0.5, "half"]), r"tables\.table20\.ratios\[1\] must be float"),
    (lambda s: s["profiles"]["tiny"]["prune"].pop("seed"), r"missing 'seed' in profiles\.tiny\.prune"),
    (lambda s: s.pop("methods"), r"missing 'methods'"),
    (lambda s: s["tables"]["table20"].update(methods=["l1", "l2"]), r"tables\.table20\.methods lists \['l2'\]"),
])
def test_bad_keys_and_types_are_named(tmp_path, edit, expected):
    path = _write(tmp_path, edit)
    with pytest.raises(SpecError, match=expected) as e:
        load_experiment(str(path))
    assert str(path) in str(e.value)


def test_a_typo_on_the_command_line_is_one_line_and_exit_2(tmp_path, capsys):
    path = _write(tmp_path, lambda s: s["tables"]["table20"].update(contrl=True))
    assert cli.main(["run-table", "table20", "--experiment", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert str(path) in err and "'tables.table20.contrl'" in err and "did you mean control" in err


def test_a_tables_render_layout_is_an_opaque_mapping(tmp_path):
    layout = {"rows": [{"model": "DeltaNet 1.3B"}], "columns": ["wiki_ppl"], "anything": {"nested": [1, 2]}}
    path = _write(tmp_path, lambda s: s["tables"]["table20"].update(render=layout))
    assert load_spec(str(path)).tables["table20"].render == layout
    bad = _write(tmp_path, lambda s: s["tables"]["table20"].update(render=["rows"]))
    with pytest.raises(SpecError, match=r"tables\.table20\.render must be a mapping"):
        load_experiment(str(bad))


def test_an_unknown_experiment_names_the_closest():
    with pytest.raises(PipelineError, match=r"'deltanet_gd'.*did you mean deltanet_gdn"):
        load_experiment("deltanet_gd")


def test_the_stage_registry_holds_the_pipelines_stages_and_analysis_registers_its_own():
    import state_reduction.analysis.experiment as experiment

    assert {"prune", "shed", "rft", "evaluate"} <= set(STAGE_REGISTRY)
    assert get_stage("analyze").run is experiment.run_analysis
    with pytest.raises(PipelineError, match=r"no stage 'evalute'; did you mean evaluate"):
        get_stage("evalute")
    with pytest.raises(PipelineError, match=r"stage 'prune' is registered twice"):
        register_stage("prune")(lambda runner, name, config: {})


def test_analyses_are_mirrored_to_wandb_as_every_stage(tmp_path, monkeypatch):
    """analysis.experiment used to run its sweep beside the runner (a copy of _Runner._base, no wandb mirror)."""
    from state_reduction import tracking
    from state_reduction.analysis.experiment import run_analyses

    mirrored = []
    monkeypatch.setattr("state_reduction.pipeline.stages.mirror_result", lambda path, record, **kw: mirrored.append(Path(path).name))
    spec = yaml.safe_load((ROOT / "experiments" / "rank_analysis" / "config.yaml").read_text())
    spec["methods"] = ["l1"]
    spec["profiles"]["tiny"]["prune"].update(n_calib=2, seq_len=64)
    spec["profiles"]["tiny"]["analyze"].update(n_calib=2, seq_len=64, stride=16, batch_size=2)
    spec["tables"] = {"table6": {"models": ["DeltaNet 370M"], "ratios": [0.75], "rft": [False]}}
    path = tmp_path / "rank.yaml"
    path.write_text(yaml.safe_dump(spec))
    paths = run_analyses("table6", "tiny", str(path), results_root=tmp_path / "results")
    assert [p.name for p in paths] == ["deltanet-dense-analyze.json", "deltanet-l1-r75-analyze.json"]
    assert mirrored == ["deltanet-l1-r75-prune.json"] + [p.name for p in paths]


def _prune_config_reaching_prune(monkeypatch, path, tmp_path, cell):
    """The PruneConfig that the pipeline's prune stage hands to `pruning.prune` for `cell` (stopped there)."""
    from state_reduction.pipeline import stages

    seen = {}

    def spy(cfg):
        seen["cfg"] = cfg
        raise StopIteration

    monkeypatch.setattr(stages, "prune", spy)
    runner = stages.Runner(load_experiment(path), "tiny", results_root=tmp_path / "r")
    with pytest.raises(StopIteration):
        stages.run_prune(runner, "x", runner.prune_config(cell))
    return seen["cfg"]


def test_the_budget_varies_like_a_setting_and_uniform_keeps_the_plain_name_and_key(tmp_path, monkeypatch):
    """Issue 17: `vary: {budget: [...]}` crosses budgets with selectors; the uniform budget (and the default floor)
    is no override, so its cells keep the names and config keys of the table without budgets, and prune receives
    the budget."""
    from state_reduction.pipeline import stages

    scored = ["l1", "drrqr", "grad", "wanda"]  # the experiment's methods but rand, which has no per-channel scores

    def vary(spec):
        spec["tables"]["table20"]["vary"] = {"budget": ["uniform", "global-aire"], "budget_floor": [1, 2]}
        spec["tables"]["table20"]["methods"] = scored

    def keys(experiment):
        return {n: config_key(c) for n, c in plan_table(experiment, "table20", "tiny")["stages"]["prune"]}

    plain, path = keys("deltanet_gdn"), str(_write(tmp_path, vary))
    plain = {n: k for n, k in plain.items() if n.split("-")[1] in scored + ["dense"]}
    varied = keys(path)
    assert {n: k for n, k in varied.items() if n in plain} == plain
    assert set(varied) - set(plain) == {n.replace("-prune", f"{s}-prune") for n in plain
                                        for s in ("-bud_global-aire", "-floor_2", "-bud_global-aire-floor_2")}
    cfg = _prune_config_reaching_prune(monkeypatch, path, tmp_path, stages.Cell("deltanet", "drrqr", 0.5,
                                                                                 (("budget", "global-aire"),)))
    assert (cfg.budget, cfg.budget_floor) == ("global-aire", 1)

    def typo(spec):
        spec["tables"]["table20"]["vary"] = {"budget": ["uniform", "global"]}

    with pytest.raises(PipelineError, match="table20 .* vary budget 'global' unknown; accepted: uniform, global-aire"):
        plan_table(str(_write(tmp_path, typo)), "table20", "tiny")

    def unscored(spec):  # rand draws its channels: no scores to pool, refused by the plan, before any compute
        spec["tables"]["table20"]["vary"] = {"budget": ["uniform", "global-last"]}

    with pytest.raises(PipelineError, match="table20 of experiment 'deltanet_gdn', cell deltanet-rand-r50-bud_global-last"
                                            ": --budget global-last needs per-channel scores; --method rand has none"):
        plan_table(str(_write(tmp_path, unscored)), "table20", "tiny")


def test_budget_granularity_and_layer_removal_vary_and_an_unknown_granularity_is_refused(tmp_path, monkeypatch):
    """Issue 17: `budget_granularity` and `allow_layer_removal` vary like the other budget settings (their defaults
    are no override) and reach prune; an unknown granularity is one line when the table is planned."""
    from state_reduction.pipeline import stages

    def vary(spec):
        spec["tables"]["table20"]["vary"] = {"budget": ["global-aire"], "budget_granularity": ["layer", "head"],
                                             "allow_layer_removal": [False, True]}
        spec["tables"]["table20"]["methods"] = ["l1"]

    path = str(_write(tmp_path, vary))
    names = {n for n, _ in plan_table(path, "table20", "tiny")["stages"]["prune"]}
    assert any("-gran_head" in n for n in names) and any("-rm_True" in n for n in names)
    assert not any("gran_layer" in n or "rm_False" in n for n in names)
    vary_cell = (("allow_layer_removal", True), ("budget", "global-aire"), ("budget_granularity", "head"))
    cfg = _prune_config_reaching_prune(monkeypatch, path, tmp_path, stages.Cell("deltanet", "l1", 0.5, vary_cell))
    assert (cfg.budget_granularity, cfg.allow_layer_removal) == ("head", True)

    def typo(spec):
        spec["tables"]["table20"]["vary"] = {"budget": ["global-aire"], "budget_granularity": ["heads"]}

    with pytest.raises(PipelineError, match="table20 .* vary budget_granularity 'heads' unknown; accepted: layer, head"):
        plan_table(str(_write(tmp_path, typo)), "table20", "tiny")
