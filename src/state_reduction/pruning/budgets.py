"""Layer-adaptive key-dimension budgets (AIRE-Prune / LAST global thresholding for linear attention; issue #17
part 3, the schedule only: how many channels each layer keeps, apart from which ones).

Given per-channel scores [H, K] of every layer (any score-based selector: L1, S-Wanda, Grad, energy), a
budget returns each layer's K' (one K per layer: fla's kernels need it) such that sum_l H_l K'_l equals the
uniform budget's total sum_l H_l floor(K (1 - ratio)), up to the rounding reported in `Budget.total_error`:

- `uniform`: K' = floor(K (1 - ratio)) everywhere (the paper's budget);
- `global-aire` / `global-last`: each layer's scores are normalised as in AIRE-Prune / LAST (sort ascending,
  divide by the sum of itself and all larger scores, computed over the layer's H K channels), pooled over
  layers, and the top total are taken; layer l's K'_l is the number it receives divided by H_l, rounded to
  the nearest multiple of `multiple`, at least `floor`, and then the totals are repaired greedily (add or
  remove `multiple` channels per head where the next normalised score is largest / smallest) so the total
  state equals the uniform one within one multiple per layer.

The seeds' two global budgets share the normalisation and differ in the score: AIRE's energy
||C||^2 ||B||^2 / (1 - |lambda|^2) and LAST's squared H-infinity norm ||C||^2 ||B||^2 / (1 - |lambda|)^2. Here any
selector's per-channel scores (pruning.selectors, `Selector.channel_scores`) take the place of the energy for
`global-aire`; `global-last` multiplies them by each head's ratio of the two (`last_head_factor`), from the head's
calibrated decay. The factor is one per head, so it changes how many channels a layer keeps, never which channels
a head ranks first; with no decay (DeltaNet) it is the same for every head and global-last equals global-aire.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from state_reduction.errors import InputError

BUDGETS = ("uniform", "global-aire", "global-last")


@dataclass(frozen=True)
class Budget:
    key_dims: dict[int, int]      # layer -> K'
    requested_total: int          # sum_l H_l floor(K (1 - ratio)): the uniform budget's channel count
    kept_total: int               # sum_l H_l K'_l

    @property
    def total_error(self) -> int:
        return self.kept_total - self.requested_total


def last_head_factor(rho: torch.Tensor, horizon: int) -> torch.Tensor:
    """[H] squared H-infinity gain over energy of a scalar decay a = sqrt(rho) (rho = E[a^2] from calibration, as the
    energy selector reads it) up to `horizon` lags: (sum_{tau < L} a^tau)^2 / sum_{tau < L} a^(2 tau), which is LAST's
    (1 - a^2) / (1 - a)^2 = (1 + a) / (1 - a) as L grows, and L at a = 1."""
    a = rho.double().clamp(min=0, max=1).sqrt()
    lags = torch.arange(horizon, dtype=torch.float64)
    powers = a[:, None] ** lags  # [H, L]
    return powers.sum(1) ** 2 / powers.square().sum(1)


def layer_normalise(scores: torch.Tensor) -> torch.Tensor:
    """AIRE/LAST normalisation of one layer's scores (any shape): s_(j) / sum_{k >= j} s_(k), top = 1."""
    flat = scores.flatten().double()
    order = torch.argsort(flat, stable=True)
    ascending = flat[order]
    tail = torch.flip(torch.cumsum(torch.flip(ascending, [0]), 0), [0])
    out = torch.empty_like(flat)
    out[order] = ascending / tail.clamp(min=torch.finfo(torch.float64).tiny)
    return out.view_as(scores)


