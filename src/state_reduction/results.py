"""One result schema for every run (prune, evaluate, rft, analyze, bench) and sweeps keyed by config hash.

A result is a JSON object:

    schema            "state-reduction/result"
    schema_version    SCHEMA_VERSION
    kind              prune | evaluate | rft | analyze | bench
    profile           tiny | paper
    experiment        the experiment folder it belongs to (table20, deltanet_gdn, speed, ...)
    config            the fully resolved configuration of the run
    config_key        sha256 of `config` (16 hex digits): what a sweep uses to find finished runs
    metrics           flat name -> number (or null where undefined)
    model             {path, weights_sha256} of the model measured, or null
    data              name -> sha256 of every data file read
    seeds             name -> seed
    wall_time_s, peak_memory  {rss_bytes, cuda_bytes}
    provenance        git commit and dirty flag, package versions, hardware (provenance.collect_provenance)
    created           UTC timestamp
    extra             anything kind-specific (per-layer details, rows of a benchmark, ...)

Files are written atomically; a file of another schema or schema version is never overwritten.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from tqdm.auto import tqdm

from state_reduction.atomic import check_output, remove_stale, write_json_atomic
from state_reduction.errors import Error, InputError, MissingInputError
from state_reduction.hashing import config_key
from state_reduction.peak_memory import process_peaks
from state_reduction.provenance import REPO_ROOT, collect_provenance

SCHEMA = "state-reduction/result"
SCHEMA_VERSION = 1
KINDS = ("prune", "evaluate", "rft", "analyze", "bench")
PROFILES = ("tiny", "paper")
REQUIRED = ("schema", "schema_version", "kind", "profile", "experiment", "config", "config_key", "metrics",
            "model", "data", "seeds", "wall_time_s", "peak_memory", "provenance", "created")


class ResultsError(Error, RuntimeError):
    """A result file is malformed or of another schema; the message names the path."""


def results_dir(profile: str, experiment: str, root: str | Path | None = None) -> Path:
    if profile not in PROFILES:
        raise InputError(f"profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    return Path(root or REPO_ROOT / "results") / profile / experiment


def weights_sha256(model_dir: str | Path) -> str:
    """sha256 over the checkpoint's *.safetensors files in name order."""
    model_dir = Path(model_dir)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise MissingInputError(f"no *.safetensors weights in {model_dir}")
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()


def _display_path(path: str | Path) -> str:
    p = Path(path).resolve()
    return str(p.relative_to(REPO_ROOT)) if p.is_relative_to(REPO_ROOT) else str(path)


def model_entry(model_dir: str | Path) -> dict:
    """{path, weights_sha256, tokenizer_sha256} for a local checkpoint; a hub id (no such folder) gets None
    hashes (the hub revision is resolved at load time)."""
    p = Path(model_dir)
    if p.is_dir():
        tok = p / "tokenizer.json"
        tokenizer = hashlib.sha256(tok.read_bytes()).hexdigest() if tok.is_file() else None
        return {"path": _display_path(p), "weights_sha256": weights_sha256(p), "tokenizer_sha256": tokenizer}
    return {"path": str(model_dir), "weights_sha256": None, "tokenizer_sha256": None}


