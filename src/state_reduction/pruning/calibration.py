"""Streaming calibration: one pass over the calibration windows (plus one backward pass for the gradient
statistics) accumulates, per mixer, the statistics the chosen selectors need (`LayerCalibration`), in float64 and
in memory that does not grow with the number of calibration tokens.

`STATISTICS` is the vocabulary of needs a selector declares (`selectors.register`); `calibrate` and
`calibrate_streaming` compute exactly the union they are given and nothing else."""

from __future__ import annotations

import difflib
import math

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from state_reduction.errors import InputError, UnknownNameError
from state_reduction.pruning.dynamics import accumulate, add_dynamics_hooks
from state_reduction.pruning.types import KeyChannelAdapter, LayerCalibration

# need -> the LayerCalibration fields it fills and how they are collected
STATISTICS = {
    "gram": "gram_q, gram_k: sum_t q_t q_t^T of the post-conv q/k (forward hooks)",
    "normalised_moments": "sum_q, sum_k, sum_qq, sum_kk of the L2-normalised q/k (forward hooks)",
    "input_norms": "input_sq: sum_t x_t^2 of the q/k projections' input (forward pre-hooks)",
    "dynamics": "decay_sq, gain_sq: the heads' decay and input gain (forward hooks on the gate/beta projections)",
    "window_norms": "window_norm_qk/_q/_k: per-window column norms of the q/k the kernel sees (forward hooks)",
    "state_gramians": "gramian_ctrl, gramian_obs: diagonal time-varying Gramians of the state channels (forward "
                      "hooks on q/k and on the decay/gain; needs a per-head scalar decay)",
    "decay_grams": "decay_score_gram: sum_t (q_t q_t^T) o P_t, P_t = a_t^2 P_{t-1} + k_t k_t^T, of the q/k the kernel "
                   "sees (forward hooks on q/k and on the decay; a = 1 without one)",
    "gradients": "saliency_q, saliency_k: |W * sum of dL/dW| of the q/k rows (a backward pass)",
    "taylor": "taylor_q/_k, fisher_qq/_kk/_qk: per-batch W . dL/dW of the q/k rows (a backward pass)",
}
GRADIENT_NEEDS = frozenset({"gradients", "taylor"})
QK_NEEDS = frozenset({"gram", "normalised_moments", "window_norms", "state_gramians", "decay_grams"})
# what `calibrate` computed for every caller before selectors declared their needs (memory plan, analysis, bench)
FORWARD_DEFAULT = frozenset({"gram", "normalised_moments", "input_norms", "dynamics"})


