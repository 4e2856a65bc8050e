"""A table's tasks in several processes on one machine (run-table --workers; make's WORKERS on the tiny profile).

`run_table(..., workers=1)` is what other modules import (state_reduction.pipeline.run_table): one worker runs the
stages in this process (pipeline.stages.run_table); more run the Slurm planner's tasks (pipeline.tasks) side by side.
"""

from __future__ import annotations

from pathlib import Path

import torch

from state_reduction.allocator import pipeline_heap
from state_reduction.pipeline.spec import PipelineError
from state_reduction.pipeline.stages import STAGES
from state_reduction.pipeline.stages import run_table as run_table_here
from state_reduction.pipeline.tasks import plan_tasks, run_task
from state_reduction.progress import quiet_progress_off_tty


def run_table(experiment: str | None, table: str, profile: str = "tiny", results_root=None, data_dir=None,
              stages=STAGES, seeds=None, workers: int = 1) -> list[Path]:
    """Run what `table` needs and is missing; return the result files it reads (pipeline.stages.run_table), in
    `workers` processes when more than one (run_tasks_in_workers)."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise PipelineError(f"--workers must be an integer >= 1, got {workers!r}")
    if workers == 1:
        return run_table_here(experiment, table, profile, results_root, data_dir, stages, seeds)
    return run_tasks_in_workers(experiment, table, profile, workers, stages, results_root, data_dir, seeds)


def _worker_init(threads: int) -> None:
    quiet_progress_off_tty()  # a spawned worker starts from a fresh tqdm: as quiet off a terminal as the CLI
    pipeline_heap()  # and from glibc's default allocator: the CLI's setting (allocator.py)
    torch.set_num_threads(threads)


def _run_task_in_worker(args: tuple) -> list[Path]:
    experiment, name, profile, tables, stages, results_root, data_dir, seeds = args
    return run_task(experiment, name, profile, tables, stages, results_root, data_dir, seeds)


def run_tasks_in_workers(experiment: str, table: str, profile: str, workers: int, stages=STAGES, results_root=None,
                         data_dir=None, seeds=None) -> list[Path]:
    """run_table's work as `workers` processes on one machine: each takes the next task of plan_tasks (a model's
    dense baseline, or every stage of one cell) until none is left, with torch's threads split between them (tiny
    models run best on one thread each). A cell's stages depend only on its own results and the dense checkpoint,
    so tasks never wait for one another; the results are the files, config keys and metrics of one process
    (tests/test_pipeline_workers.py). Baselines go first. A failed task stops the run with its error (a project error pickles
    whole: type, message, hint); the other workers are stopped as by a kill, so what they had not finished is discarded,
    and every finished result is kept (a rerun runs only what is missing)."""
    import multiprocessing

    from state_reduction.pipeline.spec import find_experiment

    experiment = experiment or find_experiment(table)
    tasks = plan_tasks(experiment, profile, [table], seeds)
    threads = max(1, torch.get_num_threads() // workers)
    # the tasks of cells with an RFT budget of their own run after every other: they fine-tune the pruned model of the
    # plain cell's task, which two of them must not make at once
    phases = [[t for t in tasks if t.cell is None or not t.cell.rft_overrides()],
              [t for t in tasks if t.cell is not None and t.cell.rft_overrides()]]
    paths = []
    # spawn: a fresh interpreter per worker (a forked torch with live OpenMP threads can deadlock)
    with multiprocessing.get_context("spawn").Pool(min(workers, len(tasks)), _worker_init, (threads,)) as pool:
        for phase in phases:
            jobs = [(experiment, t.name, profile, [table], tuple(stages), results_root, data_dir, seeds) for t in phase]
            paths += [p for done in pool.imap(_run_task_in_worker, jobs, chunksize=1) for p in done]
    return list(dict.fromkeys(paths))
