"""Experiment pipelines: prune -> evaluate (pre-RFT) -> RFT -> evaluate (post-RFT), plus the dense baseline,
for the cells a paper table needs, on either profile.

An experiment is `experiments/<name>/config.yaml`: per profile the models (each standing for one or more
of the paper's model names), pruning, RFT and evaluation settings; and per table the paper's model
names, ratios and RFT states it shows. `run_table(experiment, table, profile)` runs every missing stage
and returns the result files. Each stage is a sweep (results.run_sweep) keyed by its configuration, which
includes the key of the stage it builds on: a rerun does nothing, a killed run resumes at the first
missing result, and a changed setting reruns exactly the stages downstream of it.

Results go to results/<profile>/<experiment>/<model>-<method>-r<pct>-<stage>.json; model artifacts to
results/<profile>/<experiment>/models/.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from state_reduction.atomic import is_complete
from state_reduction.errors import Error
from state_reduction.provenance import REPO_ROOT
from state_reduction.results import (
    build_result,
    config_key,
    measure,
    model_entry,
    read_result,
    results_dir,
    run_sweep,
)

EXPERIMENTS_DIR = REPO_ROOT / "experiments"
STAGES = ("baseline", "prune", "eval-pre", "rft", "eval-post")


class PipelineError(Error, ValueError):
    """An experiment, table or profile cannot be run as asked; the message says which and why."""


@dataclass(frozen=True)
class Cell:
    model: str  # the profile's model key
    method: str
    ratio: float
    vary: tuple[tuple[str, object], ...] = ()  # pruning-setting overrides from a table's `vary:`, sorted by name

    @property
    def name(self) -> str:
        return f"{self.model}-{self.method}-r{round(self.ratio * 100)}" + vary_suffix(self.vary)


def load_experiment(name: str) -> dict:
    """experiments/<name>/config.yaml, or a YAML file given by path (tests, private experiments)."""
    path = Path(name) if str(name).endswith((".yaml", ".yml")) else EXPERIMENTS_DIR / name / "config.yaml"
    if not path.is_file() and path.suffix in (".yaml", ".yml") and path.parent != EXPERIMENTS_DIR / name:
        raise PipelineError(f"experiment file {path} does not exist")
    if not path.is_file():
        known = sorted(p.parent.name for p in EXPERIMENTS_DIR.glob("*/config.yaml"))
        raise PipelineError(f"experiment {name!r} has no {path.relative_to(REPO_ROOT)}; known: {', '.join(known)}")
    spec = yaml.safe_load(path.read_text())
    for key in ("experiment", "methods", "profiles", "tables"):
        if key not in spec:
            raise PipelineError(f"{path}: missing {key!r}")
    return spec


def profile_spec(spec: dict, profile: str) -> dict:
    if profile not in spec["profiles"]:
        raise PipelineError(f"experiment {spec['experiment']!r} has no profile {profile!r}; "
                            f"profiles: {', '.join(spec['profiles'])}")
    return spec["profiles"][profile]


def resolve_model_path(path: str) -> str:
    """Expand ${VARS}; a relative path that exists under the repository root is taken from there."""
    missing = [v for v in re.findall(r"\$\{(\w+)\}", path) if v not in os.environ]
    if missing:
        raise PipelineError(f"model path {path!r} needs the environment variable {', '.join(missing)} "
                            "(where the locally pretrained checkpoints are)")
    path = os.path.expandvars(path)
    local = REPO_ROOT / path
    return str(local) if not os.path.isabs(path) and local.exists() else path


def find_experiment(table: str) -> str:
    """The experiment whose config.yaml declares `table` under `tables:` (exactly one may)."""
    owners = sorted(p.parent.name for p in EXPERIMENTS_DIR.glob("*/config.yaml")
                    if table in (yaml.safe_load(p.read_text()) or {}).get("tables", {}))
    if len(owners) != 1:
        declared = sorted({t for p in EXPERIMENTS_DIR.glob("*/config.yaml")
                           for t in (yaml.safe_load(p.read_text()) or {}).get("tables", {})},
                          key=lambda t: (len(t), t))
        raise PipelineError(f"{table!r} is declared by {len(owners)} experiments ({', '.join(owners) or 'none'}); "
                            f"pass --experiment. Tables declared: {', '.join(declared)}")
    return owners[0]


def table_methods(spec: dict, table: str) -> list[str]:
    """The table's `methods:` (a subset of the experiment's, e.g. Table 13 shows only DRRQR and L1), else all."""
    methods = spec["tables"][table].get("methods", spec["methods"])
    unknown = [m for m in methods if m not in spec["methods"]]
    if unknown:
        raise PipelineError(f"{table} of experiment {spec['experiment']!r} lists methods {unknown} that the "
                            f"experiment does not run; its methods: {', '.join(spec['methods'])}")
    return list(methods)


def table_cells(spec: dict, table: str, profile: str, seeds=None) -> tuple[list[str], list[Cell], tuple[bool, ...]]:
    """(model keys, cells, rft states) of `table` on `profile`; the paper's model names map to model keys
    through `stands_for`, and two names on one stand-in give one set of runs. The methods are the table's
    `methods:` where it has one, else the experiment's."""
    tables = spec.get("tables", {})
    if table not in tables:
        raise PipelineError(f"experiment {spec['experiment']!r} does not feed {table!r}; tables: {', '.join(tables)}")
    t = tables[table]
    models = profile_spec(spec, profile)["models"]
    keys = []
    for paper_name in t["models"]:
        key = next((k for k, m in models.items() if paper_name in m["stands_for"]), None)
        if key is None:
            raise PipelineError(f"{table} needs {paper_name!r}, which no model of profile {profile!r} stands for")
        if key not in keys:
            keys.append(key)
    cells = [Cell(k, m, float(r)) for k in keys for r in t["ratios"] for m in table_methods(spec, table)]
    rft_states = tuple(bool(x) for x in t["rft"])
    if t.get("control") and True in rft_states:
        cells += [Cell(k, CONTROL, 0.0) for k in keys]
    cells = expand_vary(spec, table, profile, cells, seeds)
    return keys, cells, rft_states


