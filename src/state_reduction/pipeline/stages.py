"""The stage runner: prune -> evaluate (pre-RFT) -> RFT -> evaluate (post-RFT), plus the dense baseline, for the
cells a paper table needs, on either profile.

A stage kind is registered once (`register_stage`): a function (runner, result name, configuration) -> result
record. The pipeline's own kinds are `prune` (key channels), `shed` (structure removal, pruning.shed), `linearize` (MLP
linearization, ralimp.linearize), `rft` and `evaluate`; other modules add theirs (analysis.experiment registers `analyze`) and run them through
`Runner.sweep`, which keys, resumes and mirrors every result as the pipeline's own stages are.

`run_table(experiment, table, profile)` runs every missing stage and returns the result files. Each stage is a
sweep (results.run_sweep) keyed by its configuration, which includes the key of the stage it builds on: a rerun
does nothing, a killed run resumes at the first missing result, and a changed setting reruns exactly the stages
downstream of it.

Results go to results/<profile>/<experiment>/<model>-<method>-r<pct>-<stage>.json; model artifacts to
results/<profile>/<experiment>/models/.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from transformers import AutoModelForCausalLM

from state_reduction.atomic import is_complete
from state_reduction.backend import install_cpu_backend
from state_reduction.checkpoints import load_model, load_tokenizer, save_model_atomic
from state_reduction.data import sample_sequences
from state_reduction.devices import compute_dtype, resolve_device
from state_reduction.evaluation import evaluate
from state_reduction.evaluation.longctx import check_model_path
from state_reduction.evaluation.run import SUITE_CONTEXT, EvaluationError, _require_hub
from state_reduction.pipeline.spec import (
    CONTROL,
    Cell,
    PipelineError,
    find_experiment,
    load_experiment,
    profile_spec,
    profile_tables,
    resolve_model_path,
    table_cells,
    table_evaluate,
    table_seeds,
)
from state_reduction.pruning.prune import PruneConfig, prune, prune_result
from state_reduction.pruning.shed import decode_timing, parse_structure_method, prune_cell, shed_result, structure_costs
from state_reduction.ralimp.linearize import fit_metrics, linearize_model, method_spec, parse_linearize_method
from state_reduction.ralimp.linearize import measure as measure_linearized
from state_reduction.results import (
    ResultsError,
    build_result,
    config_key,
    measure,
    model_entry,
    read_result,
    results_dir,
    run_sweep,
)
from state_reduction.rft import RFTConfig, run_rft as fine_tune
from state_reduction.rft.trainer import MODEL_DIR
from state_reduction.tracking import mirror_result

# The steps of a table's plan, in the order they run; each runs one stage kind (STEP_KINDS).
STAGES = ("baseline", "prune", "eval-pre", "rft", "eval-post")


@dataclass(frozen=True)
class Stage:
    """A registered stage kind: `run(runner, result name, configuration)` returns the result record."""

    name: str
    run: Callable[[Runner, str, dict], dict]
    doc: str = ""


STAGE_REGISTRY: dict[str, Stage] = {}


def register_stage(name: str):
    """Decorator: register `fn(runner, name, config) -> result record` as stage kind `name`."""

    def add(fn):
        if name in STAGE_REGISTRY and STAGE_REGISTRY[name].run is not fn:
            raise PipelineError(f"stage {name!r} is registered twice ({STAGE_REGISTRY[name].run.__module__} and "
                                f"{fn.__module__})")
        STAGE_REGISTRY[name] = Stage(name, fn, (fn.__doc__ or "").strip().split("\n")[0])
        return fn

    return add


def get_stage(name: str) -> Stage:
    if name not in STAGE_REGISTRY:
        close = difflib.get_close_matches(name, STAGE_REGISTRY, n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise PipelineError(f"no stage {name!r}; {hint}stages: {', '.join(STAGE_REGISTRY)}")
    return STAGE_REGISTRY[name]


# method-name parsers of the stage kinds other than `prune` (key channels), in the order they are tried
REDUCTION_KINDS = (("shed", parse_structure_method), ("linearize", parse_linearize_method))


def prune_kind(method: str) -> str:
    """The stage kind that makes the reduced model of `method`: `shed` for structure removal, `linearize` for MLP
    linearization (optionally after key channels), else `prune`."""
    return next((kind for kind, parse in REDUCTION_KINDS if parse(method) is not None), "prune")


def check_context(spec: dict, profile: str, keys, local_only: bool = False, evaluate: dict | None = None) -> None:
    """Before any compute: the context length of the long-context suite (the table's `evaluate`, else the
    profile's) must fit every model of the table (evaluation.longctx.check_model_path reads config and tokenizer
    files only). `local_only` (dry runs) skips models that are not local folders, which would need the hub."""
    evaluate = evaluate or profile_spec(spec, profile)["evaluate"]
    if evaluate["suite"] not in SUITE_CONTEXT:
        return
    for key in keys:
        try:
            path = resolve_model_path(profile_spec(spec, profile)["models"][key]["path"])
        except PipelineError:
            if local_only:
                continue
            raise
        if local_only and not Path(path).is_dir():
            continue
        check_model_path(path, SUITE_CONTEXT[evaluate["suite"]], evaluate.get("max_length"))


class Runner:
    """The configurations and models of one experiment and profile, and the sweeps of its stages."""

    def __init__(self, spec: dict, profile: str, results_root=None, data_dir=None, dry_run: bool = False,
                 evaluate: tuple[dict, str] | None = None, dense: dict | None = None):
        self.spec, self.profile, self.data_dir, self.dry_run = spec, profile, data_dir, dry_run
        self.p = profile_spec(spec, profile)
        self.evaluate, self.eval_suffix = evaluate or (self.p["evaluate"], "")  # see table_evaluate
        self.out = results_dir(profile, spec["experiment"], results_root)
        self.models_dir = self.out / "models"
        self._dense = {} if dense is None else dense  # `dense`: shared by runners of one experiment (one hash each)

    # -- configurations: each includes the key of what it builds on -------------------------------------
    def dense(self, key: str) -> dict:
        if key not in self._dense and self.dry_run:  # no hub call, no file read: the plan only names the model
            path = self.p["models"][key]["path"]
            try:
                path = resolve_model_path(path)
            except PipelineError:
                pass  # an unset ${VAR} stays visible in the plan
            self._dense[key] = {"path": path, "weights_sha256": "<hashed at run time>"}
        if key not in self._dense:
            path = resolve_model_path(self.p["models"][key]["path"])
            if self.profile == "tiny" and not Path(path).is_dir():  # else taken for a hub id, failing much later
                raise PipelineError(f"model {key!r} of profile 'tiny': no checkpoint folder {path} (the tiny profile "
                                    "runs local checkpoints; experiments/tiny_models/README.md trains them)")
            self._dense[key] = {"path": path, **{k: v for k, v in model_entry(path).items() if k != "path"}}
        return self._dense[key]

    def base_config(self, model: str, stage: str, method, ratio: float, vary=()) -> dict:
        """The keys every stage's configuration starts with: what it is and which dense model it reduces."""
        d = self.dense(model)
        return {"experiment": self.spec["experiment"], "stage": stage, "model": model,
                "model_path": self.p["models"][model]["path"], "dense_weights_sha256": d["weights_sha256"],
                "method": method, "ratio": ratio, **({"vary": dict(vary)} if vary else {})}

    def _base(self, cell: Cell, stage: str) -> dict:
        return self.base_config(cell.model, stage, cell.method, cell.ratio, cell.vary)

    def prune_config(self, cell: Cell) -> dict:
        cell = cell.pruning()  # every RFT budget of a replicate fine-tunes the same pruned model
        return {**self._base(cell, "prune"), "select": self.spec.get("select", "kq"), **self.p["prune"],
                **dict(cell.vary)}

    def rft_config(self, cell: Cell) -> dict:
        rft = self.p["rft"]
        seed = dict(cell.vary).get("seed")
        pruned = CONTROL if cell.method == CONTROL else config_key(self.prune_config(cell))
        seeded = {"seed": seed} if seed is not None else {}
        # the recipe's resolved values (dataclass defaults, preset, the profile's overrides, the replicate's seed) are
        # part of the key: editing any of them reruns RFT and what follows, and the dry-run plan shows them
        budget = cell.rft_overrides()  # a table's `vary: {rft_<field>: ...}` (spec.RFT_VARY)
        overrides = {k: v for k, v in rft.items() if k != "preset"} | seeded | budget
        recipe = RFTConfig.from_preset(rft["preset"], "<pruned>", "<dense>", "<out>", profile=self.profile,
                                       **overrides).recipe()
        return {**self._base(cell, "rft"), "pruned": pruned, **rft, **seeded, **budget, "preset_values": recipe}

    def eval_config(self, cell: Cell, rft: bool) -> dict:
        if not rft:
            cell = cell.pruning()  # a pruned model's evaluation is one for all its RFT budgets
        if cell.method == "baseline":
            of = "dense"
        else:
            of = config_key(self.rft_config(cell) if rft else self.prune_config(cell))
        stage = "baseline" if cell.method == "baseline" else ("eval-post" if rft else "eval-pre")
        return {**self._base(cell, stage), "rft": rft, "of": of, **self.evaluate}

    def model_dir(self, cell: Cell, stage: str, config: dict) -> Path:
        return self.models_dir / f"{cell.name}-{stage}-{config_key(config)}"

    @staticmethod
    def cell_of(config: dict) -> Cell:
        return Cell(config["model"], config["method"], config["ratio"], tuple(sorted(config.get("vary", {}).items())))

    _cell = cell_of

    # -- models the stages build on ----------------------------------------------------------------------
    def ensure_pruned(self, cell: Cell) -> Path:
        if cell.method == CONTROL:  # the control fine-tunes the dense model itself
            return Path(self.dense(cell.model)["path"])
        cell = cell.pruning()
        config = self.prune_config(cell)
        folder = self.model_dir(cell, "prune", config)
        if not is_complete(folder):  # published whole, marker last (atomic.publishing); selection.json or shed.json
            get_stage(prune_kind(cell.method)).run(self, f"{cell.name}-prune", config)
        return folder

    def ensure_rft(self, cell: Cell) -> Path:
        """The merged post-RFT model of `cell`, fine-tuning it (or resuming its checkpoint) if it is missing."""
        config = self.rft_config(cell)
        folder = self.model_dir(cell, "rft", config)
        if not is_complete(folder / MODEL_DIR):
            get_stage("rft").run(self, f"{cell.name}-rft", config)
        return folder / MODEL_DIR

    # -- running ---------------------------------------------------------------------------------------
    def stage_fn(self, kind: str) -> Callable[[str, dict], dict]:
        """run_sweep's function for stage kind `kind` on this runner."""
        stage = get_stage(kind)
        return lambda name, config: stage.run(self, name, config)

    def run_prune(self, name: str, config: dict) -> dict:
        return get_stage(prune_kind(config["method"])).run(self, name, config)

    def run_rft(self, name: str, config: dict) -> dict:
        return get_stage("rft").run(self, name, config)

    def run_eval(self, name: str, config: dict) -> dict:
        return get_stage("evaluate").run(self, name, config)

    def sweep(self, jobs: list[tuple[str, dict]], fn: Callable[[str, dict], dict] | str) -> list[Path]:
        """Run the missing `jobs` ((result name, configuration) pairs) of a stage (a kind name or a function), in
        this runner's results folder, mirroring each new result to wandb; return the result files."""
        fn = self.stage_fn(fn) if isinstance(fn, str) else fn
        return run_sweep(jobs, fn, self.out, on_result=mirror(self))


