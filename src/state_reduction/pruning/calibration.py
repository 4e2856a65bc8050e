"""Streaming calibration: one pass over the calibration windows (plus one backward pass for Grad)
accumulates, per mixer, every statistic the selectors need (`LayerCalibration`), in float64 and in
memory that does not grow with the number of calibration tokens."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from state_reduction.errors import InputError
from state_reduction.pruning.dynamics import accumulate, add_dynamics_hooks
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


def dynamics_hooks(adapter: KeyChannelAdapter, ref, stats: LayerCalibration, horizon: int, active=lambda: True) -> list:
    """Hooks accumulating the decay and input gain of `ref`'s heads (pruning.dynamics) into `stats`, and the
    facts the energy selector reads (horizon, whether q/k are L2-normalised); `active()` gates accumulation."""
    stats.horizon = int(horizon)
    stats.qk_l2_normalised = bool(adapter.qk_l2_normalised(ref.module))
    if adapter.dynamics is None:
        return []
    key_heads = adapter.qk_weights(ref.module)[0].shape[0]

    def on_dynamics(name, value):
        if active():
            accumulate(stats, name, value)

    return add_dynamics_hooks(adapter.dynamics, ref.module, key_heads, on_dynamics)


def _rows_of(mixer, view: torch.Tensor, where: str) -> tuple[torch.nn.Parameter, slice]:
    """The parameter of `mixer` whose rows `view` ([H, K, d_in], from `adapter.qk_weights`) is, and those rows."""
    for p in mixer.parameters():
        if p.dim() == 2 and p.untyped_storage().data_ptr() == view.untyped_storage().data_ptr():
            start, width = view.storage_offset() - p.storage_offset(), p.shape[1]
            rows = view.shape[0] * view.shape[1]
            if p.is_contiguous() and view.shape[2] == width and start % width == 0 and view.is_contiguous():
                return p, slice(start // width, start // width + rows)
    raise InputError(f"calibration: the q/k weights of {where} are not a block of rows of one 2-D parameter")


class QKGradients:
    """Sums of dL/dW over backward passes for the q/k rows of every mixer only.

    Only the parameters holding q/k rows require gradients; after each backward a hook adds their q/k rows
    to a sum kept on `home` (in the weight's dtype, the sum autograd's own accumulation would form) and frees
    the full gradient, so the extra memory is the q/k rows of every layer, not a copy of the weights."""

    def __init__(self, adapter: KeyChannelAdapter, mixers, home: torch.device | str = "cpu"):
        self.adapter, self.home = adapter, torch.device(home)
        self.sums: dict[tuple[int, str], torch.Tensor] = {}
        self.handles, owners = [], {}
        for ref in mixers:
            w_q, w_k = adapter.qk_weights(ref.module)
            for side, view in (("q", w_q), ("k", w_k)):
                param, rows = _rows_of(ref.module, view, f"{type(ref.module).__name__} layer {ref.layer}")
                owners.setdefault(param, []).append(((ref.layer, side), rows, tuple(view.shape)))
        for param, parts in owners.items():
            param.requires_grad_(True)
            self.handles.append(param.register_post_accumulate_grad_hook(
                lambda p, parts=parts: self._take(p, parts)))

    @torch.no_grad()
    def _take(self, param: torch.nn.Parameter, parts) -> None:
        for key, rows, shape in parts:
            g = param.grad[rows].reshape(shape).to(self.home)
            self.sums[key] = g.clone() if key not in self.sums else self.sums[key] + g
        param.grad = None

    @torch.no_grad()
    def saliency(self, ref) -> tuple[torch.Tensor, torch.Tensor]:
        """[H, K] float64 each: sum_i |W[j, i] * (sum of dL/dW)[j, i]| for the queries and the keys of `ref`."""
        w_q, w_k = self.adapter.qk_weights(ref.module)
        return tuple((w.detach().to(self.home).double() * self.sums[(ref.layer, side)].double()).abs().sum(-1)
                     for side, w in (("q", w_q), ("k", w_k)))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def check_finite(stats: dict[int, LayerCalibration]) -> None:
    """NaN or Inf anywhere stops calibration with the layer, statistic and head."""
    for layer, s in stats.items():
        for name in ("gram_q", "gram_k", "sum_q", "sum_k", "sum_qq", "sum_kk", "saliency_q", "saliency_k",
                     "decay_sq", "gain_sq"):
            t = getattr(s, name)
            if t is not None and not torch.isfinite(t).all():
                head = int((~torch.isfinite(t)).reshape(t.shape[0], -1).any(dim=1).nonzero()[0])
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
        raise InputError(f"calibration: no reducible mixers found in {type(model).__name__}")
    stats = {m.layer: LayerCalibration() for m in mixers}
    handles = []
    for m in mixers:
        s = stats[m.layer]
        handles += adapter.add_hooks(m.module, on_qk=lambda q, k, s=s: _accumulate_qk(s, q, k),
                                     on_input=lambda x, s=s: _accumulate_input(s, x))
        handles += dynamics_hooks(adapter, m, s, windows.shape[1])
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    params = [p for p in model.parameters()]
    requires = [p.requires_grad for p in params]
    grads = None
    try:
        for p in params:
            p.requires_grad_(False)
            p.grad = None
        if gradients:
            grads = QKGradients(adapter, mixers, home=device)
        n_batches = math.ceil(windows.shape[0] / batch_size)
        for i in tqdm(range(n_batches), desc="calibration", leave=False):
            x = windows[i * batch_size:(i + 1) * batch_size].to(device)
            if gradients:
                loss = model(input_ids=x, labels=x, use_cache=False).loss
                (loss * x.shape[0] / windows.shape[0]).backward()
            else:
                with torch.no_grad():  # the hooks need the mixers only: skip the [B, T, vocab] logits
                    model.base_model(input_ids=x, use_cache=False)
        if gradients:
            for m in mixers:
                stats[m.layer].saliency_q, stats[m.layer].saliency_k = grads.saliency(m)
    finally:
        for h in handles + (grads.handles if grads is not None else []):
            h.remove()
        for p, r in zip(params, requires):
            p.requires_grad_(r)
            p.grad = None
        model.train(was_training)
    check_finite(stats)
    return stats