# The dense+RFT control of a table with `control: true` (issue 15): the dense model fine-tuned with the table's
# RFT recipe and budget, evaluated post-RFT only, so that recovery can be read against it rather than against a
# dense model that never saw the fine-tuning data.
CONTROL = "dense"


def table_seeds(spec: dict, table: str, profile: str, override=None) -> list:
    """The replicate seeds of `table` on `profile`: `override` (run-table --seeds), else the table's
    `seeds: {profile: [...]}`, else the profile's `seeds:`, else the profile's one pruning seed. One seed drives both
    the calibration draw and the RFT run of a replicate (its data order and LoRA initialisation), so replicates
    differ in everything that is random."""
    own = (spec["tables"][table].get("seeds") or {})
    if not isinstance(own, dict):
        raise PipelineError(f"{table} of experiment {spec['experiment']!r}: seeds must be a mapping profile -> list "
                            f"of ints, got {own!r}")
    p = profile_spec(spec, profile)
    seeds = list(override) if override is not None else own.get(profile, p.get("seeds", [p["prune"]["seed"]]))
    if not seeds or not all(isinstance(x, int) and not isinstance(x, bool) for x in seeds) \
            or len(set(seeds)) != len(seeds):
        raise PipelineError(f"{table} of experiment {spec['experiment']!r} ({profile}): seeds must be a list of "
                            f"distinct ints, got {seeds!r}")
    return list(seeds)


# A table's `vary:` crosses pruning settings with its cells (Tables 2, 7, 16): a mapping of setting -> list of
# values (crossed), or a list of such mappings (their union). A value list may be a mapping profile -> list.
VARY_SETTINGS = {"select": "sel", "calib": "cal", "n_calib": "n", "seq_len": "len", "seed": "seed"}


def vary_suffix(vary) -> str:
    return "".join(f"-{VARY_SETTINGS[k]}_{v}" for k, v in vary)


