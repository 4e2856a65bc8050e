"""State-pruning scores of diagonal SSM modes, the layer normalisation and the budgets (AIRE-Prune, LAST).

For a mode i of a discrete diagonal system (lambda_i, B_bar[i, :], C[:, i]) the impulse response from all inputs to
all outputs is the rank-one matrix sequence h_i[k] = C[:, i] lambda_i^k B_bar[i, :], k >= 0, and
||h_i[k]||_F = ||C[:, i]|| |lambda_i|^k ||B_bar[i, :]|| (Frobenius norm of an outer product). Hence

    AIRE (arXiv 2602.00534):  E_i = sum_k ||h_i[k]||_F^2 = ||C[:, i]||^2 ||B_bar[i, :]||^2 / (1 - |lambda_i|^2 + 1e-8)
    LAST (arXiv 2411.02824):  H_i = ||C[:, i]||^2 ||B_bar[i, :]||^2 / (1 - |lambda_i|)^2   (squared H-infinity norm,
                              the peak gain at the frequency of lambda_i)

Both are normalised per layer (`layer_normalise`): sort ascending, divide each score by the sum of itself and all
larger scores, so a layer's top mode scores 1. A global budget pools the normalised scores of all layers and keeps
the top floor(total * (1 - ratio)); the uniform budget keeps floor(P * (1 - ratio)) of each layer's P modes.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Sequence

import torch

from state_reduction.pruning.budgets import layer_normalise  # noqa: F401  (one normalisation for both settings)

EPS = 1e-8


def aire_energy(lam_bar: torch.Tensor, b_bar: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """E [P] from lambda_bar [P], B_bar [P, H_in], C [H_out, P] (complex)."""
    return c.abs().pow(2).sum(0) * b_bar.abs().pow(2).sum(1) / (1 - lam_bar.abs().pow(2) + EPS)


def hinf_score(lam_bar: torch.Tensor, b_bar: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Squared H-infinity norm of each mode [P] (LAST)."""
    return c.abs().pow(2).sum(0) * b_bar.abs().pow(2).sum(1) / (1 - lam_bar.abs()).pow(2)


def keep_top(scores: torch.Tensor, n_keep: int) -> torch.Tensor:
    """Boolean mask of the n_keep largest entries (ties broken by position, deterministic)."""
    mask = torch.zeros(scores.numel(), dtype=torch.bool)
    if n_keep > 0:
        mask[torch.argsort(scores, descending=True, stable=True)[:n_keep]] = True
    return mask


def global_keep(scores: Sequence[torch.Tensor], ratio: float) -> list[torch.Tensor]:
    """Pool the layers' scores and keep the top floor(total * (1 - ratio)); one mask per layer."""
    sizes = [s.numel() for s in scores]
    total = sum(sizes)
    mask = keep_top(torch.cat([s.flatten() for s in scores]), math.floor(total * (1 - ratio) + 1e-9))
    return list(torch.split(mask, sizes))


def uniform_keep(scores: Sequence[torch.Tensor], ratio: float) -> list[torch.Tensor]:
    """Keep the top floor(P * (1 - ratio)) of each layer."""
    return [keep_top(s.flatten(), math.floor(s.numel() * (1 - ratio) + 1e-9)) for s in scores]


def random_keep(sizes: Sequence[int], ratio: float, seed: int) -> list[torch.Tensor]:
    """floor(P * (1 - ratio)) modes of each layer drawn uniformly at random."""
    g = torch.Generator().manual_seed(seed)
    return [keep_top(torch.rand(p, generator=g), math.floor(p * (1 - ratio) + 1e-9)) for p in sizes]


def _normalised(score: Callable) -> Callable:
    return lambda systems: [layer_normalise(score(*s)) for s in systems]


# method -> (per-layer scores from [(lambda_bar, B_bar, C)] of each layer, budget)
METHODS: dict[str, tuple[Callable | None, Callable | None]] = {
    "aire": (_normalised(aire_energy), global_keep),
    "last": (_normalised(hinf_score), global_keep),
    "uniform_hinf": (lambda systems: [hinf_score(*s) for s in systems], uniform_keep),
    "global_hinf": (lambda systems: [hinf_score(*s) for s in systems], global_keep),
    "random": (None, None),
}


def select_modes(method: str, systems: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], ratio: float,
                 seed: int = 0) -> list[torch.Tensor]:
    """Keep-masks, one per layer, of `method` at fraction `ratio` of all modes removed."""
    if method not in METHODS:
        near = difflib.get_close_matches(method, METHODS, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ValueError(f"SSM pruning method {method!r} unknown{hint}; known: {', '.join(METHODS)}")
    if not 0 <= ratio < 1:
        raise ValueError(f"SSM pruning ratio must be in [0, 1), got {ratio}")
    if method == "random":
        return random_keep([s[0].numel() for s in systems], ratio, seed)
    score, budget = METHODS[method]
    return budget(score(systems), ratio)
