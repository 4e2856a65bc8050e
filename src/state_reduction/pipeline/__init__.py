"""Experiment pipelines: the typed experiment spec (spec), the stage runner and its stage registry (stages) and
the Slurm task planner (tasks) and its local workers (workers). The names other modules import are re-exported here."""

from state_reduction.pipeline.spec import (
    CONTROL,
    EXPERIMENTS_DIR,
    VARY_SETTINGS,
    AnalyzeSettings,
    Cell,
    EvaluateSettings,
    ExperimentSpec,
    ModelSpec,
    PipelineError,
    ProfileSpec,
    PruneSettings,
    SlurmSettings,
    SpecError,
    TableSpec,
    expand_vary,
    experiment_path,
    find_experiment,
    load_experiment,
    load_spec,
    parse_spec,
    profile_spec,
    resolve_model_path,
    table_cells,
    table_evaluate,
    table_methods,
    table_seeds,
    table_variations,
    vary_suffix,
)
from state_reduction.pipeline.stages import (
    STAGE_REGISTRY,
    STAGES,
    Runner,
    Stage,
    _Runner,
    _stage_jobs,
    check_context,
    clean_models,
    collect,
    get_stage,
    mirror,
    offline_cache,
    plan_table,
    prune_kind,
    register_stage,
    require_hub_for,
    stage_jobs,
)
from state_reduction.pipeline.tasks import Task, find_task, plan_tasks, run_task, task_jobs
from state_reduction.pipeline.workers import run_table, run_tasks_in_workers

__all__ = [
    "CONTROL", "EXPERIMENTS_DIR", "STAGES", "STAGE_REGISTRY", "VARY_SETTINGS", "AnalyzeSettings", "Cell",
    "EvaluateSettings", "ExperimentSpec", "ModelSpec", "PipelineError", "ProfileSpec", "PruneSettings", "Runner",
    "SlurmSettings", "SpecError", "Stage", "TableSpec", "Task", "check_context", "clean_models", "collect",
    "expand_vary", "experiment_path", "find_experiment", "find_task", "get_stage", "load_experiment", "load_spec",
    "mirror", "offline_cache", "parse_spec", "plan_table", "plan_tasks", "profile_spec", "prune_kind", "register_stage",
    "require_hub_for", "resolve_model_path", "run_table", "run_task", "run_tasks_in_workers", "stage_jobs", "table_cells", "table_evaluate",
    "table_methods", "table_seeds", "table_variations", "task_jobs", "vary_suffix", "_Runner", "_stage_jobs",
]
