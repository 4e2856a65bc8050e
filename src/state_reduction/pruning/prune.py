"""`state-reduction prune`: load, calibrate, select, cut, save with selection.json."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from state_reduction.pruning.selectors import MODES, get_selector, keep_count, select

# What each selector reads from calibration (rand and l1 use the weights only).
NEEDS_CALIBRATION = {"wanda", "grad", "drrqr", "pca", "pca-adv"}
NEEDS_GRADIENTS = {"grad"}


@dataclass
class PruneConfig:
    model: str
    method: str
    ratio: float
    out: str
    select: str = "kq"
    calib: str = "ptb"
    n_calib: int = 32
    seq_len: int = 256
    seed: int = 0
    batch_size: int = 8
    multiple: int | None = None
    power_of_two: bool = False
    overwrite: bool = False
    data_dir: str | None = None
    stream_layers: bool = False  # calibrate with one decoder block at a time on `device` (7B-9B models, issue 8)
    device: str | None = None  # compute device of calibration (None or auto: the GPU when present, else the CPU)
    # Grad's backward keeps every block's activations of one forward: at most this many tokens per forward
    # (windows per forward = max(1, grad_tokens // seq_len), never above batch_size). The gradient sums are
    # additive over windows, so the scores do not depend on it beyond float summation order.
    grad_tokens: int = 2048

    def validate(self) -> None:
        get_selector(self.method)
        if self.select not in MODES:
            raise ValueError(f"--select must be one of {', '.join(MODES)}, got {self.select!r}")
        if self.n_calib < 1 or self.seq_len < 2:
            raise ValueError(f"--n-calib must be >= 1 and --seq-len >= 2, got {self.n_calib}, {self.seq_len}")
        if self.grad_tokens < 1:
            raise ValueError(f"grad_tokens must be >= 1, got {self.grad_tokens}")
        from state_reduction.devices import resolve_device

        resolve_device(self.device)
        if Path(self.out).exists() and not self.overwrite:
            raise FileExistsError(f"output directory {self.out} exists; pass --overwrite to replace it")


def grad_batch_size(cfg: PruneConfig) -> int:
    """Windows per forward of Grad calibration (PruneConfig.grad_tokens)."""
    return max(1, min(cfg.batch_size, cfg.grad_tokens // cfg.seq_len))


def prune(cfg: PruneConfig) -> dict:
    """Prune `cfg.model` and write the checkpoint and selection.json to `cfg.out`; returns the record."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    import state_reduction  # noqa: F401  (Auto-class registration)
    from state_reduction.backend import install_cpu_backend
    from state_reduction.data import get_corpus_info, sample_sequences
    from state_reduction.provenance import collect_provenance, write_json_atomic
    from state_reduction.pruning.adapters import get_adapter
    from state_reduction.pruning.calibration import calibrate
    from state_reduction.pruning.streaming import calibrate_streaming
    from state_reduction.pruning.surgery import reduce_model, save_reduced

    from state_reduction.devices import (
        checkpoint_dtype,
        compute_dtype,
        host_peak_rss_bytes,
        peak_memory_bytes,
        resolve_device,
    )

    cfg.validate()
    t0 = time.time()
    install_cpu_backend()
    config = AutoConfig.from_pretrained(cfg.model)
    get_adapter(config)  # a wrong or wrapper config fails before the weights load
    device = resolve_device(cfg.device)
    saved_dtype = checkpoint_dtype(config)
    model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=compute_dtype(device))
    adapter = get_adapter(model)
    run_dtype = next(model.parameters()).dtype
    if not cfg.stream_layers:
        model.to(device)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    H, K = adapter.key_heads(model.config)
    keep = keep_count(K, cfg.ratio, cfg.multiple, cfg.power_of_two)
    state_before = adapter.state_bytes_per_sequence(model.config)

    stats, calibration = {}, None
    if cfg.method in NEEDS_CALIBRATION and keep < K:
        windows = sample_sequences(tokenizer, cfg.calib, n=cfg.n_calib, seq_len=cfg.seq_len, seed=cfg.seed,
                                   stream="calibration", data_dir=cfg.data_dir)
        gradients = cfg.method in NEEDS_GRADIENTS
        batch = grad_batch_size(cfg) if gradients else cfg.batch_size
        if cfg.stream_layers:
            stats = calibrate_streaming(model, adapter, windows, batch_size=batch, gradients=gradients, device=device)
        else:
            stats = calibrate(model, adapter, windows, batch_size=batch, gradients=gradients)
        calibration = {"corpus": cfg.calib, "stream": "calibration", "n": cfg.n_calib, "seq_len": cfg.seq_len,
                       "tokens": int(windows.numel()), "seed": cfg.seed,
                       "sha256": get_corpus_info(cfg.calib).sha256}

    generator = torch.Generator().manual_seed(cfg.seed)
    selections = {}
    for ref in adapter.mixers(model):
        w_q, w_k = adapter.qk_weights(ref.module)
        selections[ref.layer] = select(cfg.method, stats.get(ref.layer), w_q.detach(), w_k.detach(), keep,
                                       cfg.select, generator, ref.layer)
    reduce_model(model, selections)
    model.to(saved_dtype)  # computed in fp32 on a CPU; saved in the checkpoint's own dtype
    state_after = adapter.state_bytes_per_sequence(model.config)
    rotations = {f"layer{layer}": sel.rotation.contiguous() for layer, sel in selections.items()
                 if sel.rotation is not None}
    record = {
        "kind": "prune", "config": asdict(cfg), "model_type": model.config.model_type,
        "key_heads": H, "key_dim_before": K, "key_dim_after": keep,
        "state_bytes_per_sequence": {"before": state_before, "after": state_after, "dtype": "bfloat16"},
        "selection": {str(layer): {"keep": sel.keep.tolist()} if sel.keep is not None
                      else {"rotation_shape": list(sel.rotation.shape)} for layer, sel in selections.items()},
        "selection_rotations": "selection_rotations.safetensors" if rotations else None,
        "calibration": calibration,
        "device": str(device), "compute_dtype": str(run_dtype), "saved_dtype": str(saved_dtype),
        "provenance": collect_provenance(),
    }

    def write_selection(folder: Path) -> None:
        if rotations:
            from safetensors.torch import save_file

            save_file(rotations, os.fspath(folder / "selection_rotations.safetensors"))
        record.update(wall_time_s=round(time.time() - t0, 2), peak_memory_bytes=peak_memory_bytes(device),
                      peak_rss_bytes=host_peak_rss_bytes())
        write_json_atomic(folder / "selection.json", record)

    save_reduced(model, tokenizer, cfg.out, overwrite=cfg.overwrite, write_extra=write_selection)
    return record


def prune_result(record: dict, folder, *, profile: str, experiment: str, config: dict | None = None) -> dict:
    """The run of `prune` (its returned record, its output folder) as a result of the common schema."""
    from state_reduction.results import build_result, model_entry

    calibration = record.get("calibration") or {}
    config = record["config"] if config is None else config
    return build_result(
        "prune", profile=profile, experiment=experiment, config=config,
        metrics={"key_dim_before": record["key_dim_before"], "key_dim_after": record["key_dim_after"],
                 "state_bytes_before": record["state_bytes_per_sequence"]["before"],
                 "state_bytes_after": record["state_bytes_per_sequence"]["after"]},
        model=model_entry(folder), data={calibration["corpus"]: calibration["sha256"]} if calibration else {},
        seeds={"selection": record["config"]["seed"]}, wall_time_s=record["wall_time_s"],
        extra={"selection_file": str(Path(folder) / "selection.json"), "calibration": calibration,
               "dense_model": model_entry(record["config"]["model"])})
