"""Replace the gated MLPs of the last k decoder layers of a causal LM by RaLiMP (or a baseline) linearizations.

Calibration: forward pre-hooks record the inputs of the replaced MLPs on calibration token windows; the gate's
pre-activations t = g_j . x (n_calib of them) initialise the linearization's coefficients by least squares and
|x| gives the RMS norm the unit-sphere option needs (seed App. D.2 / D.6).
"""

from __future__ import annotations

import torch
from torch import nn

from state_reduction.ralimp.gated import GatedLinearization, gated_weights


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    lists = [m for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and n.endswith("layers")]
    if not lists:
        raise ValueError(f"ralimp: {type(model).__name__} has no decoder `layers` list")
    return lists[0]


class LinearizedMLP(nn.Module):
    """Drop-in for a decoder layer's `mlp` (accepts and ignores the extra keyword arguments layers pass)."""

    def __init__(self, gated: GatedLinearization):
        super().__init__()
        self.gated = gated

    def forward(self, x: torch.Tensor, **_) -> torch.Tensor:
        return self.gated(x)


def check_layer_count(model: nn.Module, k: int) -> list[int]:
    n = len(decoder_layers(model))
    if int(k) != k or not 1 <= k <= n:
        raise ValueError(f"ralimp: replace_layers={k!r} but {type(model).__name__} has {n} decoder layers "
                         f"(accepted: 1..{n})")
    return list(range(n - int(k), n))


@torch.no_grad()
def mlp_inputs(model: nn.Module, indices: list[int], input_ids: torch.Tensor) -> dict[int, torch.Tensor]:
    """Inputs [N, d] of the MLPs of `indices` on the calibration windows input_ids [B, T]."""
    layers, seen, hooks = decoder_layers(model), {}, []
    for i in indices:
        hooks.append(layers[i].mlp.register_forward_pre_hook(
            lambda mod, args, i=i: seen.setdefault(i, []).append(args[0].detach().flatten(0, -2).float())))
    try:
        model(input_ids=input_ids)
    finally:
        for h in hooks:
            h.remove()
    return {i: torch.cat(v) for i, v in seen.items()}


def replace_last_mlps(model: nn.Module, k: int, input_ids: torch.Tensor, *, method: str = "ralimp",
                      budget: int = 32, rank: int = 128, n_calib: int = 2000, seed: int = 0,
                      **options) -> list[int]:
    """Replace the MLPs of the last k layers in place; returns their indices. ValueError for k out of range or an
    MLP that is not gated."""
    indices = check_layer_count(model, k)
    layers = decoder_layers(model)
    weights = {i: gated_weights(layers[i].mlp, where=f"layer {i} mlp") for i in indices}
    inputs = mlp_inputs(model, indices, input_ids)
    gen = torch.Generator().manual_seed(int(seed))
    for i in indices:
        g, u, d = (w.detach().float() for w in weights[i])
        x = inputs[i]
        t = (x @ g.T).flatten()
        calib_t = t[torch.randperm(t.numel(), generator=gen)[:n_calib]]
        opts = dict(options)
        if opts.get("sphere"):
            opts.setdefault("x_rms", float(x.norm(dim=-1).pow(2).mean().sqrt()))
        gated = GatedLinearization(g, u, d, rank=rank, method=method, budget=budget, calib_t=calib_t,
                                   seed=int(seed) + i, **opts)
        layers[i].mlp = LinearizedMLP(gated).to(g.device)
    return indices