_Runner = Runner  # the name modules and tests used before the split


# -- the pipeline's stage kinds ------------------------------------------------------------------------------
@register_stage("prune")
def run_prune(runner: Runner, name: str, config: dict) -> dict:
    """Key-channel pruning of the dense model (pruning.prune)."""
    cell = runner.cell_of(config)
    folder = runner.model_dir(cell, "prune", config)
    record = prune(PruneConfig(
        model=runner.dense(cell.model)["path"], method=cell.method, ratio=cell.ratio, out=str(folder),
        select=config["select"], calib=config["calib"], n_calib=config["n_calib"],
        seq_len=config["seq_len"], seed=config["seed"], batch_size=config.get("batch_size", 8),
        stream_layers=config.get("stream_layers", False), device=config.get("device"),
        budget=config.get("budget", "uniform"), budget_floor=config.get("budget_floor", 1),
        budget_granularity=config.get("budget_granularity", "layer"),
        allow_layer_removal=config.get("allow_layer_removal", False),
        selector_options=config.get("selector_options"),
        multiple=config.get("multiple"), overwrite=True, data_dir=runner.data_dir))
    result = prune_result(record, folder, profile=runner.profile, experiment=runner.spec["experiment"], config=config)
    return _with_costs(runner, cell, config, folder, result)


