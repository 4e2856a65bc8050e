import math
import re
import warnings

import numpy as np
import pytest
import torch

from state_reduction.pruning.selectors import (
    SELECTORS,
    get_selector,
    keep_count,
    select,
)
from state_reduction.pruning.srrqr import srrqr
from state_reduction.pruning.types import LayerCalibration

H, K, D, N = 3, 16, 12, 400
MODES = ("kq", "k", "q")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def weights(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(seed)
    scale = torch.rand(H, K, 1, generator=g) * 2  # channels of different magnitude
    return torch.randn(H, K, D, generator=g) * scale, torch.randn(H, K, D, generator=g) * scale.flip(1)


def activations(seed: int = 1):
    """q, k [N, H, K] with distinct per-channel scales and correlations; x [N, D]."""
    g = gen(seed)
    latent = torch.logspace(0, -2, K, dtype=torch.float64)[:, None]  # decaying spectrum
    mixes = [torch.randn(H, K, K, generator=g, dtype=torch.float64) * latent for _ in range(2)]
    q, k = (torch.einsum("nhj,hjk->nhk", torch.randn(N, H, K, generator=g, dtype=torch.float64), m) for m in mixes)
    x = torch.randn(N, D, generator=g, dtype=torch.float64) * torch.linspace(0.1, 3, D, dtype=torch.float64)
    return q, k, x


def calibration(q, k, x, seed: int = 2) -> LayerCalibration:
    """Statistics as calibration would accumulate them, computed here directly from the activations."""
    g = gen(seed)
    qn, kn = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    return LayerCalibration(
        n_tokens=q.shape[0],
        gram_q=torch.einsum("nhi,nhj->hij", q, q),
        gram_k=torch.einsum("nhi,nhj->hij", k, k),
        sum_q=qn.sum(0),
        sum_qq=torch.einsum("nhi,nhj->hij", qn, qn),
        sum_k=kn.sum(0),
        sum_kk=torch.einsum("nhi,nhj->hij", kn, kn),
        input_sq=(x**2).sum(0),
        saliency_q=torch.rand(H, K, generator=g, dtype=torch.float64),
        saliency_k=torch.rand(H, K, generator=g, dtype=torch.float64),
    )


@pytest.fixture(scope="module")
def setup():
    w_q, w_k = weights()
    q, k, x = activations()
    return w_q, w_k, q, k, x, calibration(q, k, x)


def top_by_loop(scores, keep):
    """Per head: the `keep` largest scores, ties to the lower index, sorted."""
    out = []
    for h in range(len(scores)):
        order = sorted(range(len(scores[h])), key=lambda j: (-scores[h][j], j))
        out.append(sorted(order[:keep]))
    return out


def uses(mode):
    return {"kq": ("q", "k"), "k": ("k",), "q": ("q",)}[mode]


@pytest.mark.parametrize("mode", MODES)
def test_l1_matches_loop(setup, mode):
    w_q, w_k, *_ = setup
    w = {"q": w_q.tolist(), "k": w_k.tolist()}
    scores = [[sum(abs(w[s][h][j][i]) for s in uses(mode) for i in range(D)) for j in range(K)] for h in range(H)]
    sel = select("l1", None, w_q, w_k, 6, mode, gen(0), 0)
    assert sel.keep.tolist() == top_by_loop(scores, 6)
    assert sel.keep.dtype == torch.int64 and sel.rotation is None


@pytest.mark.parametrize("mode", MODES)
def test_wanda_matches_loop(setup, mode):
    w_q, w_k, _, _, x, stats = setup
    w = {"q": w_q.tolist(), "k": w_k.tolist()}
    col_norm = [float(np.sqrt(sum(x[t, i].item() ** 2 for t in range(N)))) for i in range(D)]
    scores = [
        [sum(abs(w[s][h][j][i]) * col_norm[i] for s in uses(mode) for i in range(D)) for j in range(K)]
        for h in range(H)
    ]
    sel = select("wanda", stats, w_q, w_k, 5, mode, gen(0), 0)
    assert sel.keep.tolist() == top_by_loop(scores, 5)


def test_wanda_follows_the_input_norms(setup):
    w_q, w_k, *_ = setup
    stats = LayerCalibration(n_tokens=N, input_sq=torch.zeros(D, dtype=torch.float64))
    stats.input_sq[3] = 1.0  # only input feature 3 is ever non-zero
    sel = select("wanda", stats, w_q, w_k, 5, "kq", gen(0), 0)
    scores = (w_q[:, :, 3].abs() + w_k[:, :, 3].abs()).tolist()
    assert sel.keep.tolist() == top_by_loop(scores, 5)
    assert sel.keep.tolist() != select("l1", None, w_q, w_k, 5, "kq", gen(0), 0).keep.tolist()


@pytest.mark.parametrize("mode", MODES)
def test_grad_uses_saliencies(setup, mode):
    w_q, w_k, *_, stats = setup
    sal = {"q": stats.saliency_q.tolist(), "k": stats.saliency_k.tolist()}
    scores = [[sum(sal[s][h][j] for s in uses(mode)) for j in range(K)] for h in range(H)]
    assert select("grad", stats, w_q, w_k, 7, mode, gen(0), 0).keep.tolist() == top_by_loop(scores, 7)


def test_rand_seeded_and_independent_of_stats(setup):
    w_q, w_k, *_, stats = setup
    a = select("rand", stats, w_q, w_k, 4, "kq", gen(7), 0).keep
    b = select("rand", None, w_q * 0 + 1, w_k, 4, "q", gen(7), 3).keep
    c = select("rand", stats, w_q, w_k, 4, "kq", gen(8), 0).keep
    assert torch.equal(a, b) and not torch.equal(a, c)
    g = gen(7)
    ref = [sorted(torch.randperm(K, generator=g)[:4].tolist()) for _ in range(H)]
    assert a.tolist() == ref
    assert len({tuple(r) for r in a.tolist()}) > 1  # heads draw separately


def test_ties_go_to_lower_index():
    w = torch.ones(2, 8, 4)
    w[1, 5] = 2.0
    sel = select("l1", None, w, w, 3, "kq", None, 0)
    assert sel.keep.tolist() == [[0, 1, 2], [0, 1, 5]]


@pytest.mark.parametrize("method", ["l1", "wanda", "grad", "drrqr", "pca"])
def test_coupled_modes(setup, method):
    """Mode k ignores everything about queries, mode q everything about keys; kq sees both."""
    w_q, w_k, q, k, x, _stats = setup
    w_q2, w_k2 = weights(seed=5)
    q2, k2, _ = activations(seed=6)
    other = calibration(q2, k2, x, seed=7)

    def run(mode, q_side_new=False, k_side_new=False):
        s = calibration(q, k, x)
        for field in ("gram_q", "sum_q", "sum_qq", "saliency_q") if q_side_new else ():
            setattr(s, field, getattr(other, field))
        for field in ("gram_k", "sum_k", "sum_kk", "saliency_k") if k_side_new else ():
            setattr(s, field, getattr(other, field))
        sel = select(method, s, w_q2 if q_side_new else w_q, w_k2 if k_side_new else w_k, 6, mode, gen(0), 0)
        return sel.keep if sel.keep is not None else sel.rotation

    assert torch.equal(run("k"), run("k", q_side_new=True))
    assert not torch.equal(run("k"), run("k", k_side_new=True))
    assert torch.equal(run("q"), run("q", k_side_new=True))
    assert not torch.equal(run("q"), run("q", q_side_new=True))
    assert not torch.equal(run("kq"), run("kq", q_side_new=True))
    assert not torch.equal(run("kq"), run("kq", k_side_new=True))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("keep", [4, 8, 12])
def test_drrqr_equals_srrqr_on_stacked_activations(setup, mode, keep):
    w_q, w_k, q, k, _, stats = setup
    sel = select("drrqr", stats, w_q, w_k, keep, mode, gen(0), 2)
    for h in range(H):
        M = torch.cat([{"q": q, "k": k}[s][:, h] for s in uses(mode)]).numpy()  # [Q_h; K_h]
        perm, _ = srrqr(M, keep)
        assert sel.keep[h].tolist() == sorted(perm[:keep].tolist())


def test_drrqr_warns_with_fewer_tokens_than_channels(setup):
    w_q, w_k, q, k, x, _ = setup
    few = calibration(q[:5], k[:5], x[:5])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sel = select("drrqr", few, w_q, w_k, 8, "k", gen(0), 4)
    assert len(caught) == 1  # one warning per layer, naming the heads
    assert re.search(r"drrqr layer 4, heads 0, 1, 2: head 0: Gram matrix from 5 rows", str(caught[0].message))
    assert sel.keep.shape == (H, 8)


def known_covariance_stats(seed: int = 3):
    """Vectors with covariance U diag(lam) U^T (distinct lam) fed as the 'normalised keys' and queries."""
    rng = np.random.default_rng(seed)
    n = 20000
    U = np.stack([np.linalg.qr(rng.standard_normal((K, K)))[0] for _ in range(H)])  # [H, K, K]
    lam = np.r_[np.linspace(10, 6, 5), np.linspace(2, 1, K - 10), np.linspace(0.2, 0.1, 5)]
    z = np.einsum("hij,nhj->nhi", U, rng.standard_normal((n, H, K)) * np.sqrt(lam)) + rng.standard_normal((H, K))
    s = LayerCalibration(
        n_tokens=n,
        sum_k=torch.from_numpy(z.sum(0)),
        sum_kk=torch.from_numpy(np.einsum("nhi,nhj->hij", z, z)),
        sum_q=torch.from_numpy(z[::-1].sum(0) * 0.5),
        sum_qq=torch.from_numpy(np.einsum("nhi,nhj->hij", z, z) * 0.25),
    )
    return s, U, z


@pytest.mark.parametrize("method,largest", [("pca", True), ("pca-adv", False)])
def test_pca_known_covariance(method, largest):
    stats, U, z = known_covariance_stats()
    w_q, w_k = weights()
    keep = 5
    T = select(method, stats, w_q, w_k, keep, "k", gen(0), 0).rotation  # [H, keep, K]
    assert T.shape == (H, keep, K)
    for h in range(H):
        Th = T[h].numpy()
        np.testing.assert_allclose(Th @ Th.T, np.eye(keep), atol=1e-10)
        # exact against the sample covariance
        _vals, vecs = np.linalg.eigh(np.cov(z[:, h].T, bias=True))
        ref = vecs[:, ::-1][:, :keep] if largest else vecs[:, :keep]
        np.testing.assert_allclose(Th.T @ Th, ref @ ref.T, atol=1e-8)
        # and close to the population subspace
        pop = U[h][:, :keep] if largest else U[h][:, -keep:]
        assert np.linalg.norm(Th.T @ Th - pop @ pop.T, 2) < 0.05
        # rows ordered by variance, sign convention
        var = np.diag(Th @ np.cov(z[:, h].T, bias=True) @ Th.T)
        assert (np.diff(var) <= 1e-12).all() if largest else (np.diff(var) >= -1e-12).all()
        assert (Th[np.arange(keep), np.abs(Th).argmax(1)] > 0).all()


def test_pca_pools_queries_in_kq_mode():
    stats, _, z = known_covariance_stats()
    w_q, w_k = weights()
    T = select("pca", stats, w_q, w_k, 4, "kq", gen(0), 0).rotation
    for h in range(H):
        pooled = np.concatenate([z[:, h], 0.5 * z[::-1, h]])
        vecs = np.linalg.eigh(np.cov(pooled.T, bias=True))[1][:, ::-1][:, :4]
        np.testing.assert_allclose(T[h].numpy().T @ T[h].numpy(), vecs @ vecs.T, atol=1e-8)
    T_q = select("pca", stats, w_q, w_k, 4, "q", gen(0), 0).rotation
    assert not torch.allclose(T, T_q)


def test_pca_deterministic():
    stats, _, _ = known_covariance_stats()
    w_q, w_k = weights()
    a = select("pca", stats, w_q, w_k, 6, "kq", gen(0), 0).rotation
    b = select("pca", stats, w_q, w_k, 6, "kq", gen(1), 0).rotation
    assert torch.equal(a, b)


@pytest.mark.parametrize("method", sorted(SELECTORS))
def test_keep_all_is_identity(method):
    w_q, w_k = weights()
    sel = select(method, None, w_q, w_k, K, "kq", gen(0), 0)
    assert sel.keep.tolist() == [list(range(K))] * H


def test_unknown_method_suggests():
    with pytest.raises(KeyError, match=r"did you mean 'drrqr'.*known: rand, l1, wanda, grad, drrqr, pca, pca-adv"):
        get_selector("drqr")
    with pytest.raises(KeyError, match="did you mean 'pca-adv'"):
        get_selector("pca_adv")


def test_keep_count():
    assert keep_count(128, 0.75) == 32
    assert keep_count(128, 0.5) == 64
    assert keep_count(128, 0.0) == 128
    assert keep_count(100, 0.3) == 70
    assert keep_count(100, 0.5, multiple=8) == 48
    assert keep_count(16, 15 / 16) == 1
    for bad in (1.0, -0.1, 1.5, 0.97):
        with pytest.raises(ValueError, match=r"\[0, 0.9375\]"):
            keep_count(16, bad)
    with pytest.raises(ValueError, match="fewer than multiple=8"):
        keep_count(16, 0.75, multiple=8)
    with pytest.raises(ValueError, match="multiple must be a positive int"):
        keep_count(16, 0.5, multiple=0)


def test_errors(setup):
    w_q, w_k, *_, stats = setup
    with pytest.raises(ValueError, match="grad needs saliency_q/saliency_k: run calibration with gradients"):
        select("grad", LayerCalibration(n_tokens=5), w_q, w_k, 4, "kq", gen(0), 0)
    with pytest.raises(ValueError, match="wanda needs input_sq"):
        select("wanda", None, w_q, w_k, 4, "kq", gen(0), 0)
    with pytest.raises(ValueError, match="drrqr needs gram_q/gram_k"):
        select("drrqr", LayerCalibration(n_tokens=5, gram_k=stats.gram_k), w_q, w_k, 4, "kq", gen(0), 0)
    with pytest.raises(ValueError, match="pca needs sum_k/sum_kk"):
        select("pca", LayerCalibration(), w_q, w_k, 4, "k", gen(0), 0)
    bad = calibration(*activations())
    bad.gram_k[2, 3, 1] = float("nan")
    with pytest.raises(ValueError, match="drrqr: layer 9 head 2: gram_k has NaN or Inf"):
        select("drrqr", bad, w_q, w_k, 4, "kq", gen(0), 9)
    bad.saliency_q[1, 0] = float("inf")
    with pytest.raises(ValueError, match="grad: layer 9 head 1: saliency_q has NaN or Inf"):
        select("grad", bad, w_q, w_k, 4, "q", gen(0), 9)
    bad.input_sq[5] = float("nan")
    with pytest.raises(ValueError, match="wanda: layer 9 input feature 5: input_sq has NaN or Inf"):
        select("wanda", bad, w_q, w_k, 4, "kq", gen(0), 9)
    assert select("l1", None, w_q, w_k, np.int64(4), "kq", None, 0).keep.shape == (H, 4)
    w_nan = w_k.clone()
    w_nan[1, 2, 3] = float("nan")
    with pytest.raises(ValueError, match="l1: layer 0 head 1: w_k has NaN or Inf"):
        select("l1", None, w_q, w_nan, 4, "kq", gen(0), 0)
    with pytest.raises(ValueError, match=r"keep must be an int in 1..16"):
        select("l1", None, w_q, w_k, 0, "kq", gen(0), 0)
    with pytest.raises(ValueError, match=r"keep must be an int in 1..16"):
        select("l1", None, w_q, w_k, 17, "kq", gen(0), 0)
    with pytest.raises(ValueError, match="mode must be one of"):
        select("l1", None, w_q, w_k, 4, "qk", gen(0), 0)
    with pytest.raises(ValueError, match=r"\[H, K, d_in\]"):
        select("l1", None, w_q, w_k[:, :8], 4, "kq", gen(0), 0)
    short = LayerCalibration(n_tokens=N, gram_q=stats.gram_q[:2], gram_k=stats.gram_k)
    with pytest.raises(ValueError, match="gram_q has shape"):
        select("drrqr", short, w_q, w_k, 4, "kq", gen(0), 0)
    with pytest.raises(ValueError, match="rand needs a seeded torch.Generator"):
        select("rand", None, w_q, w_k, 4, "kq", None, 0)


def _with_dynamics(stats: LayerCalibration, normalised: bool, decay: bool = True) -> LayerCalibration:
    import dataclasses
    g = gen(5)
    rho = torch.rand(H, generator=g, dtype=torch.float64) * 0.9 + 0.05
    return dataclasses.replace(stats, decay_sq=rho * stats.n_tokens if decay else None,
                               gain_sq=torch.rand(H, generator=g, dtype=torch.float64) * stats.n_tokens,
                               horizon=64, qk_l2_normalised=normalised)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("normalised", [True, False])
def test_energy_matches_direct_moments(setup, mode, normalised):
    from state_reduction.pruning.selectors import energy_scores
    w_q, w_k, q, k, x, stats = setup
    stats = _with_dynamics(stats, normalised)
    acts = {"q": q, "k": k}
    if normalised:
        acts = {s: a / a.norm(dim=-1, keepdim=True) for s, a in acts.items()}
    channel = math.prod(acts[s].pow(2).mean(0) for s in uses(mode))                     # [H, K]
    rho, gain = stats.decay_sq / N, stats.gain_sq / N
    head = gain * sum(rho ** tau for tau in range(64))                                   # the truncated lag sum
    want = channel * head[:, None]
    torch.testing.assert_close(energy_scores(stats, H, K, mode), want, rtol=1e-10, atol=0)
    sel = select("energy", stats, w_q, w_k, 5, mode)
    assert sel.keep.tolist() == top_by_loop(want.tolist(), 5)


def test_energy_without_decay_uses_the_horizon_and_tends_to_aire_for_long_horizons(setup):
    import dataclasses

    from state_reduction.pruning.selectors import energy_scores
    _, _, q, k, _, stats = setup
    base = _with_dynamics(stats, True, decay=False)
    ratio = energy_scores(base, H, K) / energy_scores(dataclasses.replace(base, horizon=1), H, K)
    torch.testing.assert_close(ratio, torch.full((H, K), 64.0, dtype=torch.float64))
    long = _with_dynamics(stats, True)
    long = dataclasses.replace(long, horizon=100000)
    rho = long.decay_sq / N
    ratio = energy_scores(long, H, K) / energy_scores(dataclasses.replace(long, horizon=1), H, K)
    torch.testing.assert_close(ratio, (1 / (1 - rho))[:, None].expand(H, K))


def test_energy_needs_calibration(setup):
    w_q, w_k, *_ , stats = setup
    with pytest.raises(ValueError, match="energy needs .*horizon"):
        select("energy", stats, w_q, w_k, 4)