def build_result(kind: str, *, profile: str, experiment: str, config: dict, metrics: dict,
                 model: dict | None = None, data: dict | None = None, seeds: dict | None = None,
                 wall_time_s: float, extra: dict | None = None) -> dict:
    if kind not in KINDS:
        raise InputError(f"result kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if profile not in PROFILES:
        raise InputError(f"profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    return {
        "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "kind": kind, "profile": profile,
        "experiment": experiment, "config": config, "config_key": config_key(config), "metrics": metrics,
        "model": model, "data": data or {}, "seeds": seeds or {}, "wall_time_s": round(float(wall_time_s), 3),
        "peak_memory": process_peaks(), "provenance": collect_provenance(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "extra": extra or {},
    }


def validate(record: dict, path: str | Path = "<record>") -> dict:
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        raise ResultsError(f"{path}: not a {SCHEMA} file (schema {record.get('schema') if isinstance(record, dict) else None!r})")
    if record.get("schema_version") != SCHEMA_VERSION:
        raise ResultsError(f"{path}: schema version {record.get('schema_version')!r}, this code reads and writes "
                           f"version {SCHEMA_VERSION}; move the file away or rerun with the matching code")
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        raise ResultsError(f"{path}: result lacks {', '.join(missing)}")
    if record["kind"] not in KINDS:
        raise ResultsError(f"{path}: unknown kind {record['kind']!r}")
    return record


def read_result(path: str | Path) -> dict:
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ResultsError(f"{path}: not valid JSON ({e})",
                           hint="delete it (a rerun redoes that run) or restore it from a good copy") from None
    return validate(record, path)


def check_result_path(path: str | Path, option: str = "--out") -> Path:
    """Before compute: a result can be written at `path` (atomic.check_output; an existing file is replaced only
    if it is a result of this schema version, as write_result does)."""
    path = check_output(path, directory=False, overwrite=True, option=option)
    if path.exists():
        _check_replaceable(path)
    return path


def _check_replaceable(path: Path) -> None:
    try:
        old = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ResultsError(f"{path}: exists and is not a result file; refusing to overwrite it",
                           hint="move it away or choose another path") from None
    if not isinstance(old, dict) or old.get("schema") != SCHEMA or old.get("schema_version") != SCHEMA_VERSION:
        found = old.get("schema_version") if isinstance(old, dict) else None
        raise ResultsError(f"{path}: exists with another schema or version ({found!r}, expected "
                           f"{SCHEMA_VERSION}); refusing to overwrite it", hint="move it away or choose another path")


def write_result(path: str | Path, record: dict) -> Path:
    """Atomically write `record`; refuse to replace a file that is not a result of this schema version."""
    path = Path(path)
    validate(record, path)
    if path.exists():
        _check_replaceable(path)
    write_json_atomic(path, record)
    return path


@contextlib.contextmanager
def measure():
    """Time a block: `with measure() as m: ...` then m["wall_time_s"]."""
    box = {"wall_time_s": None}
    t0 = time.perf_counter()
    try:
        yield box
    finally:
        box["wall_time_s"] = time.perf_counter() - t0


def finished(path: str | Path, key: str) -> bool:
    """True when `path` holds a valid result with this config key. A file of another schema raises."""
    path = Path(path)
    if not path.exists():
        return False
    return read_result(path)["config_key"] == key


def run_sweep(cells: Iterable[tuple[str, dict]], run: Callable[[str, dict], dict], out_dir: str | Path,
              progress: bool = True, on_result: Callable[[Path, dict], None] | None = None) -> list[Path]:
    """Run each (name, config) cell whose result `out_dir/name.json` is missing or has another config key.

    `run(name, config)` returns a complete result record (build_result); it is written atomically as soon
    as the cell finishes, so a sweep killed midway loses at most the cell in progress and a rerun skips
    every finished one; then `on_result(path, record)` is called (e.g. to mirror it to wandb). Cell names
    must be unique. Under torchrun only rank 0 writes (every rank runs the cell)."""
    cells = list(cells)
    names = [n for n, _ in cells]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise InputError(f"sweep cell names must be unique; repeated: {', '.join(dup)}")
    out_dir = Path(out_dir)
    remove_stale(out_dir)
    if out_dir.is_dir():
        remove_stale(out_dir / "models")
    paths, todo = [], []
    for name, config in cells:
        path = out_dir / f"{name}.json"
        paths.append(path)
        if not finished(path, config_key(config)):
            todo.append((name, config, path))
    for name, config, path in tqdm(todo, desc=f"{out_dir.name} runs", disable=not progress or not todo):
        record = run(name, config)
        if record.get("config_key") != config_key(config):
            raise ResultsError(f"{path}: the run returned a record for another config (key "
                               f"{record.get('config_key')} != {config_key(config)})")
        if int(os.environ.get("RANK", "0")) != 0:
            continue
        write_result(path, record)
        if on_result is not None:
            on_result(path, record)
    return paths


TIMING_METRICS = ("wall_time_s", "tokens_per_s", "train_time_s", "eval_time_s")


def compare_results(dir_a: str | Path, dir_b: str | Path, rel_tol: float = 0.0) -> list[str]:
    """Differences between two result folders (e.g. a Slurm run and a local run of the same sweep): files on
    one side only, other config keys, other metrics (timings excluded; `rel_tol` 0 asks for equality)."""
    a = {p.name: p for p in Path(dir_a).glob("*.json")}
    b = {p.name: p for p in Path(dir_b).glob("*.json")}
    problems = [f"only in {dir_a}: {n}" for n in sorted(a.keys() - b.keys())]
    problems += [f"only in {dir_b}: {n}" for n in sorted(b.keys() - a.keys())]
    for name in sorted(a.keys() & b.keys()):
        ra, rb = read_result(a[name]), read_result(b[name])
        if ra["config_key"] != rb["config_key"]:
            problems.append(f"{name}: config key {ra['config_key']} != {rb['config_key']}")
            continue
        ma = {k: v for k, v in ra["metrics"].items() if k not in TIMING_METRICS}
        mb = {k: v for k, v in rb["metrics"].items() if k not in TIMING_METRICS}
        for k in sorted(ma.keys() | mb.keys()):
            va, vb = ma.get(k), mb.get(k)
            same = va == vb or (isinstance(va, float) and isinstance(vb, float)
                                and math.isclose(va, vb, rel_tol=rel_tol, abs_tol=0.0))
            if not same:
                problems.append(f"{name}: {k} {va!r} != {vb!r}")
    return problems