def table_variations(spec: dict, table: str, profile: str) -> list[tuple[tuple[str, object], ...]]:
    """The pruning-setting overrides of `table` on `profile`, each sorted by setting name; a value equal to the
    profile's own setting is no override (so that cell keeps the plain name and key), duplicates are dropped.
    No `vary:` gives the one empty override."""
    import itertools

    vary = spec["tables"][table].get("vary")
    if not vary:
        return [()]
    defaults = {"select": spec.get("select", "kq"), **profile_spec(spec, profile)["prune"]}
    out = []
    for block in vary if isinstance(vary, list) else [vary]:
        unknown = [k for k in block if k not in VARY_SETTINGS]
        if unknown:
            raise PipelineError(f"{table} of experiment {spec['experiment']!r} varies {unknown}; "
                                f"settings that can vary: {', '.join(VARY_SETTINGS)}")
        names = sorted(block)
        lists = []
        for k in names:
            values = block[k]
            if isinstance(values, dict):
                if profile not in values:
                    raise PipelineError(f"{table}: vary {k!r} has no values for profile {profile!r}")
                values = values[profile]
            lists.append(values)
        for combo in itertools.product(*lists):
            v = tuple((k, x) for k, x in zip(names, combo) if x != defaults.get(k))
            if v not in out:
                out.append(v)
    return out


def table_evaluate(spec: dict, table: str, profile: str) -> tuple[dict, str]:
    """The evaluation settings of `table` on `profile`: the profile's `evaluate:` updated by the table's own
    `evaluate: {<profile>: {...}}` (Table 14 needs the zero-shot suite where its experiment's other table needs
    perplexity only), and the suffix its evaluation results carry in their names ("" when nothing changes)."""
    base = profile_spec(spec, profile)["evaluate"]
    override = (spec["tables"][table].get("evaluate") or {}).get(profile) or {}
    unknown = sorted(set(override) - set(base))
    if unknown:
        raise PipelineError(f"{table} of experiment {spec['experiment']!r} overrides evaluate settings {unknown}; "
                            f"settings: {', '.join(base)}")
    changed = sorted((k, v) for k, v in override.items() if base[k] != v)
    return {**base, **override}, "".join(f"-{k}_{v}" for k, v in changed)


def expand_vary(spec: dict, table: str, profile: str, cells: list[Cell], seeds=None) -> list[Cell]:
    """Each cell once per variation of the table (unchanged where the table has no `vary:`), and each of those
    once per replicate seed (table_seeds) unless the variation sets the seed itself (Table 7). The profile's own
    seed is no override, so the first replicate keeps the plain name and key of a single-seed run."""
    default = profile_spec(spec, profile)["prune"]["seed"]
    seeds = table_seeds(spec, table, profile, seeds)
    out = []
    for c in cells:
        for v in table_variations(spec, table, profile):
            if any(k == "seed" for k, _ in v):
                out.append(Cell(c.model, c.method, c.ratio, v))
                continue
            for seed in seeds:
                extra = () if seed == default else (("seed", seed),)
                out.append(Cell(c.model, c.method, c.ratio, tuple(sorted(v + extra))))
    return out


def check_context(spec: dict, profile: str, keys, local_only: bool = False, evaluate: dict | None = None) -> None:
    """Before any compute: the context length of the long-context suite (the table's `evaluate`, else the
    profile's) must fit every model of the table (evaluation.longctx.check_model_path reads config and tokenizer
    files only). `local_only` (dry runs) skips models that are not local folders, which would need the hub."""
    from state_reduction.evaluation.longctx import check_model_path
    from state_reduction.evaluation.run import SUITE_CONTEXT

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