@register_stage("shed")
def run_shed(runner: Runner, name: str, config: dict) -> dict:
    """Mamba-Shedder cells (`shed-<target>[+<selector>]`, pruning.shed.prune_cell)."""
    cell = runner.cell_of(config)
    folder = runner.model_dir(cell, "prune", config)
    out = prune_cell(runner.dense(cell.model)["path"], cell.method, cell.ratio, folder, calib=config["calib"],
                     n_calib=config["n_calib"], seq_len=config["seq_len"], seed=config["seed"],
                     batch_size=config.get("batch_size", 8), select=config["select"],
                     search_method=config.get("search", "greedy"), group_size=config.get("group_size", 64),
                     data_dir=runner.data_dir)
    kw = {"profile": runner.profile, "experiment": runner.spec["experiment"], "config": config}
    result = shed_result(out["shed"], folder, **kw)
    if out["prune"] is not None:
        kc = prune_result(out["prune"], folder, **kw)
        result["metrics"].update({k: kc["metrics"][k] for k in ("key_dim_before", "key_dim_after")},
                                 state_bytes_after=kc["metrics"]["state_bytes_after"])
        for stale in ("parameters_after", "flops_per_token_after"):  # of the shed model, before the key channels
            result["metrics"].pop(stale, None)
        result["extra"]["selection_file"] = kc["extra"]["selection_file"]
        result["model"] = kc["model"]
        result["wall_time_s"] += kc["wall_time_s"]
    return _with_costs(runner, cell, config, folder, result)


