"""Slurm job arrays without a Slurm: the generated script, the task plan, status and the run folder. The real
single-node Slurm runs in CI (scripts/ci_slurm.sh): submission, the array, resubmission, failures."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from state_reduction import slurm
from state_reduction.pipeline import PipelineError, plan_table, plan_tasks, run_table
from state_reduction.provenance import REPO_ROOT
from state_reduction.results import build_result, config_key, write_result

CI_EXPERIMENT = str(REPO_ROOT / ".ci" / "slurm_table20.yaml")


def _experiment(tmp_path, **tiny_overrides) -> str:
    spec = yaml.safe_load(Path(CI_EXPERIMENT).read_text())
    spec["profiles"]["tiny"].update(tiny_overrides)
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_script_lists_every_task_with_its_resources(tmp_path):
    exp = _experiment(tmp_path, slurm={"gpus": 4, "mem": "80G", "sbatch": ["--partition=gpu", "--account=lab"]})
    text = slurm.render_script(exp, "tiny")
    tasks = [t.name for t in plan_tasks(exp, "tiny")]
    assert tasks == ["deltanet-baseline", "deltanet-l1-r50", "deltanet-drrqr-r50"]
    assert "#SBATCH --array=0-2" in text and "#SBATCH --mem=80G" in text and "#SBATCH --gpus-per-node=4" in text
    assert "#SBATCH --partition=gpu" in text and "#SBATCH --account=lab" in text
    listed = [line.split("#")[0].strip() for line in text.split("TASKS=(")[1].split(")")[0].strip().splitlines()]
    assert listed == tasks
    assert "torch.distributed.run --standalone --nproc-per-node \"$GPUS\"" in text
    assert "{{" not in text
    script = tmp_path / "x.sbatch"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0


def test_unknown_slurm_setting_is_named(tmp_path):
    exp = _experiment(tmp_path, slurm={"gpu": 2})
    with pytest.raises(PipelineError, match=r"unknown key 'profiles\.tiny\.slurm\.gpu'; did you mean gpus\? valid keys: cpus, mem, time, gpus"):
        slurm.render_script(exp, "tiny")


def test_generate_all_covers_every_pipeline_experiment(tmp_path, monkeypatch, capsys):
    """`make slurm-scripts` (generate all) writes a script for every pipeline experiment with a paper profile that
    the array can run, skips the others with the reason, and reads no config of another shape (aire_home)."""
    from state_reduction.pipeline import pipeline_experiments
    from state_reduction import cli

    written = []
    monkeypatch.setattr(slurm, "generate", lambda name, profile, *a, **k: written.append(name) or tmp_path / name)
    assert cli.main(["slurm", "generate", "all", "--profile", "paper"]) == 0
    out = capsys.readouterr().out
    skipped = [line.split()[1].rstrip(":") for line in out.splitlines() if line.startswith("skipped ")]
    assert sorted(written + skipped) == pipeline_experiments() and "aire_home" not in pipeline_experiments()
    committed = sorted(p.stem.rsplit("-", 1)[0] for p in (REPO_ROOT / "slurm").glob("*-paper.sbatch"))
    assert committed == sorted(written), "slurm/ lacks or keeps a paper script: run `make slurm-scripts`"


def test_committed_scripts_are_what_the_generator_writes():
    committed = sorted(p for p in (REPO_ROOT / "slurm").glob("*-*.sbatch"))
    assert committed, "slurm/ should hold the generated paper-profile scripts (make slurm-scripts)"
    for path in committed:
        experiment, profile = path.stem.rsplit("-", 1)
        assert path.read_text() == slurm.render_script(experiment, profile), \
            f"{path.name} is stale: run `make slurm-scripts`"


@pytest.mark.parametrize("experiment", ["deltanet_gdn", "calibration_sensitivity", "pca_vs_shared_conv", "long_context",
                                        "mamba2", "qwen3_5", "coupled_selection", "state_vs_structure"])
def test_tasks_cover_exactly_the_local_sweeps_results(experiment):
    """The array's tasks write the same result files as run-table over every table: none missing, none extra,
    a cell shared by several tables once."""
    from state_reduction.pipeline import load_experiment

    tasks = plan_tasks(experiment, "tiny")
    names = [n for t in tasks for n in t.result_names]
    assert len(names) == len(set(names))
    local = {name for table in load_experiment(experiment)["tables"]
             for jobs in plan_table(experiment, table, "tiny")["stages"].values() for name, _ in jobs}
    assert set(names) == local


def test_submit_without_slurm_says_how_to_run_locally(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(slurm.SlurmError, match=r"Slurm is not installed here \(no `sbatch`.*run-table"):
        slurm.submit(CI_EXPERIMENT, "tiny", results_root=tmp_path)


def _fake_result(path: Path, name: str) -> None:
    write_result(path / f"{name}.json", build_result(
        "evaluate", profile="tiny", experiment="deltanet_gdn", config={"name": name}, metrics={"x": 1.0},
        model={}, data={}, seeds={}, wall_time_s=0.0))


def test_status_tells_done_failed_killed_and_missing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(slurm, "_queue", dict)
    out = tmp_path / "tiny" / "deltanet_gdn"
    out.mkdir(parents=True)
    _fake_result(out, "deltanet-baseline-r0-eval")
    runs = out / "runs"
    (runs / "deltanet-l1-r50").mkdir(parents=True)
    (runs / "deltanet-l1-r50" / "status.json").write_text(json.dumps(
        {"state": "failed", "error": "FileNotFoundError: no-such-model", "log": "/logs/sr-7_1.out",
         "job_id": "7", "array_task_id": "1"}))
    (runs / "deltanet-drrqr-r50").mkdir(parents=True)
    (runs / "deltanet-drrqr-r50" / "status.json").write_text(json.dumps(
        {"state": "running", "log": "/logs/sr-7_2.out", "job_id": "7", "array_task_id": "2"}))
    rows = slurm.task_states(CI_EXPERIMENT, "tiny", results_root=tmp_path)
    assert [r["state"] for r in rows] == ["done", "failed", "failed"]
    assert "no-such-model" in rows[1]["error"] and "left the queue" in rows[2]["error"]
    slurm.print_status(rows, CI_EXPERIMENT, "tiny")
    text = capsys.readouterr().out
    assert "[1] deltanet-l1-r50: failed, log /logs/sr-7_1.out" in text and "/logs/sr-7_2.out" in text
    monkeypatch.setattr(slurm, "_queue", lambda: {"7_2": "RUNNING"})
    assert slurm.task_states(CI_EXPERIMENT, "tiny", results_root=tmp_path)[2]["state"] == "running"
    # a stale result (another config key than the one the task ran) is not done
    (runs / "deltanet-baseline").mkdir(parents=True)
    (runs / "deltanet-baseline" / "config.json").write_text(json.dumps(
        {"deltanet-baseline-r0-eval": {"config_key": "0" * 16}}))
    assert slurm.task_states(CI_EXPERIMENT, "tiny", results_root=tmp_path)[0]["state"] == "missing"


def test_submit_dry_run_submits_only_unfinished_tasks(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm, "_queue", dict)
    out = tmp_path / "tiny" / "deltanet_gdn"
    out.mkdir(parents=True)
    _fake_result(out, "deltanet-baseline-r0-eval")
    info = slurm.submit(CI_EXPERIMENT, "tiny", results_root=tmp_path, script=tmp_path / "s.sbatch", dry_run=True)
    assert info["indices"] == [1, 2]
    assert "--array=1,2" in info["command"] and (tmp_path / "s.sbatch").is_file()


@pytest.mark.slow
def test_run_task_records_script_config_and_status_and_matches_run_table(tmp_path, monkeypatch):
    """One array element's work, as Slurm runs it: its run folder keeps the exact script, the resolved configs
    with their keys and its state; a later local run-table finds its results finished (same keys)."""
    exp = _experiment(tmp_path, prune={"calib": "ptb", "n_calib": 4, "seq_len": 64, "seed": 0, "batch_size": 4},
                      evaluate={"suite": "tiny_ppl", "batch_size": 16, "max_length": 256, "limit": 2})
    spec = yaml.safe_load(Path(exp).read_text())
    spec["tables"]["table20"]["rft"] = [False]
    spec["methods"] = ["l1"]
    Path(exp).write_text(yaml.safe_dump(spec))
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\necho the exact script\n")
    monkeypatch.setenv("SR_SBATCH_SCRIPT", str(script))
    monkeypatch.setenv("SR_SLURM_LOG", "/logs/x_1.out")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "42")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    root = tmp_path / "results"
    assert slurm.run_task_main(exp, "deltanet-l1-r50", "tiny", results_root=root) == 0
    folder = root / "tiny" / "deltanet_gdn" / "runs" / "deltanet-l1-r50"
    assert (folder / "job.sbatch").read_text() == script.read_text()
    status = json.loads((folder / "status.json").read_text())
    assert status["state"] == "finished" and status["job_id"] == "42" and status["log"] == "/logs/x_1.out"
    configs = json.loads((folder / "config.json").read_text())
    assert sorted(configs) == ["deltanet-l1-r50-eval-pre", "deltanet-l1-r50-prune"]
    out = root / "tiny" / "deltanet_gdn"
    for name, entry in configs.items():
        assert json.loads((out / f"{name}.json").read_text())["config_key"] == entry["config_key"] == \
            config_key(entry["config"])
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.json")}
    run_table(exp, "table20", "tiny", results_root=root)  # runs only the baseline
    after = {p.name: p.stat().st_mtime_ns for p in out.glob("*.json")}
    assert {k: after[k] for k in before} == before
    assert set(after) - set(before) == {"deltanet-baseline-r0-eval.json"}
    rows = slurm.task_states(exp, "tiny", results_root=root)
    assert [r["state"] for r in rows] == ["done", "done"]


def test_failed_task_records_the_error(tmp_path, monkeypatch):
    exp = _experiment(tmp_path)
    spec = yaml.safe_load(Path(exp).read_text())
    spec["profiles"]["tiny"]["models"]["deltanet"]["path"] = "experiments/tiny_models/checkpoints/no-such-model"
    Path(exp).write_text(yaml.safe_dump(spec))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    with pytest.raises((PipelineError, OSError), match="no-such-model"):
        slurm.run_task_main(exp, "deltanet-l1-r50", "tiny", results_root=tmp_path)
    status = json.loads((tmp_path / "tiny" / "deltanet_gdn" / "runs" / "deltanet-l1-r50" / "status.json").read_text())
    assert status["state"] == "failed" and "no-such-model" in status["error"]
    monkeypatch.setattr(slurm, "_queue", dict)
    assert slurm.task_states(exp, "tiny", results_root=tmp_path)[1]["state"] == "failed"


def test_unknown_task_gets_did_you_mean():
    with pytest.raises(PipelineError, match="did you mean deltanet-l1-r50"):
        slurm.run_task_main(CI_EXPERIMENT, "deltanet-l1-r5", "tiny")


@pytest.mark.slow
def test_rft_stage_under_torchrun_runs_ddp_and_writes_once(tmp_path, monkeypatch):
    """What a multi-GPU array element does for RFT (template: torchrun ... run-task --stages rft), on 2 gloo CPU
    processes: DDP over both, one result written by rank 0, the run folder updated."""
    import sys

    from state_reduction.results import read_result

    exp = _experiment(tmp_path, prune={"calib": "ptb", "n_calib": 4, "seq_len": 64, "seed": 0, "batch_size": 4},
                      rft={"preset": "tiny", "steps": 2, "batch_size": 2, "seq_len": 32, "save_every": 2,
                           "eval_corpora": []})
    root = tmp_path / "results"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    slurm.run_task_main(exp, "deltanet-l1-r50", "tiny", stages=["prune"], results_root=root)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "state_reduction.cli", "slurm", "run-task", exp, "deltanet-l1-r50", "--profile", "tiny",
                           "--stages", "rft", "--results-root", str(root)],
                          capture_output=True, text=True, env=env, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = root / "tiny" / "deltanet_gdn"
    assert sorted(p.name for p in out.glob("*.json")) == ["deltanet-l1-r50-prune.json", "deltanet-l1-r50-rft.json"]
    rft = read_result(out / "deltanet-l1-r50-rft.json")
    trainer = json.loads(Path(rft["extra"]["rft_result"]).read_text())
    assert trainer["extra"]["world_size"] == 2 and trainer["extra"]["distributed"] == "ddp"
    status = json.loads((out / "runs" / "deltanet-l1-r50" / "status.json").read_text())
    assert status["state"] == "finished" and status["stages"] == ["rft"]


def test_a_task_on_an_offline_node_with_a_prefetched_cache_skips_the_hub_check(tmp_path, monkeypatch):
    """As run_table: with HF_HUB_OFFLINE and a prefetched cache (`state-reduction prefetch`) a paper-profile task
    does not stop at the hub check (compute nodes without internet); without the cache it does."""
    from state_reduction.evaluation.run import EvaluationError
    from state_reduction.pipeline import stages
    from state_reduction.pipeline.tasks import run_task

    def no_hub():
        raise EvaluationError("the hub is unreachable")

    monkeypatch.setattr(stages, "_require_hub", no_hub)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(PipelineError, match="profile 'paper' runs the paper's checkpoints .* the hub is unreachable"):
        run_task("deltanet_gdn", "deltanet-1.3b-baseline", "paper", tables=["table20"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("STATE_REDUCTION_CACHE", str(tmp_path / "cache"))
    class PastTheHub(Exception):
        pass

    def next_check(*args, **kwargs):  # the check after the hub's: reaching it is the point
        raise PastTheHub

    monkeypatch.setattr("state_reduction.pipeline.tasks.check_context", next_check)
    with pytest.raises(PastTheHub):
        run_task("deltanet_gdn", "deltanet-1.3b-baseline", "paper", tables=["table20"])
