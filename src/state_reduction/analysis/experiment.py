"""The `analyze` runs behind a rank-analysis figure or table (experiments/rank_analysis), on either profile.

The table's cells (model, method, ratio, pre-/post-RFT) come from the experiment's config.yaml as for every
table (`pipeline.table_cells`); the pipeline's prune and RFT stages make the reduced models (no evaluation), then
one `analyze` result per

  dense model                     <model>-dense-analyze.json        (Figures 2, 3, 5, 7; baseline rows)
  cell, pre-RFT                   <cell>-analyze.json               (states after pruning, conditioning, rho)
  cell, post-RFT                  <cell>-rft-analyze.json           (the same selection, the model after RFT)
  `overlap:` pair [a, b]          <model>-<a>-vs-<b>-r<pct>-analyze.json (appendix C.2)
  dense+RFT control (`control:`)  <model>-dense-r0-rft-analyze.json  (the dense model after the table's RFT, every
                                  channel kept, beside the dense model on the same windows: Table 5, Figure 6)

once per replicate seed of the table (`seeds:`, pipeline.table_seeds). A replicate other than the profile's own
seed carries its seed in the name (`<model>-dense-seed_1-analyze`, `<cell>-seed_1-rft-analyze`, as Cell.name) and
in the configuration (`vary: {seed: s}`), and draws the analysis windows with that seed too: Table 6 measures the
activations that replicate's selectors saw, Table 5's rho compares with the dense states on the same windows. The
first replicate keeps the names and keys of a single-seed run.

Each analysis is keyed by its configuration, which holds the keys of the stages it reads: a rerun does nothing,
a changed pruning or RFT setting reruns the analyses downstream of it. `analyze` is a stage kind of the pipeline's
registry (pipeline.register_stage), run through Runner.sweep: keyed, resumed and mirrored to wandb as every stage.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from state_reduction.analysis.analyze import AnalyzeConfig, analyze
from state_reduction.pipeline import (
    CONTROL,
    Cell,
    PipelineError,
    Runner,
    load_experiment,
    plan_table,
    profile_spec,
    register_stage,
    run_table,
    replicate_varies,
    table_cells,
    vary_suffix,
)
from state_reduction.results import build_result, config_key

EXPERIMENT = "rank_analysis"
REDUCE_STAGES = ("prune", "rft")


def overlap_pairs(spec: dict, table: str) -> list[tuple[str, str]]:
    pairs = [tuple(p) for p in spec["tables"][table].get("overlap", [])]
    for pair in pairs:
        bad = [m for m in pair if m not in spec["methods"]]
        if len(pair) != 2 or bad:
            raise PipelineError(f"{table} of experiment {spec['experiment']!r}: overlap pair {list(pair)} must name two "
                                f"of the experiment's methods ({', '.join(spec['methods'])})")
    return pairs


def analysis_name(model: str, method: str | None = None, ratio: float = 0.0, rft: bool = False,
                  compare: str | None = None, vary=()) -> str:
    """Result name of one analysis (see the module docstring); renderers find results by it. `vary`: the cell's
    overrides, here the replicate seed (("seed", 1),), empty for the profile's own seed."""
    if method is None:
        return f"{model}-dense{vary_suffix(vary)}-analyze"
    pair = f"{method}-vs-{compare}" if compare else method
    return f"{model}-{pair}-r{round(ratio * 100)}{vary_suffix(vary)}" + ("-rft" if rft else "") + "-analyze"