class _Runner:
    """The stage functions of one experiment and profile."""

    def __init__(self, spec: dict, profile: str, results_root=None, data_dir=None, dry_run: bool = False,
                 evaluate: tuple[dict, str] | None = None):
        self.spec, self.profile, self.data_dir, self.dry_run = spec, profile, data_dir, dry_run
        self.p = profile_spec(spec, profile)
        self.evaluate, self.eval_suffix = evaluate or (self.p["evaluate"], "")  # see table_evaluate
        self.out = results_dir(profile, spec["experiment"], results_root)
        self.models_dir = self.out / "models"
        self._dense = {}

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

    def _base(self, cell: Cell, stage: str) -> dict:
        d = self.dense(cell.model)
        return {"experiment": self.spec["experiment"], "stage": stage, "model": cell.model,
                "model_path": self.p["models"][cell.model]["path"], "dense_weights_sha256": d["weights_sha256"],
                "method": cell.method, "ratio": cell.ratio, **({"vary": dict(cell.vary)} if cell.vary else {})}

    def prune_config(self, cell: Cell) -> dict:
        return {**self._base(cell, "prune"), "select": self.spec.get("select", "kq"), **self.p["prune"],
                **dict(cell.vary)}

    def rft_config(self, cell: Cell) -> dict:
        from state_reduction.rft import RFTConfig

        rft = self.p["rft"]
        seed = dict(cell.vary).get("seed")
        pruned = CONTROL if cell.method == CONTROL else config_key(self.prune_config(cell))
        seeded = {"seed": seed} if seed is not None else {}
        # the recipe's resolved values (dataclass defaults, preset, the profile's overrides, the replicate's seed) are
        # part of the key: editing any of them reruns RFT and what follows, and the dry-run plan shows them
        overrides = {k: v for k, v in rft.items() if k != "preset"} | seeded
        recipe = RFTConfig.from_preset(rft["preset"], "<pruned>", "<dense>", "<out>", profile=self.profile,
                                       **overrides).recipe()
        return {**self._base(cell, "rft"), "pruned": pruned, **rft, **seeded, "preset_values": recipe}

    def eval_config(self, cell: Cell, rft: bool) -> dict:
        if cell.method == "baseline":
            of = "dense"
        else:
            of = config_key(self.rft_config(cell) if rft else self.prune_config(cell))
        stage = "baseline" if cell.method == "baseline" else ("eval-post" if rft else "eval-pre")
        return {**self._base(cell, stage), "rft": rft, "of": of, **self.evaluate}

    def model_dir(self, cell: Cell, stage: str, config: dict) -> Path:
        return self.models_dir / f"{cell.name}-{stage}-{config_key(config)}"

    # -- stages ----------------------------------------------------------------------------------------------
    def ensure_pruned(self, cell: Cell) -> Path:
        if cell.method == CONTROL:  # the control fine-tunes the dense model itself
            return Path(self.dense(cell.model)["path"])
        config = self.prune_config(cell)
        folder = self.model_dir(cell, "prune", config)
        if not is_complete(folder):  # published whole, marker last (atomic.publishing); selection.json or shed.json
            self._prune(cell, config, folder)
        return folder

    def _prune(self, cell: Cell, config: dict, folder: Path) -> dict:
        from state_reduction.pruning.prune import PruneConfig, prune, prune_result
        from state_reduction.pruning.shed import parse_structure_method

        if parse_structure_method(cell.method) is not None:
            return self._prune_structures(cell, config, folder)
        record = prune(PruneConfig(
            model=self.dense(cell.model)["path"], method=cell.method, ratio=cell.ratio, out=str(folder),
            select=config["select"], calib=config["calib"], n_calib=config["n_calib"],
            seq_len=config["seq_len"], seed=config["seed"], batch_size=config.get("batch_size", 8),
            stream_layers=config.get("stream_layers", False), device=config.get("device"),
            overwrite=True, data_dir=self.data_dir))
        result = prune_result(record, folder, profile=self.profile, experiment=self.spec["experiment"], config=config)
        return self._with_costs(cell, config, folder, result)

    def _prune_structures(self, cell: Cell, config: dict, folder: Path) -> dict:
        """Mamba-Shedder cells (`shed-<target>[+<selector>]`, pruning.shed.prune_cell)."""
        from state_reduction.pruning.prune import prune_result
        from state_reduction.pruning.shed import prune_cell, shed_result

        out = prune_cell(self.dense(cell.model)["path"], cell.method, cell.ratio, folder, calib=config["calib"],
                         n_calib=config["n_calib"], seq_len=config["seq_len"], seed=config["seed"],
                         batch_size=config.get("batch_size", 8), select=config["select"],
                         search_method=config.get("search", "greedy"), group_size=config.get("group_size", 64),
                         data_dir=self.data_dir)
        kw = {"profile": self.profile, "experiment": self.spec["experiment"], "config": config}
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
        return self._with_costs(cell, config, folder, result)

    def _with_costs(self, cell: Cell, config: dict, folder: Path, result: dict) -> dict:
        """With the profile's `prune: {costs: true}`: parameters, state bytes and FLOPs per token of the dense and
        the pruned model (pruning.shed.structure_costs), and with `decode: {...}` (pruning.shed.decode_timing
        settings) their batch-1 decode time, side by side."""
        if not config.get("costs"):
            return result
        from transformers import AutoModelForCausalLM

        from state_reduction.pruning.shed import decode_timing, structure_costs

        dense = AutoModelForCausalLM.from_pretrained(self.dense(cell.model)["path"]).eval()
        reduced = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
        before, after = structure_costs(dense), structure_costs(reduced)
        result["metrics"].update({f"{k}_before": v for k, v in before.items()})
        result["metrics"].update({f"{k}_after": v for k, v in after.items()})
        if config.get("decode"):
            result["metrics"].update(decode_timing(dense, reduced, **config["decode"]))
        return result

    def run_prune(self, name: str, config: dict) -> dict:
        cell = self._cell(config)
        return self._prune(cell, config, self.model_dir(cell, "prune", config))

    def ensure_rft(self, cell: Cell) -> Path:
        """The merged post-RFT model of `cell`, fine-tuning it (or resuming its checkpoint) if it is missing."""
        from state_reduction.rft.trainer import MODEL_DIR

        config = self.rft_config(cell)
        folder = self.model_dir(cell, "rft", config)
        if not is_complete(folder / MODEL_DIR):
            self._rft(cell, config, folder)
        return folder / MODEL_DIR

    def _rft(self, cell: Cell, config: dict, folder: Path) -> dict:
        from state_reduction.rft import RFTConfig, run_rft

        student = self.ensure_pruned(cell)
        overrides = {k: v for k, v in config.items() if k not in self._base(cell, "rft") and k not in ("pruned", "preset", "preset_values")}
        overrides.setdefault("wandb", "disabled")  # the result's wandb mirror carries the loss curve, with tags
        cfg = RFTConfig.from_preset(config["preset"], str(student), self.dense(cell.model)["path"], str(folder),
                                    profile=self.profile, experiment=self.spec["experiment"], resume=True,
                                    **overrides)
        with measure() as m:
            record = run_rft(cfg)  # resumes a killed run from its checkpoint; returns at once if it finished
        return build_result("rft", profile=self.profile, experiment=self.spec["experiment"], config=config,
                            metrics=record["metrics"], model=record["model"], data=record.get("data", {}),
                            seeds=record.get("seeds", {}), wall_time_s=m["wall_time_s"],
                            extra={"rft_config": record["config"], "rft_result": str(folder / "rft_result.json")})

    def run_rft(self, name: str, config: dict) -> dict:
        cell = self._cell(config)
        return self._rft(cell, config, self.model_dir(cell, "rft", config))

    def run_eval(self, name: str, config: dict) -> dict:
        from state_reduction.backend import install_cpu_backend
        from state_reduction.checkpoints import load_model, load_tokenizer
        from state_reduction.devices import compute_dtype, resolve_device
        from state_reduction.evaluation import evaluate

        cell = self._cell(config)
        if cell.method == "baseline":
            folder = self.dense(cell.model)["path"]
        else:
            folder = self.ensure_rft(cell) if config["rft"] else self.ensure_pruned(cell)
        install_cpu_backend()
        device = resolve_device(None)  # the GPU when present: lm-eval runs on the model's device
        with measure() as m:
            model = load_model(str(folder), dtype=compute_dtype(device)).to(device)
            tokenizer = load_tokenizer(str(folder))
            model.eval()
            out = evaluate(model, tokenizer, suite=config["suite"], batch_size=config["batch_size"],
                           max_length=config["max_length"], limit=config["limit"], data_dir=self.data_dir)
        data = {t: d["sha256"] for t, d in out["data"].items() if d}
        return build_result("evaluate", profile=self.profile, experiment=self.spec["experiment"], config=config,
                            metrics=out["metrics"], model=model_entry(folder), data=data, seeds={},
                            wall_time_s=m["wall_time_s"],
                            extra={k: out[k] for k in ("suite", "tasks", "n_examples", "lm_eval_version", "vocab")
                                   if k in out} | {"data_files": out["data"], "device": str(device)})

    @staticmethod
    def _cell(config: dict) -> Cell:
        return Cell(config["model"], config["method"], config["ratio"], tuple(sorted(config.get("vary", {}).items())))


