"""Kill test: prune (fresh and --overwrite), RFT (fresh and --overwrite), evaluate (building its suite, and
replacing a result) and a run-table sweep are SIGKILLed at the fault points of atomic.publishing (inside every
kind of save, in the middle of an overwrite) and at a few wall-clock moments. At each point:

- before any rerun: no result file is half-written (every one reads as a valid result), every published model
  folder is complete, and an overwritten artefact is present, complete, and either the old or the new one;
- after a rerun: the outputs are bit-identical to an uninterrupted run (weights files byte for byte; results by
  config key and every metric but timings), and no temporary folder or file is left anywhere.

The processes are forked from the test (imports paid once) and killed by a real SIGKILL; models are the tiny
DeltaNet of conftest.make_tiny_checkpoint."""

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
import yaml

from state_reduction import atomic
from state_reduction.atomic import MARKER, is_complete
from state_reduction.cli import main
from state_reduction.results import TIMING_METRICS, compare_results, read_result

pytestmark = pytest.mark.slow

PRUNE = ["--method", "l1", "--ratio", "0.5"]
RFT = ["--preset", "tiny", "--steps", "2", "--batch-size", "2", "--seq-len", "16", "--corpus", "ptb", "--threads", "1",
       "--wandb", "disabled", "--set", "progress=false", "--save-every", "1"]
EVAL = ["--suite", "tiny_ppl", "--limit", "1", "--batch-size", "128", "--max-length", "64"]
POINTS: dict[str, int] = {}  # scenario -> injection points run (printed by the last test)


def child(argv: list[str], fault: str | None = None, trace: Path | None = None, kill_after: float | None = None):
    """Run `state-reduction argv` in a forked process; returns its wait status."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        rc = 99
        try:
            if fault:
                os.environ["STATE_REDUCTION_FAULT"] = fault
            if trace:
                os.environ["STATE_REDUCTION_FAULT_TRACE"] = str(trace)
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            rc = main(argv)
        finally:
            os._exit(rc)
    if kill_after is not None:
        deadline = time.time() + kill_after
        while time.time() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]


def killed(status) -> bool:
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def ok(status) -> bool:
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def trace_points(argv: list[str], tmp: Path) -> list[str]:
    trace = tmp / "trace.txt"
    trace.unlink(missing_ok=True)
    assert ok(child(argv, trace=trace))
    return trace.read_text().split()


def leftovers(root: Path) -> list[Path]:
    return [Path(d) / n for d, dirs, files in os.walk(root) for n in dirs + files if atomic._NAME.match(n)]


def weights(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.safetensors"))}


def metrics(path: Path) -> dict:
    """A result's config (but where and how it was written: out, overwrite, resume) and every metric but timings."""
    r = read_result(path)
    config = {k: v for k, v in r["config"].items() if k not in ("out", "overwrite", "resume")}
    return {"config": config, **{k: v for k, v in r["metrics"].items() if k not in TIMING_METRICS}}


def check_folder(folder: Path, *allowed: Path) -> None:
    """Published whole and equal to one of `allowed` (weights byte for byte)."""
    assert is_complete(folder), f"{folder} is visible but not complete"
    assert any(weights(folder) == weights(a) for a in allowed), f"{folder} is neither the old nor the new artefact"


def settle(parent: Path) -> None:
    """Where the filesystem swaps two folders atomically (renameat2), an overwritten folder is never absent: check
    it as the kill left it. Elsewhere the next run first restores a folder set aside (remove_stale): do that."""
    probe = parent / ".swap-probe"
    (probe / "a").mkdir(parents=True)
    (probe / "b").mkdir()
    swaps = atomic._exchange(probe / "a", probe / "b")
    shutil.rmtree(probe)
    if not swaps:
        atomic.remove_stale(parent)


