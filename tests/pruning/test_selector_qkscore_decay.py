"""qkscore-decay (issue 19): its streaming statistic equals a direct O(T^2) sum over (query, key) pairs with the
decay weights, a = 1 gives the causal all-pairs form, value heads add into their key head, J from it equals the
dense weighted score error, and the selection on a hand example keeps the channel recent pairs need."""

import itertools

import pytest
import torch

from state_reduction.pruning.calibration import _accumulate_qk, accumulate_decay_gram
from state_reduction.pruning.selectors import _score_error, select
from state_reduction.pruning.types import LayerCalibration

B, T, Hk, K = 2, 7, 2, 5


def data(seed=3, hv=Hk):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, Hk, K, generator=g, dtype=torch.float64)
    k = torch.randn(B, T, Hk, K, generator=g, dtype=torch.float64)
    a = torch.rand(B, T, hv, generator=g, dtype=torch.float64) * 0.9 + 0.05
    return q, k, a


def direct(q, k, a, v):
    """sum_{s <= t} w_ts^2 (q_t q_t^T) o (k_s k_s^T), w_ts = prod_{s < r <= t} a_r, value head v (a [B, T, H_v])."""
    hv = a.shape[-1]
    h = v // (hv // Hk)
    M = torch.zeros(K, K, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            for s in range(t + 1):
                w = torch.prod(a[b, s + 1:t + 1, v]) if s < t else torch.tensor(1.0, dtype=torch.float64)
                M += w ** 2 * torch.outer(q[b, t, h], q[b, t, h]) * torch.outer(k[b, s, h], k[b, s, h])
    return M


def test_streaming_statistic_equals_the_direct_pair_sum():
    q, k, a = data()
    stats = LayerCalibration()
    accumulate_decay_gram(stats, q[:1], k[:1], a[:1])  # two calls: the sums add over batches
    accumulate_decay_gram(stats, q[1:], k[1:], a[1:])
    for h in range(Hk):
        assert torch.allclose(stats.decay_score_gram[h], direct(q, k, a, h), rtol=1e-10, atol=1e-10)


def test_value_heads_add_into_their_key_head():
    q, k, a = data(hv=2 * Hk)
    stats = LayerCalibration()
    accumulate_decay_gram(stats, q, k, a)
    for h in range(Hk):
        want = direct(q, k, a, 2 * h) + direct(q, k, a, 2 * h + 1)
        assert torch.allclose(stats.decay_score_gram[h], want, rtol=1e-10, atol=1e-10)


def test_no_decay_is_the_causal_all_pairs_form():
    q, k, _ = data()
    stats, ones = LayerCalibration(), LayerCalibration()
    accumulate_decay_gram(stats, q, k, None)
    accumulate_decay_gram(ones, q, k, torch.ones(B, T, Hk, dtype=torch.float64))
    assert torch.allclose(stats.decay_score_gram, ones.decay_score_gram, rtol=1e-12)
    for h in range(Hk):
        causal = sum(torch.outer(q[b, t, h], q[b, t, h]) * torch.outer(k[b, s, h], k[b, s, h])
                     for b in range(B) for t in range(T) for s in range(t + 1))
        assert torch.allclose(stats.decay_score_gram[h], causal, rtol=1e-10)
    # and it is not the all-pairs M of qkscore (which pairs s > t and across windows too)
    plain = LayerCalibration()
    _accumulate_qk(plain, q, k, {"gram"})
    assert not torch.allclose(stats.decay_score_gram, plain.gram_q * plain.gram_k)


@pytest.mark.parametrize("normalised", [False, True])
def test_J_from_the_statistic_equals_the_dense_weighted_score_error(normalised):
    q, k, a = data()
    seen = [torch.nn.functional.normalize(x, dim=-1) if normalised else x for x in (q, k)]
    stats = LayerCalibration(qk_l2_normalised=normalised)
    accumulate_decay_gram(stats, seen[0], seen[1], a)
    _accumulate_qk(stats, q, k, {"gram", "normalised_moments"})
    h = 1
    Gq, Gk = (stats.sum_qq[h], stats.sum_kk[h]) if normalised else (stats.gram_q[h], stats.gram_k[h])
    for r in (1, 2, 4):
        for S in itertools.combinations(range(K), r):
            kept = torch.zeros(1, K, dtype=torch.float64)
            kept[0, list(S)] = 1
            scale = 1.0
            if normalised:
                scale = torch.sqrt(Gq.trace() * Gk.trace() / (Gq.diagonal()[list(S)].sum() * Gk.diagonal()[list(S)].sum()))
            dense = 0.0
            for b in range(B):
                for t in range(T):
                    for s in range(t + 1):
                        w = torch.prod(a[b, s + 1:t + 1, h]) if s < t else 1.0
                        qt, ks = seen[0][b, t, h], seen[1][b, s, h]
                        dense += float(w ** 2 * (scale * qt[list(S)] @ ks[list(S)] - qt @ ks) ** 2)
            J = _score_error(stats.decay_score_gram[h], Gq.diagonal(), Gk.diagonal(), kept, normalised)
            assert float(J[0]) == pytest.approx(dense, rel=1e-9)


def test_selection_keeps_the_channel_recent_pairs_need():
    """Hand example, one head, K = 2, unnormalised: channel 0 carries the scores of pairs far apart, channel 1
    those of neighbouring tokens. With a fast decay, qkscore-decay keeps channel 1; with a = 1 (all pairs
    weighted alike) the far pairs dominate and it keeps channel 0, as plain qkscore does."""
    T2 = 6
    q = torch.zeros(1, T2, 1, 2, dtype=torch.float64)
    k = torch.zeros(1, T2, 1, 2, dtype=torch.float64)
    k[0, 0, 0, 0] = 3.0  # one early key on channel 0, read by every later query
    q[0, 1:, 0, 0] = 1.0
    for t in range(1, T2):  # each token writes channel 1 and the next token reads it
        k[0, t - 1, 0, 1] = 1.0
        q[0, t, 0, 1] = 1.0
    picks = {}
    for name, a in (("fast", torch.full((1, T2, 1), 0.1, dtype=torch.float64)), ("none", None)):
        stats = LayerCalibration(qk_l2_normalised=False)
        _accumulate_qk(stats, q, k, {"gram", "normalised_moments"})
        accumulate_decay_gram(stats, q, k, a)
        w = torch.zeros(1, 2, 3)
        picks[name] = select("qkscore-decay", stats=stats, w_q=w, w_k=w, keep=1, mode="kq",
                             generator=torch.Generator(), layer=0).keep.flatten().tolist()
        picks["plain"] = select("qkscore", stats=stats, w_q=w, w_k=w, keep=1, mode="kq",
                                generator=torch.Generator(), layer=0).keep.flatten().tolist()
    assert picks == {"fast": [1], "none": [0], "plain": [0]}


@pytest.mark.parametrize("mode", ["kq", "k", "q"])
def test_selection_is_the_greedy_on_the_decay_weighted_J(mode):
    """Every mode keeps the query-key M; a(S) comes from (G_q, G_k), (G_k, G_k) or (G_q, G_q). The selection
    equals a plain greedy elimination written with `_score_error` (the dense-checked J above)."""
    q, k, a = data()
    seen = [torch.nn.functional.normalize(x, dim=-1) for x in (q, k)]
    stats = LayerCalibration(qk_l2_normalised=True)
    accumulate_decay_gram(stats, seen[0], seen[1], a)
    _accumulate_qk(stats, q, k, {"gram", "normalised_moments"})
    w = torch.zeros(Hk, K, 3)
    got = select("qkscore-decay", stats=stats, w_q=w, w_k=w, keep=2, mode=mode, generator=None, layer=0).keep
    G = {"q": stats.sum_qq, "k": stats.sum_kk}
    left, right = {"kq": "qk", "k": "kk", "q": "qq"}[mode]
    for h in range(Hk):
        kept = torch.ones(K, dtype=torch.float64)
        while int(kept.sum()) > 2:
            cands = [j for j in range(K) if kept[j]]
            rows = kept.repeat(len(cands), 1)
            rows[range(len(cands)), cands] = 0
            J = _score_error(stats.decay_score_gram[h], G[left][h].diagonal(), G[right][h].diagonal(), rows, True)
            kept[cands[int(torch.argmin(J))]] = 0
        assert got[h].tolist() == torch.nonzero(kept).flatten().tolist()
