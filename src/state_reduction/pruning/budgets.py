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

A layer left at K' = 0 (only with `floor` 0) is refused unless `allow_layer_removal` (prune then removes that
layer's token mixer, `Budget.removed_layers`). `granularity="head"` gives each head its own K'_h from the same
threshold, rounded, floored and repaired per head; the layer stores the largest (`Budget.allocated_total`).

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
GRANULARITIES = ("layer", "head")  # --budget-granularity: one K' per layer (default) or per head


@dataclass(frozen=True)
class Budget:
    key_dims: dict[int, int]      # layer -> K' (head granularity: the layer's largest K'_h, what it stores)
    requested_total: int          # sum_l H_l floor(K (1 - ratio)): the uniform budget's channel count
    kept_total: int               # sum_l H_l K'_l (head granularity: sum_l sum_h K'_lh)
    head_key_dims: dict[int, list[int]] | None = None  # head granularity: layer -> [K'_h]

    @property
    def total_error(self) -> int:
        return self.kept_total - self.requested_total

    @property
    def removed_layers(self) -> list[int]:
        """Layers whose K' is 0 (only with allow_layer_removal): their token mixer is removed."""
        return [layer for layer, k in self.key_dims.items() if k == 0]

    @property
    def allocated_total(self) -> int:
        """Channels the checkpoint stores: sum_l H_l K'_l at each layer's (largest) K'."""
        heads = self.head_key_dims or {}
        return sum(len(heads.get(layer, [])) * k for layer, k in self.key_dims.items()) if heads else self.kept_total


def check_budget(budget: str) -> None:
    if budget not in BUDGETS:
        raise InputError(f"--budget {budget!r} unknown; accepted: {', '.join(BUDGETS)}")


def check_granularity(granularity: str) -> None:
    if granularity not in GRANULARITIES:
        raise InputError(f"--budget-granularity {granularity!r} unknown; accepted: {', '.join(GRANULARITIES)}")


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
                 multiple: int = 1, allow_layer_removal: bool = False, granularity: str = "layer") -> Budget:
    """Per-layer K' from per-channel scores {layer: [H, K]} (see the module docstring). With `granularity` "head"
    each head gets its own K'_h from the same threshold (rounding, floor and repair per head)."""
    check_budget(budget)
    check_granularity(granularity)
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
    if sum(h * floor for h in heads.values()) > requested:
        limit = requested // sum(heads.values())
        raise InputError(f"--budget-floor {floor}: the floors alone need {sum(h * floor for h in heads.values())} channels, "
                         f"more than the budget's {requested} at ratio {ratio}; the largest floor is {limit}")
    normalised = {layer: layer_normalise(s) for layer, s in scores.items()}
    pooled = torch.cat([n.flatten() for n in normalised.values()])
    threshold_index = torch.argsort(pooled, descending=True, stable=True)[:requested]
    mask = torch.zeros_like(pooled, dtype=torch.bool)
    mask[threshold_index] = True
    # units: (layer, head) at head granularity, (layer, None) at layer granularity; each has `width` heads
    counts, offset = {}, 0
    for layer, n in normalised.items():
        m = mask[offset:offset + n.numel()].view(n.shape)
        offset += n.numel()
        if granularity == "head":
            counts.update({(layer, h): int(m[h].sum()) for h in range(heads[layer])})
        else:
            counts[(layer, None)] = int(m.sum()) / heads[layer]
    width = {u: 1 if u[1] is not None else heads[u[0]] for u in counts}
    ranked = {u: torch.sort((normalised[u[0]][u[1]] if u[1] is not None else normalised[u[0]]).flatten(),
                            descending=True).values for u in counts}
    dims = {u: min(K, max(floor, multiple * round(c / multiple))) for u, c in counts.items()}

    # greedy repair of the rounding: move `multiple` channels per head between units by the next score
    def next_score(u, grow: bool) -> float:
        idx = dims[u] * width[u] + (0 if grow else -1)
        return float(ranked[u][idx]) if 0 <= idx < ranked[u].numel() else (-math.inf if grow else math.inf)

    total = lambda: sum(width[u] * dims[u] for u in dims)  # noqa: E731
    for _ in range(len(dims) * K):
        gap = total() - requested
        if abs(gap) < min(width.values()) * multiple:
            break
        if gap < 0:
            grow = [u for u in dims if dims[u] + multiple <= K]
            if not grow:
                break
            dims[max(grow, key=lambda u: next_score(u, True))] += multiple
        else:
            shrink = [u for u in dims if dims[u] - multiple >= floor]
            if not shrink:
                break
            dims[min(shrink, key=lambda u: next_score(u, False))] -= multiple
    if granularity == "head":
        head_dims = {layer: [dims[(layer, h)] for h in range(heads[layer])] for layer in scores}
        key_dims = {layer: max(d) for layer, d in head_dims.items()}
    else:
        head_dims, key_dims = None, {layer: dims[(layer, None)] for layer in scores}
    empty = [layer for layer, k in key_dims.items() if k == 0]
    if empty and not allow_layer_removal:
        raise InputError(f"--budget {budget} with --budget-floor {floor} leaves layer(s) {', '.join(map(str, empty))} "
                         f"with K'=0 (every key channel removed); pass --allow-layer-removal to remove their token "
                         f"mixer, or a --budget-floor >= 1")
    return Budget(key_dims, requested, total(), head_dims)


def check_scored_selector(method: str, budget: str) -> None:
    """A global budget needs the selector's per-channel scores: a selector that rotates (PCA), draws (rand) or
    searches channel sets jointly has none. One check for `prune` (PruneConfig.validate) and for a table's plan
    (pipeline.spec.table_cells), so a run-table or its dry run refuses such a cell before any compute."""
    from state_reduction.pruning.selectors import SELECTORS, get_selector  # lazy: selectors is the heavier module

    if budget != "uniform" and get_selector(method).scores is None:
        scored = ", ".join(n for n, s in SELECTORS.items() if s.scores is not None)
        raise InputError(f"--budget {budget} needs per-channel scores; --method {method} has none "
                         f"(it rotates, draws or jointly searches channels); accepted with a global budget: {scored}")
