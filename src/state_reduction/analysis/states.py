"""Recurrent states of every reducible mixer over calibration sequences, decay and gating included.

The layers run unchanged; the call into their recurrence kernel is intercepted to record its inputs in one
canonical form (`KernelInputs`: q, k after the kernel's L2 norm, beta and the log-decay g the kernel uses), and
the states S_t are then rebuilt with the backend's torch reference (`run_delta_rule`), segment by segment, at
every `stride`-th token. Where each family's inputs are read is its `state_capture` (a kernel route or mixer
hooks, in its module under state_reduction.models.families):
  DeltaNet      g = None (no decay)
  GatedDeltaNet g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b) (the in-kernel gate, as the layer asks)
  Qwen3.5       the layer's g and beta (its GDN layers only; value heads share key heads)
  Mamba-2       h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T (no delta term), rebuilt from the in_proj output
The authors' analysis ignored the GDN decay; `ignore_decay=True` reproduces that for comparison.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from state_reduction.backend.delta_rule import run_delta_rule
from state_reduction.models.families import KernelInputs, family_for
from state_reduction.pruning.types import KeyChannelAdapter


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
    try:
        with family_for(model).state_capture.attach(mixers, record), torch.no_grad():
            model.base_model(input_ids=input_ids, use_cache=False)
    finally:
        for hd in handles:
            hd.remove()
    missing = [r.layer for r in mixers if r.layer not in seen]
    if missing:
        raise RuntimeError(f"{adapter.model_type}: no recurrence inputs captured for layers {missing}")
    return captured
