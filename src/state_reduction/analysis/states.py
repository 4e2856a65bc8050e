"""Recurrent states of every reducible mixer over calibration sequences, decay and gating included.

The layers run unchanged; the call into their recurrence kernel is intercepted to record its inputs in one
canonical form (`KernelInputs`: q, k after the kernel's L2 norm, beta and the log-decay g the kernel uses), and
the states S_t are then rebuilt with the backend's torch reference (`run_delta_rule`), segment by segment, at
every `stride`-th token. Per family:
  DeltaNet      g = None (no decay)
  GatedDeltaNet g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b) (the in-kernel gate, as the layer asks)
  Qwen3.5       the layer's g and beta (its GDN layers only; value heads share key heads)
  Mamba-2       h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T (no delta term), rebuilt from the in_proj output
The authors' analysis ignored the GDN decay; `ignore_decay=True` reproduces that for comparison.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from state_reduction.backend.delta_rule import l2norm, run_delta_rule
from state_reduction.backend.gated_delta_rule import _prepare_gate_and_beta
from state_reduction.pruning.types import KeyChannelAdapter


@dataclass
class KernelInputs:
    """What one mixer's recurrence saw. q, k [B, T, H, K] (normalised as in the kernel); v [B, T, HV, V];
    beta, g [B, T, HV] (g: log-decay, None = no decay); float64. decay_only: Mamba-2 (no delta term, beta = dt)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    beta: torch.Tensor
    g: torch.Tensor | None
    decay_only: bool = False


def _delta_capture(kw: dict) -> KernelInputs:
    q, k = kw["q"].double(), kw["k"].double()
    if kw.get("use_qk_l2norm_in_kernel"):
        q, k = l2norm(q), l2norm(k)
    beta = kw.get("beta")
    beta = torch.ones_like(q[..., 0]) if beta is None else beta.double()
    return KernelInputs(q, k, kw["v"].double(), beta, None)


def _gated_capture(kw: dict) -> KernelInputs:
    q, k, v = kw["q"].double(), kw["k"].double(), kw["v"].double()
    if kw.get("use_qk_l2norm_in_kernel"):
        q, k = l2norm(q), l2norm(k)
    beta = kw.get("beta")
    beta = torch.ones_like(v[..., 0]) if beta is None else beta
    g, beta = _prepare_gate_and_beta(
        "analysis", kw.get("g"), beta, torch.float64, kw.get("use_gate_in_kernel", False), kw.get("A_log"),
        kw.get("dt_bias"), kw.get("use_beta_sigmoid_in_kernel", False), kw.get("allow_neg_eigval", False))
    return KernelInputs(q, k, v, beta, None if g is None else g.double())


def _qwen_capture(kw: dict) -> KernelInputs:
    q, k, v = kw["query"].double(), kw["key"].double(), kw["value"].double()
    if kw.get("use_qk_l2norm_in_kernel"):
        q, k = l2norm(q), l2norm(k)
    return KernelInputs(q, k, v, kw["beta"].double(), kw["g"].double())


# model_type -> (module whose globals the layer calls, {kernel name: positional argument names}, canonicaliser)
_DELTA_ARGS = ("q", "k", "v", "beta")
_GATED_ARGS = ("q", "k", "v", "g", "beta")
_QWEN_ARGS = ("query", "key", "value", "g", "beta")
KERNEL_ROUTES: dict[str, tuple[str, dict[str, tuple[str, ...]], Callable[[dict], KernelInputs]]] = {
    "delta_net": ("fla.layers.delta_net",
                  {"chunk_delta_rule": _DELTA_ARGS, "fused_recurrent_delta_rule": _DELTA_ARGS}, _delta_capture),
    "delta_net_shared_conv": ("fla.layers.delta_net",  # fla's DeltaNet layer with shared q/k conv filters
                              {"chunk_delta_rule": _DELTA_ARGS, "fused_recurrent_delta_rule": _DELTA_ARGS},
                              _delta_capture),
    "gated_deltanet": ("fla.layers.gated_deltanet",
                       {"chunk_gated_delta_rule": _GATED_ARGS, "fused_recurrent_gated_delta_rule": _GATED_ARGS},
                       _gated_capture),
    "qwen3_5_text": ("transformers.models.qwen3_5.modeling_qwen3_5",
                     {"torch_chunk_gated_delta_rule": _QWEN_ARGS, "torch_recurrent_gated_delta_rule": _QWEN_ARGS},
                     _qwen_capture),
}


@contextlib.contextmanager
def _intercept_kernels(model_type: str, record: Callable[[KernelInputs], None]) -> Iterator[None]:
    module_name, names, canonical = KERNEL_ROUTES[model_type]
    module = importlib.import_module(module_name)
    saved = {name: getattr(module, name) for name in names}

    def wrap(name, original):
        def kernel(*args, **kwargs):
            record(canonical({**dict(zip(names[name], args)), **kwargs}))
            return original(*args, **kwargs)
        return kernel

    try:
        for name, original in saved.items():
            setattr(module, name, wrap(name, original))
        yield
    finally:
        for name, original in saved.items():
            setattr(module, name, original)


