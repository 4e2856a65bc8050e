"""Separable random features: f(x . w) ~= <Phi(x), Psi(w)> (seed paper sections 2.2, 2.3.1, 2.3.2, App. A.4).

EUGen polynomial features (section 2.2). Shared Gaussian projections G^(1..K) [m, d]; for degree n,
    phi_n(u)_r = prod_{i<=n} (G^(i)_r . u),   E[(1/m) <phi_n(x), phi_n(w)>] = (x . w)^n.
The x side returns phi_n(x) / sqrt(m), the w side phi_n(w) / sqrt(m).

Complex-argument softmax-kernel features (section 2.3.1, Lemma 1). For frequency s and a Gaussian row omega,
with a = sqrt(s/2) (1 + i): E_omega[exp(a omega.x - a^2 |x|^2 / 2) exp(a omega.w - a^2 |w|^2 / 2)] = exp(a^2 x.w)
= exp(i s x.w) since (1 + i)^2 = 2i. Real and imaginary parts of each factor give the towers
    xi_v = sqrt(s/2) omega.v,  H_v = (s/2) |v|^2,
    phi_cos(v)_r = e^{xi_v,r} cos(xi_v,r - H_v) / sqrt(m),   phi_sin(v)_r = e^{xi_v,r} sin(xi_v,r - H_v) / sqrt(m),
    C_hat = <phi_cos(x), phi_cos(w)> - <phi_sin(x), phi_sin(w)>   -> E = cos(s x.w)
    S_hat = <phi_cos(x), phi_sin(w)> + <phi_sin(x), phi_cos(w)>   -> E = sin(s x.w),
i.e. each summand Y^c_r = e^xi cos(xi - H) with xi = sqrt(s/2) omega.(x+w), H = (s/2)(|x|^2 + |w|^2).

Variance (section 2.3.2, "the second moments are exact"; derived here with the Gaussian MGF,
E[e^{z xi}] = e^{z^2 sigma^2 / 2}, sigma^2 = (s/2) |x + w|^2):
    E[(Y^c)^2] = (e^{2 sigma^2} + cos(2 sigma^2 + 2 s t)) / 2,   E[(Y^s)^2] = (e^{2 sigma^2} - cos(2 sigma^2 + 2 s t)) / 2,
    Var C_hat = (E[(Y^c)^2] - cos^2(s t)) / m,                 Var S_hat = (E[(Y^s)^2] - sin^2(s t)) / m,
with t = x.w; the leading term e^{2 sigma^2} / (2m) depends on the inputs only through |x + w| (the seed's remark).
The input scale tau enters by x -> x / tau, w -> w / tau (so t -> t / tau^2, sigma^2 -> sigma^2 / tau^2).

`clamp` caps xi_v from above (the seed's App. D.6 safeguard, 10 there); a clamped estimator is biased.
"""

from __future__ import annotations

import math

import torch


def gaussian_projections(n: int, m: int, d: int, generator: torch.Generator, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(n, m, d, generator=generator, dtype=dtype)


def eugen_features(u: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """[..., d] x G [K, m, d] -> [..., K, m]: degree-n features prod_{i<=n} G^(i) u / sqrt(m), n = 1..K."""
    proj = (u @ G.flatten(0, 1).T).unflatten(-1, G.shape[:2])          # one GEMM for every degree
    return torch.cumprod(proj, dim=-2) / math.sqrt(G.shape[1])


def complex_exp_features(v: torch.Tensor, omega: torch.Tensor, s: torch.Tensor,
                         clamp: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """v [..., d], omega [F, m, d], s [F] -> (phi_cos, phi_sin), each [..., F, m]: the towers at frequency s_f."""
    a = torch.sqrt(s / 2)                                              # [F]
    xi = (v @ omega.flatten(0, 1).T).unflatten(-1, omega.shape[:2]) * a[:, None]   # [..., F, m]
    h = (s / 2)[:, None] * (v * v).sum(-1)[..., None, None]            # [..., F, 1]
    mag = torch.exp(xi.clamp(max=clamp) if clamp is not None else xi) / math.sqrt(omega.shape[1])
    return mag * torch.cos(xi - h), mag * torch.sin(xi - h)


def cos_sin_estimate(x: torch.Tensor, w: torch.Tensor, omega: torch.Tensor, s: torch.Tensor,
                     clamp: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(C_hat, S_hat) [..., F] for paired rows x, w [..., d]: unbiased estimates of cos(s x.w), sin(s x.w)."""
    xc, xs = complex_exp_features(x, omega, s, clamp)
    wc, ws = complex_exp_features(w, omega, s, clamp)
    return (xc * wc - xs * ws).sum(-1), (xc * ws + xs * wc).sum(-1)


def cos_sin_variance(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact variances of C_hat and S_hat with m projections (section 2.3.2), [..., F]."""
    t = (x * w).sum(-1)[..., None]
    sigma2 = (s / 2) * ((x + w) ** 2).sum(-1)[..., None]
    e, c = torch.exp(2 * sigma2), torch.cos(2 * sigma2 + 2 * s * t)
    return ((e + c) / 2 - torch.cos(s * t) ** 2) / m, ((e - c) / 2 - torch.sin(s * t) ** 2) / m
