"""Gated (SwiGLU) replacement with the folded weight side (seed paper App. C.5, "Implementation of RaLiMP in LLMs").

A gated MLP y = W_d [SiLU(G x) * (U x)] with G, U [F, d] and W_d [d_out, F]. With SiLU(g_j . x) ~= <Phi(x), Psi(g_j)>
(any linearization of layers.py), the gated product is a Hadamard product of two dot-product matrices,
    M_ij = <Phi(x_i), Psi(g_j)> (x_i . u_j) = <Phi(x_i) (x) x_i, Psi(g_j) (x) u_j>      ((x): Kronecker product).
Its rank-r factorisation (Eq. 37 reconstructed; the text keeps only that it is unbiased and never materialises
d^2-length vectors) sketches the Kronecker product with Gaussian P [r, D], Q [r, d]:
    v(x) = (P Phi(x)) * (Q x)                  [r]
    w_j  = (P Psi(g_j)) * (Q u_j) / r          [r],     E_{P,Q}[<v(x), w_j>] = M_ij,
since E[(p.a)(p.b)] = a.b and E[(q.c)(q.e)] = c.e for independent Gaussian rows. The weight side folds once:
    y(x) = W_d W^T v(x) = W_fold v(x),  W_fold = W_d W^T  [d_out, r]   (W [F, r] the rows w_j),
so a token costs one feature map, P Phi(x) (r D), Q x (r d) and W_fold v (r d_out): the wide F-dimensional
intermediate is never formed.
"""

from __future__ import annotations

import torch
from torch import nn

from state_reduction.ralimp.errors import RalimpError
from state_reduction.ralimp.layers import build_linearization

GATED_NAMES = ("gate_proj", "up_proj", "down_proj")


def gated_weights(mlp: nn.Module, where: str = "mlp") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(G [F, d], U [F, d], W_d [d_out, F]) of a SwiGLU MLP; RalimpError for an MLP that is not gated."""
    missing = [n for n in GATED_NAMES if not isinstance(getattr(mlp, n, None), nn.Linear)]
    if missing:
        raise RalimpError(f"ralimp: gated form requested but {where} ({type(mlp).__name__}) is not a gated MLP: "
                         f"no {', '.join(missing)} (needs {', '.join(GATED_NAMES)})")
    act = getattr(mlp, "hidden_act", "swish")
    if act not in ("swish", "silu"):
        raise RalimpError(f"ralimp: gated form linearizes SiLU, but {where} has hidden_act={act!r} (accepted: swish, silu)")
    return mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight


class GatedLinearization(nn.Module):
    """Trainable SwiGLU replacement: SiLU gate linearized by `method`, Hadamard product sketched at rank r."""

    def __init__(self, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, *, rank: int, method: str = "ralimp",
                 budget: int = 32, calib_t: torch.Tensor, seed: int = 0, **options):
        super().__init__()
        if int(rank) != rank or rank < 1:
            raise RalimpError(f"ralimp: rank must be an integer >= 1, got {rank!r}")
        self.gate = build_linearization(method, gate, "silu", budget, calib_t=calib_t, seed=seed, **options)
        d = gate.shape[1]
        gen = torch.Generator().manual_seed(int(seed) + 7919)
        dim = self.gate.input_features(torch.zeros(1, d)).shape[-1]
        self.rank = int(rank)
        self.register_buffer("P", torch.randn(rank, dim, generator=gen))
        self.register_buffer("Q", torch.randn(rank, d, generator=gen))
        self.up = nn.Parameter(up.detach().clone().float())
        self.down = nn.Parameter(down.detach().clone().float())

    def input_side(self, x: torch.Tensor) -> torch.Tensor:
        """v(x) [..., r]."""
        return (self.gate.input_features(x) @ self.P.T) * (x @ self.Q.T)

    def weight_side(self) -> torch.Tensor:
        """W [F, r]: the rows w_j."""
        return (self.gate.weight_features() @ self.P.T) * (self.up @ self.Q.T) / self.rank

    def folded_weight(self) -> torch.Tensor:
        """W_fold = W_d W [d_out, r]."""
        return self.down @ self.weight_side()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.input_side(x) @ self.folded_weight().T

    def unfolded(self, x: torch.Tensor) -> torch.Tensor:
        """The same estimate through the wide intermediate M_hat = v W^T [..., F] (reference for tests)."""
        return (self.input_side(x) @ self.weight_side().T) @ self.down.T

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        """The un-sketched gated product W_d [<Phi(x), Psi(g_j)> (x . u_j)] that the rank-r sketch estimates."""
        return ((self.gate(x)) * (x @ self.up.T)) @ self.down.T

    def fold(self) -> "FoldedGatedMLP":
        return FoldedGatedMLP(self)


class FoldedGatedMLP(nn.Module):
    """Inference form: the input-side feature map, P, Q and one [d_out, r] matrix."""

    def __init__(self, source: GatedLinearization):
        super().__init__()
        with torch.no_grad():
            self.features = source.gate
            self.register_buffer("P", source.P.clone())
            self.register_buffer("Q", source.Q.clone())
            self.folded = nn.Parameter(source.folded_weight().detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = (self.features.input_features(x) @ self.P.T) * (x @ self.Q.T)
        return v @ self.folded.T

    def deployed_parameters(self) -> int:
        proj = sum(t.numel() for n, t in self.features.named_buffers() if n.split(".")[-1] in ("G", "omega"))
        proj += sum(p.numel() for n, p in self.features.named_parameters() if n.split(".")[-1] in ("G", "omega"))
        return self.folded.numel() + self.P.numel() + self.Q.numel() + proj

    def flops_per_token(self) -> int:
        """Multiply-adds x 2 of one token: the projections of the feature map, P Phi, Q x and the folded matrix."""
        d = self.Q.shape[1]
        proj = sum(t.numel() for n, t in list(self.features.named_buffers()) + list(self.features.named_parameters())
                   if n.split(".")[-1] in ("G", "omega"))
        r, dim = self.P.shape
        return 2 * (proj + r * dim + r * d + self.folded.numel())


def dense_gated_flops_per_token(gate: torch.Tensor, down: torch.Tensor) -> int:
    return 2 * (2 * gate.numel() + down.numel())


__all__ = ["GatedLinearization", "FoldedGatedMLP", "gated_weights", "dense_gated_flops_per_token"]