def _mamba2_hooks(mixer, record: Callable[[KernelInputs], None]) -> list:
    """Mamba-2 computes its scan inline: rebuild x, B, C, dt from the in_proj output (conv + SiLU as the layer)."""
    from transformers.activations import ACT2FN

    def after_proj(module, args, out):  # out [B, T, P]
        inter, g_, n, heads = mixer.intermediate_size, mixer.n_groups, mixer.ssm_state_size, mixer.num_heads
        xbc, dt = out[..., inter:2 * inter + 2 * g_ * n].double(), out[..., 2 * inter + 2 * g_ * n:].double()
        conv = mixer.conv1d
        width = conv.weight.shape[-1]
        y = F.conv1d(xbc.transpose(1, 2), conv.weight.double(), None if conv.bias is None else conv.bias.double(),
                     padding=width - 1, groups=xbc.shape[-1])[..., :xbc.shape[1]]
        y = ACT2FN[mixer.activation](y).transpose(1, 2)
        x, b, c = torch.split(y, [inter, g_ * n, g_ * n], dim=-1)
        bsz, t = x.shape[:2]
        dt = F.softplus(dt + mixer.dt_bias.double())
        lo, hi = mixer.time_step_limit
        dt = dt.clamp(lo, hi)
        a = -torch.exp(mixer.A_log.double())
        # heads read group h // (heads / groups)
        b = b.reshape(bsz, t, g_, n).repeat_interleave(heads // g_, dim=2)
        c = c.reshape(bsz, t, g_, n).repeat_interleave(heads // g_, dim=2)
        record(KernelInputs(c, b, x.reshape(bsz, t, heads, -1), dt, dt * a, decay_only=True))

    return [mixer.in_proj.register_forward_hook(after_proj)]


def states_at(inputs: KernelInputs, stride: int, ignore_decay: bool = False) -> torch.Tensor:
    """States at tokens stride, 2*stride, ... (and the last token): [B, n, HV, K, V] float64, from zero.

    Each segment runs the backend's reference (`run_delta_rule`, one chunk per segment) from the previous
    state; Mamba-2's decay-only recurrence is a weighted outer-product sum within a segment."""
    q, k, v, beta, g = inputs.q, inputs.k, inputs.v, inputs.beta, inputs.g
    g = None if ignore_decay else g
    bsz, t, heads = q.shape[:3]
    hv = v.shape[2]
    h = q.new_zeros(bsz, hv, k.shape[-1], v.shape[-1])
    if hv != heads and not inputs.decay_only:
        q, k = (x.repeat_interleave(hv // heads, dim=2) for x in (q, k))
    ends = list(range(stride, t + 1, stride))
    if not ends or ends[-1] != t:
        ends.append(t)
    out, start = [], 0
    for end in ends:
        sl = slice(start, end)
        if inputs.decay_only:
            gg = torch.zeros_like(beta[:, sl]) if g is None else g[:, sl]  # [B, L, H]
            cum = gg.cumsum(1)
            w = beta[:, sl] * (cum[:, -1:] - cum).exp()  # weight of token s in the segment-end state
            h = h * cum[:, -1, :, None, None].exp() + torch.einsum("bsh,bshk,bshv->bhkv", w, k[:, sl], v[:, sl])
        else:
            _, h = run_delta_rule(q[:, sl], k[:, sl], v[:, sl], beta[:, sl], None if g is None else g[:, sl],
                                  function="analysis", scale=None, initial_state=h, output_final_state=True,
                                  use_qk_l2norm_in_kernel=False, cu_seqlens=None, chunk_size=end - start)
        out.append(h)
        start = end
    return torch.stack(out, dim=1)


def capture_kernel_inputs(model, adapter: KeyChannelAdapter, input_ids: torch.Tensor,
                          on_inputs: Callable[[int, KernelInputs], None] | None = None) -> dict[int, KernelInputs]:
    """One forward over input_ids [B, T]; the recurrence inputs of every reducible mixer, by layer index.

    With `on_inputs(layer, inputs)` each layer's inputs are handed over during the forward and not kept (memory
    of one layer instead of all); the returned dict is then empty."""
    mixers = list(adapter.mixers(model))
    captured: dict[int, KernelInputs] = {}
    seen: set[int] = set()
    current = {"layer": None}

    def record(inputs: KernelInputs) -> None:
        layer = current["layer"]
        if layer is None:
            raise RuntimeError(f"{adapter.model_type}: a recurrence kernel ran outside a reducible mixer")
        seen.add(layer)
        if on_inputs is None:
            captured[layer] = inputs
        else:
            on_inputs(layer, inputs)

    handles = []
    for ref in mixers:
        def enter(module, args, layer=ref.layer):
            current["layer"] = layer
        handles.append(ref.module.register_forward_pre_hook(enter))
        if adapter.model_type == "mamba2":
            handles += _mamba2_hooks(ref.module, record)
    route = contextlib.nullcontext() if adapter.model_type == "mamba2" else _intercept_kernels(adapter.model_type, record)
    try:
        with route, torch.no_grad():
            model.base_model(input_ids=input_ids, use_cache=False)
    finally:
        for hd in handles:
            hd.remove()
    missing = [r.layer for r in mixers if r.layer not in seen]
    if missing:
        raise RuntimeError(f"{adapter.model_type}: no recurrence inputs captured for layers {missing}")
    return captured