def layer_budget(scores: dict[int, torch.Tensor], K: int, ratio: float, budget: str = "uniform", *, floor: int = 1,
                 multiple: int = 1, allow_layer_removal: bool = False) -> Budget:
    """Per-layer K' from per-channel scores {layer: [H, K]} (see the module docstring)."""
    if budget not in BUDGETS:
        raise InputError(f"--budget {budget!r} unknown; accepted: {', '.join(BUDGETS)}")
    if floor > K:
        raise InputError(f"--budget-floor {floor} exceeds the key dimension K={K}; the largest floor is "
                         f"{math.floor(K * (1 - ratio) + 1e-9)} at ratio {ratio}")
    if not 0 <= ratio < 1:
        raise InputError(f"--ratio must be in [0, 1), got {ratio}")
    if multiple < 1 or floor < 0:
        raise InputError(f"--multiple must be >= 1 and --budget-floor >= 0, got {multiple} and {floor}")
    uniform_k = math.floor(K * (1 - ratio) + 1e-9)
    uniform_k -= uniform_k % multiple  # the uniform budget rounds down to the multiple (selectors.keep_count)
    heads = {layer: s.shape[0] for layer, s in scores.items()}
    requested = sum(h * uniform_k for h in heads.values())
    if budget == "uniform":
        return Budget({layer: uniform_k for layer in scores}, requested, requested)
    if floor == 0 and not allow_layer_removal:
        raise InputError("--budget-floor 0 lets a global budget remove every channel of a layer; the limit is a "
                         "floor >= 1 (removing a layer's whole state is structure removal: --method shed --target mixer)")
    min_k = max(floor, 0 if allow_layer_removal else 1)
    if sum(h * min_k for h in heads.values()) > requested:
        limit = requested // sum(heads.values())
        raise InputError(f"--budget-floor {floor}: the floors alone need {sum(h * min_k for h in heads.values())} channels, "
                         f"more than the budget's {requested} at ratio {ratio}; the largest floor is {limit}")
    normalised = {layer: layer_normalise(s) for layer, s in scores.items()}
    pooled = torch.cat([n.flatten() for n in normalised.values()])
    threshold_index = torch.argsort(pooled, descending=True, stable=True)[:requested]
    mask = torch.zeros_like(pooled, dtype=torch.bool)
    mask[threshold_index] = True
    key_dims, offset = {}, 0
    for layer, n in normalised.items():
        count = int(mask[offset:offset + n.numel()].sum())
        offset += n.numel()
        k = multiple * round(count / heads[layer] / multiple)
        key_dims[layer] = min(K, max(min_k, k))
    # greedy repair of the rounding: move `multiple` channels per head between layers by the next score
    def next_score(layer: int, grow: bool) -> float:
        ranked = torch.sort(normalised[layer].flatten(), descending=True).values
        idx = key_dims[layer] * heads[layer] + (0 if grow else -1)
        return float(ranked[idx]) if 0 <= idx < ranked.numel() else (-math.inf if grow else math.inf)

    total = lambda: sum(heads[l] * key_dims[l] for l in key_dims)  # noqa: E731
    for _ in range(len(key_dims) * K):
        gap = total() - requested
        if abs(gap) < min(heads.values()) * multiple:
            break
        if gap < 0:
            grow = [l for l in key_dims if key_dims[l] + multiple <= K]
            if not grow:
                break
            best = max(grow, key=lambda l: next_score(l, True))
            key_dims[best] += multiple
        else:
            shrink = [l for l in key_dims if key_dims[l] - multiple >= min_k]
            if not shrink:
                break
            worst = min(shrink, key=lambda l: next_score(l, False))
            key_dims[worst] -= multiple
    return Budget(key_dims, requested, total())


def check_scored_selector(method: str, budget: str) -> None:
    """A global budget needs the selector's per-channel scores: a selector that rotates (PCA), draws (rand) or
    searches channel sets jointly has none. One check for `prune` (PruneConfig.validate) and for a table's plan
    (pipeline.spec.table_cells), so a run-table or its dry run refuses such a cell before any compute."""
    from state_reduction.pruning.selectors import SELECTORS, get_selector  # lazy: selectors is the heavier module

    if budget != "uniform" and get_selector(method).scores is None:
        scored = ", ".join(n for n, s in SELECTORS.items() if s.scores is not None)
        raise InputError(f"--budget {budget} needs per-channel scores; --method {method} has none "
                         f"(it rotates, draws or jointly searches channels); accepted with a global budget: {scored}")
