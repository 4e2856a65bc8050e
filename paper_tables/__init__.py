"""The paper's tables and figures, rendered from result JSON only (results/<profile>/<experiment>/*.json).

`state-reduction render TABLE [--profile tiny|paper]` (or `render(...)` here) renders one table or figure. Which
experiment owns a table comes from the experiments' config.yaml files only; a table whose config has a
`render:` mapping is laid out from that data (paper_tables/spec.py, metrics by id from paper_tables/metrics.py);
the others are rendered by their experiment's module, listed in RENDERERS.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from paper_tables import spec as table_spec
from paper_tables.metrics import TableSpecError, closest
from state_reduction.pipeline import load_experiment, profile_tables, run_table

# layouts as data: a `render: {layout: ...}` names one of these modules' LAYOUTS
LAYOUT_MODULES = ["paper_tables.lm_tables", "paper_tables.long_context_tables", "paper_tables.shared_conv_tables"]
# tables whose layout is still code: the renderer of their owning experiment (it renders the experiment's outputs)
RENDERERS = {"calibration_sensitivity": "paper_tables.ablation_tables",
             "coupled_selection": "paper_tables.ablation_tables",
             "pca_vs_shared_conv": "paper_tables.shared_conv_tables",
             "rank_analysis": "paper_tables.rank_tables",
             "mqar_recall": "paper_tables.figure_mqar",
             "state_vs_structure": "paper_tables.state_vs_structure",
             "layer_adaptive_budgets": "paper_tables.layer_budgets",
             "joint_compression": "paper_tables.joint_compression"}
# renderers that read the results of every table their experiment declares (e.g. figure_mqar and mqar_seeds); they
# take the profile, not one table
WHOLE_EXPERIMENT = {"mqar_recall", "state_vs_structure", "joint_compression"}
# experiments whose tables are computed by analyses (`state-reduction run-analysis`) rather than run-table
ANALYSIS_EXPERIMENTS = {"rank_analysis"}
# experiments whose one renderer draws every table they declare, under the experiment's name (`render <experiment>`;
# its tables are run one by one, e.g. one per family)
EXPERIMENT_RENDERERS = {"joint_compression": "paper_tables.joint_compression"}
# outputs that no pipeline experiment declares: speed benchmarks (`state-reduction bench`) and the RaLiMP benchmark
UNDECLARED = {"table17": "paper_tables.speed.table17", "table18": "paper_tables.speed.table18",
              "table19": "paper_tables.speed.table19", "figure4": "paper_tables.speed.figure4",
              "ralimp_synthetic": "paper_tables.ralimp_synthetic"}


def layouts() -> dict:
    """layout name -> (module, layout function) over LAYOUT_MODULES."""
    out = {}
    for name in LAYOUT_MODULES:
        module = importlib.import_module(name)
        out.update({k: (module, f) for k, f in module.LAYOUTS.items()})
    return out


def targets() -> list[str]:
    """Every table and figure `render` accepts."""
    return sorted([*table_spec.declared_tables(), *UNDECLARED, *EXPERIMENT_RENDERERS], key=lambda t: (len(t), t))


def render(table: str, profile: str = "tiny", experiment: str | None = None, results_root=None,
           out_root: Path | None = None, figures_root: Path | None = None, quiet: bool = False, seeds=None):
    """Render `table` on `profile` from the results under `results_root` (default results/); outputs under
    `out_root`/<profile>/ (default paper_tables/out/) and figures under `figures_root`/<profile>/ (default
    figures/). `seeds`: the replicate seeds shown (language-modelling tables only)."""
    if table in UNDECLARED:
        return _render_undeclared(table, profile, results_root, out_root, figures_root, seeds)
    if table in EXPERIMENT_RENDERERS:
        if seeds is not None:
            raise TableSpecError(f"{table}: --seeds applies to the language-modelling tables only")
        return importlib.import_module(EXPERIMENT_RENDERERS[table]).render(profile, results_root, out_root=out_root,
                                                                          figures_root=figures_root)
    if table not in table_spec.declared_tables() and experiment is None:
        raise TableSpecError(f"{table_spec.EXPERIMENTS_DIR}/*/config.yaml: no experiment declares table {table!r} "
                             f"under `tables:`, and it is not one of {', '.join(UNDECLARED)}; "
                             f"{closest(table, targets())}")
    experiment = table_spec.owner(table, experiment)
    spec = load_experiment(experiment)
    if "render" in (spec.get("tables") or {}).get(table, {}):
        found = layouts()
        layout = table_spec.render_spec(spec, table, profile, found, experiment)["layout"]
        module = found[layout][0]
        extra = {"seeds": seeds} if seeds is not None else {}
        if extra and module.__name__ != "paper_tables.lm_tables":
            raise TableSpecError(f"{table}: --seeds applies to the language-modelling tables only")
        return module.render(table, profile, experiment, results_root, out_root=out_root, figures_root=figures_root,
                             quiet=quiet, **extra)
    read_by = table_spec.readers(spec, table)
    if read_by:
        raise TableSpecError(f"{table_spec.config_path(experiment)}: tables.{table} is a companion table, shown as "
                             f"columns of {', '.join(read_by)}; render {read_by[0]}")
    name = RENDERERS.get(spec["experiment"])
    if name is None:
        raise TableSpecError(f"{table_spec.config_path(experiment)}: tables.{table} has no `render:` mapping and "
                             f"experiment {spec['experiment']!r} has no renderer; renderers: "
                             f"{', '.join(RENDERERS)}")
    if seeds is not None:
        raise TableSpecError(f"{table}: --seeds applies to the language-modelling tables only")
    module = importlib.import_module(name)
    if spec["experiment"] in WHOLE_EXPERIMENT:
        return module.render(profile, results_root, out_root=out_root, figures_root=figures_root)
    return module.render(table, profile, experiment, results_root, out_root=out_root, figures_root=figures_root,
                         quiet=quiet)


def run_missing(table: str, profile: str = "tiny", experiment: str | None = None, results_root=None,
                seeds=None, workers: int = 1) -> list[Path]:
    """Run what `table`'s results lack, through its experiment's runner (run-table, in `workers` processes, or
    run-analysis for the rank analysis); return the result files. Undeclared outputs (speed, RaLiMP) have their own
    runners: nothing here."""
    if table in UNDECLARED:
        return []
    if table in EXPERIMENT_RENDERERS:
        tables = importlib.import_module(EXPERIMENT_RENDERERS[table]).tables_of(load_experiment(table), profile)
        return [p for t in tables for p in run_table(table, t, profile, results_root=results_root)]
    experiment = table_spec.owner(table, experiment)
    spec = load_experiment(experiment)
    if spec["experiment"] in ANALYSIS_EXPERIMENTS:
        # imported when asked for: rendering alone does not load the analysis stack
        from state_reduction.analysis.experiment import run_analyses

        return run_analyses(table, profile, experiment, results_root=results_root)
    if spec["experiment"] in WHOLE_EXPERIMENT:
        tables = profile_tables(spec, profile)
    else:  # the table, then the companion tables its columns read (e.g. Table 4's MQAR columns: recall_table4)
        tables = [table] + table_spec.companions(spec, table, profile)
    return [p for t in tables for p in run_table(experiment, t, profile, results_root=results_root,
                                                   seeds=seeds if t == table else None, workers=workers)]


def _render_undeclared(table, profile, results_root, out_root, figures_root, seeds):
    if seeds is not None:
        raise TableSpecError(f"{table}: --seeds applies to the language-modelling tables only")
    module = importlib.import_module(UNDECLARED[table])
    if table == "ralimp_synthetic":
        return module.render(profile, results_root, out_root=out_root, figures_root=figures_root)
    # the speed renderers write their files straight into one folder (table17_<profile>.tex, figure4_<profile>.png)
    return module.render(profile, results_root=results_root, out_dir=figures_root if table == "figure4" else out_root)
