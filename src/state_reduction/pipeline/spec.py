"""The experiment spec: `experiments/<name>/config.yaml`, typed and validated, and what a table asks of it.

An experiment declares per profile its models (each standing for one or more of the paper's model names) and
its pruning, RFT, evaluation and analysis settings, and per table the paper's model names, ratios and RFT states
it shows. `parse_spec` checks a loaded YAML mapping against the dataclasses below: an unknown key or a value of
the wrong type is a SpecError naming the file, the key and the closest valid names. `load_experiment` returns
the validated mapping as written (result configurations are built from the settings as written, so that their
keys do not change when a dataclass gains a default); `load_spec` returns the typed view.
"""

from __future__ import annotations

import difflib
import itertools
import os
import re
import types
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Union

import yaml

from state_reduction.errors import Error
from state_reduction.provenance import REPO_ROOT
from state_reduction.pruning.budgets import BUDGETS, GRANULARITIES, check_scored_selector
from state_reduction.rft.config import RFTConfig

EXPERIMENTS_DIR = REPO_ROOT / "experiments"


class PipelineError(Error, ValueError):
    """An experiment, table or profile cannot be run as asked; the message says which and why."""


class SpecError(PipelineError):
    """An experiment config.yaml does not match the spec: names the file, the key and the closest valid names."""


# -- the typed spec ----------------------------------------------------------------------------------------
# Every section lists the keys it accepts; a default marks a key as optional (the settings as written, not
# these defaults, enter the result configurations).
@dataclass(frozen=True)
class ModelSpec:
    path: str  # a checkpoint folder (relative to the repository root), a hub id, or ${VAR}/...
    stands_for: list[str]  # the paper's model names this model runs for on the profile


@dataclass(frozen=True)
class PruneSettings:
    calib: str
    n_calib: int
    seq_len: int
    seed: int
    batch_size: int = 8
    stream_layers: bool = False
    device: Union[str, None] = None
    costs: bool = False  # parameters, state bytes and FLOPs of dense and pruned model (pruning.shed)
    decode: Union[dict[str, Any], None] = None  # pruning.shed.decode_timing settings
    search: str = "greedy"  # structure removal (shed-* methods)
    group_size: int = 64
    # MLP linearization (linearize stage, `<method>-k<k>` methods): budget, rank, fit_steps, fit_lr and the
    # method's own options (ralimp.layers)
    linearize: Union[dict[str, Any], None] = None


@dataclass(frozen=True)
class EvaluateSettings:
    suite: str
    batch_size: int
    max_length: Union[int, None]
    limit: Union[int, None]


@dataclass(frozen=True)
class AnalyzeSettings:
    calib: str
    stream: str
    n_calib: int
    seq_len: int
    seed: int
    stride: int
    divisor: str
    ignore_decay: bool
    batch_size: int


@dataclass(frozen=True)
class SlurmSettings:
    cpus: int = 1
    mem: str = "4G"
    time: str = "01:00:00"
    gpus: int = 0
    sbatch: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ProfileSpec:
    models: dict[str, ModelSpec]
    prune: PruneSettings
    evaluate: EvaluateSettings
    rft: Union[dict[str, Any], None] = None  # `preset` plus RFTConfig fields (checked by _check_rft)
    analyze: Union[AnalyzeSettings, None] = None
    seeds: Union[list[int], None] = None
    slurm: Union[SlurmSettings, None] = None


@dataclass(frozen=True)
class TableSpec:
    models: list[str]  # the paper's model names
    ratios: list[float]
    rft: list[bool]
    methods: Union[list[str], None] = None  # a subset of the experiment's; default all
    control: bool = False  # the dense+RFT control (CONTROL)
    vary: Union[dict[str, Any], list[dict[str, Any]], None] = None  # table_variations
    seeds: Union[dict[str, list[int]], None] = None  # profile -> replicate seeds
    evaluate: Union[dict[str, dict[str, Any]], None] = None  # profile -> evaluate overrides (table_evaluate)
    overlap: Union[list[list[str]], None] = None  # method pairs (analysis.experiment)
    render: Union[dict[str, Any], None] = None  # the table's layout; paper_tables defines and checks it
    profiles: Union[list[str], None] = None  # the profiles the table is defined on (default: every profile)


