import torch

from state_reduction.ralimp.synthetic import fit, make_problem


def test_problem_is_exact_reparametrisation():
    x, y, w_eff, z = make_problem("tanh", 0, n=64, d=8, out=4)
    torch.testing.assert_close(x @ w_eff.T, z)
    torch.testing.assert_close(y.mean(0), torch.zeros(4, dtype=y.dtype), atol=1e-12, rtol=0)
    torch.testing.assert_close(y.std(0), torch.ones(4, dtype=y.dtype))


def test_gram_loss_equals_direct_mse():
    for method in ("ralimp", "eugen", "snnk", "lowrank"):
        budget = {"ralimp": 12, "lowrank": 4}.get(method, 8)
        r = fit(method, "silu", 1, budget=budget, steps=5, n=128, d=8, out=4, n_calib=200,
                options=dict(poly_features=6, n_freq=1) if method == "ralimp" else None)
        assert abs(r["train_mse"] - r["gram_mse"]) <= 1e-6 * max(1.0, r["train_mse"])


def test_training_lowers_the_loss():
    r = fit("eugen", "gelu", 0, budget=8, steps=50, n=256, d=8, out=4, n_calib=200,
            options=dict(train_projections=True))
    assert r["train_mse"] < r["init_mse"]