@register_stage("linearize")
def run_linearize(runner: Runner, name: str, config: dict) -> dict:
    """MLP linearization (`[<selector>+]<method>-k<k>`, ralimp.linearize): the last k gated MLPs of the dense model,
    or of the selector's key-channel-pruned model at the cell's ratio (the same pruned model as the selector's own
    cell), replaced, initialised by least squares, fitted to the dense MLPs' outputs, saved as the registered
    variant. With the profile's `costs: true`: parameters / state bytes / FLOPs of the dense and the deployed
    (folded) model, and with `decode:` their decode time side by side, as for the other reduction stages."""
    cell = runner.cell_of(config)
    parsed = parse_linearize_method(cell.method)
    folder = runner.model_dir(cell, "prune", config)
    dense_path = runner.dense(cell.model)["path"]
    settings = dict(config.get("linearize") or {})
    fit_steps, fit_lr = settings.pop("fit_steps", 0), settings.pop("fit_lr", 3e-3)
    spec = method_spec(parsed.method, settings.pop("budget", 32), settings.pop("rank", 128), **settings)
    install_cpu_backend()
    with measure() as m:
        source, state = dense_path, None
        if parsed.selector is not None:
            source = runner.ensure_pruned(Cell(cell.model, parsed.selector, cell.ratio, cell.vary))
            state = json.loads((Path(source) / "selection.json").read_text())
        torch.manual_seed(config["seed"])
        model = load_model(str(source)).eval()
        tokenizer = load_tokenizer(str(source))
        ids = sample_sequences(tokenizer, config["calib"], config["n_calib"], config["seq_len"], config["seed"],
                               stream="calibration", data_dir=runner.data_dir)
        variant, idx, report, init_s = linearize_model(model, ids, parsed.k, spec=spec, seed=config["seed"],
                                                       fit_steps=fit_steps, fit_lr=fit_lr)
        save_model_atomic(variant, tokenizer, folder, overwrite=True)
    metrics = {"init_time_s": init_s, **fit_metrics(report)}
    if state is not None:
        metrics.update(key_dim_before=state["key_dim_before"], key_dim_after=state["key_dim_after"])
    if config.get("costs"):
        dense = AutoModelForCausalLM.from_pretrained(dense_path).eval()
        metrics.update(measure_linearized(dense, AutoModelForCausalLM.from_pretrained(str(folder)).eval(), idx,
                                          config.get("decode")))
    return build_result("prune", profile=runner.profile, experiment=runner.spec["experiment"], config=config,
                        metrics=metrics, model=model_entry(folder), data={}, seeds={"selection": config["seed"]},
                        wall_time_s=m["wall_time_s"],
                        extra={"replaced_layers": idx, "fit": {str(i): r for i, r in report.items()}, "ralimp": spec,
                               "source_model": str(source),
                               **({"selection_file": str(Path(source) / "selection.json")} if state else {})})


