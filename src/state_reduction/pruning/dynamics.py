"""Per-head state dynamics seen in calibration: the decay a_t and the input gain of each recurrent head.

Every family's state update has the form S_t = a_t S_{t-1} (...) + g_t v_t k_t^T with a scalar decay a_t and a
scalar input gain g_t per value head:

    family            decay a_t                                           gain g_t
    Mamba-2           exp(-exp(A_log) * softplus(dt_raw + dt_bias))        dt = softplus(dt_raw + dt_bias), clamped
                      (dt_raw: the last num_heads rows of in_proj)         to time_step_limit (ZOH: B_bar = dt B)
    Gated DeltaNet    exp(-exp(A_log) * softplus(a_proj(x) + dt_bias))      beta = sigmoid(b_proj(x)) (x2 with
                                                                          allow_neg_eigval)
    Qwen3.5 linear    exp(-exp(A_log) * softplus(in_proj_a(x) + dt_bias))   beta = sigmoid(in_proj_b(x))
    DeltaNet          1 (no decay)                                        beta = sigmoid(b_proj(x)) (1 without
                                                                          use_beta; x2 with allow_neg_eigval)

`HeadDynamics` holds these facts per adapter (one table entry, no family branches); `add_dynamics_hooks`
accumulates, per *key* head, sum_t a_t^2 and sum_t g_t^2 averaged over the value heads that share the key head
(value head h reads key head h // (H_v / H_k) in every family), into LayerCalibration.decay_sq / gain_sq.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from state_reduction.pruning.types import LayerCalibration


@dataclass(frozen=True)
class HeadDynamics:
    gate: str | None            # module whose output holds the decay pre-activation; None: no decay (a = 1)
    beta: str | None            # module whose output holds the beta pre-activation; None: gain from the gate (dt)
    value_heads: str            # mixer attribute: number of value heads (decay/gain heads)
    gate_tail: bool = False     # the pre-activation is the last `value_heads` outputs of `gate` (Mamba-2 in_proj)
    gain_is_dt: bool = False    # the input gain is dt itself (Mamba-2's ZOH input matrix dt * B)
    beta_flag: str | None = None  # mixer attribute that switches beta on (DeltaNet's use_beta)


def _key_head_mean(x: torch.Tensor, key_heads: int) -> torch.Tensor:
    """[B, T, H_v] -> [H_k]: sum over tokens, mean over the value heads of each key head."""
    per_v = x.double().sum(dim=(0, 1))
    return per_v.view(key_heads, -1).mean(1)


def _dt(mixer: nn.Module, raw: torch.Tensor) -> torch.Tensor:
    dt = F.softplus(raw.float() + mixer.dt_bias.float())
    limit = getattr(mixer, "time_step_limit", None)
    if limit is not None:
        dt = dt.clamp(min=limit[0], max=limit[1])
    return dt


def _add(stats: LayerCalibration, name: str, value: torch.Tensor) -> None:
    current = getattr(stats, name)
    setattr(stats, name, value if current is None else current + value)


def add_dynamics_hooks(spec: HeadDynamics, mixer: nn.Module, key_heads: int, on_dynamics=None, on_series=None) -> list:
    """Forward hooks calling on_dynamics(name, [H_k] float64 sum) for name in decay_sq, gain_sq and/or
    on_series(name, [B, T, H_v] float32 per token) for name in decay, gain; returns handles."""
    hv = getattr(mixer, spec.value_heads)
    handles = []
    if spec.gate is not None:
        def on_gate(module, args, out):
            raw = out[..., -hv:] if spec.gate_tail else out
            dt = _dt(mixer, raw)
            a = torch.exp(-torch.exp(mixer.A_log.float()) * dt)
            if on_dynamics is not None:
                on_dynamics("decay_sq", _key_head_mean(a.pow(2), key_heads))
            if on_series is not None:
                on_series("decay", a)
            if spec.gain_is_dt:
                if on_dynamics is not None:
                    on_dynamics("gain_sq", _key_head_mean(dt.pow(2), key_heads))
                if on_series is not None:
                    on_series("gain", dt)
        handles.append(getattr(mixer, spec.gate).register_forward_hook(on_gate))
    if spec.beta is not None:
        def on_beta(module, args, out):
            beta = out.float().sigmoid() * (2.0 if getattr(mixer, "allow_neg_eigval", False) else 1.0)
            if on_dynamics is not None:
                on_dynamics("gain_sq", _key_head_mean(beta.pow(2), key_heads))
            if on_series is not None:
                on_series("gain", beta)

        if spec.beta_flag is None or getattr(mixer, spec.beta_flag):
            handles.append(getattr(mixer, spec.beta).register_forward_hook(on_beta))
    return handles


def accumulate(stats: LayerCalibration, name: str, value: torch.Tensor) -> None:
    _add(stats, name, value)
