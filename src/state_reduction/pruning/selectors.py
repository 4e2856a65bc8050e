"""Key-channel selectors (paper 3.4, appendix B.2-B.4, C.6, C.7; issue 19): calibration statistics -> what to keep.

A selector is one function from a `SelectorInput` (one mixer's calibration statistics, its W_Q/W_K [H, K, d_in],
`keep`, the coupled mode, a generator and the layer index) to a `KeyChannelSelection`, registered with the
statistics it reads:

    @register_selector("drrqr", needs={"gram"}, scores=drrqr_scores)
    def select_drrqr(x: SelectorInput) -> KeyChannelSelection: ...

    @register_scored("grad", needs={"gradients"})       # a score per channel; keeps the top `keep` per head
    def select_grad(x: SelectorInput) -> torch.Tensor: ...

`needs` names entries of `calibration.STATISTICS`; calibration computes exactly the union of the chosen
selectors' needs (`needs_of`), and nothing when it is empty (rand, l1). A selector that only some families can
serve also gives `serves(adapter) -> None or what the family lacks`. `mode` picks the coupled-selection variant of
Table 16: "kq" (queries and keys, the default), "k" (keys only) or "q" (queries only). Score-based selectors keep
the `keep` highest scores per head (ties: lower index first) and return the indices sorted; `keep == K` returns
the identity (ratio 0 leaves the model untouched) without reading any statistic.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import numbers
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from state_reduction.errors import InputError, UnknownNameError
from state_reduction.pruning.calibration import GRADIENT_NEEDS, STATISTICS, missing_decay
from state_reduction.pruning.srrqr import qrcp_pivot_norms, srrqr_from_gram
from state_reduction.pruning.types import KeyChannelSelection, LayerCalibration

MODES = ("kq", "k", "q")
DRRQR_F = 1.5  # swap threshold f of strong RRQR (paper, appendix B.2)


@dataclass(frozen=True)
class SelectorInput:
    """What a selector sees of one mixer."""

    stats: LayerCalibration | None  # its calibration statistics (None: no calibration ran)
    w_q: torch.Tensor  # [H, K, d_in] query rows (Mamba-2: C)
    w_k: torch.Tensor  # [H, K, d_in] key rows (Mamba-2: B)
    keep: int  # channels to keep per head, 1..K
    mode: str = "kq"
    generator: torch.Generator | None = None
    layer: int = 0

    @property
    def shape(self) -> tuple[int, int]:
        """(H, K)."""
        return tuple(self.w_q.shape[:2])


@dataclass(frozen=True)
class Selector:
    """A registered selector: its function, the calibration statistics it reads and the families it serves."""

    name: str
    fn: Callable[..., KeyChannelSelection]
    needs: frozenset[str]
    serves: Callable[[object], str | None] | None = None  # adapter -> None, or what the family lacks
    scores: Callable[[SelectorInput], torch.Tensor] | None = None  # per-channel scores [H, K] (None: PCA, rand)

    @property
    def gradients(self) -> bool:
        return bool(self.needs & GRADIENT_NEEDS)

    def missing(self, adapter) -> str | None:
        """What `adapter`'s family lacks for this selector (None: it can be served)."""
        return self.serves(adapter) if self.serves is not None else None

    def options(self, text: str | None) -> dict:
        """Parse "KEY=VALUE[,KEY=VALUE]" (prune's --selector-options) into this selector's keyword options, each
        converted to the type of its default (e.g. qkscore: swaps=4); an unknown key or a bad value is one line naming
        the selector and what it takes."""
        if not text:
            return {}
        known = {n: p.default for n, p in inspect.signature(self.fn).parameters.items()
                 if p.kind is inspect.Parameter.KEYWORD_ONLY}
        takes = ", ".join(f"{n} (default {d!r})" for n, d in known.items()) or "no options"
        out = {}
        for item in text.split(","):
            key, sep, value = (part.strip() for part in item.partition("="))
            if not sep or key not in known:
                raise InputError(f"selector {self.name!r}: option {item.strip()!r} is not KEY=VALUE of an option it "
                                 f"takes: {takes}")
            default = known[key]
            kind = type(default) if default is not None else int
            try:
                out[key] = {"true": True, "false": False}[value.lower()] if kind is bool else kind(value)
            except (KeyError, ValueError):
                what = {bool: "true or false", int: "an integer", float: "a number"}.get(kind, kind.__name__)
                raise InputError(f"selector {self.name!r}: option {key}={value!r} is not {what}") from None
        return out

    def check_family(self, adapter) -> None:
        """One line naming the selector, the family and what is missing when the family cannot be served."""
        missing = self.missing(adapter)
        if missing is not None:
            raise InputError(f"selector {self.name!r} cannot serve family {adapter.family}: it needs {missing}")

    def channel_scores(self, x: SelectorInput) -> torch.Tensor:
        """[H, K] float64 per-channel scores (what a layer-adaptive budget pools, pruning.budgets); a selector
        without them is refused in one line naming it."""
        if self.scores is None:
            scored = ", ".join(n for n, s in SELECTORS.items() if s.scores is not None)
            raise InputError(f"selector {self.name!r} has no per-channel scores (it rotates, draws or jointly searches channels); "
                             f"selectors with scores: {scored}")
        _check_args(self.name, x.w_q, x.w_k, 1, x.mode, x.layer)
        return self.scores(x).to(torch.float64)

    def __call__(self, x: SelectorInput, **options) -> KeyChannelSelection:
        H, K = _check_args(self.name, x.w_q, x.w_k, x.keep, x.mode, x.layer)
        if x.keep == K:
            return KeyChannelSelection(keep=torch.arange(K).expand(H, K).clone())
        if not isinstance(x.keep, int):
            x = SelectorInput(x.stats, x.w_q, x.w_k, int(x.keep), x.mode, x.generator, x.layer)
        return self.fn(x, **options)


