"""CPU execution for fla 0.6.0's Triton-only pieces and transformers' Qwen3.5 gated-delta fallback.

`install_cpu_backend()` rebinds (see `patch.py`) every Triton-only function that fla's DeltaNet and GatedDeltaNet
models call, and the fla-bound functions of transformers' Qwen3.5 family, to dispatchers that run a pure-torch
reference on CPU tensors and the original kernel on any other device. Importing this package changes nothing.

Fused cross-entropy is routed (configs may keep fuse_cross_entropy=True): on CPU the loss is F.cross_entropy.
"""

from __future__ import annotations

from state_reduction.backend import patch
from state_reduction.backend.delta_rule import chunk_delta_rule_torch, recurrent_delta_rule_torch
from state_reduction.backend.gated_delta_rule import chunk_gated_delta_rule_torch, recurrent_gated_delta_rule_torch

_installed = False


def install_cpu_backend() -> None:
    """Route fla's Triton kernels (and transformers' fla bindings) to torch references for CPU tensors.
    Idempotent; CUDA tensors keep using the original kernels."""
    global _installed

    patch.install()
    _installed = True


def is_installed() -> bool:
    return _installed


__all__ = [
    'chunk_delta_rule_torch',
    'chunk_gated_delta_rule_torch',
    'install_cpu_backend',
    'is_installed',
    'recurrent_delta_rule_torch',
    'recurrent_gated_delta_rule_torch',
]
