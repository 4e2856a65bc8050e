"""Linearized feed-forward layers y_j = f(w_j . x) ~= <Phi(x), Psi(w_j)> and the baselines at matched budget.

Every method here has the same shape: a fixed input-side feature map Phi (frozen random projections, so the
features of a fixed input never change during training) and a trainable weight side Psi(W) [out, D]; the
output is Phi(x) @ Psi(W)^T. `budget` counts the random features (the constant feature 1 that carries the
constant term c_0 is not counted), and for the low-rank map the rank.

  ralimp   polynomial EUGen block of degree K with `poly_features` features (K groups of poly_features / K) plus the
           rational block: n_freq Gauss-Laguerre nodes x m projections x (cos, sin) towers, m = (budget -
           poly_features) / (2 n_freq) (App. D.1: 32 = 8 + 3 x 4 x 2). Atoms (A, B, p, q) act on u = t / tau^2
           with t = w . x; the atom width q enters as w -> w / q on the weight side only, so all atoms share the
           input-side towers. Per-node coefficients are free (App. B "Partial fractions") and trainable; they
           start from App. D.2's two steps: ridge least squares of f on calibration pre-activations over
           {1, t, .., t^K}, then each atom's amplitude on the residual with the atom's own node profile
           (gamma_k w_c,k, gamma_k w_s,k) of Eq. 14 (a joint fit over all node columns gave coefficients large
           enough to blow the estimator's noise up to MSE ~1e9 on the synthetic benchmark).
  eugen    the polynomial block alone, degree K with budget / K features per degree (section 2.2).
  snnk     URF-style features (Sehanobish et al. 2024, as the seed describes them in App. B): f's spectrum on
           the calibration range (least-squares fit on `budget` frequencies evenly spaced in (0, max_freq], the
           band RaLiMP's nodes cover with s_max = 4) is the proposal; budget / 2 distinct frequencies are drawn
           from it in proportion to their amplitude, each estimated with one complex-argument softmax-kernel
           projection (cos and sin towers); the coefficients start from the spectrum's own at the drawn
           frequencies and train.
  lowrank  x -> B A^T x (rank = budget), initialised from the truncated SVD of c_1 W (c_1 the least-squares slope
           of f on the calibration pre-activations).

`sphere=True` normalises x to unit norm before the rational / SNNK projections (the seed's App. D.6 recipe);
the least-squares init then maps t to u with the calibration RMS of |x|.
"""

from __future__ import annotations

import difflib
import inspect
import math

import torch
from torch import nn
from torch.nn import functional as F

from state_reduction.ralimp.errors import RalimpError
from state_reduction.ralimp.features import complex_exp_features, eugen_features
from state_reduction.ralimp.quadrature import gauss_laguerre, node_coefficients

ACTIVATIONS = {
    "gelu": F.gelu,
    "silu": F.silu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "softsign": F.softsign,
}

RIDGE = 1e-8


