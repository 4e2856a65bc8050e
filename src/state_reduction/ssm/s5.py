"""An S5-style diagonal state space model in torch (Smith et al. 2023), the home setting of AIRE-Prune.

Each layer holds P complex modes shared by H input/output features (MIMO):

    x_t = lambda_bar * x_{t-1} + B_bar u_t          x [P] complex, u [H] real
    y_t = Re(C x_t) + D * u_t                        C [H, P] complex, D [H] real

with the zero-order-hold discretisation lambda_bar = exp(lambda * dt), B_bar = (lambda_bar - 1) / lambda * B and
the stable parameterisation Re(lambda) = -exp(log_neg_real) < 0, so |lambda_bar| < 1 for every dt > 0. Each mode
has its own timescale dt = exp(log_dt). Initialisation: S4D-Lin (lambda_n = -1/2 + i pi n), log_dt uniform in
[log 1e-3, log 1e-1]. A layer is pre-norm: u -> LayerNorm -> SSM -> GELU -> linear -> + u.

Pruning a mode is structural: `keep` (a bool buffer [P] per layer) removes the mode's row of B_bar and
column of C, which is exactly a model with that mode deleted (the modes do not interact).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class S5Config:
    vocab_size: int
    n_classes: int
    d_model: int = 64
    d_state: int = 32
    n_layers: int = 4
    dt_min: float = 1e-3
    dt_max: float = 1e-1
    dropout: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


class DiagonalSSM(nn.Module):
    def __init__(self, d_model: int, d_state: int, dt_min: float, dt_max: float):
        super().__init__()
        h, p = d_model, d_state
        self.log_neg_real = nn.Parameter(torch.full((p,), math.log(0.5)))
        self.imag = nn.Parameter(math.pi * torch.arange(p, dtype=torch.float32))
        self.log_dt = nn.Parameter(torch.empty(p).uniform_(math.log(dt_min), math.log(dt_max)))
        # B [P, H] and C [H, P] as (real, imag) pairs; variance-preserving scales
        self.B = nn.Parameter(torch.randn(p, h, 2) / math.sqrt(2 * h))
        self.C = nn.Parameter(torch.randn(h, p, 2) / math.sqrt(2 * p))
        self.D = nn.Parameter(torch.randn(h))
        self.register_buffer("keep", torch.ones(p, dtype=torch.bool))

    def continuous_lambda(self) -> torch.Tensor:
        return torch.complex(-torch.exp(self.log_neg_real), self.imag)

    def discrete(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(lambda_bar [P], B_bar [P, H], C [H, P]) after ZOH, with pruned modes' B_bar rows and C columns zeroed."""
        lam = self.continuous_lambda()
        lam_bar = torch.exp(lam * torch.exp(self.log_dt))
        b = torch.view_as_complex(self.B.contiguous())
        c = torch.view_as_complex(self.C.contiguous())
        b_bar = ((lam_bar - 1) / lam)[:, None] * b
        mask = self.keep.to(b_bar.real.dtype)
        return lam_bar, b_bar * mask[:, None], c * mask[None, :]

    def states(self, u: torch.Tensor) -> torch.Tensor:
        """u [B, T, H] real -> x [B, T, P] complex: the causal convolution of B_bar u with lambda_bar^k (by FFT)."""
        lam_bar, b_bar, _ = self.discrete()
        t = u.shape[1]
        bu = torch.einsum("bth,ph->btp", u.to(b_bar.dtype), b_bar)                      # [B, T, P]
        powers = lam_bar[None, :] ** torch.arange(t, device=u.device, dtype=u.dtype)[:, None]   # [T, P]
        n = 2 * t
        x = torch.fft.ifft(torch.fft.fft(bu, n=n, dim=1) * torch.fft.fft(powers, n=n, dim=0)[None], dim=1)
        return x[:, :t]

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        _, _, c = self.discrete()
        x = self.states(u)
        return torch.einsum("btp,hp->bth", x, c).real + self.D * u


class S5Block(nn.Module):
    def __init__(self, cfg: S5Config):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.d_model)
        self.ssm = DiagonalSSM(cfg.d_model, cfg.d_state, cfg.dt_min, cfg.dt_max)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return u + self.drop(self.out(nn.functional.gelu(self.ssm(self.norm(u)))))


class S5Classifier(nn.Module):
    """Embedding -> n_layers S5 blocks -> LayerNorm -> mean over the valid positions -> linear head."""

    def __init__(self, cfg: S5Config):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(S5Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.n_classes)

    def ssm_layers(self) -> list[DiagonalSSM]:
        return [b.ssm for b in self.blocks]

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] (right-padded), lengths [B] -> logits [B, n_classes]. Causal layers, so padding after a
        sequence never reaches its valid positions."""
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h)
        h = self.norm(h)
        valid = (torch.arange(tokens.shape[1], device=tokens.device)[None] < lengths[:, None]).to(h.dtype)
        return self.head((h * valid[..., None]).sum(1) / lengths[:, None].to(h.dtype))

    def set_keep(self, keep: list[torch.Tensor]) -> None:
        if len(keep) != self.cfg.n_layers:
            raise ValueError(f"S5Classifier.set_keep: {len(keep)} masks for {self.cfg.n_layers} layers")
        for ssm, k in zip(self.ssm_layers(), keep):
            if k.shape != ssm.keep.shape:
                raise ValueError(f"S5Classifier.set_keep: mask of shape {tuple(k.shape)}, layer has {tuple(ssm.keep.shape)} modes")
            ssm.keep.copy_(k)
