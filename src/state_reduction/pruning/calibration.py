"""Streaming calibration: one pass over the calibration windows (plus one backward pass for Grad)
accumulates, per mixer, every statistic the selectors need (`LayerCalibration`), in float64 and in
memory that does not grow with the number of calibration tokens."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from state_reduction.pruning.types import KeyChannelAdapter, LayerCalibration

NEEDS_GRADIENTS = frozenset({"grad"})


def _accumulate_qk(stats: LayerCalibration, q: torch.Tensor, k: torch.Tensor) -> None:
    """q, k: [B, T, H, K] post-conv activations (before the kernel's L2 norm)."""
    q, k = q.detach().double(), k.detach().double()
    gq, gk = torch.einsum("bthk,bthl->hkl", q, q), torch.einsum("bthk,bthl->hkl", k, k)
    qn, kn = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    parts = {
        "gram_q": gq, "gram_k": gk,
        "sum_q": qn.sum(dim=(0, 1)), "sum_k": kn.sum(dim=(0, 1)),
        "sum_qq": torch.einsum("bthk,bthl->hkl", qn, qn), "sum_kk": torch.einsum("bthk,bthl->hkl", kn, kn),
    }
    for name, value in parts.items():
        current = getattr(stats, name)
        setattr(stats, name, value if current is None else current + value)
    stats.n_tokens += q.shape[0] * q.shape[1]


def _accumulate_input(stats: LayerCalibration, x: torch.Tensor) -> None:
    """x: [B, T, d_in], the input of the q/k projections."""
    sq = x.detach().double().pow(2).sum(dim=(0, 1))
    stats.input_sq = sq if stats.input_sq is None else stats.input_sq + sq


@torch.no_grad()
def _saliency_views(adapter: KeyChannelAdapter, mixer) -> tuple[torch.Tensor, torch.Tensor]:
    """|W * dL/dW| laid out like `adapter.qk_weights` ([H, K, d_in] each), float64.

    The adapter knows where the q/k rows live, so its views are read off with every parameter's data
    temporarily replaced by its saliency; the weights are put back before returning."""
    saved = {}
    for p in mixer.parameters():
        if p.grad is not None:
            saved[p] = p.data
            p.data = (p.data.double() * p.grad.double()).abs()
    try:
        w_q, w_k = adapter.qk_weights(mixer)
        return w_q.clone(), w_k.clone()
    finally:
        for p, data in saved.items():
            p.data = data


def check_finite(stats: dict[int, LayerCalibration]) -> None:
    """NaN or Inf anywhere stops calibration with the layer, statistic and head."""
    for layer, s in stats.items():
        for name in ("gram_q", "gram_k", "sum_q", "sum_k", "sum_qq", "sum_kk", "saliency_q", "saliency_k"):
            t = getattr(s, name)
            if t is not None and not torch.isfinite(t).all():
                head = int((~torch.isfinite(t)).flatten(1).any(dim=1).nonzero()[0])
                raise FloatingPointError(f"calibration: {name} of layer {layer}, head {head} has NaN or Inf")
        if s.input_sq is not None and not torch.isfinite(s.input_sq).all():
            raise FloatingPointError(f"calibration: input norms of layer {layer} have NaN or Inf")


def calibrate(model, adapter: KeyChannelAdapter, windows: torch.Tensor, batch_size: int = 8,
              gradients: bool = False) -> dict[int, LayerCalibration]:
    """Statistics per mixer layer from calibration windows [N, L] (token ids).

    With `gradients`, the next-token loss is back-propagated over all windows and the saliency
    |W * sum of gradients| of each q/k row is summed over its inputs (the authors' Grad score)."""
    mixers = list(adapter.mixers(model))
    if not mixers:
        raise ValueError(f"calibration: no reducible mixers found in {type(model).__name__}")
    stats = {m.layer: LayerCalibration() for m in mixers}
    handles = []
    for m in mixers:
        s = stats[m.layer]
        handles += adapter.add_hooks(m.module, on_qk=lambda q, k, s=s: _accumulate_qk(s, q, k),
                                     on_input=lambda x, s=s: _accumulate_input(s, x))
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    params = [p for p in model.parameters()]
    requires = [p.requires_grad for p in params]
    try:
        if gradients:
            for p in params:
                p.requires_grad_(False)
                p.grad = None
            for m in mixers:
                m.module.requires_grad_(True)
        n_batches = math.ceil(windows.shape[0] / batch_size)
        for i in tqdm(range(n_batches), desc="calibration", leave=False):
            x = windows[i * batch_size:(i + 1) * batch_size].to(device)
            if gradients:
                loss = model(input_ids=x, labels=x).loss
                (loss * x.shape[0] / windows.shape[0]).backward()
            else:
                with torch.no_grad():  # the hooks need the mixers only: skip the [B, T, vocab] logits
                    model.base_model(input_ids=x, use_cache=False)
        if gradients:
            for m in mixers:
                sal_q, sal_k = _saliency_views(adapter, m.module)
                stats[m.layer].saliency_q, stats[m.layer].saliency_k = sal_q.sum(-1), sal_k.sum(-1)
    finally:
        for h in handles:
            h.remove()
        for p, r in zip(params, requires):
            p.requires_grad_(r)
            p.grad = None
        model.train(was_training)
    check_finite(stats)
    return stats