@dataclass(frozen=True)
class ExperimentSpec:
    experiment: str
    methods: list[str]
    profiles: dict[str, ProfileSpec]
    tables: dict[str, TableSpec]
    select: str = "kq"
    claims: Union[list[dict[str, Any]], None] = None  # state_reduction.claims
    source: Union[Path, None] = None  # the file it was read from (not a YAML key)
    raw: dict = field(default_factory=dict, repr=False, compare=False)  # the mapping as written


def _type_name(tp) -> str:
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a mapping"
    if is_dataclass(tp):
        return "a mapping"
    return getattr(tp, "__name__", str(tp))


def _unknown_key(source, where: str, key, valid) -> SpecError:
    close = difflib.get_close_matches(str(key), [str(v) for v in valid], n=3)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return SpecError(f"{source}: unknown key {f'{where}{key}'!r}; {hint}valid keys: {', '.join(map(str, valid))}")


def _convert(value, tp, source, where: str):
    """`value` checked against the annotation `tp`; dataclass annotations become instances."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        errors = []
        for option in typing.get_args(tp):
            try:
                return _convert(value, option, source, where)
            except SpecError as e:
                errors.append(e)
        # an option of the right shape with an error inside (a typo, a missing key, a wrong type deeper down)
        inner = [e for e in errors if not str(e).startswith(f"{source}: {where} must be ")]
        if inner:
            raise inner[0]
        raise _wrong_type(value, tp, source, where)
    if tp is type(None):
        if value is not None:
            raise _wrong_type(value, tp, source, where)
        return None
    if is_dataclass(tp):
        if not isinstance(value, dict):
            raise _wrong_type(value, tp, source, where)
        return _build(tp, value, source, where)
    if origin is list:
        if not isinstance(value, list):
            raise _wrong_type(value, tp, source, where)
        (item,) = typing.get_args(tp)
        return [_convert(v, item, source, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise _wrong_type(value, tp, source, where)
        _, item = typing.get_args(tp)
        return {k: _convert(v, item, source, f"{where}.{k}") for k, v in value.items()}
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, tp)
    if not ok:
        raise _wrong_type(value, tp, source, where)
    return value


def _wrong_type(value, tp, source, where: str) -> SpecError:
    return SpecError(f"{source}: {where} must be {_type_name(tp)}, got {type(value).__name__} {value!r}")


def _build(cls, raw: dict, source, where: str):
    hints = typing.get_type_hints(cls)
    keys = [f.name for f in fields(cls) if f.name not in ("source", "raw")]
    prefix = f"{where}." if where else ""
    for key in raw:
        if key not in keys:
            raise _unknown_key(source, prefix, key, keys)
    missing = [f.name for f in fields(cls) if f.name in keys and f.name not in raw
               and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise SpecError(f"{source}: missing {', '.join(repr(m) for m in missing)}" + (f" in {where}" if where else ""))
    return cls(**{k: _convert(v, hints[k], source, f"{prefix}{k}") for k, v in raw.items()})


def _check_rft(source, where: str, section: dict) -> None:
    """A profile's `rft:` is `preset` plus RFTConfig fields other than the run's paths and names."""
    hints = typing.get_type_hints(RFTConfig)
    fixed = ("student", "teacher", "out", "profile", "experiment", "resume")
    valid = ["preset"] + [f.name for f in fields(RFTConfig) if f.name not in fixed]
    if "preset" not in section:
        raise SpecError(f"{source}: missing 'preset' in {where}")
    for key, value in section.items():
        if key not in valid:
            raise _unknown_key(source, f"{where}.", key, valid)
        tp = str if key == "preset" else hints[key]
        if typing.get_origin(tp) is tuple:  # adam_betas: a YAML list
            tp = list[float]
        _convert(value, tp, source, f"{where}.{key}")


def parse_spec(raw, source) -> ExperimentSpec:
    """The typed, validated spec of a loaded config.yaml (`source` names the file in errors)."""
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: an experiment config is a mapping, got {type(raw).__name__}")
    spec = _build(ExperimentSpec, raw, source, "")
    for name, profile in spec.profiles.items():
        if profile.rft is not None:
            _check_rft(source, f"profiles.{name}.rft", profile.rft)
    for name, table in spec.tables.items():
        missing = [p for p in table.profiles or () if p not in spec.profiles]
        if missing:
            raise SpecError(f"{source}: tables.{name}.profiles lists {missing}, which the experiment does not define; "
                            f"its profiles: {', '.join(spec.profiles)}")
        unknown = [m for m in table.methods or () if m not in spec.methods]
        if unknown:
            raise SpecError(f"{source}: tables.{name}.methods lists {unknown}, which the experiment does not run; "
                            f"its methods: {', '.join(spec.methods)}")
    return ExperimentSpec(**{f.name: getattr(spec, f.name) for f in fields(spec) if f.name not in ("source", "raw")},
                          source=Path(source), raw=raw)


def experiment_path(name: str) -> Path:
    """experiments/<name>/config.yaml, or a YAML file given by path (tests, private experiments)."""
    path = Path(name) if str(name).endswith((".yaml", ".yml")) else EXPERIMENTS_DIR / name / "config.yaml"
    if not path.is_file() and path.suffix in (".yaml", ".yml") and path.parent != EXPERIMENTS_DIR / name:
        raise PipelineError(f"experiment file {path} does not exist")
    if not path.is_file():
        known = sorted(p.parent.name for p in EXPERIMENTS_DIR.glob("*/config.yaml"))
        close = difflib.get_close_matches(str(name), known, n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise PipelineError(f"experiment {name!r} has no {path.relative_to(REPO_ROOT)}; {hint}known: {', '.join(known)}")
    return path


PIPELINE_KEYS = frozenset({"experiment", "methods", "profiles", "tables"})


def pipeline_experiments() -> list[str]:
    """The experiments run by this pipeline: their config.yaml declares experiment, methods, profiles and tables.
    Others (aire_home, ralimp_synthetic, ...) keep a config of their own module's shape and are skipped."""
    return sorted(p.parent.name for p in EXPERIMENTS_DIR.glob("*/config.yaml")
                  if PIPELINE_KEYS <= set(yaml.safe_load(p.read_text()) or {}))


