"""The wandb mirror: a real tiny sweep logged offline, read back from wandb's own run files."""

import json
from pathlib import Path

import pytest
import yaml

from state_reduction import tracking
from state_reduction.pipeline import run_table
from state_reduction.results import read_result

SPEC = {
    "experiment": "wandb_check", "methods": ["l1"], "select": "kq",
    "profiles": {"tiny": {
        "models": {"deltanet": {"path": "experiments/tiny_models/checkpoints/deltanet", "stands_for": ["DeltaNet 370M"]}},
        "prune": {"calib": "ptb", "n_calib": 4, "seq_len": 64, "seed": 0, "batch_size": 4},
        "rft": {"preset": "tiny", "steps": 3, "batch_size": 2, "seq_len": 32, "save_every": 3, "eval_corpora": []},
        "evaluate": {"suite": "tiny", "batch_size": 16, "max_length": 256, "limit": 2}}},
    "tables": {"table20": {"models": ["DeltaNet 370M"], "ratios": [0.5], "rft": [False, True]}},
}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A tiny sweep (baseline, prune, eval-pre, RFT, eval-post) and two small benchmarks, mirrored offline."""
    from state_reduction.cli import main as cli_main

    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_MODE", "offline")
    tmp = tmp_path_factory.mktemp("wandb")
    exp = tmp / "exp.yaml"
    exp.write_text(yaml.safe_dump(SPEC))
    root = tmp / "results"
    paths = run_table(str(exp), "table20", "tiny", results_root=root)
    speed = root / "tiny" / "speed"
    assert cli_main(["bench", "recurrence", "--batch-sizes", "2", "--levels", "recurrence", "--warmup", "0", "--steps", "1",
                       "--repeats", "1", "--out", str(speed / "recurrence.json")]) == 0
    assert cli_main(["bench", "decode", "--model", "experiments/tiny_models/checkpoints/deltanet", "--batch-sizes", "4",
                       "--prompt-len", "16", "--warmup", "0", "--steps", "2", "--repeats", "1",
                       "--out", str(speed / "decode.json")]) == 0
    mirrored = tracking.mirror_missing("tiny", root)
    yield {"root": root, "paths": paths, "bench": sorted(speed.glob("*.json")), "mirrored": mirrored}
    mp.undo()


@pytest.mark.slow
def test_every_result_is_one_offline_run_with_its_tags_config_and_metrics(sweep):
    runs = {r["name"]: r for r in map(tracking.read_offline_run, tracking.offline_runs("tiny", sweep["root"]))}
    assert len(sweep["mirrored"]) == 2  # the benchmarks; the sweep mirrored its own results as it wrote them
    assert set(runs) == {p.stem for p in sweep["paths"]} | {p.stem for p in sweep["bench"]}
    expected_state = {"baseline": "dense", "eval-pre": "pre-rft", "eval-post": "post-rft", "rft": "rft"}
    for path in sweep["paths"]:
        result, run = read_result(path), runs[path.stem]
        stage = result["config"]["stage"]
        assert run["run_id"] == f"sr-{result['config_key']}" and run["group"] == "tiny/wandb_check"
        assert run["project"] == "state-reduction" and run["job_type"] == stage
        assert {"experiment:wandb_check", "profile:tiny", "family:delta_net", "model:deltanet", f"stage:{stage}"} \
            <= set(run["tags"])
        if stage != "baseline":
            assert {"method:l1", "r50"} <= set(run["tags"])
        if stage in expected_state:
            assert expected_state[stage] in run["tags"]
        assert run["config"]["config_key"] == result["config_key"]
        assert run["config"]["provenance"]["git_commit"] == result["provenance"]["git_commit"]
        for key, value in result["config"].items():
            assert run["config"][key] == value
        for key, value in result["metrics"].items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                assert run["summary"][key] == pytest.approx(value, rel=1e-12)


def test_rft_run_carries_the_loss_curve(sweep):
    rft = next(p for p in sweep["paths"] if p.stem.endswith("-rft"))
    log = Path(read_result(rft)["extra"]["rft_result"]).parent / "log.jsonl"
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    run = next(r for r in map(tracking.read_offline_run, tracking.offline_runs("tiny", sweep["root"]))
               if r["name"] == rft.stem)
    assert len(steps) == 3
    assert [h["rft/loss"] for h in run["history"]] == pytest.approx([s["loss"] for s in steps], rel=1e-12)


def test_dashboard_panels_read_keys_that_the_runs_log(sweep):
    from state_reduction.wandb_workspace import build_workspace, panel_keys

    runs = list(map(tracking.read_offline_run, tracking.offline_runs("tiny", sweep["root"])))
    logged = {"config": set().union(*(r["config"] for r in runs)),
              "summary": set().union(*(r["summary"] for r in runs)),
              "history": set().union(*(h for r in runs for h in r["history"]))}
    for kind, keys in panel_keys().items():
        assert keys <= logged[kind], f"panels read {kind} keys no run logs: {sorted(keys - logged[kind])}"
    workspace = build_workspace("someone")
    assert [s.name for s in workspace.sections] == ["Perplexity vs compression", "Zero-shot", "RFT", "Speed"]


def test_mirror_is_idempotent(sweep):
    assert tracking.mirror_missing("tiny", sweep["root"]) == []


def test_online_without_login_logs_offline_with_one_notice(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    (tmp_path / "netrc").write_text("")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setattr(tracking, "_notices", set())
    assert tracking.wandb_mode() == "offline" and tracking.wandb_mode() == "offline"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not logged in" in err[0] and "make wandb-sync" in err[0]
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert tracking.wandb_mode() == "online"


def test_bad_mode_is_named(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "sometimes")
    with pytest.raises(tracking.TrackingError, match=r"offline, online, disabled, got 'sometimes' \(from \$WANDB_MODE\)"):
        tracking.wandb_mode()


def test_a_failing_wandb_never_stops_a_sweep(sweep, monkeypatch, capsys):
    import wandb

    def broken(**kwargs):
        raise RuntimeError("service unreachable")

    monkeypatch.setattr(wandb, "init", broken)
    monkeypatch.setattr(tracking, "_notices", set())
    path = sweep["paths"][0]
    before = path.read_bytes()
    assert tracking.mirror_result(path, results_root=sweep["root"] / "other", mode="offline") is None
    assert "could not log" in capsys.readouterr().err and path.read_bytes() == before


def test_disabled_logs_nothing(sweep, tmp_path):
    assert tracking.mirror_result(sweep["paths"][0], results_root=tmp_path, mode="disabled") is None
    assert not (tmp_path / "tiny" / "wandb").exists()


def test_sync_without_login_says_what_to_do(monkeypatch, tmp_path):
    (tmp_path / "tiny" / "wandb" / "wandb" / "offline-run-1-x").mkdir(parents=True)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    (tmp_path / "netrc").write_text("")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    with pytest.raises(tracking.TrackingError, match="wandb login"):
        tracking.sync("tiny", tmp_path)
    from state_reduction.wandb_workspace import create

    with pytest.raises(tracking.TrackingError, match="wandb login"):
        create("someone")


def test_reading_a_folder_that_is_no_run_is_an_error(tmp_path):
    with pytest.raises(tracking.TrackingError, match="no run-\\*.wandb file"):
        tracking.read_offline_run(tmp_path)
    (tmp_path / "run-x.wandb").write_bytes(b"garbage")
    with pytest.raises(tracking.TrackingError, match="not a wandb transaction log"):
        tracking.read_offline_run(tmp_path)


def test_the_wandb_command_prints_panels_and_names_a_bad_run_folder(tmp_path, capsys):
    import json

    from state_reduction.cli import main
    from state_reduction.wandb_workspace import PANELS

    assert main(["wandb", "workspace", "--print"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(PANELS))
    assert main(["wandb", "show", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("state-reduction wandb show: error:") and "no run-*.wandb file" in err and "\n" not in err


def test_the_index_is_updated_under_a_lock(sweep, tmp_path, monkeypatch):
    """Workers of one run-table (or Slurm tasks on one node) mirror into one index: an update waits for the lock,
    so no process drops another's entry."""
    import shutil
    import threading
    import time

    from filelock import FileLock

    monkeypatch.setenv("WANDB_MODE", "offline")
    root = tmp_path / "results"
    src = sweep["paths"][0]
    dst = root / "tiny" / src.parent.name / src.name
    dst.parent.mkdir(parents=True)
    shutil.copy(src, dst)
    index = tracking.wandb_dir("tiny", root) / tracking.MIRRORED_INDEX
    index.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(f"{index}.lock")
    lock.acquire()
    worker = threading.Thread(target=tracking.mirror_result, args=(dst,), kwargs={"results_root": root})
    worker.start()
    deadline = time.time() + 120
    while not tracking.offline_runs("tiny", root) and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # an offline run finishes in well under a second
    assert tracking.offline_runs("tiny", root)
    assert worker.is_alive() and not index.exists()  # the run is logged, the index waits for the lock
    lock.release()
    worker.join(60)
    assert list(json.loads(index.read_text())) == [read_result(dst)["config_key"]]
