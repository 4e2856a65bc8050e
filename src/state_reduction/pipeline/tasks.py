"""The Slurm task planner: the stages of an experiment's tables split into tasks, one per job array element
(state_reduction.slurm). A task is a model's dense baseline or every stage of one cell; its results are the same
files, with the same config keys, as run_table's."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

import torch

from state_reduction.pipeline.spec import (
    CONTROL,
    Cell,
    PipelineError,
    load_experiment,
    profile_tables,
    table_cells,
    table_evaluate,
)
from state_reduction.pipeline.stages import STAGES, Runner, check_context, offline_cache, require_hub_for, stage_jobs


@dataclass(frozen=True)
class Task:
    """One unit of work for a cluster job array: a model's dense baseline, or every stage of one cell that
    the experiment's tables need. Its results are the same files, with the same config keys, as run_table's.
    `evals`: the evaluations its tables need, as (evaluation-name suffix, RFT state) pairs (table_evaluate; suffix
    "" for the profile's own settings), all on the same pruned and fine-tuned model."""

    name: str
    model: str
    cell: Cell | None  # None: the dense baseline
    evals: tuple[tuple[str, bool], ...] = (("", False),)

    @property
    def rft_states(self) -> tuple[bool, ...]:
        return tuple(sorted({rft for _, rft in self.evals}))

    @property
    def stages(self) -> tuple[str, ...]:
        if self.cell is None:
            return ("baseline",)
        if self.cell.method == CONTROL or self.cell.rft_overrides():  # the prune is the plain cell's task
            return ("rft", "eval-post")
        return ("prune",) + (("eval-pre",) if False in self.rft_states else ()) + \
            (("rft", "eval-post") if True in self.rft_states else ())

    @property
    def result_names(self) -> list[str]:
        """Its result files' names (without .json), as run_table names them."""
        if self.cell is None:
            return [f"{Cell(self.model, 'baseline', 0.0).name}-eval{sfx}" for sfx in dict(self.evals)]
        if self.cell.method == CONTROL or self.cell.rft_overrides():
            return [f"{self.cell.name}-rft"] + [f"{self.cell.name}-eval-post{sfx}" for sfx, rft in self.evals if rft]
        names = [f"{self.cell.name}-prune"] + ([f"{self.cell.name}-rft"] if True in self.rft_states else [])
        return names + [f"{self.cell.name}-eval-{'post' if rft else 'pre'}{sfx}" for sfx, rft in self.evals]


def _eval_variants(spec: dict, profile: str, tables) -> dict[str, tuple[dict, str]]:
    """suffix -> (evaluate settings, suffix) over `tables` (table_evaluate)."""
    out = {}
    for table in tables:
        settings, sfx = table_evaluate(spec, table, profile)
        out.setdefault(sfx, (settings, sfx))
    return out


def plan_tasks(experiment: str, profile: str = "tiny", tables=None, seeds=None) -> list[Task]:
    """The tasks of `tables` (default: every table of the experiment defined on `profile`) on `profile`: one per model for the
    dense baseline, then one per distinct cell (a cell shared by several tables is one task, with the
    evaluations each of them needs), in table order. A cell with an RFT budget of its own (spec.RFT_VARY) is a task
    of RFT and post-RFT evaluation; its pruned model and pre-RFT evaluation are the task of the plain cell
    (Cell.pruning), which its RFT needs first. `seeds`: replicate seeds, as run-table --seeds."""
    spec = load_experiment(experiment)
    tables = list(tables or profile_tables(spec, profile))
    models, cells = {}, {}
    for table in tables:
        keys, table_cells_, rft_states = table_cells(spec, table, profile, seeds)
        sfx = table_evaluate(spec, table, profile)[1]
        for k in keys:
            models.setdefault(k, {})[(sfx, False)] = None
        for c in table_cells_:
            if c.rft_overrides() and c.method != CONTROL:
                plain = cells.setdefault(c.pruning(), {})
                plain.update(dict.fromkeys((sfx, False) for rft in rft_states if not rft))
            states = (True,) if c.method == CONTROL or c.rft_overrides() else rft_states
            cells.setdefault(c, {}).update(dict.fromkeys((sfx, rft) for rft in states))
    return ([Task(f"{k}-baseline", k, None, tuple(e)) for k, e in models.items()]
            + [Task(c.name, c.model, c, tuple(e)) for c, e in cells.items()])


def find_task(experiment: str, name: str, profile: str = "tiny", tables=None, seeds=None) -> Task:
    tasks = {t.name: t for t in plan_tasks(experiment, profile, tables, seeds)}
    if name not in tasks:
        close = difflib.get_close_matches(name, tasks, n=3)
        raise PipelineError(f"experiment {experiment!r} ({profile} profile) has no task {name!r}"
                            + (f"; did you mean {', '.join(close)}?" if close else f"; tasks: {', '.join(tasks)}"))
    return tasks[name]


def task_jobs(experiment: str, name: str, profile: str = "tiny", tables=None, stages=STAGES, results_root=None,
              data_dir=None, seeds=None):
    """(runner, [(stage, [(result name, config)], stage function)]) of one task, restricted to `stages`: the
    model stages once, each evaluation once per evaluation setting of the task's tables."""
    spec = load_experiment(experiment)
    task = find_task(experiment, name, profile, tables, seeds)
    variants = _eval_variants(spec, profile, list(tables or profile_tables(spec, profile)))
    wanted = tuple(s for s in task.stages if s in stages)
    jobs, runner, model_stages_done = [], None, False
    for sfx in dict(task.evals):
        runner = Runner(spec, profile, results_root, data_dir, evaluate=variants[sfx])
        states = tuple(sorted({rft for s, rft in task.evals if s == sfx}))
        here = tuple(s for s in wanted if s in ("baseline", "eval-pre", "eval-post")
                     or not model_stages_done)  # prune and RFT once, before the first evaluation
        if task.cell is None:
            jobs += list(stage_jobs(runner, [task.model], [], (False,), here))
        else:
            jobs += list(stage_jobs(runner, [], [task.cell], states, here))
            if "rft" in here and True not in states and True in task.rft_states:  # RFT for a later evaluation
                jobs += list(stage_jobs(runner, [], [task.cell], (True,), ("rft",)))
        model_stages_done = True
    return runner, jobs


def run_task(experiment: str, name: str, profile: str = "tiny", tables=None, stages=STAGES, results_root=None,
             data_dir=None, seeds=None) -> list[Path]:
    """Run what is missing of one task of plan_tasks (a job array element); return its result files."""
    spec = load_experiment(experiment)
    task = find_task(experiment, name, profile, tables, seeds)
    if offline_cache() is None:  # a prefetched cache offline needs no hub (as run_table; the caller checked the cache)
        require_hub_for(profile, "run the task")
    variants = _eval_variants(spec, profile, list(tables or profile_tables(spec, profile)))
    for sfx in dict(task.evals):
        check_context(spec, profile, [task.model], evaluate=variants[sfx][0])
    torch.manual_seed(0)
    runner, jobs = task_jobs(experiment, name, profile, tables, stages, results_root, data_dir, seeds)
    paths = []
    for _, step_jobs, fn in jobs:
        paths += runner.sweep(step_jobs, fn)
    return paths