def _display(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_absolute() and path.is_relative_to(REPO_ROOT) else str(path)


def load_spec(name: str) -> ExperimentSpec:
    """The typed spec of experiment `name` (or of a YAML file given by path)."""
    path = experiment_path(name)
    return parse_spec(yaml.safe_load(path.read_text()), _display(path))


def load_experiment(name: str) -> dict:
    """The validated mapping of experiment `name` (or of a YAML file given by path), as written."""
    return load_spec(name).raw


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


# -- what a table asks for ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cell:
    model: str  # the profile's model key
    method: str
    ratio: float
    vary: tuple[tuple[str, object], ...] = ()  # pruning-setting overrides from a table's `vary:`, sorted by name

    @property
    def name(self) -> str:
        return f"{self.model}-{self.method}-r{round(self.ratio * 100)}" + vary_suffix(self.vary)

    def pruning(self) -> Cell:
        """The cell without its RFT-setting overrides (RFT_VARY): the pruned model and pre-RFT evaluation that every
        RFT budget of one replicate shares."""
        return Cell(self.model, self.method, self.ratio, tuple((k, v) for k, v in self.vary if k not in RFT_VARY))

    def rft_overrides(self) -> dict:
        """The RFT-config fields this cell's `vary:` sets (rft_steps: 96 -> {"steps": 96}); {} for the recipe's own."""
        return {k[len("rft_"):]: v for k, v in self.vary if k in RFT_VARY}


# The dense+RFT control of a table with `control: true` (issue 15): the dense model fine-tuned with the table's
# RFT recipe and budget, evaluated post-RFT only, so that recovery can be read against it rather than against a
# dense model that never saw the fine-tuning data.
CONTROL = "dense"


def table_profiles(spec: dict, table: str) -> list[str]:
    """The profiles `table` is defined on: its `profiles:` (e.g. a tiny-only companion table), else every profile."""
    return list(spec["tables"][table].get("profiles") or spec["profiles"])


def profile_tables(spec: dict, profile: str) -> list[str]:
    """The experiment's tables defined on `profile` (table_profiles), in config order."""
    return [t for t in spec.get("tables", {}) if profile in table_profiles(spec, t)]


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
    if profile not in table_profiles(spec, table):
        raise PipelineError(f"{table} of experiment {spec['experiment']!r} is defined on profiles "
                            f"{', '.join(table_profiles(spec, table))} only, not {profile!r}")
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
    _check_budgets(spec, table, profile, cells)
    _check_rft_vary(spec, table, profile, cells, rft_states)
    return keys, cells, rft_states


def _check_budgets(spec: dict, table: str, profile: str, cells: list[Cell]) -> None:
    """A cell with a global budget needs a selector with per-channel scores: refused when the table is planned (its
    dry run included), not when the cell's prune runs after other cells' compute."""
    from state_reduction.pruning.selectors import SELECTORS

    prune = profile_spec(spec, profile)["prune"]
    default = prune.get("budget", VARY_DEFAULTS["budget"])
    granularity = prune.get("budget_granularity", VARY_DEFAULTS["budget_granularity"])
    if granularity not in GRANULARITIES:
        raise PipelineError(f"{table} of experiment {spec['experiment']!r} ({profile}): prune budget_granularity "
                            f"{granularity!r} unknown; accepted: {', '.join(GRANULARITIES)}")
    for c in cells:
        if c.method in SELECTORS:
            try:
                check_scored_selector(c.method, dict(c.vary).get("budget", default))
            except Error as e:
                raise PipelineError(f"{table} of experiment {spec['experiment']!r}, cell {c.name}: {e}") from None


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
VARY_SETTINGS = {"select": "sel", "calib": "cal", "n_calib": "n", "seq_len": "len", "seed": "seed",
                 "budget": "bud", "budget_floor": "floor", "budget_granularity": "gran",
                 "allow_layer_removal": "rm"}
# settings a profile's `prune:` need not name, at the value that is no override (issue 17: layer-adaptive budgets)
VARY_DEFAULTS = {"budget": "uniform", "budget_floor": 1, "budget_granularity": "layer", "allow_layer_removal": False}


# RFT settings a table may vary too (issue 15 item 4: the tiny RFT budget), `rft_<RFTConfig field>`, each with the
# tag of its name suffix; their default is the profile's resolved RFT recipe (rft_settings). A cell that varies them
# shares its pruned model and pre-RFT evaluation with the plain cell (Cell.pruning).
RFT_VARY = {"rft_steps": "steps", "rft_lr": "lr", "rft_ce_weight": "ce", "rft_kd_weight": "kd",
            "rft_kd_temperature": "kdT", "rft_warmup_steps": "warm", "rft_rank": "rank", "rft_weight_decay": "wd"}


def vary_suffix(vary) -> str:
    tags = {**VARY_SETTINGS, **RFT_VARY}
    return "".join(f"-{tags[k]}_{v}" for k, v in vary)


def rft_settings(spec: dict, profile: str) -> dict:
    """Every field of the profile's RFT recipe as resolved (dataclass defaults, preset, the profile's overrides); {}
    for a profile without `rft:`."""
    rft = profile_spec(spec, profile).get("rft")
    if rft is None:
        return {}
    overrides = {k: v for k, v in rft.items() if k != "preset"}
    return RFTConfig.from_preset(rft["preset"], "<pruned>", "<dense>", "<out>", profile=profile, **overrides).to_dict()


def _check_rft_vary(spec: dict, table: str, profile: str, cells: list[Cell], rft_states) -> None:
    """Cells that vary RFT settings need post-RFT cells and a profile recipe, and each budget must be a valid RFT
    config: refused when the table is planned, naming the table and the settings."""
    budgets = list(dict.fromkeys(tuple(sorted(c.rft_overrides().items())) for c in cells if c.rft_overrides()))
    if not budgets:
        return
    where = f"{table} of experiment {spec['experiment']!r} ({profile})"
    if set(rft_states) != {False, True}:
        raise PipelineError(f"{where} varies RFT settings ({', '.join(f'rft_{k}' for k, _ in budgets[0])}) and "
                            f"needs `rft: [false, true]` (got {list(rft_states)}): each budget is read against the "
                            "pruned model it starts from")
    rft = profile_spec(spec, profile).get("rft")
    if rft is None:
        raise PipelineError(f"{where} varies RFT settings but profile {profile!r} has no `rft:` recipe")
    base = {k: v for k, v in rft.items() if k != "preset"}
    for budget in budgets:
        try:
            RFTConfig.from_preset(rft["preset"], "<pruned>", "<dense>", "<out>", profile=profile,
                                  **{**base, **dict(budget)}).validate()
        except Error as e:
            settings = ", ".join(f"rft_{k}={v!r}" for k, v in budget)
            raise PipelineError(f"{where}: RFT budget {settings}: {e}") from None


def table_variations(spec: dict, table: str, profile: str) -> list[tuple[tuple[str, object], ...]]:
    """The pruning-setting overrides of `table` on `profile`, each sorted by setting name; a value equal to the
    profile's own setting is no override (so that cell keeps the plain name and key), duplicates are dropped.
    No `vary:` gives the one empty override."""
    vary = spec["tables"][table].get("vary")
    if not vary:
        return [()]
    defaults = {"select": spec.get("select", "kq"), **VARY_DEFAULTS, **profile_spec(spec, profile)["prune"],
                **{f"rft_{k}": v for k, v in rft_settings(spec, profile).items()}}
    out = []
    for block in vary if isinstance(vary, list) else [vary]:
        unknown = [k for k in block if k not in VARY_SETTINGS and k not in RFT_VARY]
        if unknown:
            raise PipelineError(f"{table} of experiment {spec['experiment']!r} varies {unknown}; "
                                f"settings that can vary: {', '.join([*VARY_SETTINGS, *RFT_VARY])}")
        names = sorted(block)
        lists = []
        for k in names:
            values = block[k]
            if isinstance(values, dict):
                if profile not in values:
                    raise PipelineError(f"{table}: vary {k!r} has no values for profile {profile!r}")
                values = values[profile]
            lists.append(values)
        for setting, accepted in (("budget", BUDGETS), ("budget_granularity", GRANULARITIES)):
            bad = [x for x in dict(zip(names, lists)).get(setting, []) if x not in accepted]
            if bad:
                raise PipelineError(f"{table} of experiment {spec['experiment']!r}: vary {setting} {bad[0]!r} "
                                    f"unknown; accepted: {', '.join(accepted)}")
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
    seed is no override, so the first replicate keeps the plain name and key of a single-seed run. The dense+RFT
    control takes only the seed and RFT settings (RFT_VARY) of a variation: one control per replicate and RFT
    budget, shared by every pruning setting of the table."""
    replicates = replicate_varies(spec, table, profile, seeds)
    out = []
    for c in cells:
        for v in table_variations(spec, table, profile):
            if c.method == CONTROL:  # the control prunes nothing: only a variation's seed and RFT settings apply to it
                v = tuple((k, x) for k, x in v if k == "seed" or k in RFT_VARY)
            if any(k == "seed" for k, _ in v):
                out.append(Cell(c.model, c.method, c.ratio, v))
                continue
            for extra in replicates:
                out.append(Cell(c.model, c.method, c.ratio, tuple(sorted(v + extra))))
    return list(dict.fromkeys(out))  # a control crossed with pruning settings (budgets, calibration) runs once


def replicate_varies(spec: dict, table: str, profile: str, seeds=None) -> list[tuple[tuple[str, object], ...]]:
    """The cell override of each replicate seed of `table` (table_seeds): () for the profile's own pruning seed, so
    the first replicate keeps the plain name and key, else (("seed", s),)."""
    default = profile_spec(spec, profile)["prune"]["seed"]
    return [() if s == default else (("seed", s),) for s in table_seeds(spec, table, profile, seeds)]