def _with_costs(runner: Runner, cell: Cell, config: dict, folder: Path, result: dict) -> dict:
    """With the profile's `prune: {costs: true}`: parameters, state bytes and FLOPs per token of the dense and
    the pruned model (pruning.shed.structure_costs), and with `decode: {...}` (pruning.shed.decode_timing
    settings) their batch-1 decode time, side by side."""
    if not config.get("costs"):
        return result

    dense = AutoModelForCausalLM.from_pretrained(runner.dense(cell.model)["path"]).eval()
    reduced = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    before, after = structure_costs(dense), structure_costs(reduced)
    result["metrics"].update({f"{k}_before": v for k, v in before.items()})
    result["metrics"].update({f"{k}_after": v for k, v in after.items()})
    if config.get("decode"):
        result["metrics"].update(decode_timing(dense, reduced, **config["decode"]))
    return result


@register_stage("rft")
def run_rft(runner: Runner, name: str, config: dict) -> dict:
    """Recovery fine-tuning of the pruned model (or of the dense one for the control), rft.run_rft."""
    cell = runner.cell_of(config)
    folder = runner.model_dir(cell, "rft", config)
    student = runner.ensure_pruned(cell)
    overrides = {k: v for k, v in config.items()
                 if k not in runner._base(cell, "rft") and k not in ("pruned", "preset", "preset_values")}
    overrides.setdefault("wandb", "disabled")  # the result's wandb mirror carries the loss curve, with tags
    cfg = RFTConfig.from_preset(config["preset"], str(student), runner.dense(cell.model)["path"], str(folder),
                                profile=runner.profile, experiment=runner.spec["experiment"], resume=True,
                                **overrides)
    with measure() as m:
        record = fine_tune(cfg)  # resumes a killed run from its checkpoint; returns at once if it finished
    return build_result("rft", profile=runner.profile, experiment=runner.spec["experiment"], config=config,
                        metrics=record["metrics"], model=record["model"], data=record.get("data", {}),
                        seeds=record.get("seeds", {}), wall_time_s=m["wall_time_s"],
                        extra={"rft_config": record["config"], "rft_result": str(folder / "rft_result.json")})