def analysis_jobs(runner: Runner, spec: dict, table: str, profile: str) -> list[tuple[str, dict]]:
    """(result name, configuration) of every analysis `table` reads, each replicate seed's in turn."""
    keys, cells, rft_states = table_cells(spec, table, profile)
    settings = profile_spec(spec, profile).get("analyze")
    if settings is None:
        raise PipelineError(f"experiment {spec['experiment']!r} profile {profile!r} has no `analyze:` settings")

    def base(model: str, method: str | None, ratio: float, vary: tuple) -> dict:
        seed = dict(vary).get("seed")
        return {**runner.base_config(model, "analyze", method, ratio, vary), **settings,
                **({"seed": seed} if seed is not None else {})}

    jobs = []
    for vary in replicate_varies(spec, table, profile):
        jobs += [(analysis_name(k, vary=vary), {**base(k, None, 0.0, vary), "rft": False}) for k in keys]
    for cell in cells:
        for rft in (True,) if cell.method == CONTROL else rft_states:  # the control exists after RFT only
            of = runner.rft_config(cell) if rft else runner.prune_config(cell)
            jobs.append((analysis_name(cell.model, cell.method, cell.ratio, rft, vary=cell.vary),
                         {**base(cell.model, cell.method, cell.ratio, cell.vary), "rft": rft, "of": config_key(of)}))
    replicates = list(dict.fromkeys((c.model, c.ratio, c.vary) for c in cells if c.method != CONTROL))
    for model, ratio, vary in replicates:
        for a, b in overlap_pairs(spec, table):
            ca, cb = Cell(model, a, ratio, vary), Cell(model, b, ratio, vary)
            jobs.append((analysis_name(model, a, ratio, compare=b, vary=vary),
                         {**base(model, a, ratio, vary), "rft": False, "compare": b,
                          "of": config_key(runner.prune_config(ca)), "compare_of": config_key(runner.prune_config(cb))}))
    return jobs


@register_stage("analyze")
def run_analysis(runner: Runner, name: str, config: dict) -> dict:
    """State-rank analysis of a dense, pruned or post-RFT model (analysis.analyze)."""
    model = runner.dense(config["model"])["path"]
    selection = compare = selection_model = None
    if config["method"] == CONTROL:  # the dense model after RFT, at full width beside the dense model
        selection_model = str(runner.ensure_rft(Runner.cell_of(config)))
    elif config["method"] is not None:
        cell = Runner.cell_of(config)
        selection = str(runner.ensure_pruned(cell))
        if config["rft"]:
            selection_model = str(runner.ensure_rft(cell))
        if config.get("compare"):
            compare = str(runner.ensure_pruned(Cell(cell.model, config["compare"], cell.ratio, cell.vary)))
    cfg = AnalyzeConfig(model=model, selection=selection, compare=compare, selection_model=selection_model,
                        calib=config["calib"], stream=config["stream"], n_calib=config["n_calib"],
                        seq_len=config["seq_len"], seed=config["seed"], stride=config["stride"],
                        divisor=config["divisor"], ignore_decay=config["ignore_decay"],
                        batch_size=config["batch_size"], data_dir=runner.data_dir)
    t0 = time.time()
    record = analyze(cfg, profile=runner.profile, experiment=runner.spec["experiment"])
    return build_result("analyze", profile=runner.profile, experiment=runner.spec["experiment"], config=config,
                        metrics=record["metrics"], model=record["model"], data=record["data"], seeds=record["seeds"],
                        wall_time_s=time.time() - t0, extra={**record["extra"], "analyze_config": record["config"]})


def run_analyses(table: str, profile: str = "tiny", experiment: str = EXPERIMENT, results_root=None,
                 data_dir=None) -> list[Path]:
    """Prune and fine-tune what `table` needs and is missing (pipeline stages), then run its missing analyses;
    return the analysis result files."""
    spec = load_experiment(experiment)
    run_table(experiment, table, profile, results_root=results_root, data_dir=data_dir, stages=REDUCE_STAGES)
    torch.manual_seed(0)
    runner = Runner(spec, profile, results_root, data_dir)
    return runner.sweep(analysis_jobs(runner, spec, table, profile), "analyze")


def plan_analyses(table: str, profile: str = "tiny", experiment: str = EXPERIMENT, results_root=None) -> dict:
    """What run_analyses would run, loading no model and calling no hub: the pipeline's prune/RFT plan plus the
    analyses."""
    spec = load_experiment(experiment)
    plan = plan_table(experiment, table, profile, results_root=results_root, stages=REDUCE_STAGES)
    runner = Runner(spec, profile, results_root, dry_run=True)
    plan["stages"]["analyze"] = analysis_jobs(runner, spec, table, profile)
    return plan