SELECTORS: dict[str, Selector] = {}


def keep_count(K: int, ratio: float, multiple: int | None = None, power_of_two: bool = False) -> int:
    """Channels kept per head at compression ratio `ratio` (fraction removed): floor(K * (1 - ratio)),
    optionally rounded down to a multiple of `multiple` (kernel-friendly budgets, e.g. 8 or 16) and/or to a
    power of two (fla's GPU kernels pad K up to the next power of two, so 77 channels cost as much as 128)."""
    if not isinstance(K, int) or K < 1:
        raise InputError(f"K must be a positive int, got {K!r}")
    max_ratio = 1.0 - 1.0 / K
    if not (isinstance(ratio, (int, float)) and 0.0 <= ratio < 1.0):
        raise InputError(f"compression ratio must be in [0, {max_ratio:g}] for K={K} (fraction removed), got {ratio!r}")
    kept = math.floor(K * (1.0 - ratio) + 1e-9)  # 1e-9: 100 * (1 - 0.3) is 69.99999999999999
    if kept < 1:
        raise InputError(f"compression ratio {ratio} removes every channel of K={K}; allowed range [0, {max_ratio:g}]")
    if multiple is not None:
        if not isinstance(multiple, int) or multiple < 1:
            raise InputError(f"multiple must be a positive int, got {multiple!r}")
        if kept < multiple:
            raise InputError(
                f"compression ratio {ratio} keeps {kept} of K={K} channels, fewer than multiple={multiple}; "
                f"allowed range [0, {1.0 - multiple / K:g}]"
            )
        kept -= kept % multiple
    if power_of_two:
        kept = 1 << (kept.bit_length() - 1)
    return kept