@register_stage("evaluate")
def run_eval(runner: Runner, name: str, config: dict) -> dict:
    """Evaluation of the dense, pruned or post-RFT model (evaluation.evaluate)."""
    cell = runner.cell_of(config)
    if cell.method == "baseline":
        folder = runner.dense(cell.model)["path"]
    else:
        folder = runner.ensure_rft(cell) if config["rft"] else runner.ensure_pruned(cell)
    install_cpu_backend()
    device = resolve_device(None)  # the GPU when present: lm-eval runs on the model's device
    with measure() as m:
        model = load_model(str(folder), dtype=compute_dtype(device)).to(device)
        tokenizer = load_tokenizer(str(folder))
        model.eval()
        out = evaluate(model, tokenizer, suite=config["suite"], batch_size=config["batch_size"],
                       max_length=config["max_length"], limit=config["limit"], data_dir=runner.data_dir)
    data = {t: d["sha256"] for t, d in out["data"].items() if d}
    return build_result("evaluate", profile=runner.profile, experiment=runner.spec["experiment"], config=config,
                        metrics=out["metrics"], model=model_entry(folder), data=data, seeds={},
                        wall_time_s=m["wall_time_s"],
                        extra={k: out[k] for k in ("suite", "tasks", "n_examples", "lm_eval_version", "vocab")
                               if k in out} | {"data_files": out["data"], "device": str(device)})


# -- a table's plan ------------------------------------------------------------------------------------------
def stage_jobs(runner: Runner, keys, cells, rft_states, stages):
    """(step, [(result name, config)], stage function) in the order they run."""
    sfx = runner.eval_suffix
    if "baseline" in stages:
        base = [Cell(k, "baseline", 0.0) for k in keys]
        yield "baseline", [(f"{c.name}-eval{sfx}", runner.eval_config(c, False)) for c in base], runner.run_eval
    # the control has no pruning and no pre-RFT evaluation; the RFT budgets of one replicate share both
    pruned = list(dict.fromkeys(c.pruning() for c in cells if c.method != CONTROL))
    if "prune" in stages:
        yield "prune", [(f"{c.name}-prune", runner.prune_config(c)) for c in pruned], runner.run_prune
    if False in rft_states and "eval-pre" in stages:
        yield "eval-pre", [(f"{c.name}-eval-pre{sfx}", runner.eval_config(c, False)) for c in pruned], runner.run_eval
    if True in rft_states and "rft" in stages:
        yield "rft", [(f"{c.name}-rft", runner.rft_config(c)) for c in cells], runner.run_rft
    if True in rft_states and "eval-post" in stages:
        yield "eval-post", [(f"{c.name}-eval-post{sfx}", runner.eval_config(c, True)) for c in cells], runner.run_eval


_stage_jobs = stage_jobs


def require_hub_for(profile: str, what: str) -> None:
    if profile != "paper":
        return

    try:
        _require_hub()
    except EvaluationError as e:
        raise PipelineError(f"profile 'paper' runs the paper's checkpoints and lm-eval tasks from the "
                            f"Hugging Face hub; {e}. Use --profile tiny ({what} with PROFILE=tiny) here, "
                            f"or --dry-run to print the plan") from None


def offline_cache() -> str | None:
    """The prefetched cache a run uses offline: $STATE_REDUCTION_CACHE when HF_HUB_OFFLINE is set too, else None.
    Its artefacts are checked before any compute by the caller (`state-reduction run-table` runs
    `prefetch.check_offline`; the pipeline does not import prefetch, which plans from the pipeline)."""
    cache = os.environ.get("STATE_REDUCTION_CACHE")
    return cache if os.environ.get("HF_HUB_OFFLINE") and cache else None


def plan_table(experiment: str | None, table: str, profile: str = "tiny", results_root=None,
               stages=STAGES, seeds=None) -> dict:
    """What run_table would run, without running, loading a model or calling the hub: per stage the result
    names and their resolved configurations (keys of upstream stages depend on the dense weights' hash, so
    the plan shows configurations, not keys)."""
    experiment = experiment or find_experiment(table)
    spec = load_experiment(experiment)
    keys, cells, rft_states = table_cells(spec, table, profile, seeds)
    evaluate = table_evaluate(spec, table, profile)
    check_context(spec, profile, keys, local_only=True, evaluate=evaluate[0])
    runner = Runner(spec, profile, results_root, dry_run=True, evaluate=evaluate)
    return {"experiment": spec["experiment"], "table": table, "profile": profile, "results_dir": str(runner.out),
            "models": {k: runner.dense(k)["path"] for k in keys}, "rft": list(rft_states),
            "stages": {stage: jobs for stage, jobs, _ in stage_jobs(runner, keys, cells, rft_states, stages)}}