def _stage_jobs(runner: _Runner, keys, cells, rft_states, stages):
    """(stage, [(result name, config)], stage function) in the order they run."""
    sfx = runner.eval_suffix
    if "baseline" in stages:
        base = [Cell(k, "baseline", 0.0) for k in keys]
        yield "baseline", [(f"{c.name}-eval{sfx}", runner.eval_config(c, False)) for c in base], runner.run_eval
    pruned = [c for c in cells if c.method != CONTROL]  # the control has no pruning and no pre-RFT evaluation
    if "prune" in stages:
        yield "prune", [(f"{c.name}-prune", runner.prune_config(c)) for c in pruned], runner.run_prune
    if False in rft_states and "eval-pre" in stages:
        yield "eval-pre", [(f"{c.name}-eval-pre{sfx}", runner.eval_config(c, False)) for c in pruned], runner.run_eval
    if True in rft_states and "rft" in stages:
        yield "rft", [(f"{c.name}-rft", runner.rft_config(c)) for c in cells], runner.run_rft
    if True in rft_states and "eval-post" in stages:
        yield "eval-post", [(f"{c.name}-eval-post{sfx}", runner.eval_config(c, True)) for c in cells], runner.run_eval


def _require_hub_for(profile: str, what: str) -> None:
    if profile != "paper":
        return
    from state_reduction.evaluation.run import EvaluationError, _require_hub

    try:
        _require_hub()
    except EvaluationError as e:
        raise PipelineError(f"profile 'paper' runs the paper's checkpoints and lm-eval tasks from the "
                            f"Hugging Face hub; {e}. Use --profile tiny ({what} with PROFILE=tiny) here, "
                            f"or --dry-run to print the plan") from None