def resolve_needs(needs, gradients: bool = False) -> frozenset[str]:
    """`needs` (None: FORWARD_DEFAULT) plus "gradients" when `gradients`, checked against STATISTICS."""
    needs = FORWARD_DEFAULT if needs is None else frozenset(needs)
    unknown = sorted(needs - set(STATISTICS))
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(STATISTICS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UnknownNameError(f"calibration: unknown statistic {unknown[0]!r}{hint} (known: {', '.join(STATISTICS)})")
    return needs | {"gradients"} if gradients else needs


def _add_to(stats: LayerCalibration, parts: dict) -> None:
    for name, value in parts.items():
        current = getattr(stats, name)
        setattr(stats, name, value if current is None else current + value)


def _accumulate_qk(stats: LayerCalibration, q: torch.Tensor, k: torch.Tensor, needs=QK_NEEDS) -> None:
    """q, k: [B, T, H, K] post-conv activations (before the kernel's L2 norm)."""
    q, k = q.detach().double(), k.detach().double()
    parts = {}
    if "gram" in needs:
        parts.update(gram_q=torch.einsum("bthk,bthl->hkl", q, q), gram_k=torch.einsum("bthk,bthl->hkl", k, k))
    if "normalised_moments" in needs:
        qn, kn = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        parts.update(sum_q=qn.sum(dim=(0, 1)), sum_k=kn.sum(dim=(0, 1)),
                     sum_qq=torch.einsum("bthk,bthl->hkl", qn, qn), sum_kk=torch.einsum("bthk,bthl->hkl", kn, kn))
    if "window_norms" in needs:
        qs, ks = _kernel_view(stats, q), _kernel_view(stats, k)
        nq, nk = qs.pow(2).sum(dim=1).sqrt(), ks.pow(2).sum(dim=1).sqrt()  # [B, H, K]: ||Q_w[:, j]||, ||K_w[:, j]||
        parts.update(window_norm_qk=(nq * nk).sum(0), window_norm_q=nq.sum(0), window_norm_k=nk.sum(0))
    _add_to(stats, parts)
    stats.n_tokens += q.shape[0] * q.shape[1]


def _kernel_view(stats: LayerCalibration, x: torch.Tensor) -> torch.Tensor:
    """The q or k the state kernel sees: L2-normalised per head where the kernel normalises them."""
    return F.normalize(x, dim=-1) if stats.qk_l2_normalised else x


def _accumulate_input(stats: LayerCalibration, x: torch.Tensor) -> None:
    """x: [B, T, d_in], the input of the q/k projections."""
    sq = x.detach().double().pow(2).sum(dim=(0, 1))
    stats.input_sq = sq if stats.input_sq is None else stats.input_sq + sq


def accumulate_gramians(stats: LayerCalibration, q: torch.Tensor, k: torch.Tensor, decay: torch.Tensor,
                        gain: torch.Tensor | None) -> None:
    """GHOST-style diagonal Gramians of one batch (arXiv 2602.11408: balanced truncation from forward passes).

    q, k [B, T, H_k, K] as the kernel sees them; decay a and gain g [B, T, H_v] (g None: 1); value head v reads
    key head v // (H_v / H_k). Channel j of value head v's state evolves as s_t = a_t s_{t-1} + g_t k_t[j] u_t
    and is read by q_t[j]; with a scalar decay the diagonal of the time-varying Gramians is exact:

        controllability  P_t[j] = a_t^2 P_{t-1}[j] + g_t^2 k_t[j]^2          (P_0 = 0, forward in t)
        observability    Q_t[j] = q_t[j]^2 + a_{t+1}^2 Q_{t+1}[j]            (Q_{T+1} = 0, backward in t)

    and sum_t P_t, sum_t Q_t are added to gramian_ctrl / gramian_obs [H_v, K]. (Gated) DeltaNet's erasure
    (I - beta k k^T) is not scalar and is left out: there the Gramians are those of the decay alone."""
    B, T, Hk, K = k.shape
    Hv = decay.shape[-1]
    rep = Hv // Hk
    q2 = q.detach().double().pow(2).repeat_interleave(rep, dim=2)  # [B, T, H_v, K]
    k2 = k.detach().double().pow(2).repeat_interleave(rep, dim=2)
    a2 = decay.detach().double().pow(2)[..., None]  # [B, T, H_v, 1]
    g2 = gain.detach().double().pow(2)[..., None] if gain is not None else torch.ones_like(a2)
    p = torch.zeros(B, Hv, K, dtype=torch.float64, device=k.device)
    ctrl = torch.zeros_like(p)
    for t in range(T):
        p = a2[:, t] * p + g2[:, t] * k2[:, t]
        ctrl += p
    o = torch.zeros_like(p)
    obs = torch.zeros_like(p)
    for t in reversed(range(T)):
        o = q2[:, t] + (a2[:, t + 1] * o if t + 1 < T else 0.0)
        obs += o
    _add_to(stats, {"gramian_ctrl": ctrl.sum(0).cpu(), "gramian_obs": obs.sum(0).cpu()})


def accumulate_decay_gram(stats: LayerCalibration, q: torch.Tensor, k: torch.Tensor,
                          decay: torch.Tensor | None) -> None:
    """The decay-weighted score Gram of one batch (qkscore-decay, issue 19).

    q, k [B, T, H_k, K] as the kernel sees them; decay a [B, T, H_v] (None: a = 1, no forgetting); value head v
    reads key head v // (H_v / H_k). Per value head, forward in t,

        P_t = a_t^2 P_{t-1} + k_t k_t^T    (P_0 = 0),      M += (q_t q_t^T) o P_t,

    so M = sum_{s <= t} w_ts (q_t q_t^T) o (k_s k_s^T) with w_ts = prod_{s < r <= t} a_r^2; the value heads of
    one key head add into its [K, K] block of `decay_score_gram` [H_k, K, K]. Cost: O(B T H_v K^2) flops and a
    [B, H_v, K, K] float64 running P per batch; the sum kept is [H_k, K, K], as a Gram."""
    B, T, Hk, K = k.shape
    q, k = q.detach().double(), k.detach().double()
    Hv = decay.shape[-1] if decay is not None else Hk
    rep = Hv // Hk
    q, k = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)  # [B, T, H_v, K]
    a2 = decay.detach().double().pow(2)[..., None, None] if decay is not None else None  # [B, T, H_v, 1, 1]
    P = torch.zeros(B, Hv, K, K, dtype=torch.float64, device=k.device)
    M = torch.zeros(Hv, K, K, dtype=torch.float64, device=k.device)
    for t in range(T):
        kk = k[:, t, :, :, None] * k[:, t, :, None, :]
        P = kk + (a2[:, t] * P if a2 is not None else P)
        M += torch.einsum("bhk,bhl,bhkl->hkl", q[:, t], q[:, t], P)
    _add_to(stats, {"decay_score_gram": M.reshape(Hk, rep, K, K).sum(1).cpu()})