def run_table(experiment: str | None, table: str, profile: str = "tiny", results_root=None, data_dir=None,
              stages=STAGES, seeds=None) -> list[Path]:
    """Run what `table` needs and is missing, in this process; return the result files it reads. `experiment`
    None: the one that declares the table (find_experiment); `seeds` overrides the table's replicate seeds
    (table_seeds). `pipeline.run_table` (pipeline.workers) can also run the table in several processes."""
    experiment = experiment or find_experiment(table)
    spec = load_experiment(experiment)
    keys, cells, rft_states = table_cells(spec, table, profile, seeds)
    if offline_cache() is None:  # a prefetched cache offline: no hub check (the caller checked the cache)
        require_hub_for(profile, f"make {table}")
    evaluate = table_evaluate(spec, table, profile)
    check_context(spec, profile, keys, evaluate=evaluate[0])
    torch.manual_seed(0)
    runner = Runner(spec, profile, results_root, data_dir, evaluate=evaluate)
    paths = []
    for _, jobs, fn in stage_jobs(runner, keys, cells, rft_states, stages):
        paths += runner.sweep(jobs, fn)
    return paths


def stale_results(experiment: str, profile: str, results_root=None) -> list[tuple[str, str, str, str]]:
    """The experiment's result files that its config no longer gives: (file name, stored config key, the key the
    config gives now, a table that reads it) for each file whose name a table of `profile` plans under another
    configuration (an edited recipe, setting or dense checkpoint whose table was not rerun since). Renders and
    claims read every result file, so such a file would mix recipes until its table is rerun. Files no table plans
    (a removed table, another tool's results) are not judged. Every replicate seed found among the results is
    planned, so the results of `run-table --seeds` are judged too. Hashes each local dense checkpoint once."""
    spec = load_experiment(experiment)
    folder = results_dir(profile, spec["experiment"], results_root)
    stored, seeds = {}, set()
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            record = read_result(path)
        except ResultsError:
            continue  # not a result (a manifest, a plan)
        stored[path.stem] = record["config_key"]
        seed = (record.get("config", {}).get("vary") or {}).get("seed")
        if isinstance(seed, int) and not isinstance(seed, bool):
            seeds.add(seed)
    if not stored:
        return []
    dense, stale = {}, {}
    for table in profile_tables(spec, profile):
        planned = sorted(set(table_seeds(spec, table, profile)) | seeds)
        keys, cells, rft_states = table_cells(spec, table, profile, planned)
        runner = Runner(spec, profile, results_root, evaluate=table_evaluate(spec, table, profile), dense=dense)
        for _, jobs, _ in stage_jobs(runner, keys, cells, rft_states, STAGES):
            for name, config in jobs:
                key = config_key(config)
                if name in stored and stored[name] != key:
                    stale.setdefault(name, (name, stored[name], key, table))
    return sorted(stale.values())


def mirror(runner: Runner):
    """run_sweep's on_result: each new result is mirrored to wandb (offline unless configured online)."""
    return lambda path, record: mirror_result(path, record, results_root=runner.out.parent.parent)


_mirror = mirror


def collect(experiment: str, profile: str, results_root=None) -> list[dict]:
    """Every result of the experiment on the profile (renderers read these)."""
    folder = results_dir(profile, experiment, results_root)
    return [read_result(p) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []


def clean_models(experiment: str, profile: str, results_root=None) -> None:
    """Remove the model artifacts (results stay; a rerun re-creates only what an unfinished stage needs)."""
    shutil.rmtree(results_dir(profile, experiment, results_root) / "models", ignore_errors=True)
