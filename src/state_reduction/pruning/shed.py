"""Structure removal in the manner of Mamba-Shedder (arXiv 2501.17088): candidates, masking, surgery, search.

Candidates (`Candidate`, indices of the model as loaded): a decoder block, the sequence mixer inside a block
(SSM, linear attention or softmax attention), the MLP inside a block, a group of `group_size` consecutive MLP
channels. A *masked* model keeps its modules and hooks them: a masked block passes its input on, a masked
mixer or MLP outputs zeros, a masked channel group's up-projection outputs zeros (so the gated product and its
down-projection contribution vanish). *Surgery* deletes what is masked: blocks leave the ModuleList (the config
has fewer layers), mixers and MLPs become `ZeroMixer`/`ZeroMLP` (recorded in a `<type>_shed` config), channel
groups are sliced out. Both give the same logits (tests/pruning/test_shed.py).

The search (the seed's Algorithm 1): at every step mask each remaining candidate in turn on top of what is
removed, measure perplexity on calibration windows, remove the one whose removal raises it least, re-score
(`greedy`); or score every candidate once on the dense model and remove the N best (`one-shot`). Each step's
scores are saved as it finishes, so a killed search resumes where it stopped.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from state_reduction.atomic import check_output, write_json_atomic
from state_reduction.backend import install_cpu_backend
from state_reduction.checkpoints import save_model_atomic
from state_reduction.data import get_corpus_info, sample_sequences
from state_reduction.devices import resolve_device
from state_reduction.errors import InputError
from state_reduction.hashing import config_key
from state_reduction.models.families import get_adapter, shed_classes
from state_reduction.models.shed import SHED_SUFFIX, ZeroMixer, ZeroMLP, remove_mixer, resize_mlp
from state_reduction.options import positive_int
from state_reduction.peak_memory import peak_memory_bytes
from state_reduction.provenance import collect_provenance
from state_reduction.pruning.prune import PruneConfig, prune
from state_reduction.pruning.selectors import get_selector
from state_reduction.results import build_result, model_entry, weights_sha256
from state_reduction.speed.timing import TimingProtocol, median, paired_speedup, time_interleaved

STRUCTURE_METHODS = ("shed",)  # `state-reduction prune --method shed` (key-channel methods: pruning.selectors)
TARGETS = ("block", "mixer", "mlp", "mlp-channels")
SEARCHES = ("greedy", "one-shot")


@dataclass(frozen=True, order=True)
class Candidate:
    kind: str  # one of TARGETS
    layer: int  # decoder-block index in the model as loaded
    group: int = -1  # channel group (mlp-channels): channels [group * size, (group + 1) * size)

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.layer}" + (f":{self.group}" if self.group >= 0 else "")

    @classmethod
    def parse(cls, name: str) -> Candidate:
        kind, *rest = name.split(":")
        if kind not in TARGETS or len(rest) != 1 + (kind == "mlp-channels"):
            raise InputError(f"candidate {name!r}: expected KIND:LAYER (block, mixer, mlp) or mlp-channels:LAYER:GROUP")
        return cls(kind, int(rest[0]), int(rest[1]) if len(rest) > 1 else -1)


def _layout(model: nn.Module):
    adapter = get_adapter(model)
    if adapter.structure is None:
        raise InputError(f"{adapter.family} adapter: no StructureLayout, so no structure removal for "
                         f"model_type {model.config.model_type!r}")
    return adapter, adapter.structure


def _model_name(model: nn.Module) -> str:
    return getattr(model.config, "_name_or_path", None) or model.config.model_type


def _mlp(block: nn.Module, layout) -> nn.Module | None:
    mlp = getattr(block, layout.mlp, None) if layout.mlp else None
    return None if mlp is None or isinstance(mlp, ZeroMLP) else mlp


def _has_mixer(block: nn.Module, layout) -> bool:
    return not isinstance(getattr(block, layout.mixer_name(block)), ZeroMixer)


def mlp_width(block: nn.Module, layout) -> int:
    mlp = _mlp(block, layout)
    return 0 if mlp is None else getattr(mlp, layout.mlp_up).out_features


def candidates(model: nn.Module, target: str, group_size: int = 64) -> list[Candidate]:
    """Every candidate of `target` in the model as it is (already removed mixers/MLPs are none)."""
    if target not in TARGETS:
        raise InputError(f"--target {target!r}; accepted: {', '.join(TARGETS)}")
    adapter, layout = _layout(model)
    blocks = layout.blocks(model)
    if target in ("mlp", "mlp-channels") and layout.mlp is None:
        raise InputError(f"{_model_name(model)} ({adapter.family}): target {target!r} does not exist, "
                         f"{adapter.family} blocks have no MLP; targets of this model: block, mixer")
    if target == "block":
        return [Candidate("block", i) for i in range(len(blocks))]
    if target == "mixer":
        return [Candidate("mixer", i) for i, b in enumerate(blocks) if _has_mixer(b, layout)]
    if target == "mlp":
        return [Candidate("mlp", i) for i, b in enumerate(blocks) if _mlp(b, layout) is not None]
    if group_size < 1:
        raise InputError(f"--group-size must be >= 1, got {group_size}")
    out = []
    for i, b in enumerate(blocks):
        width = mlp_width(b, layout)
        if width % group_size:
            raise InputError(f"{_model_name(model)}: MLP of layer {i} has {width} channels, not a multiple of "
                             f"--group-size {group_size}")
        out += [Candidate("mlp-channels", i, g) for g in range(width // group_size)]
    return out


def _mixers_left(model: nn.Module, layout, removed: Iterable[Candidate]) -> int:
    gone = {c.layer for c in removed if c.kind in ("block", "mixer")}
    return sum(_has_mixer(b, layout) and i not in gone for i, b in enumerate(layout.blocks(model)))


def removal_limit(model: nn.Module, target: str, group_size: int = 64) -> int:
    """How many candidates of `target` may go: every MLP or channel group, but at least one mixer must remain."""
    cands = candidates(model, target, group_size)
    if target in ("mlp", "mlp-channels"):
        return len(cands)
    _, layout = _layout(model)
    with_mixer = _mixers_left(model, layout, [])
    return len(cands) - 1 if target == "mixer" else len(cands) - (1 if with_mixer else 0)


def check_steps(model: nn.Module, target: str, steps: int, group_size: int = 64) -> None:
    limit = removal_limit(model, target, group_size)
    if steps < 1 or steps > limit:
        n = len(candidates(model, target, group_size))
        why = "at least one sequence mixer must remain" if target in ("block", "mixer") else f"only {n} exist"
        raise InputError(f"{_model_name(model)}: target {target!r} has {n} candidates; --steps {steps} is outside "
                         f"1..{limit} ({why})")


# -- masking ---------------------------------------------------------------------------------------------------


def _zero_output(module, args, output):
    if isinstance(output, tuple):
        return (torch.zeros_like(output[0]),) + output[1:]
    return torch.zeros_like(output)


def mask(model: nn.Module, removed: Iterable[Candidate], group_size: int = 64) -> list:
    """Hook the model so that it computes as if `removed` were gone; returns handles (`h.remove()` undoes)."""
    adapter, layout = _layout(model)
    blocks = layout.blocks(model)
    handles, channel_masks = [], {}
    for c in removed:
        block = blocks[c.layer]
        if c.kind == "block":
            def identity(module, args, kwargs, output):
                return adapter.block_output(args[0] if args else kwargs["hidden_states"], kwargs)

            handles.append(block.register_forward_hook(identity, with_kwargs=True))
        elif c.kind == "mixer":
            handles.append(getattr(block, layout.mixer_name(block)).register_forward_hook(_zero_output))
        elif c.kind == "mlp":
            handles.append(getattr(block, layout.mlp).register_forward_hook(_zero_output))
        else:
            up = getattr(_mlp(block, layout), layout.mlp_up)
            m = channel_masks.setdefault(c.layer, torch.ones(up.out_features, dtype=up.weight.dtype))
            m[c.group * group_size:(c.group + 1) * group_size] = 0
    for layer, m in channel_masks.items():
        up = getattr(_mlp(blocks[layer], layout), layout.mlp_up)
        handles.append(up.register_forward_hook(lambda module, args, out, m=m: out * m.to(out.device)))
    return handles


class masked:
    """`with masked(model, removed, group_size): ...`"""

    def __init__(self, model, removed, group_size: int = 64):
        self.args = (model, list(removed), group_size)

    def __enter__(self):
        self.handles = mask(*self.args)
        return self.args[0]

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()


# -- surgery ---------------------------------------------------------------------------------------------------


def remove_structures(model: nn.Module, removed: Iterable[Candidate], group_size: int = 64) -> nn.Module:
    """Delete `removed` from the model in place and rewrite its config so that the saved checkpoint reloads
    with AutoModelForCausalLM: fewer blocks in the stock config; removed mixers/MLPs and per-layer MLP widths
    in the `<type>_shed` config (the model and config become instances of the variant classes)."""
    adapter, layout = _layout(model)
    removed = sorted(set(removed))
    blocks = layout.blocks(model)
    for c in removed:
        if not 0 <= c.layer < len(blocks):
            raise InputError(f"{_model_name(model)}: candidate {c.name} names layer {c.layer}; layers 0..{len(blocks) - 1}")
    if _mixers_left(model, layout, removed) == 0:
        raise InputError(f"{_model_name(model)}: removing {', '.join(c.name for c in removed)} leaves no sequence "
                         f"mixer; at least one must remain")
    groups: dict[int, list[int]] = {}
    for c in removed:
        if c.kind == "mlp-channels":
            groups.setdefault(c.layer, []).append(c.group)
    channels_cut = False
    for layer, gs in groups.items():
        mlp = _mlp(blocks[layer], layout)
        width = mlp_width(blocks[layer], layout)
        drop = torch.zeros(width, dtype=torch.bool)
        for g in gs:
            drop[g * group_size:(g + 1) * group_size] = True
        if bool(drop.all()):
            setattr(blocks[layer], layout.mlp, ZeroMLP())
        else:
            resize_mlp(mlp, layout, keep=(~drop).nonzero().flatten())
        channels_cut = True
    for c in removed:
        if c.kind == "mlp":
            setattr(blocks[c.layer], layout.mlp, ZeroMLP())
        elif c.kind == "mixer":
            remove_mixer(blocks[c.layer], layout)
    dropped = sorted({c.layer for c in removed if c.kind == "block"})
    for i in reversed(dropped):
        del blocks[i]
    for new, block in enumerate(blocks):
        for m in block.modules():
            if isinstance(getattr(m, "layer_idx", None), int):
                m.layer_idx = new
    config = model.config
    layout.drop_layers(config, dropped)
    removed_mixers = [i for i, b in enumerate(blocks) if not _has_mixer(b, layout)]
    removed_mlps = [i for i, b in enumerate(blocks) if layout.mlp and isinstance(getattr(b, layout.mlp), ZeroMLP)]
    if removed_mixers or removed_mlps or channels_cut or config.model_type.endswith(SHED_SUFFIX):
        config_cls, model_cls = shed_classes(config.model_type)
        config.__class__ = config_cls  # the same fields, the variant's model_type
        if "model_type" in vars(config):  # loaded configs carry it as an instance attribute
            config.model_type = config_cls.model_type
        model.__class__ = model_cls
        config.shed_removed_mixers = removed_mixers
        config.shed_removed_mlps = removed_mlps
        config.shed_mlp_sizes = [mlp_width(b, layout) or None for b in blocks]
        config.architectures = [model_cls.__name__]
    return model


# -- costs -----------------------------------------------------------------------------------------------------


def structure_costs(model: nn.Module) -> dict:
    """Parameters (tied counted once), recurrent-state bytes per sequence (bfloat16, the key-channel adapters'
    definition) and matmul FLOPs per token (2 per weight of every nn.Linear: projections, MLPs, the LM head;
    the recurrence itself, convolutions and softmax attention over the context are not counted)."""
    adapter, _ = _layout(model)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    return {"parameters": sum(p.numel() for p in model.parameters()),
            "state_bytes": adapter.state_bytes_per_sequence(model.config),
            "flops_per_token": 2 * linear}


# -- calibration perplexity and search -------------------------------------------------------------------------


class Scorer:
    """Perplexity on calibration windows [N, T], counting forward passes (one per batch)."""

    def __init__(self, windows: torch.Tensor, batch_size: int = 8) -> None:
        self.windows, self.batch_size, self.forward_passes = windows, batch_size, 0

    @torch.no_grad()
    def __call__(self, model: nn.Module) -> float:
        device = next(model.parameters()).device
        nll, count = 0.0, 0
        for batch in self.windows.split(self.batch_size):
            batch = batch.to(device)
            logits = model(batch, use_cache=False).logits[:, :-1]  # [B, T-1, V]
            nll += float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(),
                                                           batch[:, 1:].reshape(-1), reduction="sum"))
            count += batch[:, 1:].numel()
            self.forward_passes += 1
        return math.exp(nll / count)


def _step_path(folder: Path, step: int) -> Path:
    return folder / f"step_{step:03d}.json"


def load_steps(folder: Path | None, key: str) -> list[dict]:
    """The saved steps of a search with this key, in order (stops at the first missing one)."""
    if folder is None:
        return []
    out, step = [], 0
    while _step_path(folder, step).is_file():
        record = json.loads(_step_path(folder, step).read_text())
        if record.get("search_key") != key:
            raise InputError(f"{_step_path(folder, step)}: saved by another search (key {record.get('search_key')} "
                             f"!= {key}); remove {folder} or use another --out")
        out.append(record)
        step += 1
    return out


def search(model: nn.Module, target: str, steps: int, scorer: Scorer, *, method: str = "greedy",
           group_size: int = 64, state_dir: str | Path | None = None, key: str = "", log=print) -> dict:
    """Choose `steps` candidates of `target` to remove. Returns {order, steps, forward_passes, resumed_steps}:
    `order` the removal order (candidate names), `steps` each step's scores (perplexity with the candidate
    also masked). Steps already saved in `state_dir` (by a search with the same `key`) are reused."""
    if method not in SEARCHES:
        raise InputError(f"--search {method!r}; accepted: {', '.join(SEARCHES)}")
    check_steps(model, target, steps, group_size)
    _, layout = _layout(model)
    folder = Path(state_dir) if state_dir is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    done = load_steps(folder, key)
    pool = candidates(model, target, group_size)
    removed: list[Candidate] = []
    records = []
    n_score_steps = 1 if method == "one-shot" else steps
    for step in range(n_score_steps):
        if step < len(done):
            record = done[step]
        else:
            t0 = time.time()
            passes0 = scorer.forward_passes
            scores = {}
            for c in pool:
                if c in removed or _mixers_left(model, layout, removed + [c]) == 0:
                    continue
                with masked(model, removed + [c], group_size):
                    scores[c.name] = scorer(model)
            chosen = min(scores, key=lambda n: (scores[n], Candidate.parse(n)))
            record = {"search_key": key, "step": step, "method": method, "removed_before": [c.name for c in removed],
                      "scores": scores, "chosen": chosen, "forward_passes": scorer.forward_passes - passes0,
                      "wall_time_s": round(time.time() - t0, 3)}
            if folder is not None:
                write_json_atomic(_step_path(folder, step), record)
            log(f"shed step {step + 1}/{n_score_steps}: remove {chosen} (calibration ppl {scores[chosen]:.4g}; "
                f"{len(scores)} candidates, {record['forward_passes']} forward passes)")
        records.append(record)
        removed.append(Candidate.parse(record["chosen"]))
    if method == "one-shot":
        scores = records[0]["scores"]
        ranked = sorted(scores, key=lambda n: (scores[n], Candidate.parse(n)))
        removed = []
        for n in ranked:  # the N best whose joint removal keeps a mixer
            if len(removed) == steps:
                break
            if _mixers_left(model, layout, removed + [Candidate.parse(n)]) > 0:
                removed.append(Candidate.parse(n))
    return {"order": [c.name for c in removed], "steps": records,
            "forward_passes": sum(r["forward_passes"] for r in records),
            "resumed_steps": min(len(done), n_score_steps)}


# -- the command -----------------------------------------------------------------------------------------------


@dataclass
class ShedConfig:
    """`state-reduction prune --method shed`; the options it adds to prune's are generated from these fields."""

    model: str
    target: str = field(metadata={"help": "shed: block, mixer, mlp or mlp-channels"})
    steps: int = field(metadata={"help": "shed: structures removed (one per greedy step)", "type": positive_int})
    out: str
    search: str = field(default="greedy", metadata={"help": "shed: greedy (re-score every step) or one-shot"})
    group_size: int = field(default=64, metadata={"help": "shed --target mlp-channels: channels per group",
                                                  "type": positive_int})
    calib: str = "ptb"
    n_calib: int = 32
    seq_len: int = 256
    seed: int = 0
    batch_size: int = 8
    overwrite: bool = False
    data_dir: str | None = None
    device: str | None = None

    def validate(self) -> None:
        if self.target not in TARGETS:
            raise InputError(f"--target {self.target!r}; accepted: {', '.join(TARGETS)}")
        if self.search not in SEARCHES:
            raise InputError(f"--search {self.search!r}; accepted: {', '.join(SEARCHES)}")
        if self.n_calib < 1 or self.seq_len < 2:
            raise InputError(f"--n-calib must be >= 1 and --seq-len >= 2, got {self.n_calib}, {self.seq_len}")
        check_output(self.out, directory=True, overwrite=self.overwrite)

    def search_key(self, weights_sha256: str) -> str:
        keys = ("target", "search", "group_size", "calib", "n_calib", "seq_len", "seed", "steps")
        return config_key({"weights_sha256": weights_sha256, **{k: getattr(self, k) for k in keys}})


