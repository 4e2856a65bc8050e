"""Slurm job arrays for experiment sweeps: one sbatch template (slurm/template.sbatch), one generated script
per experiment and profile, one array task per pipeline task (pipeline.plan_tasks: a dense baseline, or one
cell's prune -> eval-pre -> RFT -> eval-post). A task writes the same result files, under the same config
keys, as `run-table`; a resubmission passes --array with the unfinished tasks only.

    state-reduction slurm generate EXPERIMENT --profile P   # slurm/<experiment>-<profile>.sbatch
    state-reduction slurm submit EXPERIMENT --profile P     # (re)submit what is not done (make submit)
    state-reduction slurm status EXPERIMENT --profile P     # done / running / queued / failed / missing
    state-reduction slurm run-task EXPERIMENT TASK ...      # what an array element runs

Each task's run folder, results/<profile>/<experiment>/runs/<task>/, holds the exact script Slurm ran
(job.sbatch), the resolved configurations and keys of its stages (config.json) and status.json (state, job
id, log path, error).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

from state_reduction.atomic import write_json_atomic, write_text_atomic
from state_reduction.errors import Error
from state_reduction.hashing import config_key
from state_reduction.pipeline import (
    STAGES,
    PipelineError,
    find_task,
    load_experiment,
    pipeline_experiments,
    plan_tasks,
    profile_spec,
    task_jobs,
)
from state_reduction.pipeline import run_task
from state_reduction.provenance import REPO_ROOT
from state_reduction.results import read_result, results_dir

TEMPLATE = REPO_ROOT / "slurm" / "template.sbatch"
SLURM_DIR = REPO_ROOT / "slurm"
# per profile; an experiment overrides any of them under profiles.<profile>.slurm in its config.yaml
RESOURCES = {
    "tiny": {"cpus": 1, "mem": "4G", "time": "01:00:00", "gpus": 0, "sbatch": []},
    "paper": {"cpus": 8, "mem": "64G", "time": "24:00:00", "gpus": 1, "sbatch": []},
}
RESOURCE_KEYS = set(RESOURCES["tiny"])


class SlurmError(Error, RuntimeError):
    """Slurm is missing or refused a request; the message says what to do instead."""


def experiment_name(experiment: str) -> str:
    return load_experiment(experiment)["experiment"]


def resources(experiment: str, profile: str) -> dict:
    spec = load_experiment(experiment)
    own = profile_spec(spec, profile).get("slurm", {}) or {}
    unknown = sorted(set(own) - RESOURCE_KEYS)
    if unknown:
        raise PipelineError(f"experiment {spec['experiment']!r}, profile {profile!r}: unknown slurm settings "
                            f"{unknown}; accepted: {', '.join(sorted(RESOURCE_KEYS))}")
    return {**RESOURCES[profile], **own}


def default_script(experiment: str, profile: str) -> Path:
    return SLURM_DIR / f"{experiment_name(experiment)}-{profile}.sbatch"


def log_dir(experiment: str, profile: str, results_root=None) -> Path:
    return results_dir(profile, experiment_name(experiment), results_root) / "slurm-logs"


def _rel(path: Path) -> str:
    path = Path(path)
    return str(path.relative_to(REPO_ROOT)) if path.is_absolute() and path.is_relative_to(REPO_ROOT) else str(path)


def unsupported(experiment: str, profile: str) -> str | None:
    """Why the experiment cannot run as a job array of pipeline tasks (None: it can)."""
    spec = load_experiment(experiment)
    if "analyze" in profile_spec(spec, profile):
        return (f"experiment {spec['experiment']!r} ends in `analyze` runs (state-reduction run-analysis), which "
                "the job array does not run yet; run its make targets in one job instead")
    return None


def render_script(experiment: str, profile: str, tables=None) -> str:
    """The sbatch script of the experiment's tasks on `profile` (text; generate() writes it)."""
    reason = unsupported(experiment, profile)
    if reason:
        raise PipelineError(reason)
    tasks = plan_tasks(experiment, profile, tables)
    res = resources(experiment, profile)
    name = experiment_name(experiment)
    lines = [f"#SBATCH --gpus-per-node={res['gpus']}"] if res["gpus"] else []
    lines += [f"#SBATCH {extra}" for extra in res["sbatch"]]
    stages = sorted({s for t in tasks for s in t.stages}, key=STAGES.index)
    values = {
        "title": f"{name}, {profile} profile" + (f", tables {' '.join(tables)}" if tables else ", every table"),
        "experiment_arg": _rel(Path(experiment)) if str(experiment).endswith((".yaml", ".yml")) else experiment,
        "profile": profile, "n_tasks": str(len(tasks)), "stages": ", ".join(stages),
        "job_name": f"sr-{name}-{profile}", "last_index": str(len(tasks) - 1), "cpus": str(res["cpus"]),
        "mem": str(res["mem"]), "time": str(res["time"]), "gpus": str(res["gpus"]),
        "log_dir": _rel(log_dir(experiment, profile)), "resource_lines": "\n".join(lines),
        "task_lines": "\n".join(f"    {t.name}  # {i}" for i, t in enumerate(tasks)),
        "tables_arg": f" --tables {' '.join(tables)}" if tables else "",
    }
    text = TEMPLATE.read_text()
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    return text.replace("\n\n\n", "\n\n")