def _choice(kind: str, name: str, options) -> str:
    if name in options:
        return name
    close = difflib.get_close_matches(str(name), list(options), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise RalimpError(f"ralimp: unknown {kind} {name!r}, expected one of {', '.join(sorted(options))}{hint}")


def activation(name: str):
    return ACTIVATIONS[_choice("activation", name, ACTIVATIONS)]


def _check_tau(tau: float) -> float:
    if not (isinstance(tau, (int, float)) and tau > 0 and math.isfinite(tau)):
        raise RalimpError(f"ralimp: tau must be a finite number > 0, got {tau!r}")
    return float(tau)


def ridge_fit(basis: torch.Tensor, target: torch.Tensor, ridge: float = RIDGE) -> torch.Tensor:
    """argmin |basis c - target|^2 + ridge * trace-scaled |c|^2 (float64)."""
    b, y = basis.double(), target.double()
    gram = b.T @ b
    lam = ridge * gram.diagonal().mean().clamp(min=1e-30)
    return torch.linalg.solve(gram + lam * torch.eye(gram.shape[0], dtype=b.dtype), b.T @ y)


def _projection(module: nn.Module, name: str, value: torch.Tensor, trainable: bool) -> None:
    """Random projections: frozen buffers (the default, App. D.2) or trained parameters (App. D.6)."""
    if trainable:
        setattr(module, name, nn.Parameter(value))
    else:
        module.register_buffer(name, value)


class Linearization(nn.Module):
    """Base: forward(x) = Phi(x) @ Psi(W)^T; subclasses define input_features and weight_features."""

    method = ""

    def __init__(self, weight: torch.Tensor, activation_name: str, budget: int):
        super().__init__()
        if int(budget) != budget or budget < 1:
            raise RalimpError(f"ralimp: budget must be an integer >= 1, got {budget!r}")
        self.activation_name = _choice("activation", activation_name, ACTIVATIONS)
        self.budget = int(budget)
        self.out_features, self.in_features = weight.shape
        self.weight = nn.Parameter(weight.detach().clone().float())

    def input_features(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def weight_features(self) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.input_features(x) @ self.weight_features().T

    def expected(self, x: torch.Tensor) -> torch.Tensor:
        """The exact kernel the random features estimate without bias (their mean over projection draws)."""
        raise NotImplementedError

    def projections_trainable(self) -> bool:
        return any(p.requires_grad for n, p in self.named_parameters() if n.split(".")[-1] in ("G", "omega"))

    def deployed_parameters(self) -> int:
        """Parameters of the deployed layer: the folded weight side plus the input-side projections."""
        proj = sum(t.numel() for n, t in list(self.named_parameters()) + list(self.named_buffers())
                   if n.split(".")[-1] in ("G", "omega"))
        return self.weight_features().numel() + proj


class EUGenBlock(nn.Module):
    """Polynomial block sum_{n=0..K} c_n (x . w)^n with degree-n EUGen features (m per degree)."""

    def __init__(self, in_features: int, degree: int, m: int, generator: torch.Generator,
                 train_projections: bool = False):
        super().__init__()
        self.degree, self.m = degree, m
        _projection(self, "G", torch.randn(degree, m, in_features, generator=generator), train_projections)
        self.coef = nn.Parameter(torch.zeros(degree + 1))       # c_0 .. c_K

    def x_side(self, x: torch.Tensor) -> torch.Tensor:
        feats = eugen_features(x, self.G).flatten(-2)           # [..., K m]
        return torch.cat([torch.ones_like(feats[..., :1]), feats], -1)

    def w_side(self, w: torch.Tensor) -> torch.Tensor:
        feats = eugen_features(w, self.G) * self.coef[1:, None]  # [out, K, m]
        return torch.cat([self.coef[:1].expand(w.shape[0], 1), feats.flatten(-2)], -1)

    def basis(self, t: torch.Tensor) -> torch.Tensor:
        return torch.stack([t ** n for n in range(self.degree + 1)], -1)

    def expected(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """E over the projections: sum_n c_n (x . w_j)^n, [..., out]."""
        return self.basis(x @ w.T) @ self.coef.to(x.dtype)


class CosSinBlock(nn.Module):
    """sum_{a, f} (cc[a, f] cos(nu_f u / q_a) + cs[a, f] sin(nu_f u / q_a)), u = x.w / tau^2, estimated with m
    complex-argument softmax-kernel projections per frequency nu_f (shared by every atom a)."""

    def __init__(self, in_features: int, freqs: torch.Tensor, m: int, n_atoms: int, tau: float,
                 generator: torch.Generator, clamp: float | None, sphere: bool, q_init=None, train_q: bool = True,
                 train_projections: bool = False):
        super().__init__()
        self.m, self.tau, self.clamp, self.sphere = m, tau, clamp, sphere
        self.register_buffer("freqs", freqs.float())
        _projection(self, "omega", torch.randn(len(freqs), m, in_features, generator=generator), train_projections)
        self.cc = nn.Parameter(torch.zeros(n_atoms, len(freqs)))
        self.cs = nn.Parameter(torch.zeros(n_atoms, len(freqs)))
        q0 = torch.ones(n_atoms) if q_init is None else torch.as_tensor(q_init, dtype=torch.float32)
        self.log_q = nn.Parameter(q0.log(), requires_grad=train_q)

    def x_side(self, x: torch.Tensor) -> torch.Tensor:
        if self.sphere:
            x = x / x.norm(dim=-1, keepdim=True).clamp(min=1e-12)
        c, s = complex_exp_features(x / self.tau, self.omega, self.freqs, self.clamp)   # [..., F, m]
        return torch.cat([c, s], -1).flatten(-2)                                         # [..., F 2m]

    def w_side(self, w: torch.Tensor) -> torch.Tensor:
        q = self.log_q.exp()                                                              # [A]
        wa = w[:, None, :] / (self.tau * q[:, None])                                      # [out, A, d]
        c, s = complex_exp_features(wa, self.omega, self.freqs, self.clamp)              # [out, A, F, m]
        cc, cs = self.cc[None, :, :, None], self.cs[None, :, :, None]
        cos_part = (cc * c + cs * s).sum(1)          # pairs with the x cos tower
        sin_part = (cs * c - cc * s).sum(1)          # pairs with the x sin tower
        return torch.cat([cos_part, sin_part], -1).flatten(-2)                            # [out, F 2m]

    def basis(self, u: torch.Tensor) -> torch.Tensor:
        arg = u[:, None, None] * (self.freqs.double()[None, None, :] / self.log_q.detach().double().exp()[None, :, None])
        return torch.cat([torch.cos(arg).flatten(1), torch.sin(arg).flatten(1)], -1)     # [n, 2 A F]

    def expected(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """E over the projections (no clamp): sum_{a,f} cc cos(nu_f u / q_a) + cs sin(nu_f u / q_a), [..., out]."""
        if self.sphere:
            x = x / x.norm(dim=-1, keepdim=True).clamp(min=1e-12)
        u = (x @ w.T) / self.tau ** 2                                                      # [..., out]
        arg = u[..., None, None] * (self.freqs.to(x.dtype) / self.log_q.exp().to(x.dtype)[:, None])
        return (torch.cos(arg) * self.cc.to(x.dtype) + torch.sin(arg) * self.cs.to(x.dtype)).sum((-2, -1))

    def set_coefficients(self, coef: torch.Tensor) -> None:
        n = self.cc.numel()
        with torch.no_grad():
            self.cc.copy_(coef[:n].view_as(self.cc))
            self.cs.copy_(coef[n:].view_as(self.cs))


def _calibration_u(calib_t: torch.Tensor, tau: float, sphere: bool, x_rms: float | None) -> torch.Tensor:
    u = calib_t.double() / tau ** 2
    if sphere:
        if not x_rms:
            raise RalimpError("ralimp: sphere=True needs x_rms (the calibration RMS of |x|) for the least-squares init")
        u = u / x_rms
    return u


class EUGen(Linearization):
    method = "eugen"

    def __init__(self, weight, activation_name, budget, *, calib_t, generator, degree: int = 2,
                 train_projections: bool = False):
        super().__init__(weight, activation_name, budget)
        if int(degree) != degree or degree < 1:
            raise RalimpError(f"ralimp: degree must be an integer >= 1, got {degree!r}")
        if budget < degree or budget % degree:
            raise RalimpError(f"ralimp: eugen budget {budget} must be a positive multiple of degree {degree}")
        self.poly = EUGenBlock(self.in_features, degree, budget // degree, generator, train_projections)
        t = calib_t.double()
        with torch.no_grad():
            self.poly.coef.copy_(ridge_fit(self.poly.basis(t), activation(activation_name)(t)))

    def input_features(self, x):
        return self.poly.x_side(x)

    def weight_features(self):
        return self.poly.w_side(self.weight)

    def expected(self, x):
        return self.poly.expected(x, self.weight.to(x.dtype))


class RaLiMP(Linearization):
    method = "ralimp"

    def __init__(self, weight, activation_name, budget, *, calib_t, generator, degree: int = 2,
                 poly_features: int = 8, n_freq: int = 3, s_max: float | None = None, tau: float = 1.0,
                 atoms=((1.0, 0.0, 0.0, 1.0),), clamp: float | None = None, sphere: bool = False,
                 x_rms: float | None = None, train_projections: bool = False):
        super().__init__(weight, activation_name, budget)
        tau = _check_tau(tau)
        if int(degree) != degree or degree < 1:
            raise RalimpError(f"ralimp: degree must be an integer >= 1, got {degree!r}")
        if poly_features < degree or poly_features % degree:
            raise RalimpError(f"ralimp: poly_features {poly_features} must be a positive multiple of degree {degree}")
        rational = budget - poly_features
        if rational < 2 * n_freq or rational % (2 * n_freq):
            raise RalimpError(f"ralimp: budget {budget} leaves {rational} rational features after poly_features "
                             f"{poly_features}; need a positive multiple of 2 x n_freq = {2 * n_freq} "
                             f"(budget >= {poly_features + 2 * n_freq})")
        if not atoms:
            raise RalimpError("ralimp: atoms must list at least one (A, B, p, q)")
        self.nodes = gauss_laguerre(n_freq, s_max)
        self.poly = EUGenBlock(self.in_features, degree, poly_features // degree, generator, train_projections)
        s, _ = self.nodes.tensors()
        self.rational = CosSinBlock(self.in_features, s, rational // (2 * n_freq), len(atoms), tau, generator,
                                    clamp, sphere, q_init=[a[3] for a in atoms], train_projections=train_projections)
        t = calib_t.double()
        u = _calibration_u(t, tau, sphere, x_rms)
        target = activation(activation_name)(t)
        poly = ridge_fit(self.poly.basis(t), target)
        # App. D.2: the polynomial fitted first, then the atom amplitudes to the residual; each atom keeps the
        # node profile of Eq. 14 (gamma_k w_c,k, gamma_k w_s,k) and only its amplitude is fitted.
        profiles = [node_coefficients(self.nodes, *a) for a in atoms]
        s_k = torch.tensor(self.nodes.nodes, dtype=torch.float64)
        shapes = torch.stack([(torch.cos(u[:, None] * s_k / a[3]) * torch.from_numpy(wc)).sum(-1)
                              + (torch.sin(u[:, None] * s_k / a[3]) * torch.from_numpy(ws)).sum(-1)
                              for a, (wc, ws) in zip(atoms, profiles)], -1)          # [n, atoms]
        amp = ridge_fit(shapes, target - self.poly.basis(t) @ poly, ridge=1e-6)
        with torch.no_grad():
            self.poly.coef.copy_(poly)
        cc = torch.stack([torch.from_numpy(wc) * a for (wc, _), a in zip(profiles, amp)])
        cs = torch.stack([torch.from_numpy(ws) * a for (_, ws), a in zip(profiles, amp)])
        self.rational.set_coefficients(torch.cat([cc.flatten(), cs.flatten()]).float())

    def input_features(self, x):
        return torch.cat([self.poly.x_side(x), self.rational.x_side(x)], -1)

    def weight_features(self):
        return torch.cat([self.poly.w_side(self.weight), self.rational.w_side(self.weight)], -1)

    def expected(self, x):
        w = self.weight.to(x.dtype)
        return self.poly.expected(x, w) + self.rational.expected(x, w)


class SNNK(Linearization):
    method = "snnk"
    GRID_FACTOR = 2   # the spectrum is fitted on 2 x (budget / 2) harmonics, half of them are drawn

    def __init__(self, weight, activation_name, budget, *, calib_t, generator, tau: float = 1.0,
                 clamp: float | None = None, sphere: bool = False, x_rms: float | None = None,
                 train_projections: bool = False, max_freq: float = 4.0):
        super().__init__(weight, activation_name, budget)
        tau = _check_tau(tau)
        if not max_freq > 0:
            raise RalimpError(f"ralimp: snnk max_freq must be > 0, got {max_freq!r}")
        if budget < 2 or budget % 2:
            raise RalimpError(f"ralimp: snnk budget must be an even number >= 2 (cos and sin towers), got {budget}")
        n = budget // 2
        t = calib_t.double()
        u = _calibration_u(t, tau, sphere, x_rms)
        f = activation(activation_name)(t)
        n_grid = self.GRID_FACTOR * n
        grid = max_freq * torch.arange(1, n_grid + 1, dtype=torch.float64) / n_grid
        arg = u[:, None] * grid
        spec = ridge_fit(torch.cat([torch.ones_like(u[:, None]), torch.cos(arg), torch.sin(arg)], -1), f, ridge=1e-4)
        a_l, b_l = spec[1:n_grid + 1], spec[n_grid + 1:]
        amp = torch.sqrt(a_l ** 2 + b_l ** 2)
        pick = torch.multinomial(amp / amp.sum(), n, replacement=False, generator=generator)
        self.block = CosSinBlock(self.in_features, grid[pick], 1, 1, tau, generator, clamp, sphere, train_q=False,
                                 train_projections=train_projections)
        # the spectrum's own coefficients at the drawn frequencies (a truncated Fourier series), not a refit
        self.c0 = nn.Parameter(spec[:1].float())
        self.block.set_coefficients(torch.cat([a_l[pick], b_l[pick]]).float())

    def input_features(self, x):
        feats = self.block.x_side(x)
        return torch.cat([torch.ones_like(feats[..., :1]), feats], -1)

    def weight_features(self):
        feats = self.block.w_side(self.weight)
        return torch.cat([self.c0.expand(feats.shape[0], 1), feats], -1)

    def expected(self, x):
        return self.c0.to(x.dtype) + self.block.expected(x, self.weight.to(x.dtype))


class LowRank(Linearization):
    method = "lowrank"

    def __init__(self, weight, activation_name, budget, *, calib_t, generator=None):
        super().__init__(weight, activation_name, budget)
        if budget > min(self.weight.shape):
            raise RalimpError(f"ralimp: lowrank rank {budget} exceeds min(out, in) = {min(self.weight.shape)}")
        t = calib_t.double()
        c = ridge_fit(torch.stack([torch.ones_like(t), t], -1), activation(activation_name)(t))
        U, S, Vh = torch.linalg.svd(self.weight.detach().double() * c[1], full_matrices=False)
        r = budget
        self.A = nn.Parameter((Vh[:r].T * S[:r].sqrt()).float())      # [d, r]
        self.B = nn.Parameter((U[:, :r] * S[:r].sqrt()).float())      # [out, r]
        self.c0 = nn.Parameter(c[:1].float())
        del self.weight

    def input_features(self, x):
        return torch.cat([torch.ones_like(x[..., :1]), x], -1)

    def weight_features(self):
        return torch.cat([self.c0.expand(self.B.shape[0], 1), self.B @ self.A.T], -1)

    def forward(self, x):
        return (x @ self.A) @ self.B.T + self.c0

    def expected(self, x):
        return self.forward(x)

    def deployed_parameters(self) -> int:
        return self.A.numel() + self.B.numel() + 1


METHODS = {cls.method: cls for cls in (RaLiMP, EUGen, SNNK, LowRank)}


def build_linearization(method: str, weight: torch.Tensor, activation_name: str, budget: int, *,
                        calib_t: torch.Tensor, seed: int = 0, **options) -> Linearization:
    """A linearization of x -> f(x W^T) (weight [out, in]); options are the method's keyword arguments."""
    cls = METHODS[_choice("method", method, METHODS)]
    accepted = [n for n, p in inspect.signature(cls.__init__).parameters.items() if p.kind is p.KEYWORD_ONLY
                and n not in ("calib_t", "generator")]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise RalimpError(f"ralimp: method {method!r} has no option {unknown[0]!r}; accepted: {', '.join(accepted)}")
    gen = torch.Generator().manual_seed(int(seed))
    return cls(weight, activation_name, budget, calib_t=calib_t, generator=gen, **options)