def search_dir(out: str | Path) -> Path:
    """Where the steps of the search for output `out` are kept until the model is saved (then inside it)."""
    out = Path(out)
    return out.parent / f".{out.name}.search"


def shed(cfg: ShedConfig) -> dict:
    """Search, remove, save `cfg.out` (reloadable) with shed.json; returns the record."""
    cfg.validate()
    t0 = time.time()
    install_cpu_backend()
    get_adapter(AutoConfig.from_pretrained(cfg.model))
    model = AutoModelForCausalLM.from_pretrained(cfg.model).eval()
    model.config._name_or_path = cfg.model
    check_steps(model, cfg.target, cfg.steps, cfg.group_size)  # before any calibration
    if cfg.device is not None:
        model.to(cfg.device)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    windows = sample_sequences(tokenizer, cfg.calib, n=cfg.n_calib, seq_len=cfg.seq_len, seed=cfg.seed,
                               stream="calibration", data_dir=cfg.data_dir)
    scorer = Scorer(windows, cfg.batch_size)
    before = structure_costs(model)
    ppl_dense = scorer(model)
    key = cfg.search_key(weights_sha256(cfg.model) if Path(cfg.model).is_dir() else cfg.model)
    state_dir = search_dir(cfg.out)
    found = search(model, cfg.target, cfg.steps, scorer, method=cfg.search, group_size=cfg.group_size,
                   state_dir=state_dir, key=key)
    removed = [Candidate.parse(n) for n in found["order"]]
    with masked(model, removed, cfg.group_size):
        ppl_masked = scorer(model)
    remove_structures(model, removed, cfg.group_size)
    after = structure_costs(model)
    ppl_after = scorer(model)
    print(f"shed calibration cost: {scorer.forward_passes} forward passes of batches of {cfg.batch_size} x "
          f"{cfg.seq_len} tokens ({found['forward_passes']} in the search)")
    record = {
        "kind": "shed", "config": asdict(cfg), "model_type": model.config.model_type,
        "removed": found["order"], "search": {k: found[k] for k in ("forward_passes", "resumed_steps")},
        "steps": [{k: s[k] for k in ("step", "chosen", "scores", "forward_passes")} for s in found["steps"]],
        "costs": {"before": before, "after": after},
        "calibration_ppl": {"dense": ppl_dense, "masked": ppl_masked, "after": ppl_after},
        "calibration": {"corpus": cfg.calib, "stream": "calibration", "n": cfg.n_calib, "seq_len": cfg.seq_len,
                        "tokens": int(windows.numel()), "seed": cfg.seed, "sha256": get_corpus_info(cfg.calib).sha256,
                        "forward_passes": scorer.forward_passes},
        "provenance": collect_provenance(),
    }

    def write_record(folder: Path) -> None:
        record.update(wall_time_s=round(time.time() - t0, 2),
                      peak_memory_bytes=peak_memory_bytes(resolve_device(cfg.device or "cpu")))
        write_json_atomic(folder / "shed.json", record)
        shutil.copytree(state_dir, folder / "search")

    save_model_atomic(model, tokenizer, cfg.out, overwrite=cfg.overwrite, write_extra=write_record)
    shutil.rmtree(state_dir, ignore_errors=True)
    return record


