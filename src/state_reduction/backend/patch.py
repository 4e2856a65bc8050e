"""The one place that rebinds names in fla and transformers to device dispatchers.

A dispatcher looks at the first tensor argument: on a CPU tensor it calls the torch reference, on any other
device (CUDA, and meta in tests) the original function, so installing is a no-op for GPU runs. Names are rebound
where they are looked up at call time: the module globals of fla's layers and of the fla functions its modules
call (ShortConvolution -> causal_conv1d / causal_conv1d_update, RMSNorm -> rms_norm, FusedRMSNormGated ->
rms_norm_gated, GatedMLP -> swiglu / swiglu_linear), fla's ACT2FN entries, the loss modules' `forward`, and the
gated-delta / causal-conv functions that transformers' Qwen3.5-family modules bind to fla's kernels.
Modules that copied an ACT2FN entry at construction (fla's GLA/Mamba layers, not DeltaNet/GatedDeltaNet) keep
the Triton function when built before installing.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any

import torch

from state_reduction.backend import modules as torch_modules
from state_reduction.backend.delta_rule import chunk_delta_rule_torch, recurrent_delta_rule_torch
from state_reduction.backend.gated_delta_rule import chunk_gated_delta_rule_torch, recurrent_gated_delta_rule_torch

_DELTA_RULE = {
    'chunk_delta_rule': chunk_delta_rule_torch,
    'fused_recurrent_delta_rule': recurrent_delta_rule_torch,
}
_GATED_DELTA_RULE = {
    'chunk_gated_delta_rule': chunk_gated_delta_rule_torch,
    'fused_recurrent_gated_delta_rule': recurrent_gated_delta_rule_torch,
}
_CONV = {
    'causal_conv1d': torch_modules.causal_conv1d_torch,
    'causal_conv1d_update': torch_modules.causal_conv1d_update_torch,
}
_SWIGLU = {
    'swiglu': torch_modules.swiglu_torch,
    'swiglu_linear': torch_modules.swiglu_linear_torch,
}

# (owner, {name: torch reference}); owner is 'module' or 'module:attribute' (a class or a dict)
FLA_ROUTES: tuple[tuple[str, dict[str, Callable]], ...] = (
    ('fla.ops.delta_rule', _DELTA_RULE),
    ('fla.ops.gated_delta_rule', _GATED_DELTA_RULE),
    ('fla.layers.delta_net', {**_DELTA_RULE, 'elu_p1': torch_modules.elu_p1_torch}),
    ('fla.layers.gated_deltanet', {**_GATED_DELTA_RULE, 'causal_conv1d': torch_modules.causal_conv1d_torch}),
    ('fla.modules.causal_conv1d', _CONV),
    ('fla.modules.causal_conv1d.ops', _CONV),
    ('fla.modules.norm.layernorm', {'rms_norm': torch_modules.rms_norm_torch}),
    ('fla.modules.norm.fused_norm_gate', {'rms_norm_gated': torch_modules.rms_norm_gated_torch}),
    ('fla.modules.mlp', _SWIGLU),
    ('fla.modules.activations', {
        **_SWIGLU,
        'swish': torch_modules.swish_torch,
        'sigmoid': torch_modules.sigmoid_torch,
        'logsigmoid': torch_modules.logsigmoid_torch,
        'elu_p1': torch_modules.elu_p1_torch,
    }),
    ('fla.modules.activations.ops:ACT2FN', {
        'sigmoid': torch_modules.sigmoid_torch,
        'logsigmoid': torch_modules.logsigmoid_torch,
        'silu': torch_modules.swish_torch,
        'swish': torch_modules.swish_torch,
    }),
    ('fla.modules.fused_cross_entropy.ops:FusedCrossEntropyLoss', {
        'forward': torch_modules.fused_cross_entropy_forward_torch,
    }),
    ('fla.modules.fused_linear_cross_entropy.ops:FusedLinearCrossEntropyLoss', {
        'forward': torch_modules.fused_linear_cross_entropy_forward_torch,
    }),
)

# transformers binds these to fla's kernels when fla is importable; on CPU they go back to the torch function
# each one wraps (`use_kernel_func_from_hub_with_fallback` keeps it as __wrapped__).
TRANSFORMERS_FALLBACK_MODULES = (
    'transformers.models.qwen3_5.modeling_qwen3_5',
    'transformers.models.qwen3_5_moe.modeling_qwen3_5_moe',
    'transformers.models.qwen3_next.modeling_qwen3_next',
)
TRANSFORMERS_FALLBACK_NAMES = (
    'torch_chunk_gated_delta_rule',
    'torch_recurrent_gated_delta_rule',
    'causal_conv1d_fn',
    'causal_conv1d_update',
)

_DISPATCHER_FLAG = '_state_reduction_dispatcher'
_installed: dict[tuple[str, str], Callable] = {}  # (owner, name) -> dispatcher


def first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
    return None


def uses_reference(args: tuple, kwargs: dict) -> bool:
    """The dispatch rule: the torch reference exactly when the first tensor argument lives on the CPU."""
    tensor = first_tensor(args, kwargs)
    return tensor is not None and tensor.device.type == 'cpu'


def make_dispatcher(original: Callable, reference: Callable) -> Callable:
    @functools.wraps(original)
    def dispatcher(*args, **kwargs):
        if uses_reference(args, kwargs):
            return reference(*args, **kwargs)
        return original(*args, **kwargs)

    dispatcher.original = original
    dispatcher.reference = reference
    setattr(dispatcher, _DISPATCHER_FLAG, True)
    return dispatcher


def is_dispatcher(function: Any) -> bool:
    return getattr(function, _DISPATCHER_FLAG, False) is True


def _resolve(owner: str) -> Any:
    module_name, _, attribute = owner.partition(':')
    target = importlib.import_module(module_name)
    for part in filter(None, attribute.split('.')):
        target = getattr(target, part)
    return target


def _get(target: Any, name: str, owner: str) -> Any:
    try:
        return target[name] if isinstance(target, dict) else getattr(target, name)
    except (KeyError, AttributeError):
        raise AttributeError(
            f"install_cpu_backend: {owner} has no {name!r}; the routes in state_reduction/backend/patch.py "
            f"are written for flash-linear-attention 0.6.0 and transformers 5.24."
        ) from None


def _set(target: Any, name: str, value: Any) -> None:
    if isinstance(target, dict):
        target[name] = value
    else:
        setattr(target, name, value)


def _route(owner: str, name: str, reference_for: Callable[[Callable], Callable]) -> None:
    target = _resolve(owner)
    current = _get(target, name, owner)
    if is_dispatcher(current):
        _installed[(owner, name)] = current
        return
    dispatcher = make_dispatcher(current, reference_for(current))
    _set(target, name, dispatcher)
    _installed[(owner, name)] = dispatcher


def _transformers_torch_fallback(name: str) -> Callable[[Callable], Callable]:
    def reference_for(original: Callable) -> Callable:
        torch_function = inspect.unwrap(original)

        @functools.wraps(torch_function)
        def reference(*args, **kwargs):
            if kwargs.get('cu_seqlens') is not None or kwargs.get('seq_idx') is not None:
                raise NotImplementedError(
                    f"{name}: transformers' torch fallback cannot keep packed sequences (cu_seqlens/seq_idx) apart "
                    f"on CPU; pass a padded batch with an attention_mask instead."
                )
            return torch_function(*args, **kwargs)

        return reference

    return reference_for


def install() -> None:
    for owner, references in FLA_ROUTES:
        for name, reference in references.items():
            _route(owner, name, lambda original, reference=reference: reference)
    for module in TRANSFORMERS_FALLBACK_MODULES:
        for name in TRANSFORMERS_FALLBACK_NAMES:
            _route(module, name, _transformers_torch_fallback(name))


def installed_dispatchers() -> dict[tuple[str, str], Callable]:
    """(owner, name) -> dispatcher for every name rebound so far."""
    return dict(_installed)
