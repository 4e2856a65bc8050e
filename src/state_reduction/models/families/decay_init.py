"""Initial decay of gated recurrences alpha = exp(-exp(A_log) * softplus(a + dt_bias)) (Gated DeltaNet, the Qwen3.5
linear layers, Mamba-2), set by half-life in tokens.

The stock inits draw A ~ U(0, 16) with dt ~ logU(1e-3, 0.1) (fla) or dt_bias = 1 (transformers Qwen3.5), so many
heads start forgetting within a few tokens (alpha^24 < 0.01), before an MQAR query reaches its key. With the input
term a ~ 0 at init, A = 1 and softplus(dt_bias) = ln 2 / h give alpha^h = 1/2 exactly.
"""

from __future__ import annotations

import math

import torch


def decay_modules(model) -> list:
    """The modules holding a per-head (A_log, dt_bias) pair, in model order."""
    return [m for m in model.modules()
            if isinstance(getattr(m, "A_log", None), torch.nn.Parameter)
            and isinstance(getattr(m, "dt_bias", None), torch.nn.Parameter)]


def init_decay_half_life(model, low: float, high: float, seed: int) -> int:
    """Every head's initial half-life log-uniform in [low, high] tokens (one draw per head, own generator, so the
    model's other weights are untouched); returns the number of heads set."""
    g = torch.Generator().manual_seed(seed)
    n = 0
    with torch.no_grad():
        for m in decay_modules(model):
            heads = m.A_log.numel()
            h = torch.exp(torch.rand(heads, generator=g, dtype=torch.float64) * math.log(high / low) + math.log(low))
            dt = math.log(2.0) / h
            m.A_log.zero_()
            m.dt_bias.copy_((dt + torch.log(-torch.expm1(-dt))).reshape(m.dt_bias.shape))  # softplus^-1
            n += heads
    return n


def initial_half_lives(model) -> list[torch.Tensor]:
    """Per decay module, each head's half-life in tokens at a = 0: ln 2 / (exp(A_log) softplus(dt_bias))."""
    return [math.log(2.0) / (m.A_log.detach().double().exp().flatten()
                             * torch.nn.functional.softplus(m.dt_bias.detach().double()).flatten())
            for m in decay_modules(model)]