def shed_result(record: dict, folder, *, profile: str, experiment: str, config: dict | None = None) -> dict:
    """A `shed` run as a result of the common schema (kind prune)."""
    cal = record["calibration"]
    b, a = record["costs"]["before"], record["costs"]["after"]
    metrics = {"n_removed": len(record["removed"]), "calib_forward_passes": cal["forward_passes"],
               "calib_ppl_dense": record["calibration_ppl"]["dense"], "calib_ppl": record["calibration_ppl"]["after"],
               **{f"{k}_before": b[k] for k in b}, **{f"{k}_after": a[k] for k in a}}
    return build_result(
        "prune", profile=profile, experiment=experiment, config=record["config"] if config is None else config,
        metrics=metrics, model=model_entry(folder), data={cal["corpus"]: cal["sha256"]},
        seeds={"calibration": cal["seed"]}, wall_time_s=record["wall_time_s"],
        extra={"shed_file": str(Path(folder) / "shed.json"), "removed": record["removed"], "calibration": cal,
               "dense_model": model_entry(record["config"]["model"])})


# -- pipeline cells: structure removal alone or followed by key-channel pruning ----------------------------------


def parse_structure_method(method: str) -> tuple[str, str | None] | None:
    """`shed-<target>` -> (target, None); `shed-<target>+<selector>` -> (target, selector): remove structures,
    then key channels of what remains; a key-channel method -> None."""
    head, plus, then = method.partition("+")
    if not head.startswith("shed-"):
        return None
    target = head[len("shed-"):]
    if target not in TARGETS:
        raise InputError(f"method {method!r}: target {target!r}; accepted: shed-{', shed-'.join(TARGETS)}")
    if plus:
        get_selector(then)
    return target, then or None


