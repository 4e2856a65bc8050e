"""Progress bars off a terminal: the CLI gives tqdm a 30 s default redraw interval, so lm-eval's bars (which
the project does not create) stop flooding make, Slurm and CI logs."""

import functools
import io
import time

import pytest
import tqdm.std as tqdm_std

from state_reduction.cli import QUIET_PROGRESS_INTERVAL_S, quiet_progress_off_tty


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def fresh_tqdm(monkeypatch):
    """tqdm as imported: without the default an earlier CLI call in this process may have added."""
    init = tqdm_std.tqdm.__dict__["__init__"]
    if isinstance(init, functools.partialmethod) and "mininterval" in init.keywords:
        init = functools.partialmethod(init.func, *init.args, **{k: v for k, v in init.keywords.items()
                                                                 if k not in ("mininterval", "delay")})
    monkeypatch.setattr(tqdm_std.tqdm, "__init__", init)
    monkeypatch.delenv("TQDM_MININTERVAL", raising=False)


def _redraws(**kw) -> int:
    out = io.StringIO()
    for _ in tqdm_std.tqdm(range(60), file=out, **kw):
        time.sleep(0.01)
    return out.getvalue().count("\r")


def test_off_a_terminal_short_bars_are_silent_and_long_ones_redraw_rarely(fresh_tqdm):
    loud = _redraws(mininterval=0.05)
    quiet_progress_off_tty(io.StringIO())
    once = tqdm_std.tqdm.__dict__["__init__"]
    quiet_progress_off_tty(io.StringIO())
    assert tqdm_std.tqdm.__dict__["__init__"] is once  # a second call adds nothing
    bar = tqdm_std.tqdm(range(3), file=io.StringIO())
    assert bar.mininterval == QUIET_PROGRESS_INTERVAL_S
    assert bar.delay == QUIET_PROGRESS_INTERVAL_S
    assert _redraws() == 0 < loud  # ended within the delay: not a line in the log
    assert tqdm_std.tqdm(range(3), file=io.StringIO(), mininterval=0.5).mininterval == 0.5
    shown = io.StringIO()  # a bar past its delay is drawn, and its last state written when it closes
    for _ in tqdm_std.tqdm(range(3), file=shown, delay=0.02, mininterval=0.01):
        time.sleep(0.03)
    assert "3/3" in shown.getvalue()


def test_on_a_terminal_or_with_a_users_interval_nothing_changes(fresh_tqdm, monkeypatch):
    quiet_progress_off_tty(_Terminal())
    assert tqdm_std.tqdm(range(3), file=io.StringIO()).mininterval == 0.1
    monkeypatch.setenv("TQDM_MININTERVAL", "2")
    quiet_progress_off_tty(io.StringIO())
    assert tqdm_std.tqdm(range(3), file=io.StringIO()).mininterval == 0.1  # tqdm read it at import, not here


def test_a_run_table_worker_sets_the_default_again(fresh_tqdm, monkeypatch):
    """run-table --workers spawns fresh interpreters, which do not inherit the CLI's default: the worker's
    initialiser sets it."""
    import sys

    import torch

    from state_reduction.pipeline.workers import _worker_init

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    threads = torch.get_num_threads()
    try:
        _worker_init(1)
    finally:
        torch.set_num_threads(threads)
    init = tqdm_std.tqdm.__dict__["__init__"]
    assert isinstance(init, functools.partialmethod) and init.keywords["mininterval"] == QUIET_PROGRESS_INTERVAL_S
