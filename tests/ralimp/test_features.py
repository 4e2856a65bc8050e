import math

import pytest
import torch

from state_reduction.ralimp.features import complex_exp_features, cos_sin_variance, eugen_features


def _pair(d=8, scale=0.3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(d, generator=g, dtype=torch.float64) * scale,
            torch.randn(d, generator=g, dtype=torch.float64) * scale)


def test_eugen_unbiased():
    x, w = _pair(scale=0.5)
    g = torch.Generator().manual_seed(1)
    draws, m, K = 20000, 4, 3
    G = torch.randn(K, draws * m, 8, generator=g, dtype=torch.float64)
    # per-projection summands, then estimates of m projections each
    prod = (eugen_features(x, G) * eugen_features(w, G) * draws * m).view(K, draws, m).mean(-1)
    t = x @ w
    for n in range(K):
        est = prod[n]
        assert abs(est.mean() - t ** (n + 1)) < 4 * est.std() / math.sqrt(draws)


def _summands(x, w, s, draws, m, seed=1):
    g = torch.Generator().manual_seed(seed)
    om = torch.randn(len(s), draws * m, x.shape[-1], generator=g, dtype=torch.float64)
    xc, xs = complex_exp_features(x, om, s)
    wc, ws = complex_exp_features(w, om, s)
    k = draws * m
    c = ((xc * wc - xs * ws) * k).view(len(s), draws, m).mean(-1)
    sn = ((xc * ws + xs * wc) * k).view(len(s), draws, m).mean(-1)
    return c, sn


def test_cos_sin_unbiased():
    x, w = _pair()
    s = torch.tensor([0.26, 1.41, 3.6], dtype=torch.float64)
    draws = 50000
    c, sn = _summands(x, w, s, draws, 4)
    t = x @ w
    half = 4 / math.sqrt(draws)
    assert ((c.mean(1) - torch.cos(s * t)).abs() < half * c.std(1)).all()
    assert ((sn.mean(1) - torch.sin(s * t)).abs() < half * sn.std(1)).all()


@pytest.mark.parametrize("m", [1, 4])
def test_variance_formula(m):
    """Section 2.3.2: the exact variance of C_hat and S_hat against the sample variance over independent draws.
    Inputs of small norm keep the lognormal tails light enough for a 10% check at 40000 draws."""
    x, w = _pair(scale=0.25, seed=3)
    s = torch.tensor([0.26, 1.41], dtype=torch.float64)
    c, sn = _summands(x, w, s, 40000, m, seed=5)
    vc, vs = cos_sin_variance(x, w, s, m)
    torch.testing.assert_close(c.var(1), vc, rtol=0.1, atol=0)
    torch.testing.assert_close(sn.var(1), vs, rtol=0.1, atol=0)


def test_variance_grows_with_norm():
    x, w = _pair(scale=0.25)
    s = torch.tensor([1.0], dtype=torch.float64)
    small = cos_sin_variance(x, w, s, 4)[0]
    big = cos_sin_variance(2 * x, 2 * w, s, 4)[0]
    assert big.item() > 5 * small.item()