def steps_for_ratio(model: nn.Module, target: str, fraction: float, group_size: int = 64) -> int:
    """round(fraction * candidates), at least 1 and at most the removal limit."""
    n = len(candidates(model, target, group_size))
    return min(max(1, round(fraction * n)), removal_limit(model, target, group_size))


def prune_cell(model: str, method: str, ratio: float, out: str | Path, *, calib: str, n_calib: int, seq_len: int,
               seed: int, batch_size: int = 8, select: str = "kq", search_method: str = "greedy",
               group_size: int = 64, data_dir=None) -> dict:
    """One pipeline cell of a structure method at `ratio`. `shed-<target>`: remove round(ratio * candidates)
    structures. `shed-<target>+<selector>`: remove round(ratio / 2 * candidates) structures, then the fraction
    q of key channels that brings the recurrent state to (1 - ratio) of the dense model's (q = 1 - (1 - ratio)
    * S_dense / S_shed, floored to whole channels by keep_count, 0 when the shed model is already within budget).
    Returns {record, shed, prune}: the shed record and, for the combination, the key-channel record."""
    target, then = parse_structure_method(method)
    install_cpu_backend()
    with torch.device("meta"):  # the module structure only: counting candidates loads no weights
        skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model))
    skeleton.config._name_or_path = model
    steps = steps_for_ratio(skeleton, target, ratio / 2 if then else ratio, group_size)
    del skeleton
    out = Path(out)
    shed_out = out.with_name(out.name + "-shed") if then else out
    record = shed(ShedConfig(model=model, target=target, steps=steps, out=str(shed_out), search=search_method,
                             group_size=group_size, calib=calib, n_calib=n_calib, seq_len=seq_len, seed=seed,
                             batch_size=batch_size, overwrite=True, data_dir=data_dir))
    if not then:
        return {"shed": record, "prune": None}
    s_dense, s_shed = record["costs"]["before"]["state_bytes"], record["costs"]["after"]["state_bytes"]
    q = 0.0 if s_shed == 0 else max(0.0, 1.0 - (1.0 - ratio) * s_dense / s_shed)
    kc = prune(PruneConfig(model=str(shed_out), method=then, ratio=q, out=str(out), select=select, calib=calib,
                           n_calib=n_calib, seq_len=seq_len, seed=seed, batch_size=batch_size, overwrite=True,
                           data_dir=data_dir))
    shutil.copy(shed_out / "shed.json", out / "shed.json")
    shutil.rmtree(shed_out)
    return {"shed": record, "prune": kc}


