"""allocator.py: the pipeline's glibc heap setting, where the CLI applies it and where it does not (bench)."""

import platform
import subprocess
import sys

import pytest

from state_reduction import allocator, cli
from state_reduction.allocator import PIPELINE_MMAP_THRESHOLD, PIPELINE_TRIM_THRESHOLD, AllocatorError


@pytest.fixture
def calls(monkeypatch):
    seen = []
    monkeypatch.setattr(allocator, "_mallopt", lambda mmap, trim: seen.append((mmap, trim)) or True)
    return seen


def test_pipeline_heap_sets_the_bounded_thresholds(calls, monkeypatch):
    monkeypatch.delenv(allocator.ENV, raising=False)
    assert allocator.pipeline_heap() == "heap below 512 MiB, trimmed above 1024 MiB"
    assert calls == [(PIPELINE_MMAP_THRESHOLD, PIPELINE_TRIM_THRESHOLD)]


def test_default_keeps_glibc_and_bad_values_are_one_line(calls, monkeypatch):
    monkeypatch.setenv(allocator.ENV, "default")
    assert allocator.pipeline_heap() == "default" and calls == []
    monkeypatch.setenv(allocator.ENV, "heap")
    with pytest.raises(AllocatorError, match="STATE_REDUCTION_MALLOC must be 'pipeline' or 'default', got 'heap'"):
        allocator.pipeline_heap()


def test_cli_applies_it_except_for_bench(calls, monkeypatch, capsys):
    monkeypatch.delenv(allocator.ENV, raising=False)
    # a command that fails on its input after the allocator is set: the setting came first
    assert cli.main(["evaluate", "/nonexistent-model-dir", "--out", "/tmp/x.json"]) == 2
    assert calls == [(PIPELINE_MMAP_THRESHOLD, PIPELINE_TRIM_THRESHOLD)]
    calls.clear()
    assert cli.main(["bench", "recurrence", "--levels", "nonsense"]) == 2
    assert calls == [], "bench measures glibc's default allocator (or its own --malloc-heap)"
    monkeypatch.setenv(allocator.ENV, "heap")
    assert cli.main(["evaluate", "/nonexistent-model-dir", "--out", "/tmp/x.json"]) == 2
    assert "STATE_REDUCTION_MALLOC must be 'pipeline' or 'default'" in capsys.readouterr().err


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_takes_the_setting_in_a_fresh_process():
    code = "from state_reduction import allocator; print(allocator.pipeline_heap())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "heap below 512 MiB, trimmed above 1024 MiB"