def _check_offline_cache(profile: str, tables: list[str], experiment: str) -> bool:
    """With HF_HUB_OFFLINE set and $STATE_REDUCTION_CACHE naming a prefetched cache (state-reduction prefetch), every
    artefact of the tables must be there: the first missing one is an error before any compute. True when the run
    is offline on such a cache (no hub check then)."""
    cache = os.environ.get("STATE_REDUCTION_CACHE")
    if not (os.environ.get("HF_HUB_OFFLINE") and cache):
        return False
    from state_reduction.prefetch import check_offline

    check_offline(profile, tables, cache, experiment)
    return True


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
    runner = _Runner(spec, profile, results_root, dry_run=True, evaluate=evaluate)
    return {"experiment": spec["experiment"], "table": table, "profile": profile, "results_dir": str(runner.out),
            "models": {k: runner.dense(k)["path"] for k in keys}, "rft": list(rft_states),
            "stages": {stage: jobs for stage, jobs, _ in _stage_jobs(runner, keys, cells, rft_states, stages)}}


def run_table(experiment: str | None, table: str, profile: str = "tiny", results_root=None, data_dir=None,
              stages=STAGES, seeds=None) -> list[Path]:
    """Run what `table` needs and is missing; return the result files it reads. `experiment` None: the one
    that declares the table (find_experiment); `seeds` overrides the table's replicate seeds (table_seeds)."""
    experiment = experiment or find_experiment(table)
    spec = load_experiment(experiment)
    keys, cells, rft_states = table_cells(spec, table, profile, seeds)
    if not _check_offline_cache(profile, [table], experiment):
        _require_hub_for(profile, f"make {table}")
    evaluate = table_evaluate(spec, table, profile)
    check_context(spec, profile, keys, evaluate=evaluate[0])
    import torch

    torch.manual_seed(0)
    runner = _Runner(spec, profile, results_root, data_dir, evaluate=evaluate)
    paths = []
    for _, jobs, fn in _stage_jobs(runner, keys, cells, rft_states, stages):
        paths += run_sweep(jobs, fn, runner.out, on_result=_mirror(runner))
    return paths


def _mirror(runner: _Runner):
    """run_sweep's on_result: each new result is mirrored to wandb (offline unless configured online)."""
    from state_reduction.tracking import mirror_result

    return lambda path, record: mirror_result(path, record, results_root=runner.out.parent.parent)


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
        if self.cell.method == CONTROL:
            return ("rft", "eval-post")
        return ("prune",) + (("eval-pre",) if False in self.rft_states else ()) + \
            (("rft", "eval-post") if True in self.rft_states else ())

    @property
    def result_names(self) -> list[str]:
        """Its result files' names (without .json), as run_table names them."""
        if self.cell is None:
            return [f"{Cell(self.model, 'baseline', 0.0).name}-eval{sfx}" for sfx in dict(self.evals)]
        if self.cell.method == CONTROL:
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


