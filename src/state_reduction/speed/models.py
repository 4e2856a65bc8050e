"""Models to benchmark: the tiny checkpoints or 1.3B-shaped configs with random weights, and their reduced copies.

1.3B shapes (paper G.1, Table 19): hidden 2048, 16 heads, d_k = d_v = 128. fla config names: Gated DeltaNet
`head_dim` is d_k and d_v = head_dim * expand_v; DeltaNet d_k = hidden * expand_k / num_heads. The layer count
is a parameter so that CPU runs can keep the shapes and drop depth.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from state_reduction.backend.fused_cpu import selected_kernel
from state_reduction.backend.vocabulary import vocabulary_modules
from state_reduction.checkpoints import load_model
from state_reduction.errors import InputError, MissingInputError
from state_reduction.models.families import build_model, speed_presets
from state_reduction.models.families import get_adapter
from state_reduction.pruning.selectors import select
from state_reduction.pruning.surgery import reduce_model

PRESETS: dict[str, tuple[str, dict]] = speed_presets()  # name -> (family, config kwargs), from each family's module
# The CPU references run with these; fla's Triton fused cross-entropy and fused norms are routed on CPU anyway.
_CPU_SAFE = {"fuse_cross_entropy": False}


def load_bench_model(model: str, *, layers: int | None = None, dtype: torch.dtype = torch.float32,
                     device: str | torch.device = "cpu", seed: int = 0) -> tuple[nn.Module, dict]:
    """`model` is a preset name (random weights) or a checkpoint directory. Returns the model (eval mode, on
    `device`) and a description for the result file."""
    if model in PRESETS:
        family, kwargs = PRESETS[model]
        kwargs = {**kwargs, **_CPU_SAFE}
        if layers is not None:
            kwargs["num_hidden_layers"] = layers
        with torch.device(device):  # initialise on the device: a 1.3B model built on the CPU takes minutes there
            m = build_model(family, kwargs, seed=seed, dtype=dtype)
        desc = {"name": model, "path": None, "family": family, "random_weights": True, "layers": kwargs["num_hidden_layers"]}
    elif Path(model).is_dir():
        if layers is not None:
            raise InputError(f"--layers applies to presets ({', '.join(PRESETS)}), not to the checkpoint {model}")
        m = load_model(model, dtype=dtype)  # fp32 on a CPU: a bf16 checkpoint's embedding and head stay in bf16
        desc = {"name": Path(model).name, "path": model, "family": m.config.model_type, "random_weights": False,
                "layers": m.config.num_hidden_layers}
    else:
        raise MissingInputError(f"model {model!r} is neither a preset ({', '.join(PRESETS)}) nor a checkpoint directory")
    m = m.to(device).eval()
    H, K = get_adapter(m).key_heads(m.config)
    desc.update(model_type=m.config.model_type, heads=H, d_k=K, dtype=str(dtype).removeprefix("torch."))
    return m, desc


def reduced_copy(model: nn.Module, keep: int, method: str = "l1") -> nn.Module:
    """A deep copy with `keep` key channels per head, chosen by a weight-only selector (speed does not depend on
    which channels are kept). The embedding and head, which reduction leaves alone, are shared, not copied."""
    adapter = get_adapter(model)
    _, K = adapter.key_heads(model.config)
    out = copy.deepcopy(model, memo={id(p): p for m in vocabulary_modules(model) for p in m.parameters()})
    if keep == K:
        return out
    selections = {}
    for ref in adapter.mixers(out):
        w_q, w_k = adapter.qk_weights(ref.module)
        selections[ref.layer] = select(method, None, w_q.detach(), w_k.detach(), keep, "kq",
                                       torch.Generator().manual_seed(0), ref.layer)
    with torch.no_grad():
        reduce_model(out, selections)
    return out


def model_device(model: nn.Module) -> torch.device:
    devices = {p.device for p in model.parameters()}
    if len(devices) != 1:
        raise InputError(f"model parameters are spread over devices {sorted(map(str, devices))}; benchmarks need one")
    return next(iter(devices))


def check_device(model: nn.Module, device: torch.device, what: str) -> None:
    """Benchmarking a model on a device it is not on is an error (a silent copy would time the transfer)."""
    found = model_device(model)
    if found.type != device.type or (device.index is not None and found.index != device.index):
        raise InputError(f"{what}: the model is on {found} but the benchmark was asked to run on {device}; "
                         f"move it with model.to({str(device)!r}) or pass --device {found}")


def backend_label(device: torch.device) -> str:
    """What executes the recurrence: fla's Triton kernels on CUDA, the project's torch references on CPU (their decode
    steps the fused C step when STATE_REDUCTION_CPU_RECURRENCE=fused or `fused_cpu.use_kernel` selects it)."""
    if device.type == "cuda":
        return "fla-triton"
    return "torch-reference-cpu" + ("+fused-c-decode" if selected_kernel() == "fused" else "")
