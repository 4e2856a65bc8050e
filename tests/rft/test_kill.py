"""A real kill: `state-reduction rft` SIGKILLed after its first checkpoint, then `--resume`d, ends with the
same adapters, loss history and merged weights as an uninterrupted run."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from state_reduction.rft.trainer import RESULT_FILE, STATE_FILE

SETTINGS = ["--preset", "tiny", "--steps", "60", "--batch-size", "2", "--seq-len", "32", "--save-every", "5",
            "--corpus", "ptb", "--threads", "1", "--wandb", "disabled", "--set", "warmup_steps=1"]


def command(student, teacher, out, *extra):
    return [sys.executable, "-m", "state_reduction.cli", "rft", student, "--teacher", teacher, "--out", str(out),
            *SETTINGS, *extra]


@pytest.mark.slow
def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path, pruned_deltanet, dense_deltanet):
    env = dict(os.environ, WANDB_MODE="disabled")
    killed = tmp_path / "killed"
    proc = subprocess.Popen(command(pruned_deltanet, dense_deltanet, killed), env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while not (killed / STATE_FILE).exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.time() < deadline, "no checkpoint within 300 s"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / RESULT_FILE).exists(), "the run finished before the kill; the test proves nothing"
    step_at_kill = torch.load(killed / STATE_FILE, weights_only=False)["step"]
    assert 5 <= step_at_kill < 60

    subprocess.run(command(pruned_deltanet, dense_deltanet, killed, "--resume"), env=env, check=True,
                   capture_output=True, timeout=600)
    straight = tmp_path / "straight"
    subprocess.run(command(pruned_deltanet, dense_deltanet, straight), env=env, check=True, capture_output=True,
                   timeout=600)
    a = torch.load(straight / STATE_FILE, weights_only=False)
    b = torch.load(killed / STATE_FILE, weights_only=False)
    assert a["step"] == b["step"] == 60
    assert all(torch.equal(a["trainable"][k], b["trainable"][k]) for k in a["trainable"])
    assert [r["loss"] for r in a["history"]] == [r["loss"] for r in b["history"]]
    import json

    ra, rb = (json.loads((d / RESULT_FILE).read_text()) for d in (straight, killed))
    assert ra["model"]["weights_sha256"] == rb["model"]["weights_sha256"]
