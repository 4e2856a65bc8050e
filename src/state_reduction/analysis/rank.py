"""Effective rank and rank utilisation of recurrent states (paper section 2.2, Eq. 3-4).

er(S) = ||S||_F^2 / ||S||_2^2 = sum_i sigma_i^2 / sigma_1^2, and u(S) = er(S) / d. The divisor d is a choice:
  "dk"  - the state's key dimension (what state reduction shrinks; Table 5 labels rows by d_k); our default,
  "min" - min(d_k, d_v), the rank bound of a d_v x d_k state; the authors' code divides by this,
  "dv"  - the value dimension.
For the tiny and paper models d_k <= d_v, so "dk" and "min" agree there.
A state whose largest singular value is (numerically) zero has no effective rank: it is *degenerate* and is
reported as such (None plus a flag), never as NaN.
"""

from __future__ import annotations

import itertools

import torch

DIVISORS = ("dk", "min", "dv")
DEGENERATE_TOL = 1e-12  # sigma_1 below this (absolute, float64) counts as an all-zero state


def check_divisor(divisor: str) -> str:
    if divisor not in DIVISORS:
        raise ValueError(f"rank utilisation divisor must be one of {', '.join(DIVISORS)}, got {divisor!r}")
    return divisor


def utilization_divisor(d_k: int, d_v: int, divisor: str = "dk") -> int:
    check_divisor(divisor)
    return {"dk": d_k, "min": min(d_k, d_v), "dv": d_v}[divisor]


def effective_rank_from_singular_values(sv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """sv [..., r] (descending) -> (er [...], degenerate [...] bool). er is 0 where degenerate (mask it)."""
    sv = sv.double()
    top = sv[..., 0]
    degenerate = top <= DEGENERATE_TOL
    safe = torch.where(degenerate, torch.ones_like(top), top)
    er = (sv.square().sum(-1) / safe.square()).masked_fill(degenerate, 0.0)
    return er, degenerate


def effective_rank(s: torch.Tensor) -> torch.Tensor:
    """er of matrices s [..., m, n] (float64); NaN-free: degenerate matrices get 0 (see `effective_rank_from_singular_values`)."""
    return effective_rank_from_singular_values(torch.linalg.svdvals(s.double()))[0]


def rank_utilization(s: torch.Tensor, d: int | None = None) -> torch.Tensor:
    """u(S) = er(S) / d; d defaults to min(m, n) of s [..., m, n]."""
    return effective_rank(s) / (min(s.shape[-2:]) if d is None else d)


def condition_number(sv: torch.Tensor) -> float | None:
    """sigma_max / sigma_min of a descending spectrum; None when sigma_min is zero (rank deficient)."""
    lo, hi = float(sv[-1]), float(sv[0])
    return None if lo <= DEGENERATE_TOL * max(hi, 1.0) else hi / lo


def spectral_gap(spectrum: list[float] | None, window: int | None = None) -> tuple[float | None, int | None]:
    """Largest ratio sigma_i / sigma_{i+1} of consecutive (mean) singular values among the first `window` and the
    1-based i where it occurs (Figures 5, 6); exact zeros (beyond the rank) are left out. None for a degenerate head."""
    if not spectrum:
        return None, None
    s = [x for x in spectrum[:window] if x > 0]
    if len(s) < 2:
        return None, None
    ratios = [a / b for a, b in itertools.pairwise(s)]
    i = max(range(len(ratios)), key=ratios.__getitem__)
    return ratios[i], i + 1
