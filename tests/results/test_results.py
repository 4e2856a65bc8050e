"""The result schema, atomic writes that refuse foreign files, and sweeps that resume after a kill."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from state_reduction.results import (
    SCHEMA_VERSION,
    ResultsError,
    build_result,
    config_key,
    read_result,
    run_sweep,
    write_result,
)


def record(config, **metrics):
    return build_result("evaluate", profile="tiny", experiment="t", config=config, metrics=metrics,
                        wall_time_s=0.1, seeds={"seed": 0})


def test_record_carries_schema_provenance_and_config_key(tmp_path):
    r = record({"a": 1}, ppl=3.0)
    assert r["schema_version"] == SCHEMA_VERSION and r["config_key"] == config_key({"a": 1})
    assert r["provenance"]["git_commit"] and "torch" in r["provenance"]["packages"]
    assert r["peak_memory"]["rss_bytes"] > 0
    path = write_result(tmp_path / "r.json", r)
    assert read_result(path) == json.loads(json.dumps(r))


def test_config_key_ignores_order_and_sees_values():
    assert config_key({"a": 1, "b": 2}) == config_key({"b": 2, "a": 1}) != config_key({"a": 1, "b": 3})


@pytest.mark.parametrize("content", [
    json.dumps({"schema": "state-reduction/result", "schema_version": SCHEMA_VERSION + 1}),
    json.dumps({"kind": "evaluate", "metrics": {}}),
    "not json at all",
])
def test_a_foreign_file_is_never_overwritten(tmp_path, content):
    path = tmp_path / "r.json"
    path.write_text(content)
    with pytest.raises(ResultsError, match=str(path)):
        write_result(path, record({"a": 1}))
    assert path.read_text() == content


def test_reading_another_schema_version_names_the_file(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({**record({"a": 1}), "schema_version": 0}))
    with pytest.raises(ResultsError, match="old.json: schema version 0"):
        read_result(path)
    with pytest.raises(ResultsError, match="lacks metrics"):
        write_result(tmp_path / "x.json", {k: v for k, v in record({"a": 1}).items() if k != "metrics"})


def test_sweep_skips_finished_cells_and_reruns_changed_ones(tmp_path):
    calls = []

    def run(name, config):
        calls.append(name)
        return record(config, value=config["x"])

    cells = [(f"c{i}", {"x": i}) for i in range(3)]
    run_sweep(cells, run, tmp_path, progress=False)
    run_sweep(cells, run, tmp_path, progress=False)
    assert calls == ["c0", "c1", "c2"]
    run_sweep([("c0", {"x": 0}), ("c1", {"x": 10}), ("c2", {"x": 2})], run, tmp_path, progress=False)
    assert calls == ["c0", "c1", "c2", "c1"]
    assert read_result(tmp_path / "c1.json")["metrics"] == {"value": 10}
    with pytest.raises(ValueError, match="repeated: c0"):
        run_sweep([("c0", {"x": 0}), ("c0", {"x": 1})], run, tmp_path, progress=False)


SWEEP_SCRIPT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from state_reduction.results import build_result, run_sweep

    out, log = Path(sys.argv[1]), Path(sys.argv[2])

    def run(name, config):
        with open(log, "a") as f:
            f.write(name + "\\n")
        time.sleep(0.4)
        return build_result("bench", profile="tiny", experiment="kill", config=config,
                            metrics={"square": config["i"] ** 2}, wall_time_s=0.4)

    run_sweep([(f"cell{i}", {"i": i}) for i in range(8)], run, out, progress=False)
""")


@pytest.mark.slow
def test_a_killed_sweep_resumes_without_losing_or_repeating_finished_cells(tmp_path):
    script, out, log = tmp_path / "sweep.py", tmp_path / "out", tmp_path / "started.log"
    script.write_text(SWEEP_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(out), str(log)], start_new_session=True)
    deadline = time.time() + 120
    while len(list(out.glob("cell*.json"))) < 3:
        assert proc.poll() is None and time.time() < deadline, "sweep ended or stalled before the kill"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = {p.stem for p in out.glob("cell*.json")}
    assert 3 <= len(done_before) < 8, "the kill should land midway"
    subprocess.run([sys.executable, str(script), str(out), str(log)], check=True, timeout=120)
    started = log.read_text().split()
    assert sorted(p.stem for p in out.glob("cell*.json")) == [f"cell{i}" for i in range(8)]
    for i in range(8):
        r = read_result(out / f"cell{i}.json")
        assert r["metrics"] == {"square": i * i}
        # finished cells ran once; the cell in flight at the kill ran at most twice; none was lost
        assert started.count(f"cell{i}") == (1 if f"cell{i}" in done_before else started.count(f"cell{i}"))
        assert 1 <= started.count(f"cell{i}") <= 2
    assert sum(started.count(f"cell{i}") == 2 for i in range(8)) <= 1
    assert not list(out.glob(".*.tmp"))