def missing_decay(adapter: KeyChannelAdapter) -> str | None:
    """What a family lacks for the state Gramians (None: nothing): a per-head scalar decay from the adapter."""
    spec = adapter.dynamics
    if spec is None or spec.gate is None:
        return f"a per-head scalar state decay (the {adapter.family} adapter declares none: dynamics.gate is None)"
    return None


def statistic_hooks(adapter: KeyChannelAdapter, ref, stats: LayerCalibration, needs, horizon: int,
                    active=lambda: True) -> list:
    """Every forward hook on mixer `ref` that accumulates the statistics in `needs` into `stats` while `active()`,
    and the facts the selectors read (horizon, whether the kernel L2-normalises q/k); returns handles."""
    stats.horizon = int(horizon)
    stats.qk_l2_normalised = bool(adapter.qk_l2_normalised(ref.module))
    handles = []
    gramians = "state_gramians" in needs
    decay_grams = "decay_grams" in needs
    series = gramians or decay_grams
    pending = {}
    if gramians:
        missing = missing_decay(adapter)
        if missing is not None:
            raise InputError(f"calibration: state_gramians need {missing}")

    def on_qk(q, k):
        if not active():
            return
        _accumulate_qk(stats, q, k, needs)
        if series:
            pending.update(q=_kernel_view(stats, q.detach().double()), k=_kernel_view(stats, k.detach().double()))

    def on_input(x):
        if active():
            _accumulate_input(stats, x)

    if needs & QK_NEEDS or "input_norms" in needs:
        handles += adapter.add_hooks(ref.module, on_qk=on_qk if needs & QK_NEEDS else None,
                                     on_input=on_input if "input_norms" in needs else None)
    if adapter.dynamics is not None and ("dynamics" in needs or series):
        key_heads = adapter.qk_weights(ref.module)[0].shape[0]

        def on_dynamics(name, value):
            if active():
                accumulate(stats, name, value)

        def on_series(name, value):
            if active():
                pending[name] = value

        handles += add_dynamics_hooks(adapter.dynamics, ref.module, key_heads,
                                      on_dynamics if "dynamics" in needs else None, on_series if series else None)
    if series:
        def flush(module, args, out):
            if active() and "q" in pending:
                if gramians:
                    accumulate_gramians(stats, pending["q"], pending["k"], pending["decay"], pending.get("gain"))
                if decay_grams:
                    accumulate_decay_gram(stats, pending["q"], pending["k"], pending.get("decay"))
            pending.clear()

        handles.append(ref.module.register_forward_hook(flush))
    return handles


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

    def __init__(self, adapter: KeyChannelAdapter, mixers, home: torch.device | str = "cpu", taylor: bool = False):
        self.adapter, self.home = adapter, torch.device(home)
        self.sums: dict[tuple[int, str], torch.Tensor] = {}
        # taylor: per backward (one per gradient batch), u[j] = sum_i W[j, i] dL_b/dW[j, i], [H, K] float64
        self.dots: dict[tuple[int, str], list[torch.Tensor]] | None = {} if taylor else None
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
            if self.dots is not None:
                w = param[rows].reshape(shape).to(self.home).double()
                self.dots.setdefault(key, []).append((w * g.double()).sum(-1))
        param.grad = None

    @torch.no_grad()
    def saliency(self, ref) -> tuple[torch.Tensor, torch.Tensor]:
        """[H, K] float64 each: sum_i |W[j, i] * (sum of dL/dW)[j, i]| for the queries and the keys of `ref`."""
        w_q, w_k = self.adapter.qk_weights(ref.module)
        return tuple((w.detach().to(self.home).double() * self.sums[(ref.layer, side)].double()).abs().sum(-1)
                     for side, w in (("q", w_q), ("k", w_k)))

    @torch.no_grad()
    def taylor(self, ref, weights: list[float]) -> dict[str, torch.Tensor]:
        """The Taylor fields of `ref` (LayerCalibration.taylor_*, fisher_*); weights[b] = c_b = N / B_b."""
        u = {side: torch.stack(self.dots[(ref.layer, side)]) for side in ("q", "k")}  # [n_batches, H, K]
        if u["q"].shape[0] != len(weights):
            raise InputError(f"calibration: layer {ref.layer} saw {u['q'].shape[0]} backward passes for "
                             f"{len(weights)} gradient batches")
        c = torch.tensor(weights, dtype=torch.float64, device=u["q"].device)[:, None, None]
        return {"taylor_q": u["q"].sum(0), "taylor_k": u["k"].sum(0), "fisher_qq": (c * u["q"] ** 2).sum(0),
                "fisher_kk": (c * u["k"] ** 2).sum(0), "fisher_qk": (c * u["q"] * u["k"]).sum(0)}

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def gradient_statistics(stats: dict[int, LayerCalibration], grads: QKGradients, mixers, needs,
                        batch_sizes: list[int]) -> None:
    """Fill the gradient statistics in `needs` from the backward passes `grads` saw, one per batch of
    `batch_sizes` windows (each back-propagating its mean loss times B_b / N)."""
    n = sum(batch_sizes)
    for m in mixers:
        if "gradients" in needs:
            stats[m.layer].saliency_q, stats[m.layer].saliency_k = grads.saliency(m)
        if "taylor" in needs:
            for name, value in grads.taylor(m, [n / b for b in batch_sizes]).items():
                setattr(stats[m.layer], name, value)


