"""Gauss-Laguerre frequency quadrature of the rational atoms (seed paper, sections 2.3 and 2.4, App. C.2).

Reconstructed equations (the seed's display equations were lost in extraction; these follow from its text):

  centred atom (Eq. 5)   1 / (1 + u^2) = int_0^inf e^{-s} cos(s u) ds  ~=  sum_k gamma_k cos(s_k u)
  odd companion          u / (1 + u^2) = int_0^inf e^{-s} sin(s u) ds  ~=  sum_k gamma_k sin(s_k u)
  shifted atom (Eq. 14)  g(u) = (A + B (u - p)) / ((u - p)^2 + q^2)
                              = c_A int e^{-s} cos(s (u - p) / q) ds + c_B int e^{-s} sin(s (u - p) / q) ds,
                         c_A = A / q^2, c_B = B / q (App. A.2 / B "Partial fractions"); by angle addition, at node
                         s_k with phase phi_k = s_k p / q (App. A.2):
                           w_c,k = c_A cos phi_k - c_B sin phi_k,   w_s,k = c_A sin phi_k + c_B cos phi_k,
                           g(u) ~= sum_k gamma_k (w_c,k cos(s_k u / q) + w_s,k sin(s_k u / q)).

(s_k, gamma_k) are the Gauss-Laguerre nodes and weights: the weight function of that rule is exactly e^{-s}, so
the gamma_k are positive and sum to 1 (App. A.2). The cutoff s_max keeps the n_freq smallest nodes of the
lowest-order rule that has n_freq nodes <= s_max ("n_freq = 3, s_max = 4", App. D.2); the discarded weight
sum_{s_k > s_max} gamma_k is what the truncation costs and is returned, not renormalised away.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from state_reduction.ralimp.errors import RalimpError

MAX_ORDER = 150


@dataclass(frozen=True)
class LaguerreNodes:
    nodes: tuple[float, ...]       # s_k, ascending
    weights: tuple[float, ...]     # gamma_k > 0
    order: int                     # order of the Gauss-Laguerre rule they were taken from
    discarded_weight: float        # sum of the weights of the dropped nodes (s_k > s_max)

    def tensors(self, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(self.nodes, dtype=dtype), torch.tensor(self.weights, dtype=dtype)


def gauss_laguerre(n_freq: int, s_max: float | None = None) -> LaguerreNodes:
    """The n_freq retained Gauss-Laguerre nodes (all of the order-n_freq rule when s_max is None)."""
    if int(n_freq) != n_freq or n_freq < 1:
        raise RalimpError(f"ralimp: n_freq must be an integer >= 1, got {n_freq!r}")
    if s_max is not None and not s_max > 0:
        raise RalimpError(f"ralimp: s_max must be > 0 or None, got {s_max!r}")
    order = int(n_freq)
    while True:
        with np.errstate(all="ignore"):   # high orders under/overflow in the weights' normalisation
            x, w = np.polynomial.laguerre.laggauss(order)
        keep = x <= s_max if s_max is not None else np.ones_like(x, dtype=bool)
        if keep.sum() >= n_freq and np.isfinite(w[keep]).all():
            idx = np.flatnonzero(keep)[:n_freq]
            dropped = float(w.sum() - w[idx].sum())
            return LaguerreNodes(tuple(float(v) for v in x[idx]), tuple(float(v) for v in w[idx]), order, dropped)
        order += 1
        if order > MAX_ORDER:
            raise RalimpError(f"ralimp: no Gauss-Laguerre rule up to order {MAX_ORDER} has {n_freq} nodes <= "
                             f"s_max={s_max}; raise s_max or lower n_freq")


def node_coefficients(nodes: LaguerreNodes, A: float, B: float, p: float, q: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-node (gamma_k w_c,k, gamma_k w_s,k) of the shifted atom (A + B (u-p)) / ((u-p)^2 + q^2), at
    frequencies s_k / q."""
    if not q > 0:
        raise RalimpError(f"ralimp: atom width q must be > 0, got {q!r}")
    s, g = np.asarray(nodes.nodes), np.asarray(nodes.weights)
    c_a, c_b = A / q ** 2, B / q
    phi = s * p / q
    return g * (c_a * np.cos(phi) - c_b * np.sin(phi)), g * (c_a * np.sin(phi) + c_b * np.cos(phi))


def atom_quadrature(u, nodes: LaguerreNodes, A: float = 1.0, B: float = 0.0, p: float = 0.0,
                    q: float = 1.0) -> np.ndarray:
    """The quadrature value of the shifted atom at u (the exact-kernel limit of the rational block)."""
    u = np.asarray(u, dtype=np.float64)
    wc, ws = node_coefficients(nodes, A, B, p, q)
    s = np.asarray(nodes.nodes) / q
    arg = u[..., None] * s
    return (np.cos(arg) * wc + np.sin(arg) * ws).sum(-1)


def shifted_atom(u, A: float = 1.0, B: float = 0.0, p: float = 0.0, q: float = 1.0) -> np.ndarray:
    """The exact atom (A + B (u - p)) / ((u - p)^2 + q^2)."""
    v = np.asarray(u, dtype=np.float64) - p
    return (A + B * v) / (v ** 2 + q ** 2)