def generate(experiment: str, profile: str, tables=None, out: str | Path | None = None) -> Path:
    path = Path(out) if out else default_script(experiment, profile)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, render_script(experiment, profile, tables))
    path.chmod(0o755)
    return path


# -- the run folder of one task --------------------------------------------------------------------------
def run_folder(experiment: str, profile: str, task: str, results_root=None) -> Path:
    return results_dir(profile, experiment_name(experiment), results_root) / "runs" / task


def _read_status(folder: Path) -> dict:
    try:
        return json.loads((folder / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def _write_status(folder: Path, **fields) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / "status.json", {**_read_status(folder), **fields, "updated": time.time()})


def run_task_main(experiment: str, task: str, profile: str, tables=None, stages=None, results_root=None,
                  data_dir=None) -> int:
    """One array element: record the script, configs and status in the run folder, then run the task."""
    find_task(experiment, task, profile, tables)  # an unknown name stops here, before any folder is made
    stages = tuple(stages or STAGES)
    main_rank = int(os.environ.get("RANK", "0")) == 0
    folder = run_folder(experiment, profile, task, results_root)
    job = {"job_id": os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID"),
           "array_task_id": os.environ.get("SLURM_ARRAY_TASK_ID"), "log": os.environ.get("SR_SLURM_LOG"),
           "host": socket.gethostname()}
    if main_rank:
        folder.mkdir(parents=True, exist_ok=True)
        script = os.environ.get("SR_SBATCH_SCRIPT")
        if script and Path(script).is_file():
            shutil.copyfile(script, folder / "job.sbatch")
        _write_status(folder, state="running", stages=list(stages), started=time.time(), error=None, **job)
    try:
        if main_rank:
            _, jobs = task_jobs(experiment, task, profile, tables, stages, results_root, data_dir)
            configs = {name: {"stage": stage, "config_key": config_key(config), "config": config}
                       for stage, stage_jobs, _ in jobs for name, config in stage_jobs}
            known = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
            write_json_atomic(folder / "config.json", {**known, **configs})
        paths = run_task(experiment, task, profile, tables, stages, results_root, data_dir)
    except BaseException as e:
        if main_rank:
            _write_status(folder, state="failed", error=f"{type(e).__name__}: {e}",
                          traceback=traceback.format_exc(limit=8), **job)
        raise
    if main_rank:
        _write_status(folder, state="finished", results=[str(p) for p in paths], finished=time.time(), **job)
        print(f"{task}: {len(paths)} result files ({', '.join(p.name for p in paths)})")
    return 0


# -- status and submission -------------------------------------------------------------------------------
def _require_slurm(command: str = "sbatch") -> str:
    exe = shutil.which(command)
    if exe is None:
        raise SlurmError(f"Slurm is not installed here (no `{command}` on PATH). Run the experiment locally "
                         "instead: `make tableN` or `state-reduction run-table TABLE --experiment EXPERIMENT "
                         "--profile tiny`; or bring up a single-node cluster on this machine with "
                         "`scripts/slurm_local_cluster.sh start` (root)")
    return exe


def _queue() -> dict[str, str]:
    """Array element id ('123_4') or job id -> state, from squeue; empty without Slurm."""
    if shutil.which("squeue") is None:
        return {}
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T"], capture_output=True, text=True, check=False)
    return dict(line.split(None, 1) for line in out.stdout.splitlines() if line.strip())


def _done(folder: Path, names: list[str], recorded: dict) -> bool:
    for name in names:
        path = folder / f"{name}.json"
        if not path.is_file():
            return False
        key = recorded.get(name, {}).get("config_key")
        if key is not None and read_result(path)["config_key"] != key:
            return False  # a result of another configuration than the one this task last ran
    return True


def task_states(experiment: str, profile: str, tables=None, results_root=None) -> list[dict]:
    """Per task: index, name, state (done, running, queued, failed, missing), log and error where known."""
    out_dir = results_dir(profile, experiment_name(experiment), results_root)
    queue = _queue()
    rows = []
    for i, task in enumerate(plan_tasks(experiment, profile, tables)):
        folder = run_folder(experiment, profile, task.name, results_root)
        status = _read_status(folder)
        recorded = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
        element = f"{status.get('job_id')}_{status.get('array_task_id')}"
        in_queue = queue.get(element) or queue.get(str(status.get("job_id")))
        row = {"index": i, "task": task.name, "log": status.get("log"), "error": None, "job": element}
        if _done(out_dir, task.result_names, recorded):
            row["state"] = "done"
        elif in_queue:
            row["state"] = "running" if in_queue in ("RUNNING", "COMPLETING") else "queued"
        elif status.get("state") == "failed":
            row.update(state="failed", error=status.get("error"))
        elif status.get("state") in ("running", "submitted", "finished"):
            missing = [n for n in task.result_names if not (out_dir / f"{n}.json").is_file()]
            if status["state"] == "finished":  # e.g. a result deleted, or the config changed, since
                row.update(state="missing", error=f"job {element} finished, but these results are missing or "
                                                  f"stale now: {', '.join(missing) or 'config changed'}")
            else:
                row.update(state="failed", error=f"job {element} left the queue without finishing (killed, "
                                                 f"timed out or out of memory?); missing: {', '.join(missing)}")
        else:
            row["state"] = "missing"
        rows.append(row)
    return rows


def print_status(rows: list[dict], experiment: str, profile: str) -> None:
    counts = {s: sum(r["state"] == s for r in rows) for s in ("done", "running", "queued", "failed", "missing")}
    print(f"{experiment_name(experiment)} ({profile}): {len(rows)} tasks: "
          + ", ".join(f"{n} {s}" for s, n in counts.items() if n))
    missing = [r for r in rows if r["state"] == "missing"]
    if len(missing) > 10:
        print(f"  missing: tasks {', '.join(str(r['index']) for r in missing)}")
    for r in rows:
        if r["state"] != "done" and (r["state"] != "missing" or len(missing) <= 10):
            print(f"  [{r['index']}] {r['task']}: {r['state']}" + (f", log {r['log']}" if r["log"] else "")
                  + (f"\n      {r['error']}" if r["error"] else ""))
    if counts["failed"] or counts["missing"]:
        print("resubmit runs only those: make submit EXP=... PROFILE=... (or state-reduction slurm submit)")


def submit(experiment: str, profile: str, tables=None, results_root=None, script: str | Path | None = None,
           dry_run: bool = False, extra_args=()) -> dict:
    """Generate the script and submit the array elements that are not done, queued or running."""
    if not dry_run:
        _require_slurm("sbatch")
    path = generate(experiment, profile, tables, script)
    rows = task_states(experiment, profile, tables, results_root)
    todo = [r for r in rows if r["state"] in ("missing", "failed")]
    if not todo:
        print(f"nothing to submit: {len(rows)} tasks are done, queued or running")
        return {"script": path, "indices": [], "job_id": None}
    logs = log_dir(experiment, profile, results_root)
    logs.mkdir(parents=True, exist_ok=True)
    indices = ",".join(str(r["index"]) for r in todo)
    env_root = {"SR_RESULTS_ROOT": str(Path(results_root).resolve())} if results_root else {}
    cmd = ["sbatch", "--parsable", f"--array={indices}", f"--output={logs}/%x-%A_%a.out",
           f"--chdir={REPO_ROOT}", *extra_args, str(path)]
    print(" ".join(cmd))
    if dry_run:
        return {"script": path, "indices": [r["index"] for r in todo], "job_id": None, "command": cmd}
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env={**os.environ, **env_root,
                                                                   "SR_LOG_DIR": str(logs)})
    if done.returncode != 0:
        raise SlurmError(f"sbatch refused {path}: {done.stderr.strip() or done.stdout.strip()}")
    job_id = done.stdout.strip().split(";")[0]
    for r in todo:
        log = f"{logs}/sr-{experiment_name(experiment)}-{profile}-{job_id}_{r['index']}.out"
        _write_status(run_folder(experiment, profile, r["task"], results_root), state="submitted",
                      job_id=job_id, array_task_id=str(r["index"]), log=log, error=None)
    print(f"submitted job {job_id}: {len(todo)} of {len(rows)} tasks ({indices})")
    return {"script": path, "indices": [r["index"] for r in todo], "job_id": job_id, "command": cmd}