FINITE_FIELDS = ("gram_q", "gram_k", "sum_q", "sum_k", "sum_qq", "sum_kk", "saliency_q", "saliency_k", "decay_sq",
                 "gain_sq", "window_norm_qk", "window_norm_q", "window_norm_k", "gramian_ctrl", "gramian_obs",
                 "decay_score_gram", "taylor_q", "taylor_k", "fisher_qq", "fisher_kk", "fisher_qk")


def check_finite(stats: dict[int, LayerCalibration]) -> None:
    """NaN or Inf anywhere stops calibration with the layer, statistic and head."""
    for layer, s in stats.items():
        for name in FINITE_FIELDS:
            t = getattr(s, name)
            if t is not None and not torch.isfinite(t).all():
                head = int((~torch.isfinite(t)).reshape(t.shape[0], -1).any(dim=1).nonzero()[0])
                raise FloatingPointError(f"calibration: {name} of layer {layer}, head {head} has NaN or Inf")
        if s.input_sq is not None and not torch.isfinite(s.input_sq).all():
            raise FloatingPointError(f"calibration: input norms of layer {layer} have NaN or Inf")


def calibrate(model, adapter: KeyChannelAdapter, windows: torch.Tensor, batch_size: int = 8,
              gradients: bool = False, needs=None) -> dict[int, LayerCalibration]:
    """Statistics per mixer layer from calibration windows [N, L] (token ids): exactly those in `needs` (names of
    STATISTICS; None: FORWARD_DEFAULT), plus "gradients" when `gradients`.

    A gradient need back-propagates the next-token loss over all windows: "gradients" sums the saliency
    |W * sum of gradients| of each q/k row over its inputs (the authors' Grad score), "taylor" keeps each batch's
    W . dL/dW per row. Without one, only the forward runs (no logits). Without any need, nothing runs."""
    needs = resolve_needs(needs, gradients)
    gradients = bool(needs & GRADIENT_NEEDS)
    mixers = list(adapter.mixers(model))
    if not mixers:
        raise InputError(f"calibration: no reducible mixers found in {type(model).__name__}")
    stats = {m.layer: LayerCalibration() for m in mixers}
    handles = []
    for m in mixers:
        handles += statistic_hooks(adapter, m, stats[m.layer], needs, windows.shape[1])
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    params = [p for p in model.parameters()]
    requires = [p.requires_grad for p in params]
    grads = None
    batch_sizes = []
    try:
        for p in params:
            p.requires_grad_(False)
            p.grad = None
        if gradients:
            grads = QKGradients(adapter, mixers, home=device, taylor="taylor" in needs)
        n_batches = math.ceil(windows.shape[0] / batch_size) if needs else 0
        for i in tqdm(range(n_batches), desc="calibration", leave=False):
            x = windows[i * batch_size:(i + 1) * batch_size].to(device)
            batch_sizes.append(x.shape[0])
            if gradients:
                loss = model(input_ids=x, labels=x, use_cache=False).loss
                (loss * x.shape[0] / windows.shape[0]).backward()
            else:
                with torch.no_grad():  # the hooks need the mixers only: skip the [B, T, vocab] logits
                    model.base_model(input_ids=x, use_cache=False)
        if gradients:
            gradient_statistics(stats, grads, mixers, needs, batch_sizes)
    finally:
        for h in handles + (grads.handles if grads is not None else []):
            h.remove()
        for p, r in zip(params, requires):
            p.requires_grad_(r)
            p.grad = None
        model.train(was_training)
    count_tokens(stats, needs, windows)
    check_finite(stats)
    return stats


def count_tokens(stats: dict[int, LayerCalibration], needs, windows: torch.Tensor) -> None:
    """The q/k hooks count the tokens they see; without them every calibration token counts."""
    if needs and not needs & QK_NEEDS:
        for s in stats.values():
            s.n_tokens = windows.numel()