def decode_timing(dense: nn.Module, reduced: nn.Module, *, prompt_len: int = 64, warmup: int = 2, steps: int = 16,
                  repeats: int = 5, seed: int = 0, device: str | None = None) -> dict:
    """Batch-1 cached decode after a `prompt_len` prompt, dense and reduced interleaved (speed.timing): ms per
    token of the reduced model and the paired speedup over the dense one (median over repetitions). `device`
    (e.g. cuda): where both models run (moved there), else where they are."""
    if device is not None:
        dense, reduced = dense.to(device), reduced.to(device)
    device = next(reduced.parameters()).device
    prompt = torch.randint(0, reduced.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(seed))
    fns = {}
    with torch.no_grad():
        for label, m in (("base", dense), ("reduced", reduced)):
            cache = m(input_ids=prompt.to(device), use_cache=True, logits_to_keep=1).past_key_values
            token = prompt[:, -1:].to(device)
            fns[label] = lambda m=m, c=cache, t=token: m(input_ids=t, past_key_values=c, use_cache=True)
        samples = time_interleaved(fns, TimingProtocol(warmup, steps, repeats), device)
    return {"decode_ms_per_token": median(samples["reduced"]) * 1e3,
            "decode_ms_per_token_dense": median(samples["base"]) * 1e3,
            "decode_speedup": paired_speedup(samples, "reduced")}