def get_selector(name: str) -> Selector:
    if name in SELECTORS:
        return SELECTORS[name]
    close = difflib.get_close_matches(name, list(SELECTORS), n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise UnknownNameError(f"unknown selector {name!r}{hint} (known: {', '.join(SELECTORS)})")


def select(
    name: str,
    stats: LayerCalibration | None,
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    keep: int,
    mode: str = "kq",
    generator: torch.Generator | None = None,
    layer: int = 0,
    **options,
) -> KeyChannelSelection:
    """Run the selector registered as `name` on one mixer (the fields of `SelectorInput`)."""
    return get_selector(name)(SelectorInput(stats, w_q, w_k, keep, mode, generator, layer), **options)


def needs_of(names) -> frozenset[str]:
    """The union of the calibration statistics the selectors `names` read."""
    return frozenset().union(*(get_selector(n).needs for n in names))


def register_selector(name: str, needs=(), serves=None, scores=None) -> Callable:
    """Register `fn(x: SelectorInput) -> KeyChannelSelection` as selector `name` reading the statistics `needs`
    (names of calibration.STATISTICS), wrapped with the argument checks every selector shares; `scores(x) -> [H, K]`
    gives its per-channel scores where it has them (layer-adaptive budgets)."""
    unknown = sorted(set(needs) - set(STATISTICS))
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(STATISTICS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UnknownNameError(f"selector {name!r}: unknown need {unknown[0]!r}{hint} (known: {', '.join(STATISTICS)})")

    def wrap(fn):
        if name in SELECTORS:
            raise InputError(f"selector {name!r} registered twice")
        SELECTORS[name] = Selector(name, fn, frozenset(needs), serves, scores)
        return fn

    return wrap


def register_scored(name: str, needs=(), serves=None) -> Callable:
    """Register `score(x: SelectorInput) -> [H, K]` as selector `name` keeping the `keep` highest scores per head
    (ties: lower index first); the scores serve layer-adaptive budgets as they are."""

    def wrap(score):
        register_selector(name, needs, serves, scores=score)(lambda x: _top(score(x), x.keep))
        return score

    return wrap


def _check_args(method: str, w_q: torch.Tensor, w_k: torch.Tensor, keep: int, mode: str, layer: int) -> tuple[int, int]:
    if mode not in MODES:
        raise InputError(
            f"{method}: mode must be one of {MODES} (kq: queries and keys, k: keys, q: queries), got {mode!r}"
        )
    if w_q.ndim != 3 or w_q.shape != w_k.shape:
        raise InputError(
            f"{method}: w_q and w_k must both be [H, K, d_in], got {tuple(w_q.shape)} and {tuple(w_k.shape)}"
        )
    H, K, _ = w_q.shape
    if isinstance(keep, bool) or not isinstance(keep, numbers.Integral) or not 1 <= keep <= K:
        raise InputError(f"{method}: keep must be an int in 1..{K} (K = {K}), got {keep!r}")
    for label, w in (("w_q", w_q), ("w_k", w_k)):
        bad = ~torch.isfinite(w.detach())
        if bad.any():
            raise InputError(f"{method}: layer {layer} head {bad.nonzero()[0, 0].item()}: {label} has NaN or Inf")
    return H, K


def _stat(stats: LayerCalibration | None, field: str, method: str, layer: int, shape: tuple, hint: str) -> torch.Tensor:
    """One calibration statistic as float64, checked for presence, shape and finiteness."""
    t = getattr(stats, field) if stats is not None else None
    if t is None:
        raise InputError(f"{method} needs {hint} (layer {layer} has no {field})")
    if tuple(t.shape) != shape:
        raise InputError(f"{method}: layer {layer} {field} has shape {tuple(t.shape)}, expected {shape}")
    t = t.detach().to("cpu", torch.float64)
    bad = ~torch.isfinite(t)
    if bad.any():
        where = bad.nonzero()[0].tolist()
        at = f"input feature {where[0]}" if t.ndim == 1 else f"head {where[0]}"
        raise InputError(f"{method}: layer {layer} {at}: {field} has NaN or Inf (calibration diverged?)")
    return t


def _pair(mode: str, q, k):
    """The terms that enter a coupled score: both, keys only or queries only (Table 16)."""
    return {"kq": (q, k), "k": (k,), "q": (q,)}[mode]


def _top(scores: torch.Tensor, keep: int) -> KeyChannelSelection:
    """[H, K] scores -> the `keep` largest per head, ties to the lower index, returned sorted."""
    order = torch.sort(-scores, dim=1, stable=True).indices
    return KeyChannelSelection(keep=order[:, :keep].sort(dim=1).values.to(torch.int64))


def _weights(w: torch.Tensor) -> torch.Tensor:
    return w.detach().to("cpu", torch.float64)


@register_selector("rand")
def select_rand(x: SelectorInput) -> KeyChannelSelection:
    """A random permutation per head from `generator` (required: unseeded selections are not reproducible)."""
    if x.generator is None:
        raise InputError("rand needs a seeded torch.Generator (generator=None)")
    H, K = x.shape
    idx = torch.stack([torch.randperm(K, generator=x.generator)[:x.keep] for _ in range(H)])
    return KeyChannelSelection(keep=idx.sort(dim=1).values)


@register_scored("l1")
def select_l1(x: SelectorInput) -> torch.Tensor:
    """s_j = ||W_Q[j, :]||_1 + ||W_K[j, :]||_1 (paper 3.4)."""
    return sum(_weights(w).abs().sum(-1) for w in _pair(x.mode, x.w_q, x.w_k))


@register_scored("wanda", needs={"input_norms"})
def select_wanda(x: SelectorInput) -> torch.Tensor:
    """S-Wanda: s_j = sum_i (|W_Q[j, i]| + |W_K[j, i]|) * ||X[:, i]||_2, X the q/k projection input (3.4)."""
    d_in = x.w_q.shape[2]
    x_norm = _stat(x.stats, "input_sq", "wanda", x.layer, (d_in,), "input_sq: run calibration with input hooks").sqrt()
    return sum((_weights(w).abs() * x_norm).sum(-1) for w in _pair(x.mode, x.w_q, x.w_k))


@register_scored("grad", needs={"gradients"})
def select_grad(x: SelectorInput) -> torch.Tensor:
    """s_j = sum_i |W_Q[j, i] dL/dW_Q[j, i]| + |W_K[j, i] dL/dW_K[j, i]| (3.4), summed in calibration."""
    H, K = x.shape
    hint = "saliency_q/saliency_k: run calibration with gradients"
    terms = [_stat(x.stats, f"saliency_{s}", "grad", x.layer, (H, K), hint) for s in _pair(x.mode, "q", "k")]
    return sum(terms)


def _drrqr_gram(x: SelectorInput) -> torch.Tensor:
    H, K = x.shape
    hint = "gram_q/gram_k: run calibration with q/k hooks"
    return sum(_stat(x.stats, f"gram_{s}", "drrqr", x.layer, (H, K, K), hint) for s in _pair(x.mode, "q", "k"))


def drrqr_scores(x: SelectorInput) -> torch.Tensor:
    """DRRQR's per-channel importance, for layer-adaptive budgets: |R_jj| of QR with column pivoting on
    M_h = [Q_h; K_h] (through its Gram matrix), given to the channel pivoted at j (`srrqr.qrcp_pivot_norms`): the
    norm of the channel's part not spanned by the channels pivoted before it, on the scale of the activations, so
    comparable across heads and layers. Within a head the kept set is still strong RRQR's at the layer's K'."""
    G = _drrqr_gram(x)
    return torch.from_numpy(np.stack([qrcp_pivot_norms(G[h].numpy()) for h in range(G.shape[0])]))


@register_selector("drrqr", needs={"gram"}, scores=drrqr_scores)
def select_drrqr(x: SelectorInput, *, f: float = DRRQR_F, max_swaps: int | None = None) -> KeyChannelSelection:
    """Strong RRQR on M_h = [Q_h; K_h] per head (appendix B.2), through its Gram matrix Q^T Q + K^T K
    (post-conv q/k, before the L2 norm) accumulated over all calibration tokens."""
    stats, keep, layer = x.stats, x.keep, x.layer
    H, K = x.shape
    G = _drrqr_gram(x)
    n_rows = stats.n_tokens * (2 if x.mode == "kq" else 1)
    kept, warned = [], {}
    for h in range(H):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            perm, _ = srrqr_from_gram(G[h].numpy(), keep, f=f, max_swaps=max_swaps, n_rows=n_rows, label=f"head {h}")
        if caught:
            warned[h] = str(caught[0].message)
        kept.append(np.sort(perm[:keep]))
    if warned:
        heads = ", ".join(map(str, warned))
        warnings.warn(f"drrqr layer {layer}, heads {heads}: {next(iter(warned.values()))}", stacklevel=3)
    return KeyChannelSelection(keep=torch.from_numpy(np.stack(kept)).to(torch.int64))


def _pca(x: SelectorInput, method: str, largest: bool) -> KeyChannelSelection:
    """Eigenvectors of the centred covariance of L2-normalised keys (pooled with queries in mode kq) as
    rows of T [H, keep, K] (appendix B.3, C.6). Signs: the largest-magnitude entry of each row is positive
    (the first such entry on exact ties)."""
    stats, keep, mode, layer = x.stats, x.keep, x.mode, x.layer
    H, K = x.shape
    hint = "sum_k/sum_kk and sum_q/sum_qq (PCA moments): run calibration with q/k hooks"
    if stats is None or stats.n_tokens <= 0:
        raise InputError(f"{method} needs {hint} (layer {layer} has no calibration tokens)")
    terms = _pair(mode, "q", "k")
    sums = [_stat(stats, f"sum_{s}", method, layer, (H, K), hint) for s in terms]
    outer = [_stat(stats, f"sum_{s}{s}", method, layer, (H, K, K), hint) for s in terms]
    n = stats.n_tokens * len(terms)
    mean = sum(sums) / n  # [H, K]
    cov = sum(outer) / n - mean[:, :, None] * mean[:, None, :]
    _, vecs = torch.linalg.eigh(0.5 * (cov + cov.transpose(1, 2)))  # ascending; eigenvectors as columns
    cols = vecs.flip(-1)[:, :, :keep] if largest else vecs[:, :, :keep]
    T = cols.transpose(1, 2).contiguous()  # [H, keep, K]
    sign = torch.sign(T.gather(-1, T.abs().argmax(dim=-1, keepdim=True)))
    return KeyChannelSelection(rotation=T * sign)


@register_selector("pca", needs={"normalised_moments"})
def select_pca(x: SelectorInput) -> KeyChannelSelection:
    """Top-`keep` principal directions ("proper" PCA, appendix C.6.2)."""
    return _pca(x, "pca", largest=True)


@register_selector("pca-adv", needs={"normalised_moments"})
def select_pca_adv(x: SelectorInput) -> KeyChannelSelection:
    """Bottom-`keep` principal directions ("adversarial" PCA baseline, appendix C.6.2)."""
    return _pca(x, "pca-adv", largest=False)


def energy_scores(stats: LayerCalibration | None, H: int, K: int, mode: str = "kq", layer: int = 0,
                  method: str = "energy") -> torch.Tensor:
    """[H, K] float64 energy of each key channel (see `select_energy`)."""
    hint = "q/k moments and head dynamics: run calibration (calibration.calibrate) with this package's hooks"
    if stats is None or stats.n_tokens <= 0 or stats.horizon is None:
        raise ValueError(f"{method} needs {hint} (layer {layer} has no calibration tokens or horizon)")
    n = stats.n_tokens
    which = "sum_{s}{s}" if stats.qk_l2_normalised else "gram_{s}"
    second = {s: torch.diagonal(_stat(stats, which.format(s=s), method, layer, (H, K, K), hint), dim1=1, dim2=2) / n
              for s in ("q", "k")}                                                   # [H, K]: E[q_j^2], E[k_j^2]
    channel = math.prod(second[s] for s in _pair(mode, "q", "k"))
    rho = (_stat(stats, "decay_sq", method, layer, (H,), hint) / n if stats.decay_sq is not None
           else torch.ones(H, dtype=torch.float64))
    gain = _stat(stats, "gain_sq", method, layer, (H,), hint) / n if stats.gain_sq is not None else torch.ones(H, dtype=torch.float64)
    L = stats.horizon
    # sum_{tau < L} rho^tau, = L at rho = 1 (DeltaNet) and -> 1 / (1 - rho) for long horizons
    horizon_sum = torch.where(rho < 1, (1 - rho.clamp(max=1) ** L) / (1 - rho).clamp(min=1e-300), torch.full_like(rho, float(L)))
    return channel * (gain * horizon_sum)[:, None]


@register_scored("energy", needs={"gram", "normalised_moments", "dynamics"})
def select_energy(x: SelectorInput) -> torch.Tensor:
    """Impulse-response energy of each key channel: AIRE-Prune's E_i (arXiv 2602.00534) for input-dependent states.

    A diagonal SSM mode i has E_i = ||C[:, i]||^2 ||B_bar[i, :]||^2 / (1 - |lambda_i|^2): the energy of its impulse
    response C[:, i] lambda_i^tau B_bar[i, :] summed over all lags tau. In linear attention the state of a head is
    S_t = a_t S_{t-1} (...) + g_t v_t k_t^T and the read-out o_t = S_t q_t, so key channel j is a "mode" whose input
    matrix entry is g_t k_t[j] (B = key; Mamba-2: the ZOH input dt_t B_t), whose output entry is q_t[j]
    (C = query) and whose transition is the head's scalar decay a_t. Its contribution at lag tau is
    q_t[j] (prod_{r in (t - tau, t]} a_r) g_{t-tau} k_{t-tau}[j]; with q, k and a treated as independent
    stationary draws (their calibration moments) the expected energy up to horizon L is

        E_j = E[q_j^2] E[k_j^2] E[g^2] sum_{tau < L} rho^tau,   rho = E[a^2],

    = E[q_j^2] E[k_j^2] E[g^2] (1 - rho^L) / (1 - rho), which tends to the seed's 1 / (1 - |lambda|^2) as L grows.
    L is the calibration window length (the context the calibration statistics saw). DeltaNet has no decay
    (rho = 1): its delta-rule erasure (I - beta k k^T) is not a scalar, so the horizon L bounds the sum and
    the head factor is L E[beta^2]. Gated DeltaNet and Qwen3.5's linear layers: a = exp(g), the gate per value
    head; Mamba-2: a = exp(dt A); value heads sharing a key head (a B/C group) are averaged. q and k are the
    vectors the kernel sees: L2-normalised (sum_qq/sum_kk) where the kernel normalises them (DeltaNet with
    qk_norm l2, Gated DeltaNet, Qwen3.5), raw post-conv (gram_q/gram_k) for Mamba-2. The decay factor is a
    constant of the head, so within a head the ranking is that of E[q_j^2] E[k_j^2]; it matters when scores
    are compared across heads and layers (global budgets). `mode` k or q drops the other factor (Table 16)."""
    H, K = x.shape
    return energy_scores(x.stats, H, K, x.mode, x.layer)


@register_scored("think", needs={"window_norms"})
def select_think(x: SelectorInput) -> torch.Tensor:
    """ThinK (arXiv 2407.21018): key channel j of a head scores ||Q[:, j] K[:, j]^T||_F, the magnitude of the
    query-key interaction it carries. Q[:, j] K[:, j]^T is rank one, so over the tokens of one window w the score
    is ||Q_w[:, j]||_2 ||K_w[:, j]||_2; it is summed over the calibration windows. q and k are the vectors the
    kernel sees (L2-normalised where it normalises them). Mode k or q keeps the key or query norm alone."""
    H, K = x.shape
    hint = "window_norm_*: run calibration with the window_norms statistic"
    field = {"kq": "window_norm_qk", "k": "window_norm_k", "q": "window_norm_q"}[x.mode]
    return _stat(x.stats, field, "think", x.layer, (H, K), hint)


def ghost_scores(stats: LayerCalibration | None, H: int, K: int, mode: str = "kq", layer: int = 0) -> torch.Tensor:
    """[H, K] float64 (see `select_ghost`)."""
    hint = "gramian_ctrl/gramian_obs: run calibration with the state_gramians statistic"
    ctrl, obs = (getattr(stats, f, None) if stats is not None else None for f in ("gramian_ctrl", "gramian_obs"))
    if ctrl is None or ctrl.shape[0] % H or tuple(ctrl.shape[1:]) != (K,):
        shape = None if ctrl is None else tuple(ctrl.shape)
        raise InputError(f"ghost needs {hint} (layer {layer} has gramian_ctrl {shape}, expected [H_v, {K}] with "
                         f"H_v a multiple of H = {H})")
    Hv = ctrl.shape[0]
    ctrl = _stat(stats, "gramian_ctrl", "ghost", layer, (Hv, K), hint)
    obs = _stat(stats, "gramian_obs", "ghost", layer, (Hv, K), hint)
    per_value_head = {"kq": (ctrl * obs).sqrt(), "k": ctrl, "q": obs}[mode]  # [H_v, K]
    return per_value_head.view(H, Hv // H, K).sum(1)


@register_scored("ghost", needs={"state_gramians"}, serves=missing_decay)
def select_ghost(x: SelectorInput) -> torch.Tensor:
    """GHOST-style balanced truncation of the state channels from forward passes (arXiv 2602.11408).

    Balanced truncation keeps the states with the largest Hankel singular values sqrt(eig(P Q)), P and Q the
    controllability and observability Gramians. Every family here updates each value head's state channel j as
    s_t = a_t s_{t-1} + g_t k_t[j] u_t (a scalar decay a_t, an input gain g_t: dt for Mamba-2, beta for Gated
    DeltaNet) and reads it with q_t[j], so the Gramians' diagonals are exact per token (`calibration.
    accumulate_gramians`); with their off-diagonal terms dropped, channel j of value head v has
    sigma_vj = sqrt(P_vj Q_vj), P and Q summed over the calibration tokens. A key channel is shared by the value
    heads of its key head (a Mamba-2 B/C group), which all lose it: s_j = sum_v sigma_vj. Mode k keeps P
    (controllability), mode q keeps Q (observability). Needs a per-head scalar decay: DeltaNet has none (its
    state forgets only through the delta rule's erasure), so it cannot be served; for Gated DeltaNet and Qwen3.5
    the erasure is left out of the Gramians."""
    H, K = x.shape
    return ghost_scores(x.stats, H, K, x.mode, x.layer)


def taylor_scores(stats: LayerCalibration | None, H: int, K: int, mode: str = "kq", layer: int = 0) -> torch.Tensor:
    """[H, K] float64 (see `select_taylor`)."""
    hint = "taylor_*/fisher_*: run calibration with the taylor statistic"
    get = functools.partial(_stat, stats, method="taylor", layer=layer, shape=(H, K), hint=hint)
    if mode == "kq":
        first = get("taylor_q") + get("taylor_k")
        second = get("fisher_qq") + get("fisher_kk") + 2 * get("fisher_qk")
    else:
        first, second = get(f"taylor_{mode}"), get(f"fisher_{mode}{mode}")
    return (0.5 * second - first).abs()


@register_scored("taylor", needs={"taylor"})
def select_taylor(x: SelectorInput) -> torch.Tensor:
    """Second-order Taylor importance of removing key channel j (arXiv 2502.18886, "On Pruning SSM LLMs").

    Removing channel j sets its q and k rows w_j (both in mode kq) to zero, delta = -w_j, so
    dL ~= -g^T w_j + 1/2 w_j^T H w_j with g the gradient of the calibration loss and H its Hessian. H is replaced by
    the empirical Fisher over the gradient batches b, F = sum_b (B_b / N) grad L_b grad L_b^T (per-window when a
    gradient batch holds one window), which gives w_j^T F w_j = sum_b c_b u_bj^2 with u_bj = sum_i W[j, i]
    dL_b'/dW[j, i] the batch's share of the gradient (`calibration.QKGradients`) and c_b = N / B_b. The score is
    |dL| = |1/2 sum_b c_b u_bj^2 - sum_b u_bj|; in mode kq, u_bj sums the query and the key rows of channel j
    (they are removed together). The conv filter of channel j is not part of the group (its gradient is not
    collected)."""
    H, K = x.shape
    return taylor_scores(x.stats, H, K, x.mode, x.layer)


def _score_error(M: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, kept: torch.Tensor,
                 normalised: bool) -> torch.Tensor:
    """J for each row of `kept` ([C, K] 0/1 float64, candidate kept sets) given M = G_q o G_k and the Gram
    diagonals dq, dk (see `select_qkscore`)."""
    quad = torch.einsum("ck,kl,cl->c", kept, M, kept)
    lin = kept @ M.sum(1)
    if not normalised:
        return quad - 2 * lin + M.sum()
    a = torch.sqrt(dq.sum() * dk.sum() / ((kept @ dq) * (kept @ dk)).clamp(min=1e-300))
    return a * a * quad - 2 * a * lin + M.sum()


def qkscore_keep(Gq: torch.Tensor, Gk: torch.Tensor, keep: int, normalised: bool, swaps: int = 0,
                 M: torch.Tensor | None = None) -> torch.Tensor:
    """One head: the kept channels (sorted) of greedy backward elimination on J, then up to `swaps` passes of
    best-improving single swaps (one kept channel out, one removed channel in); ties to the lower index.
    M: the pair-weighted Gram product (None: G_q o G_k); Gq, Gk give the renormalisation a(S)."""
    K = Gq.shape[0]
    M = Gq * Gk if M is None else M
    dq, dk = torch.diagonal(Gq), torch.diagonal(Gk)
    kept = torch.ones(K, dtype=torch.float64)
    rows, diag, total = M.sum(1), torch.diagonal(M), M.sum()
    while int(kept.sum()) > keep:
        # J of every kept set minus one channel j in O(K^2) (M symmetric):
        # (x - e_j)^T M (x - e_j) = x^T M x - 2 (M x)_j + M_jj, (x - e_j)^T M 1 = x^T M 1 - (M 1)_j
        Mx = M @ kept
        quad = kept @ Mx - 2 * Mx + diag
        lin = kept @ rows - rows
        if normalised:
            a = torch.sqrt(dq.sum() * dk.sum() / ((kept @ dq - dq) * (kept @ dk - dk)).clamp(min=1e-300))
            J = a * a * quad - 2 * a * lin + total
        else:
            J = quad - 2 * lin + total
        J[kept == 0] = math.inf
        kept[int(torch.argmin(J))] = 0
    for _ in range(swaps):
        ins, outs = torch.nonzero(kept == 0).flatten(), torch.nonzero(kept).flatten()
        if not len(ins):
            break
        cand = kept.repeat(len(outs) * len(ins), 1)
        pairs = torch.cartesian_prod(outs, ins)
        rows = torch.arange(len(pairs))
        cand[rows, pairs[:, 0]], cand[rows, pairs[:, 1]] = 0.0, 1.0
        J = _score_error(M, dq, dk, cand, normalised)
        best = int(torch.argmin(J))
        if not J[best] < _score_error(M, dq, dk, kept[None], normalised)[0]:
            break
        kept = cand[best]
    return torch.nonzero(kept).flatten()


def _qkscore_selection(x: SelectorInput, name: str, swaps: int, M: torch.Tensor | None = None) -> KeyChannelSelection:
    """`qkscore_keep` per head of the layer, on the Grams of x.mode (and the pair-weighted M [H, K, K] if given)."""
    H, K = x.shape
    normalised = bool(x.stats.qk_l2_normalised) if x.stats is not None else False
    field = "sum_{s}{s}" if normalised else "gram_{s}"
    hint = "q/k Grams (gram_* or sum_qq/sum_kk): run calibration with the gram and normalised_moments statistics"
    G = {s: _stat(x.stats, field.format(s=s), name, x.layer, (H, K, K), hint) for s in "qk"}
    left, right = {"kq": ("q", "k"), "k": ("k", "k"), "q": ("q", "q")}[x.mode]
    kept = [qkscore_keep(G[left][h], G[right][h], x.keep, normalised, swaps, M=None if M is None else M[h])
            for h in range(H)]
    return KeyChannelSelection(keep=torch.stack(kept).to(torch.int64))


@register_selector("qkscore", needs={"gram", "normalised_moments"})
def select_qkscore(x: SelectorInput, *, swaps: int = 0) -> KeyChannelSelection:
    """Ours (issue 19): keep the channels whose removal least changes the query-key scores the kernel computes.

    The state of every family here is read through the scores q_t . k_s (DeltaNet / Gated DeltaNet / Qwen3.5:
    q and k L2-normalised by the kernel; Mamba-2: C_t . B_s, unnormalised). Keeping the channel set S (removing
    D) turns each score into q_S . k_S, and in a normalising kernel into q_S . k_S / (|q_S| |k_S|): the kept
    part of unit vectors is renormalised. With the per-token norms |q_S|^2 replaced by their calibration mean
    rho_q(S) = tr G_q[S, S] / tr G_q (G_q = sum_t q_t q_t^T of the vectors the kernel sees; tr G_q = N for unit
    vectors) and a(S) = (rho_q(S) rho_k(S))^(-1/2) (a = 1 without normalisation), the squared score error over
    all calibration (query, key) token pairs is

        J(S) = sum_{t,s} (a q_S,t . k_S,s - q_t . k_s)^2 = a^2 1_S^T M 1_S - 2 a 1_S^T M 1 + 1^T M 1,

    M = G_q o G_k (the elementwise product: sum_{t,s} q_tj q_tl k_sj k_sl = G_q[j, l] G_k[j, l]), so J needs only
    the two K x K Grams of calibration. Unlike a diagonal score (E[q_j^2] E[k_j^2]) it sees channels that cancel
    or duplicate each other (off-diagonal M) and the renormalisation of what is kept. Minimising J over |S| =
    keep is a binary quadratic problem; it is solved by greedy backward elimination (remove the channel whose
    removal gives the smallest J, K - keep times), optionally refined by `swaps` passes of the best single swap.
    Mode k uses M = G_k o G_k (the key-key products of the delta rule's erasure), mode q G_q o G_q."""
    return _qkscore_selection(x, "qkscore", swaps)


@register_selector("qkscore-decay", needs={"gram", "normalised_moments", "decay_grams"})
def select_qkscore_decay(x: SelectorInput, *, swaps: int = 0) -> KeyChannelSelection:
    """Ours (issue 19): `qkscore` with every (query t, key s) pair weighted by how much of key s the state still
    holds at t.

    A decaying state reads o_t = sum_{s <= t} w_ts (erasure terms) v_s (k_s . q_t) with w_ts = prod_{s < r <= t}
    a_r (a_r the head's per-token decay: Gated DeltaNet / Qwen3.5 exp(g_r), Mamba-2 exp(dt_r A); DeltaNet a = 1).
    The score error that reaches the read-out is then the w-weighted one,

        J_a(S) = sum_{s <= t} w_ts^2 (a q_S,t . k_S,s - q_t . k_s)^2 = a^2 1_S^T M 1_S - 2 a 1_S^T M 1 + 1^T M 1,

        M = sum_{s <= t} w_ts^2 (q_t q_t^T) o (k_s k_s^T) = sum_t (q_t q_t^T) o P_t,  P_t = a_t^2 P_{t-1} + k_t k_t^T,

    expanded as in `select_qkscore` (the pair's squared error is a quadratic form in 1_S with the Schur product
    of the pair's outer products; M is PSD as a sum of Schur products of PSD matrices). P_t runs forward in the
    calibration pass (`calibration.accumulate_decay_gram`, statistic decay_grams, value heads summed into their
    key head), so M costs one K x K running state per value head and no second pass. With a = 1 it is the causal
    all-pairs M (pairs s <= t only; `qkscore` sums every pair of the whole calibration set, across windows).
    J_a bounds the read-out error of every value channel c (e_ts the score error, erasure left out): by
    Cauchy-Schwarz |sum_s w_ts e_ts v_sc|^2 <= (sum_s w_ts^2 e_ts^2) (sum_{s <= t} v_sc^2), so the summed
    squared read-out error is at most J_a max_t sum_{s <= t} v_sc^2.
    Left out: the delta rule's erasure (I - beta_r k_r k_r^T) between s and t, which makes the weight depend on
    the keys (and on the kept set) and is not a scalar; and the write gain (beta_s or dt_s), which scales every
    pair of key s (it would enter as g_s^2 k_s k_s^T in P). The renormalisation a(S) is that of `qkscore`, from
    the plain Grams. Modes k and q keep this M (the decay weight belongs to a query-key pair; a key-key or
    query-query P would be a second statistic) and take a(S) from G_k (resp. G_q) alone, as `qkscore` does."""
    H, K = x.shape
    M = _stat(x.stats, "decay_score_gram", "qkscore-decay", x.layer, (H, K, K),
              "decay_score_gram: run calibration with the decay_grams statistic")
    return _qkscore_selection(x, "qkscore-decay", swaps, M)
