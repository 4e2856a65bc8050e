"""qkscore (issue 19 part 2): its J from the calibration Grams equals a dense computation of the squared score error
over every (query, key) token pair, greedy elimination equals a brute-force greedy on that dense J, swaps never
raise J, and a channel that carries nothing goes first."""

import itertools

import pytest
import torch

from state_reduction.pruning.calibration import _accumulate_qk
from state_reduction.pruning.selectors import _score_error, qkscore_keep, select
from state_reduction.pruning.types import LayerCalibration

B, T, H, K, D = 2, 9, 2, 6, 5


def gen(seed):
    return torch.Generator().manual_seed(seed)


def qk(seed=1):
    g = gen(seed)
    q = torch.randn(B, T, H, K, generator=g, dtype=torch.float64) * torch.linspace(0.3, 2, K, dtype=torch.float64)
    k = torch.randn(B, T, H, K, generator=g, dtype=torch.float64) * torch.linspace(2, 0.3, K, dtype=torch.float64)
    k[..., 4] = 0.7 * k[..., 1] + 0.1 * k[..., 4]  # a near-duplicate key channel: off-diagonal M matters
    return q, k


def dense_J(q, k, kept, normalised):
    """sum over all (query t, key s) token pairs of (a q_S,t . k_S,s - q_t . k_s)^2, q/k [N, K] as the kernel sees
    them, a = (mean |q_S|^2 mean |k_S|^2)^(-1/2) / (mean |q|^2 mean |k|^2)^(-1/2) when normalised, else 1."""
    S = torch.tensor(kept, dtype=torch.bool)
    full = q @ k.T
    cut = q[:, S] @ k[:, S].T
    a = 1.0
    if normalised:
        a = torch.sqrt((q.pow(2).sum(1).mean() * k.pow(2).sum(1).mean())
                       / (q[:, S].pow(2).sum(1).mean() * k[:, S].pow(2).sum(1).mean()))
    return float(((a * cut - full) ** 2).sum())


def grams(normalised, mode="kq", seed=1):
    q, k = qk(seed)
    stats = LayerCalibration(qk_l2_normalised=normalised)
    _accumulate_qk(stats, q[:1], k[:1], {"gram", "normalised_moments"})  # two calls: the sums add over batches
    _accumulate_qk(stats, q[1:], k[1:], {"gram", "normalised_moments"})
    seen = [torch.nn.functional.normalize(x, dim=-1) if normalised else x for x in (q, k)]
    seen = {"q": seen[0].reshape(B * T, H, K), "k": seen[1].reshape(B * T, H, K)}
    left, right = {"kq": "qk", "k": "kk", "q": "qq"}[mode]
    return stats, seen[left], seen[right]


@pytest.mark.parametrize("normalised", [False, True])
def test_J_from_grams_equals_the_dense_score_error(normalised):
    stats, q, k = grams(normalised)
    for h in range(H):
        G = (stats.sum_qq, stats.sum_kk) if normalised else (stats.gram_q, stats.gram_k)
        M = G[0][h] * G[1][h]
        subsets = [s for r in (1, 3, 5) for s in itertools.combinations(range(K), r)]
        kept = torch.zeros(len(subsets), K, dtype=torch.float64)
        for i, s in enumerate(subsets):
            kept[i, list(s)] = 1
        J = _score_error(M, torch.diagonal(G[0][h]), torch.diagonal(G[1][h]), kept, normalised)
        want = torch.tensor([dense_J(q[:, h], k[:, h], kept[i].bool().tolist(), normalised)
                             for i in range(len(subsets))], dtype=torch.float64)
        torch.testing.assert_close(J, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("normalised", [False, True])
@pytest.mark.parametrize("mode", ["kq", "k", "q"])
def test_greedy_equals_brute_force_greedy_on_the_dense_J_and_swaps_do_not_raise_it(mode, normalised):
    stats, q, k = grams(normalised, mode)
    w = torch.randn(H, K, D, generator=gen(0))
    for keep in (1, 3, 5):
        sel = select("qkscore", stats, w, w, keep, mode)
        swapped = select("qkscore", stats, w, w, keep, mode, swaps=10)
        for h in range(H):
            kept = [True] * K
            while sum(kept) > keep:
                costs = {j: dense_J(q[:, h], k[:, h], [c and i != j for i, c in enumerate(kept)], normalised)
                         for j in range(K) if kept[j]}
                kept[min(costs, key=lambda j: (costs[j], j))] = False
            assert sel.keep[h].tolist() == [j for j in range(K) if kept[j]]
            mask = [[j in s.keep[h].tolist() for j in range(K)] for s in (sel, swapped)]
            assert dense_J(q[:, h], k[:, h], mask[1], normalised) <= dense_J(q[:, h], k[:, h], mask[0], normalised) + 1e-9


def test_a_channel_that_carries_nothing_goes_first():
    q, k = qk()
    q[:, :, 0, 3] = 0
    k[:, :, 0, 3] = 0
    stats = LayerCalibration(qk_l2_normalised=True)
    _accumulate_qk(stats, q, k, {"gram", "normalised_moments"})
    w = torch.randn(H, K, D, generator=gen(0))
    assert 3 not in select("qkscore", stats, w, w, K - 1).keep[0].tolist()
    assert qkscore_keep(stats.sum_qq[0], stats.sum_kk[0], K - 1, True).tolist() == [0, 1, 2, 4, 5]