def wait(job_id: str, timeout_s: float = 3600, poll_s: float = 5) -> None:
    """Block until no element of `job_id` is queued or running (CI, tests)."""
    t0 = time.time()
    while any(k.split("_")[0] == str(job_id) for k in _queue()):
        if time.time() - t0 > timeout_s:
            raise SlurmError(f"job {job_id} still in the queue after {timeout_s:.0f} s")
        time.sleep(poll_s)


# -- command line ----------------------------------------------------------------------------------------
def _cmd(args) -> int:
    root = args.results_root or os.environ.get("SR_RESULTS_ROOT")
    try:
        if args.slurm_command == "generate" and args.experiment == "all":
            for name in pipeline_experiments():
                reason = (f"no {args.profile} profile" if args.profile not in load_experiment(name)["profiles"]
                          else unsupported(name, args.profile))
                if reason:
                    print(f"skipped {name}: {reason}")
                else:
                    print(f"wrote {_rel(generate(name, args.profile))}")
        elif args.slurm_command == "generate":
            print(f"wrote {_rel(generate(args.experiment, args.profile, args.tables, args.out))}")
        elif args.slurm_command == "submit":
            info = submit(args.experiment, args.profile, args.tables, root, args.out, args.dry_run)
            if args.wait and info["job_id"]:
                wait(info["job_id"], args.wait)
                rows = task_states(args.experiment, args.profile, args.tables, root)
                print_status(rows, args.experiment, args.profile)
                return 0 if all(r["state"] == "done" for r in rows) else 1
        elif args.slurm_command == "status" and unsupported(args.experiment, args.profile):
            print(f"{args.experiment}: {unsupported(args.experiment, args.profile)}")
        elif args.slurm_command == "status":
            rows = task_states(args.experiment, args.profile, args.tables, root)
            if args.json:
                print(json.dumps(rows, indent=1))
            else:
                print_status(rows, args.experiment, args.profile)
            return 0 if all(r["state"] in ("done", "running", "queued") for r in rows) else 1
        elif args.slurm_command == "run-task":
            return run_task_main(args.experiment, args.task, args.profile, args.tables, args.stages, root,
                                 args.data_dir)
    except SlurmError as e:
        print(f"state-reduction slurm {args.slurm_command}: error: {e}", file=sys.stderr)
        return 2
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("slurm", help="Slurm job arrays of an experiment's sweep: generate, submit, status")
    sub = p.add_subparsers(dest="slurm_command", required=True)
    for name, help_ in (("generate", "write slurm/<experiment>-<profile>.sbatch"),
                        ("submit", "generate, then submit the tasks that are not done (sbatch --array)"),
                        ("status", "what finished, failed (with log paths), is queued or missing"),
                        ("run-task", "run one task (what an array element does)")):
        s = sub.add_parser(name, help=help_)
        s.add_argument("experiment", help="experiment name (experiments/<name>/config.yaml) or a config YAML path"
                       + ("; `all`: every experiment that runs as a job array" if name == "generate" else ""))
        if name == "run-task":
            s.add_argument("task", help="task name, as listed in the generated script")
            s.add_argument("--stages", nargs="+", choices=STAGES, default=None)
            s.add_argument("--data-dir", default=None)
        s.add_argument("--profile", default="tiny", choices=["tiny", "paper"])
        s.add_argument("--tables", nargs="+", default=None, help="only these tables' runs (default: every table)")
        s.add_argument("--results-root", default=None, help="default: $SR_RESULTS_ROOT, else results/")
        if name in ("generate", "submit"):
            s.add_argument("--out", default=None, help="script path (default slurm/<experiment>-<profile>.sbatch)")
        if name == "submit":
            s.add_argument("--dry-run", action="store_true", help="print the sbatch command, submit nothing")
            s.add_argument("--wait", type=float, default=0, metavar="SECONDS",
                           help="wait up to SECONDS for the job, then print the status (exit 1 unless all done)")
        if name == "status":
            s.add_argument("--json", action="store_true")
        s.set_defaults(func=_cmd)