@pytest.fixture(scope="module")
def ws(tmp_path_factory, tiny_checkpoint):
    """Reference (uninterrupted) runs of every scenario, done in this process, which also warms every import."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["WANDB_MODE"] = "disabled"
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("kill")
    data = root / "data"
    data.mkdir()
    from state_reduction.data import resolve_data_dir

    shared = resolve_data_dir(None)
    os.symlink(shared / "corpora", data / "corpora")
    shutil.copytree(shared / "tokens", data / "tokens")
    ref = root / "ref"
    ref.mkdir()
    w = {"root": root, "model": tiny_checkpoint, "data": data, "ref": ref}
    assert main(["prune", str(tiny_checkpoint), *PRUNE, "--out", str(ref / "pruned")]) == 0
    assert main(["prune", str(tiny_checkpoint), "--method", "l1", "--ratio", "0.25", "--out", str(ref / "old")]) == 0
    assert main(["rft", str(ref / "pruned"), "--teacher", str(tiny_checkpoint), "--out", str(ref / "rft"), *RFT]) == 0
    assert main(["rft", str(ref / "pruned"), "--teacher", str(tiny_checkpoint), "--out", str(ref / "rft_old"), *RFT,
                 "--lr", "0.01"]) == 0
    assert main(["evaluate", str(ref / "pruned"), *EVAL, "--data-dir", str(data), "--out", str(ref / "eval.json")]) == 0
    assert main(["evaluate", str(ref / "old"), *EVAL, "--data-dir", str(data), "--out", str(ref / "eval_old.json")]) == 0
    spec = {"experiment": "kill_test", "methods": ["l1"], "select": "kq",
            "profiles": {"tiny": {
                "models": {"deltanet": {"path": str(tiny_checkpoint), "stands_for": ["DeltaNet 370M"]}},
                "prune": {"calib": "ptb", "n_calib": 2, "seq_len": 16, "seed": 0, "batch_size": 2},
                "rft": {"preset": "tiny", "steps": 2, "batch_size": 2, "seq_len": 16, "save_every": 1},
                "evaluate": {"suite": "tiny_ppl", "batch_size": 128, "max_length": 64, "limit": 1}}},
            "tables": {"table20": {"models": ["DeltaNet 370M"], "ratios": [0.5], "rft": [True]}}}
    (root / "kill_test.yaml").write_text(yaml.safe_dump(spec))
    w["sweep"] = lambda results: ["run-table", "table20", "--experiment", str(root / "kill_test.yaml"),
                                  "--results-root", str(results), "--data-dir", str(data)]
    assert main(w["sweep"](ref / "results")) == 0
    return w


def fresh(ws, name: str) -> Path:
    d = ws["root"] / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    return d


def run_points(ws, scenario: str, argv, points, prepare, after_kill, rerun, check, timed=()):
    """Kill at each fault point ("*:N") and wall-clock moment, check, rerun, check again."""
    runs = [(f"*:{i}", None) for i in points] + [(None, t) for t in timed]
    for n, (fault, after) in enumerate(runs):
        d = fresh(ws, f"{scenario}-{n}")
        prepare(d)
        status = child(argv(d), fault=fault, kill_after=after)
        if fault is not None:
            assert killed(status), f"{scenario} {fault}: not killed (status {status})"
        after_kill(d)
        assert ok(child(rerun(d))), f"{scenario} {fault or after}: the rerun failed"
        check(d)
        assert leftovers(d) == [], f"{scenario} {fault or after}: left {leftovers(d)}"
        shutil.rmtree(d)
    POINTS[scenario] = len(runs)


def run_chain(ws, scenario: str, argv, ks, prepare, after_kill, check):
    """One workspace killed again and again: each (re)run is killed at its own k-th fault point, the next one
    resumes what the last left, until a run completes (or `ks` is spent and a last run finishes the work).
    Cheaper than one rerun per point where every run pays a long computation (evaluation, a sweep)."""
    d = fresh(ws, scenario.replace(" ", "_"))
    prepare(d)
    kills = 0
    for k in ks:
        status = child(argv(d), fault=f"*:{k}")
        if not killed(status):
            assert ok(status), f"{scenario}: run with fault *:{k} failed"
            break
        kills += 1
        after_kill(d)
    else:
        assert ok(child(argv(d))), f"{scenario}: the last rerun failed"
    check(d)
    assert leftovers(d) == [], f"{scenario}: left {leftovers(d)}"
    POINTS[scenario] = kills
    return kills


def test_prune_fresh_and_overwrite(ws, tmp_path):
    ref, model = ws["ref"], ws["model"]
    argv = lambda d: ["prune", str(model), *PRUNE, "--out", str(d / "out"), "--overwrite"]  # noqa: E731
    n = len(trace_points(argv(fresh(ws, "trace")), tmp_path))

    def after_fresh(d):
        if (d / "out").exists():
            check_folder(d / "out", ref / "pruned")

    def check(d):
        assert weights(d / "out") == weights(ref / "pruned") and is_complete(d / "out")
        assert json.loads((d / "out" / "selection.json").read_text())["selection"] == \
            json.loads((ref / "pruned" / "selection.json").read_text())["selection"]
        assert metrics(d / "out" / "prune_result.json") == metrics(ref / "pruned" / "prune_result.json")

    run_points(ws, "prune", argv, range(1, n + 1), lambda d: None, after_fresh, argv, check)

    def old_in_place(d):
        shutil.copytree(ref / "old", d / "out")

    def after_overwrite(d):
        settle(d)
        check_folder(d / "out", ref / "old", ref / "pruned")  # never lost, never half

    # --overwrite starts over: each run of the chain is killed at the k-th point of a whole prune
    run_chain(ws, "prune --overwrite", argv, range(1, n + 1), old_in_place, after_overwrite, check)
    assert POINTS["prune --overwrite"] == n


def test_rft_fresh_and_overwrite(ws, tmp_path):
    ref, model = ws["ref"], ws["model"]
    argv = lambda d: ["rft", str(ref / "pruned"), "--teacher", str(model), "--out", str(d / "run"), *RFT]  # noqa: E731
    rerun = lambda d: argv(d) + ["--resume"]  # noqa: E731
    overwrite = lambda d: argv(d) + ["--overwrite"]  # noqa: E731
    n = len(trace_points(argv(fresh(ws, "trace")), tmp_path))

    def after_kill(d, old=None):
        run = d / "run"
        if (run / "model").exists():
            check_folder(run / "model", *filter(None, (old, ref / "rft" / "model")))
        if (run / "rft_result.json").exists():
            r = read_result(run / "rft_result.json")  # whole, never half-written
            if old is None or r["extra"]["config_hash"] == read_result(ref / "rft" / "rft_result.json")["extra"]["config_hash"]:
                assert is_complete(run / "model") and weights(run / "model") == weights(ref / "rft" / "model")
        if (run / "checkpoints" / "state.pt").exists():
            torch.load(run / "checkpoints" / "state.pt", weights_only=False)  # whole

    def check(d):
        run = d / "run"
        assert weights(run / "model") == weights(ref / "rft" / "model") and is_complete(run / "model")
        assert metrics(run / "rft_result.json") == metrics(ref / "rft" / "rft_result.json")
        assert read_result(run / "rft_result.json")["metrics"]["tokens_per_s"] > 0

    run_points(ws, "rft", argv, range(1, n + 1, 3), lambda d: None, after_kill, rerun, check, timed=(2.0,))

    def old_run(d):
        shutil.copytree(ref / "rft_old", d / "run")

    def after_overwrite(d):
        settle(d / "run")
        after_kill(d, old=ref / "rft_old" / "model")
        assert (d / "run" / "model").exists() and (d / "run" / "rft_result.json").exists()  # the old run is kept

    run_chain(ws, "rft --overwrite", overwrite, range(2, n + 1, 3), old_run, after_overwrite, check)
    assert POINTS["rft --overwrite"] == len(range(2, n + 1, 3))


def test_evaluate_building_its_suite_and_replacing_a_result(ws, tmp_path):
    ref = ws["ref"]

    def data_dir(d):
        (d / "data").mkdir(exist_ok=True)
        for name in ("corpora", "tokens"):
            if not (d / "data" / name).exists():
                os.symlink(ws["data"] / name, d / "data" / name)
        return d / "data"

    argv = lambda d: ["evaluate", str(ref / "pruned"), *EVAL, "--data-dir", str(data_dir(d)),  # noqa: E731
                      "--out", str(d / "eval.json")]

    def after_kill(d):
        if (d / "eval.json").exists():
            assert metrics(d / "eval.json") in (metrics(ref / "eval.json"), metrics(ref / "eval_old.json"))
        manifest = d / "data" / "eval" / "tiny" / "manifest.json"
        if manifest.exists():
            json.loads(manifest.read_text())  # whole

    def check(d):
        assert metrics(d / "eval.json") == metrics(ref / "eval.json")

    # building the suite (2 files and the manifest, 4 points each), then the result file: one chain walks them
    kills = run_chain(ws, "evaluate", argv, (2, 5, 3, 6, 4, 4, 3), lambda d: None, after_kill, check)
    assert kills >= 5

    def old_result(d):
        shutil.copy(ref / "eval_old.json", d / "eval.json")
        shutil.copytree(ws["data"] / "eval", data_dir(d) / "eval")  # suite built: only the result is written

    def after_replace(d):
        assert (d / "eval.json").exists()  # the old result stays until the new one replaces it
        after_kill(d)

    run_chain(ws, "evaluate over a result", argv, (1, 2, 3, 4), old_result, after_replace, check)
    assert POINTS["evaluate over a result"] == 4


def test_run_table_sweep(ws, tmp_path):
    ref = ws["ref"]
    argv = lambda d: ws["sweep"](d / "results")  # noqa: E731
    names = trace_points(argv(fresh(ws, "trace")), tmp_path)
    models = [i + 1 for i, name in enumerate(names) if name in ("publish:synced", "publish:renamed")]
    points = sorted({models[len(models) // 3], models[2 * len(models) // 3], len(names)})

    def after_kill(d):
        out = d / "results" / "tiny" / "kill_test"
        for path in out.glob("*.json"):
            read_result(path)  # every result file is whole
        for folder in (out / "models").glob("*") if (out / "models").is_dir() else ():
            if not atomic._NAME.match(folder.name) and (folder / MARKER).exists():
                assert is_complete(folder)

    def check(d):
        out, want = d / "results" / "tiny" / "kill_test", ref / "results" / "tiny" / "kill_test"
        assert compare_results(out, want) == []
        got = {p.name: weights(p) for p in (out / "models").iterdir()}
        assert got == {p.name: weights(p) for p in (want / "models").iterdir()}

    run_points(ws, "run-table", argv, points, lambda d: None, after_kill, argv, check)
    kills = run_chain(ws, "run-table chain", argv, (5, 9, 3, 7, 12, 6, 8, 4, 10, 5, 11, 7), lambda d: None, after_kill,
                      check)
    assert kills >= 8


def test_report_injection_points():
    """Prints how many injection points each scenario ran (pytest -rP); every scenario must have run."""
    print(json.dumps(POINTS))
    assert len(POINTS) == 8 and all(v >= 3 for v in POINTS.values()), POINTS
    print(f"{sum(POINTS.values())} injection points")
