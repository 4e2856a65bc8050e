"""The seed paper's synthetic benchmark (section 3.1, App. D.1): fit one layer Y = f(X W^T).

Data (App. D.1): X0 [n, d] and W [out, d] i.i.d. Unif[0, 1]; the pre-activation Z = X0 W^T is centred by its column
means; the layer's input is X = X0 standardised per column and its target Y = f(Z) standardised per column. Since
Z = X (W diag(std X0))^T exactly, the linearizations start from w_j = (W diag(std X0))_j and a trainable per-output
affine (a_j, b_j), initialised to the target's standardisation, maps f's estimate to the standardised target.

Training: Adam, cosine decay, gradient-norm clipping, full batch. The input-side features of the fixed X never
change (frozen projections), so the full-batch MSE is computed from their Gram matrix G = Phi^T Phi / n and
C = Phi^T Y / n, computed once: loss = mean_j (theta_j^T G theta_j - 2 theta_j^T c_j + |y_j|^2 / n) with
theta_j = a_j Psi_j + b_j e_0 (e_0 the constant feature). This is the same loss as the direct forward pass, a
(D / n)-fold cheaper step; the final MSE is measured by the direct forward pass.
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn

from state_reduction.ralimp.layers import activation, build_linearization


def make_problem(activation_name: str, seed: int, n: int = 8192, d: int = 256, out: int = 256):
    """(X [n, d], Y [n, out], W_eff [out, d], Z [n, out]) in float64."""
    gen = torch.Generator().manual_seed(int(seed))
    x0 = torch.rand(n, d, generator=gen, dtype=torch.float64)
    w = torch.rand(out, d, generator=gen, dtype=torch.float64)
    z = x0 @ w.T
    z = z - z.mean(0)
    mu, sd = x0.mean(0), x0.std(0)
    x = (x0 - mu) / sd
    y = activation(activation_name)(z)
    y = (y - y.mean(0)) / y.std(0)
    return x, y, w * sd, z


def _cosine(total: int):
    return lambda step: 0.5 * (1 + math.cos(math.pi * min(step, total) / total))


def fit(method: str, activation_name: str, seed: int, *, budget: int = 32, steps: int = 3000, lr: float = 1e-2,
        clip: float = 10.0, batch_size: int | None = None, n: int = 8192, d: int = 256, out: int = 256, n_calib: int = 2000,
        options: dict | None = None) -> dict:
    """Train one linearization on one problem; returns metrics (train_mse, init_mse, ...)."""
    t0 = time.perf_counter()
    x, y, w_eff, z = make_problem(activation_name, seed, n, d, out)
    gen = torch.Generator().manual_seed(int(seed) + 1)
    calib_t = z.flatten()[torch.randperm(z.numel(), generator=gen)[:n_calib]]
    options = dict(options or {})
    if options.get("sphere"):
        options.setdefault("x_rms", float(x.norm(dim=1).pow(2).mean().sqrt()))
    layer = build_linearization(method, w_eff.float(), activation_name, budget, calib_t=calib_t,
                                seed=int(seed) + 2, **options)
    raw = activation(activation_name)(z)
    scale = nn.Parameter((1 / raw.std(0)).float())
    shift = nn.Parameter((-raw.mean(0) / raw.std(0)).float())
    direct = layer.projections_trainable()
    xf, yf = x.float(), y.float()
    with torch.no_grad():
        phi = layer.input_features(xf).double()                    # [n, D], fixed unless projections train
    gram, cross, yy = phi.T @ phi / n, phi.T @ y / n, (y * y).mean(0)

    def direct_loss():
        th = theta().float()
        idx = torch.randint(n, (batch_size,), generator=gen) if batch_size and batch_size < n else slice(None)
        return ((layer.input_features(xf[idx]) @ th.T - yf[idx]) ** 2).mean()

    def theta():
        psi = layer.weight_features().double() * scale.double()[:, None]     # [out, D]
        return psi + torch.nn.functional.one_hot(torch.tensor(0), psi.shape[1]).double() * shift.double()[:, None]

    def gram_loss():
        th = theta()
        return (((th @ gram) * th).sum(1) - 2 * (th * cross.T).sum(1) + yy).mean()

    params = [p for p in list(layer.parameters()) + [scale, shift] if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _cosine(steps))
    with torch.no_grad():
        init_mse = float(gram_loss())
    finite = True
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = direct_loss() if direct else gram_loss()
        if not torch.isfinite(loss):
            finite = False
            break
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        sched.step()
    with torch.no_grad():
        phi = layer.input_features(xf).double() if direct else phi
        gram, cross = phi.T @ phi / n, phi.T @ y / n
        pred = (phi @ theta().T) if finite else None
        train_mse = float(((pred - y) ** 2).mean()) if finite else float("nan")
        gram_mse = float(gram_loss()) if finite else float("nan")
    return {"train_mse": train_mse, "init_mse": init_mse, "gram_mse": gram_mse, "finite": float(finite),
            "feature_dim": float(phi.shape[1]), "deployed_parameters": float(layer.deployed_parameters()),
            "fit_time_s": time.perf_counter() - t0}