def plan_tasks(experiment: str, profile: str = "tiny", tables=None) -> list[Task]:
    """The tasks of `tables` (default: every table of the experiment) on `profile`: one per model for the
    dense baseline, then one per distinct cell (a cell shared by several tables is one task, with the
    evaluations each of them needs), in table order."""
    spec = load_experiment(experiment)
    tables = list(tables or spec["tables"])
    models, cells = {}, {}
    for table in tables:
        keys, table_cells_, rft_states = table_cells(spec, table, profile)
        sfx = table_evaluate(spec, table, profile)[1]
        for k in keys:
            models.setdefault(k, {})[(sfx, False)] = None
        for c in table_cells_:
            states = (True,) if c.method == CONTROL else rft_states
            cells.setdefault(c, {}).update(dict.fromkeys((sfx, rft) for rft in states))
    return ([Task(f"{k}-baseline", k, None, tuple(e)) for k, e in models.items()]
            + [Task(c.name, c.model, c, tuple(e)) for c, e in cells.items()])


def find_task(experiment: str, name: str, profile: str = "tiny", tables=None) -> Task:
    import difflib

    tasks = {t.name: t for t in plan_tasks(experiment, profile, tables)}
    if name not in tasks:
        close = difflib.get_close_matches(name, tasks, n=3)
        raise PipelineError(f"experiment {experiment!r} ({profile} profile) has no task {name!r}"
                            + (f"; did you mean {', '.join(close)}?" if close else f"; tasks: {', '.join(tasks)}"))
    return tasks[name]


def task_jobs(experiment: str, name: str, profile: str = "tiny", tables=None, stages=STAGES, results_root=None,
              data_dir=None):
    """(runner, [(stage, [(result name, config)], stage function)]) of one task, restricted to `stages`: the
    model stages once, each evaluation once per evaluation setting of the task's tables."""
    spec = load_experiment(experiment)
    task = find_task(experiment, name, profile, tables)
    variants = _eval_variants(spec, profile, list(tables or spec["tables"]))
    wanted = tuple(s for s in task.stages if s in stages)
    jobs, runner, model_stages_done = [], None, False
    for sfx in dict(task.evals):
        runner = _Runner(spec, profile, results_root, data_dir, evaluate=variants[sfx])
        states = tuple(sorted({rft for s, rft in task.evals if s == sfx}))
        here = tuple(s for s in wanted if s in ("baseline", "eval-pre", "eval-post")
                     or not model_stages_done)  # prune and RFT once, before the first evaluation
        if task.cell is None:
            jobs += list(_stage_jobs(runner, [task.model], [], (False,), here))
        else:
            jobs += list(_stage_jobs(runner, [], [task.cell], states, here))
            if "rft" in here and True not in states and True in task.rft_states:  # RFT for a later evaluation
                jobs += list(_stage_jobs(runner, [], [task.cell], (True,), ("rft",)))
        model_stages_done = True
    return runner, jobs


def run_task(experiment: str, name: str, profile: str = "tiny", tables=None, stages=STAGES, results_root=None,
             data_dir=None) -> list[Path]:
    """Run what is missing of one task of plan_tasks (a job array element); return its result files."""
    spec = load_experiment(experiment)
    task = find_task(experiment, name, profile, tables)
    _require_hub_for(profile, "run the task")
    variants = _eval_variants(spec, profile, list(tables or spec["tables"]))
    for sfx in dict(task.evals):
        check_context(spec, profile, [task.model], evaluate=variants[sfx][0])
    import torch

    torch.manual_seed(0)
    runner, jobs = task_jobs(experiment, name, profile, tables, stages, results_root, data_dir)
    paths = []
    for _, stage_jobs, fn in jobs:
        paths += run_sweep(stage_jobs, fn, runner.out, on_result=_mirror(runner))
    return paths


def collect(experiment: str, profile: str, results_root=None) -> list[dict]:
    """Every result of the experiment on the profile (renderers read these)."""
    folder = results_dir(profile, experiment, results_root)
    return [read_result(p) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []


def clean_models(experiment: str, profile: str, results_root=None) -> None:
    """Remove the model artifacts (results stay; a rerun re-creates only what an unfinished stage needs)."""
    shutil.rmtree(results_dir(profile, experiment, results_root) / "models", ignore_errors=True)
