"""wandb mirror of the result files (STYLE point 6: the JSON results are the source of truth; wandb mirrors them).

Every result is one wandb run in project `state-reduction` ($WANDB_PROJECT overrides), group
`<profile>/<experiment>`, job type = its stage, named after its result file, with the id `sr-<config key>`
and tags for the experiment, profile, family (model_type), model, method, ratio (`r50`), stage and RFT state
(`dense`, `pre-rft`, `post-rft`). Its config is the resolved config plus provenance; its summary the metrics;
an RFT run also carries the loss curve of its `log.jsonl` as history.

Mode: $WANDB_MODE (offline, online, disabled), default offline. Online without credentials logs offline with
a one-line notice; a failing wandb never stops a sweep. Offline runs live in `results/<profile>/wandb/`;
`make wandb-sync` uploads them. `read_offline_run` reads one back (tests, `state-reduction wandb show`).
"""

from __future__ import annotations

import json
import netrc
import os
import struct
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

from state_reduction.atomic import write_json_atomic
from state_reduction.errors import Error
from state_reduction.provenance import REPO_ROOT
from state_reduction.results import ResultsError, read_result

PROJECT = "state-reduction"
MODES = ("offline", "online", "disabled")
MIRRORED_INDEX = "mirrored.json"
_notices: set[str] = set()


class TrackingError(Error, ValueError):
    """A wandb request that cannot be carried out; the message says why and what to do."""


def _notice(text: str) -> None:
    if text not in _notices:
        _notices.add(text)
        print(f"wandb: {text}", file=sys.stderr)


def logged_in() -> bool:
    """True when wandb has credentials: $WANDB_API_KEY or a ~/.netrc entry for the wandb host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def wandb_mode(requested: str | None = None) -> str:
    """The mode to log in: `requested`, else $WANDB_MODE, else offline; online without credentials -> offline."""
    mode = requested or os.environ.get("WANDB_MODE") or "offline"
    if mode == "dryrun":
        mode = "offline"
    if mode not in MODES:
        raise TrackingError(f"wandb mode must be one of {', '.join(MODES)}, got {mode!r} (from "
                            f"{'the argument' if requested else '$WANDB_MODE'})")
    if mode == "online" and not logged_in():
        _notice("not logged in (no $WANDB_API_KEY, no ~/.netrc entry): logging offline; "
                "`wandb login`, then `make wandb-sync` uploads the offline runs")
        return "offline"
    return mode


def wandb_dir(profile: str, results_root=None) -> Path:
    return Path(results_root or REPO_ROOT / "results") / profile / "wandb"


def _family(record: dict) -> str | None:
    for path in ((record.get("model") or {}).get("path"), (record.get("config") or {}).get("model_path")):
        if path:
            config = Path(path) if Path(path).is_absolute() else REPO_ROOT / path
            try:
                return json.loads((config / "config.json").read_text())["model_type"]
            except (OSError, ValueError, KeyError):
                continue
    return None


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}/"))
        elif v is None or isinstance(v, (int, float, str, bool)):
            out[f"{prefix}{k}"] = v
    return out


def run_identity(path: Path, record: dict) -> dict:
    """wandb.init's project, group, job_type, name, id and tags for the result `record` stored at `path`."""
    c = record.get("config") or {}
    stage = c.get("stage") or record.get("kind", "result")
    tags = [f"experiment:{record.get('experiment')}", f"profile:{record.get('profile')}", f"stage:{stage}",
            f"kind:{record.get('kind')}"]
    family = _family(record)
    if family:
        tags.append(f"family:{family}")
    if "model" in c:
        tags.append(f"model:{c['model']}")
    if "method" in c:
        tags.append(f"method:{c['method']}")
    if "ratio" in c and isinstance(c["ratio"], (int, float)):
        tags.append(f"r{round(c['ratio'] * 100)}")
    if stage == "baseline" or c.get("method") == "baseline":
        tags.append("dense")
    elif "rft" in c:
        tags.append("post-rft" if c["rft"] else "pre-rft")
    elif stage == "rft":
        tags.append("rft")
    return {"project": os.environ.get("WANDB_PROJECT", PROJECT),
            "group": f"{record.get('profile')}/{record.get('experiment')}", "job_type": stage,
            "name": Path(path).stem, "id": f"sr-{record['config_key']}", "tags": [t[:64] for t in tags]}


def _rft_history(record: dict) -> list[dict]:
    result = (record.get("extra") or {}).get("rft_result")
    log = Path(result).parent / "log.jsonl" if result else None
    if log is None or not log.is_file():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def _index(profile: str, results_root) -> tuple[Path, dict]:
    path = wandb_dir(profile, results_root) / MIRRORED_INDEX
    try:
        return path, json.loads(path.read_text())
    except (OSError, ValueError):
        return path, {}


