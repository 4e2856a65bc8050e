import math

import pytest
import torch

from state_reduction.ralimp import build_linearization
from state_reduction.ralimp.layers import ACTIVATIONS


def _setup(d=6, out=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, d, generator=g) * 0.3
    x = torch.randn(5, d, generator=g, dtype=torch.float64) * 0.4
    calib = (torch.randn(400, d, generator=g) * 0.4) @ w.T
    return w, x, calib.flatten()


OPTIONS = {
    "ralimp": dict(budget=32, degree=2, poly_features=8, n_freq=3, tau=1.0),
    "eugen": dict(budget=32, degree=2),
    "snnk": dict(budget=32, tau=1.0),
}


@pytest.mark.parametrize("method", sorted(OPTIONS))
def test_unbiased_over_projection_draws(method):
    """The mean over independent projection draws of the layer output approaches its exact kernel."""
    w, x, calib = _setup()
    opts = dict(OPTIONS[method])
    budget = opts.pop("budget")
    ref = build_linearization(method, w, "gelu", budget, calib_t=calib, seed=0, **opts).double()
    target = ref.expected(x)
    outs = []
    for seed in range(600):
        layer = build_linearization(method, w, "gelu", budget, calib_t=calib, seed=seed, **opts).double()
        layer.load_state_dict({k: v for k, v in ref.state_dict().items() if k.split(".")[-1] not in ("G", "omega")},
                              strict=False)
        with torch.no_grad():
            outs.append(layer(x))
    outs = torch.stack(outs)
    se = outs.std(0) / math.sqrt(len(outs))
    assert ((outs.mean(0) - target).abs() <= 4 * se + 1e-9).all()


def test_ralimp_fit_no_worse_than_polynomial():
    """The atom amplitudes are fitted to the polynomial's residual: the exact-kernel fit can only improve."""
    w, x, calib = _setup()
    for act in ACTIVATIONS:
        rl = build_linearization("ralimp", w, act, 32, calib_t=calib, seed=0).double()
        t = calib.double()
        f = ACTIVATIONS[act](t)
        poly = sum(c * t ** n for n, c in enumerate(rl.poly.coef.double()))
        u = t[:, None, None] * (rl.rational.freqs.double() / rl.rational.log_q.exp().double()[:, None])
        rat = (torch.cos(u) * rl.rational.cc.double() + torch.sin(u) * rl.rational.cs.double()).sum((-2, -1))
        assert ((poly + rat - f) ** 2).mean() <= ((poly - f) ** 2).mean() + 1e-12


def test_lowrank_full_rank_is_linear_fit():
    w, x, calib = _setup(d=4, out=4)
    layer = build_linearization("lowrank", w, "tanh", 4, calib_t=calib)
    c1 = layer.B @ layer.A.T
    ratio = (c1 / w).detach()
    torch.testing.assert_close(ratio, torch.full_like(ratio, float(ratio[0, 0])), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method,budget,opts,word", [
    ("ralimp", 10, dict(poly_features=8, n_freq=3), "budget 10"),
    ("ralimp", 32, dict(tau=0.0), "tau"),
    ("ralimp", 32, dict(tau=-1.0), "tau"),
    ("snnk", 32, dict(tau=float("nan")), "tau"),
    ("eugen", 5, dict(degree=2), "multiple of degree"),
    ("snnk", 7, {}, "even"),
    ("lowrank", 99, {}, "rank 99"),
    ("ralimp", 32, dict(atoms=()), "atoms"),
    ("ralimp", 32, dict(taus=1.0), "no option 'taus'"),
    ("relimp", 32, {}, "did you mean 'ralimp'"),
])
def test_bad_input(method, budget, opts, word):
    w, _, calib = _setup()
    with pytest.raises(ValueError, match=word):
        build_linearization(method, w, "gelu", budget, calib_t=calib, **opts)


def test_unknown_activation():
    w, _, calib = _setup()
    with pytest.raises(ValueError, match="did you mean 'gelu'"):
        build_linearization("eugen", w, "gelus", 32, calib_t=calib)
