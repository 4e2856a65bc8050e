"""`state-reduction prune`: load, calibrate, select, cut, save with selection.json."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file

from state_reduction.atomic import check_output, write_json_atomic
from state_reduction.backend import install_cpu_backend
from state_reduction.checkpoints import load_config, load_model, load_tokenizer
from state_reduction.data import calibration_windows, check_calibration_source
from state_reduction.devices import checkpoint_dtype, compute_dtype, resolve_device
from state_reduction.errors import InputError
from state_reduction.evaluation.longctx import check_length_option
from state_reduction.models.families import get_adapter
from state_reduction.options import length_int, nonnegative_int, positive_int
from state_reduction.peak_memory import host_peak_rss_bytes, host_rss_bytes, peak_memory_bytes
from state_reduction.provenance import collect_provenance
from state_reduction.pruning.budgets import (
    BUDGETS,
    GRANULARITIES,
    check_budget,
    check_granularity,
    check_scored_selector,
    last_head_factor,
    layer_budget,
)
from state_reduction.pruning.calibration import calibrate
from state_reduction.pruning.selectors import MODES, SelectorInput, get_selector, keep_count
from state_reduction.pruning.streaming import calibrate_streaming
from state_reduction.pruning.surgery import reduce_model, save_reduced
from state_reduction.results import _display_path, build_result, model_entry


@dataclass
class PruneConfig:
    """What `state-reduction prune` does; the command's options are generated from these fields and their help."""

    model: str = field(metadata={"help": "checkpoint directory (or hub id on the paper profile)"})
    method: str = field(metadata={"help": "key channels: rand, l1, wanda, grad, drrqr, pca, pca-adv, energy, think, "
                                          "ghost, taylor, qkscore, qkscore-decay; "
                                          "structures: shed (Mamba-Shedder)"})
    ratio: float = field(metadata={"help": "fraction of key channels removed, in [0, 1) (key-channel methods)"})
    out: str = field(metadata={"help": "folder of the reduced checkpoint"})
    select: str = field(default="kq", metadata={"help": "coupled selection: kq, k or q (Table 16)"})
    calib: str = field(default="ptb", metadata={"help": "calibration corpus (its calibration stream), or mqar: MQAR "
                                                        "sequences with the model's training settings (recall models)"})
    n_calib: int = field(default=32, metadata={"help": "calibration sequences", "type": positive_int})
    seq_len: int = field(default=256, metadata={"help": "calibration sequence length", "type": length_int})
    seed: int = field(default=0, metadata={"help": "seed of the calibration sample (and of rand)"})
    batch_size: int = field(default=8, metadata={"help": "calibration sequences per forward", "type": positive_int})
    multiple: int | None = field(default=None, metadata={
        "help": "round kept channels down to a multiple (kernels; with a global budget: each layer's K')",
        "type": positive_int})
    budget: str = field(default="uniform", metadata={  # issue 17: pruning.budgets
        "help": f"how many channels each layer keeps: {', '.join(BUDGETS)} (uniform: K (1 - ratio) everywhere, the "
                "paper's; global-*: pooled layer-normalised per-channel scores, the same total state)"})
    budget_floor: int = field(default=1, metadata={
        "help": "global budgets: at least this many channels per head in every layer", "type": nonnegative_int})
    budget_granularity: str = field(default="layer", metadata={
        "help": f"global budgets: {' or '.join(GRANULARITIES)} (layer: one K' per layer; head: a K'_h per head, "
                "stored at the layer's largest with zeroed q/k rows)"})
    allow_layer_removal: bool = field(default=False, metadata={
        "help": "global budgets with --budget-floor 0: a layer left with K'=0 loses its token mixer (the residual "
                "passes through) instead of being refused"})
    selector_options: str | None = field(default=None, metadata={
        "help": "options of the key-channel selector, KEY=VALUE[,KEY=VALUE] (e.g. qkscore: swaps=4)"})
    power_of_two: bool = field(default=False, metadata={
        "help": "round kept channels down to a power of two (fla pads K to one on GPU)"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing --out"})
    data_dir: str | None = field(default=None, metadata={"help": "corpora folder (default: $STATE_REDUCTION_DATA, "
                                                                 "else data_cache/ in the clone, else ~/.cache)"})
    stream_layers: bool = field(default=False, metadata={  # issue 8
        "help": "calibrate one decoder block at a time on --device (7B-9B models; same selections)"})
    device: str | None = field(default=None, metadata={
        "help": "calibration device: auto (default: the GPU when present, else the CPU), cpu, cuda"})
    # Grad's backward keeps every block's activations of one forward: at most this many tokens per forward
    # (windows per forward = max(1, grad_tokens // seq_len), never above batch_size). The gradient sums are
    # additive over windows, so the scores do not depend on it beyond float summation order.
    grad_tokens: int = field(default=2048, metadata={"help": "grad: at most this many tokens per forward and "
                                                             "backward (memory only)", "type": positive_int})

    def validate(self) -> None:
        get_selector(self.method).options(self.selector_options)
        if self.select not in MODES:
            raise InputError(f"--select must be one of {', '.join(MODES)}, got {self.select!r}")
        if not 0.0 <= self.ratio < 1.0:
            raise InputError(f"--ratio: compression ratio must be in [0, 1) (fraction of key channels removed), "
                             f"got {self.ratio}")
        for option, value, least in (("--n-calib", self.n_calib, 1), ("--seq-len", self.seq_len, 2),
                                     ("--batch-size", self.batch_size, 1), ("--multiple", self.multiple or 1, 1),
                                     ("grad_tokens", self.grad_tokens, 1)):
            if not isinstance(value, int) or value < least:
                raise InputError(f"{option} must be an integer >= {least}, got {value!r}")
        check_budget(self.budget)
        check_granularity(self.budget_granularity)
        if self.budget != "uniform":
            check_scored_selector(self.method, self.budget)
            if self.selector_options:
                raise InputError(f"--selector-options with --budget {self.budget}: a global budget pools the "
                                 f"selector's per-channel scores, which take no options")
            if self.power_of_two:
                raise InputError(f"--power-of-two with --budget {self.budget}: a global budget rounds each layer's K' "
                                 "to --multiple; accepted: --multiple N")
        resolve_device(self.device)
        check_output(self.out, directory=True, overwrite=self.overwrite)

    def recorded(self) -> dict:
        """The configuration as results record it: the budget fields only when a global budget is set, so uniform
        runs keep their config keys (hashing.config_key) from before budgets existed."""
        out = asdict(self)
        if self.budget == "uniform" and self.budget_floor == 1:
            del out["budget"], out["budget_floor"]
        for name, default in (("budget_granularity", "layer"), ("allow_layer_removal", False),
                              ("selector_options", None)):
            if out[name] == default:  # the config keys of runs from before these options
                del out[name]
        return out


def grad_batch_size(cfg: PruneConfig) -> int:
    """Windows per forward of Grad calibration (PruneConfig.grad_tokens)."""
    return max(1, min(cfg.batch_size, cfg.grad_tokens // cfg.seq_len))


def _stopwatch() -> tuple[dict[str, float], Callable[[str], None]]:
    """(seconds per stage, lap): `lap(stage)` records the wall seconds since the previous lap (or the start) under
    `stage` (prune's record keeps them as `stage_seconds`; `bench pipeline` reads them)."""
    seconds, last = {}, [time.perf_counter()]

    def lap(stage: str) -> None:
        now = time.perf_counter()
        seconds[stage] = round(now - last[0], 4)
        last[0] = now

    return seconds, lap


def layer_key_dims(cfg: PruneConfig, adapter, model, selector, stats: dict, K: int, keep: int):
    """(`pruning.budgets.Budget`, per-channel scores {layer: [H, K]}) of a global budget from the selector's
    per-channel scores of every mixer. global-last weighs each head by `budgets.last_head_factor` of its calibrated
    decay (one factor per head: the ranking within a head, which head granularity reads, is unchanged)."""
    scores = {}
    for ref in adapter.mixers(model):
        w_q, w_k = adapter.qk_weights(ref.module)
        s = selector.channel_scores(SelectorInput(stats.get(ref.layer), w_q.detach(), w_k.detach(), keep,
                                                  cfg.select, None, ref.layer))
        layer_stats = stats.get(ref.layer)
        if cfg.budget == "global-last" and layer_stats is not None and layer_stats.decay_sq is not None:
            rho = layer_stats.decay_sq.double().cpu() / layer_stats.n_tokens
            s = s * last_head_factor(rho, layer_stats.horizon)[:, None]
        scores[ref.layer] = s
    budget = layer_budget(scores, K, cfg.ratio, cfg.budget, floor=cfg.budget_floor, multiple=cfg.multiple or 1,
                          allow_layer_removal=cfg.allow_layer_removal, granularity=cfg.budget_granularity)
    return budget, scores


def head_keep_masks(budget, selections: dict, scores: dict) -> dict[int, torch.Tensor]:
    """Head granularity: per layer, [H, K'] masks over the selected channels (in the reduced layer's order) keeping
    each head's top K'_h of them by the budget's per-channel scores; the rest get zeroed q/k rows."""
    masks = {}
    for layer, dims in (budget.head_key_dims or {}).items():
        keep = selections.get(layer)
        if keep is None or keep.keep is None:
            continue
        s = scores[layer].double().gather(1, keep.keep)  # [H, K'] scores of the kept channels
        order = torch.argsort(s, dim=1, descending=True, stable=True)
        ranks = torch.empty_like(order).scatter_(1, order, torch.arange(s.shape[1]).expand_as(order).clone())
        masks[layer] = ranks < torch.tensor(dims)[:, None]
    return masks


def prune(cfg: PruneConfig, write_extra: Callable[[Path, dict], None] | None = None) -> dict:
    """Prune `cfg.model` and publish the checkpoint with selection.json as `cfg.out`; returns the record.
    `write_extra(folder, record)` adds files (the result) to the folder before it is published."""
    cfg.validate()
    t0 = time.time()
    stage_seconds, lap = _stopwatch()
    install_cpu_backend()
    config = load_config(cfg.model)
    selector = get_selector(cfg.method)
    options = selector.options(cfg.selector_options)
    selector.check_family(get_adapter(config))  # a wrong or wrapper config fails before the weights load
    tokenizer = load_tokenizer(cfg.model)
    if selector.needs:
        check_calibration_source(cfg.calib, cfg.model)
        check_length_option(cfg.seq_len, "--seq-len", config, tokenizer, model_dir=cfg.model, name=cfg.model)
    device = resolve_device(cfg.device)
    saved_dtype = checkpoint_dtype(config)
    model = load_model(cfg.model, dtype=compute_dtype(device))
    adapter = get_adapter(model)
    run_dtype = next(next(adapter.mixers(model)).module.parameters()).dtype  # the embedding may stay 16-bit on a CPU
    if not cfg.stream_layers:
        model.to(device)
    H, K = adapter.key_heads(model.config)
    keep = keep_count(K, cfg.ratio, cfg.multiple, cfg.power_of_two)
    state_before = adapter.state_bytes_per_sequence(model.config)
    lap("load")
    rss_after_load = host_rss_bytes()  # what calibration and selection add is measured above this (bench selectors)

    stats, calibration = {}, None
    needs = selector.needs | ({"dynamics"} if cfg.budget == "global-last" else set())
    if needs and (keep < K or cfg.budget != "uniform"):  # exactly the statistics read (calibration.STATISTICS)
        windows, calibration = calibration_windows(cfg.calib, model_dir=cfg.model, tokenizer=tokenizer,
                                                   n=cfg.n_calib, seq_len=cfg.seq_len, seed=cfg.seed,
                                                   data_dir=cfg.data_dir, vocab_size=model.config.vocab_size)
        batch = grad_batch_size(cfg) if selector.gradients else cfg.batch_size
        if cfg.stream_layers:
            stats = calibrate_streaming(model, adapter, windows, batch_size=batch, device=device, needs=needs)
        else:
            stats = calibrate(model, adapter, windows, batch_size=batch, needs=needs)
    lap("calibration")

    generator = torch.Generator().manual_seed(cfg.seed)
    budget, scores = layer_key_dims(cfg, adapter, model, selector, stats, K, keep) if cfg.budget != "uniform" \
        else (None, None)
    removed = budget.removed_layers if budget is not None else []
    if removed and adapter.structure is None:  # before the selection's compute
        raise InputError(f"--allow-layer-removal: {adapter.family} has no StructureLayout, so removing the token "
                         f"mixer of layer(s) {', '.join(map(str, removed))} is not defined for model_type "
                         f"{model.config.model_type!r}; use a --budget-floor >= 1")
    selections = {}
    for ref in adapter.mixers(model):
        if ref.layer in removed:
            continue
        w_q, w_k = adapter.qk_weights(ref.module)
        k_layer = keep if budget is None else budget.key_dims[ref.layer]
        selections[ref.layer] = selector(SelectorInput(stats.get(ref.layer), w_q.detach(), w_k.detach(), k_layer,
                                                       cfg.select, generator, ref.layer), **options)
        del w_q, w_k  # views of the projection: the last mixer's unreduced weight would live through the surgery
    head_masks = head_keep_masks(budget, selections, scores) if budget is not None else {}
    lap("selection")
    peak_through_selection = host_peak_rss_bytes()
    reduce_model(model, selections, removed_mixers=removed)
    for ref in adapter.mixers(model):
        if ref.layer in head_masks:
            adapter.zero_key_channels(ref.module, head_masks[ref.layer])
    model.to(saved_dtype)  # computed in fp32 on a CPU; saved in the checkpoint's own dtype
    lap("surgery")
    state_after = get_adapter(model).state_bytes_per_sequence(model.config)  # the _kdim variant's after a global budget
    rotations = {f"layer{layer}": sel.rotation.contiguous() for layer, sel in selections.items()
                 if sel.rotation is not None}
    record = {
        "kind": "prune", "config": cfg.recorded(), "model_type": model.config.model_type,
        "key_heads": H, "key_dim_before": K, "key_dim_after": keep,
        "state_bytes_per_sequence": {"before": state_before, "after": state_after, "dtype": "bfloat16"},
        "selection": {str(layer): {"keep": sel.keep.tolist()} if sel.keep is not None
                      else {"rotation_shape": list(sel.rotation.shape)} for layer, sel in selections.items()},
        **({"removed_mixers": removed} if removed else {}),
        "selection_rotations": "selection_rotations.safetensors" if rotations else None,
        "calibration": calibration,
        "device": str(device), "compute_dtype": str(run_dtype), "saved_dtype": str(saved_dtype),
        # the process's resident memory after loading the model, and its peak up to the end of the selection (a
        # process's own only in a fresh one: a pipeline worker's peak carries its earlier tasks')
        "host_memory": {"rss_after_load_bytes": rss_after_load, "peak_rss_through_selection_bytes": peak_through_selection},
        "provenance": collect_provenance(),
    }
    if budget is not None:  # issue 17: each layer's K', and the totals against the uniform budget's
        record["key_dim_after"] = round(budget.kept_total / (H * len(budget.key_dims)), 4)
        record["budget"] = {"budget": cfg.budget, "floor": cfg.budget_floor, "multiple": cfg.multiple or 1,
                            "layer_key_dims": {str(layer): k for layer, k in budget.key_dims.items()},
                            "requested_channels": budget.requested_total, "kept_channels": budget.kept_total,
                            "total_error": budget.total_error}
        if removed:
            record["budget"]["removed_mixers"] = removed
        if budget.head_key_dims is not None:  # stored at each layer's largest K'_h: allocated vs exact state
            record["budget"]["granularity"] = "head"
            record["budget"]["head_key_dims"] = {str(layer): d for layer, d in budget.head_key_dims.items()}
            record["budget"]["allocated_channels"] = budget.allocated_total
            # every family's state is linear in each head's K' (tests/pruning/test_layer_budgets.py)
            record["state_bytes_per_sequence"]["exact"] = state_before * budget.kept_total // (H * len(budget.key_dims) * K)
            for layer, m in head_masks.items():
                record["selection"][str(layer)]["head_keep"] = [
                    [c for c, kept in zip(row, mrow) if kept] for row, mrow in
                    zip(selections[layer].keep.tolist(), m.tolist())]

    def write_selection(folder: Path) -> None:
        if rotations:
            save_file(rotations, os.fspath(folder / "selection_rotations.safetensors"))
        lap("save")  # the weights and tokenizer are written when the selection is
        record.update(wall_time_s=round(time.time() - t0, 2), peak_memory_bytes=peak_memory_bytes(device),
                      peak_rss_bytes=host_peak_rss_bytes(), stage_seconds=stage_seconds)
        write_json_atomic(folder / "selection.json", record)
        if write_extra is not None:
            write_extra(folder, record)

    save_reduced(model, tokenizer, cfg.out, overwrite=cfg.overwrite, write_extra=write_selection)
    return record


def prune_result(record: dict, folder, *, profile: str, experiment: str, config: dict | None = None,
                 published_as=None) -> dict:
    """The run of `prune` (its returned record, its output folder) as a result of the common schema.
    `published_as`: the folder's final name, when `folder` is the temporary one being filled."""
    model = model_entry(folder)
    if published_as is not None:
        model["path"] = _display_path(published_as)
        folder = published_as

    calibration = record.get("calibration") or {}
    config = record["config"] if config is None else config
    return build_result(
        "prune", profile=profile, experiment=experiment, config=config,
        metrics={"key_dim_before": record["key_dim_before"], "key_dim_after": record["key_dim_after"],
                 "state_bytes_before": record["state_bytes_per_sequence"]["before"],
                 "state_bytes_after": record["state_bytes_per_sequence"]["after"],
                 **({"kept_channels": record["budget"]["kept_channels"],
                     "requested_channels": record["budget"]["requested_channels"]} if record.get("budget") else {}),
                 **({"allocated_channels": record["budget"]["allocated_channels"],
                     "state_bytes_exact": record["state_bytes_per_sequence"]["exact"]}
                    if "allocated_channels" in (record.get("budget") or {}) else {})},
        model=model, data={calibration["corpus"]: calibration["sha256"] or calibration.get("sequences_sha256")}
        if calibration else {},
        seeds={"selection": record["config"]["seed"]}, wall_time_s=record["wall_time_s"],
        extra={"selection_file": str(Path(folder) / "selection.json"), "calibration": calibration,
               "dense_model": model_entry(record["config"]["model"]),
               **({"budget": record["budget"]} if record.get("budget") else {})})