def mirror_result(path: str | Path, record: dict | None = None, results_root=None, mode: str | None = None) -> str | None:
    """Log one result file as a wandb run; return the run's folder (None when disabled or wandb failed)."""
    path = Path(path)
    record = record or read_result(path)
    mode = wandb_mode(mode)
    if mode == "disabled":
        return None
    folder = wandb_dir(record["profile"], results_root)
    folder.mkdir(parents=True, exist_ok=True)
    ident = run_identity(path, record)
    config = {**(record.get("config") or {}), "config_key": record["config_key"], "result_file": str(path),
              "kind": record.get("kind"), "provenance": record.get("provenance", {}), "model_entry": record.get("model", {}),
              "data": record.get("data", {}), "seeds": record.get("seeds", {})}
    os.environ.setdefault("WANDB_SILENT", "true")
    try:
        # lazy: start-up time (wandb only when a result is mirrored)
        import wandb

        run = wandb.init(mode=mode, dir=str(folder), config=config, reinit="finish_previous", resume="allow",
                         settings=wandb.Settings(silent=True, console="off", save_code=False, x_disable_stats=True),
                         **ident)
        for rec in _rft_history(record):
            run.log({f"rft/{k}": v for k, v in rec.items() if k != "step" and isinstance(v, (int, float))},
                    step=int(rec["step"]))
        run.summary.update({k: v for k, v in _flatten(record.get("metrics", {})).items() if v is not None})
        run.summary.update({"result_wall_time_s": record.get("wall_time_s")})
        run_dir = str(Path(run.dir).parent)
        run.finish()
    except Exception as e:  # noqa: BLE001 -- wandb must never stop a sweep: the JSON result is already written
        _notice(f"could not log {path.name} ({type(e).__name__}: {e}); the result file is unaffected")
        return None
    from filelock import FileLock  # lazy, as wandb: only when a result is mirrored

    # read-modify-write under a lock: several processes (run-table --workers, Slurm array tasks on one node) mirror
    # into one index, and an unlocked update could drop another's entry (and mirror_missing would log it twice)
    index_path = wandb_dir(record["profile"], results_root) / MIRRORED_INDEX
    with FileLock(f"{index_path}.lock", timeout=600):
        _, index = _index(record["profile"], results_root)
        index[record["config_key"]] = {"result": str(path), "run_dir": run_dir, "mode": mode}
        write_json_atomic(index_path, index)
    return run_dir


def mirror_missing(profile: str, results_root=None, experiment: str | None = None, mode: str | None = None) -> list[str]:
    """Mirror every result file of the profile (or one experiment) that has no wandb run yet."""
    root = Path(results_root or REPO_ROOT / "results") / profile
    _, index = _index(profile, results_root)
    done = []
    for path in sorted(root.glob(f"{experiment or '*'}/*.json")):
        try:
            record = read_result(path)
        except ResultsError:
            continue  # not a result of this schema (e.g. a foreign file); the dashboard lists those
        if record["config_key"] in index:
            continue
        run_dir = mirror_result(path, record, results_root, mode)
        if run_dir:
            done.append(run_dir)
    return done


# -- reading offline runs back ---------------------------------------------------------------------------
_HEADER = 7  # ":W&B", magic 0xBEE1 (little endian), version byte
_BLOCK = 32768  # records never straddle a block header: a block tail under 7 bytes is padding


def _chunks(data: bytes):
    pos, parts = _HEADER, []
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:  # zero padding to the end of the block
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:  # full
            yield chunk
        elif kind == 2:  # first
            parts = [chunk]
        elif kind == 3:  # middle
            parts.append(chunk)
        elif kind == 4:  # last
            yield b"".join(parts + [chunk])
            parts = []


def read_offline_run(run_dir: str | Path) -> dict:
    """What an offline run recorded: run_id, project, group, job_type, name, tags, config, summary (last value
    per key) and history (one dict per logged step)."""
    # lazy: start-up time (wandb only when an offline run is read)
    from wandb.proto import wandb_internal_pb2 as pb

    files = sorted(Path(run_dir).glob("run-*.wandb"))
    if not files:
        raise TrackingError(f"{run_dir} holds no run-*.wandb file: not a wandb offline run folder")
    data = files[0].read_bytes()
    if data[:4] != b":W&B":
        raise TrackingError(f"{files[0]} is not a wandb transaction log (header {data[:4]!r})")
    out = {"config": {}, "summary": {}, "history": []}

    def items(update):
        return {(u.key or "/".join(u.nested_key)): json.loads(u.value_json) for u in update}

    for chunk in _chunks(data):
        rec = pb.Record()
        rec.ParseFromString(chunk)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            r = rec.run
            out.update(run_id=r.run_id, project=r.project, group=r.run_group, job_type=r.job_type,
                       name=r.display_name, tags=list(r.tags))
            out["config"].update(items(r.config.update))
        elif kind == "config":
            out["config"].update(items(rec.config.update))
        elif kind == "summary":
            out["summary"].update(items(rec.summary.update))
        elif kind == "history":
            out["history"].append(items(rec.history.item))
    out["config"].pop("_wandb", None)
    return out


def offline_runs(profile: str, results_root=None) -> list[Path]:
    return sorted(wandb_dir(profile, results_root).glob("wandb/offline-run-*"))


def sync(profile: str, results_root=None) -> int:
    """Upload the profile's offline runs (`wandb sync`); needs credentials."""
    runs = offline_runs(profile, results_root)
    if not runs:
        print(f"wandb-sync: no offline runs under {wandb_dir(profile, results_root)}")
        return 0
    if not logged_in():
        raise TrackingError("wandb-sync needs credentials: run `wandb login` (or set $WANDB_API_KEY) first; "
                            f"{len(runs)} offline runs are waiting in {wandb_dir(profile, results_root)}")
    cmd = [sys.executable, "-m", "wandb", "sync", "--include-offline", "--mark-synced", *map(str, runs)]
    return subprocess.run(cmd, check=False).returncode
