"""Replace the gated MLPs of the last k decoder layers of a causal LM by RaLiMP (or a baseline) linearizations.

Calibration: forward pre-hooks record the inputs of the replaced MLPs on calibration token windows; the gate's
pre-activations t = g_j . x (n_calib of them) initialise the linearization's coefficients by least squares and
|x| gives the RMS norm the unit-sphere option needs (seed App. D.2 / D.6).

Local distillation (`fit_steps` > 0): each replacement then trains, alone, to reproduce its dense MLP's output on
those calibration inputs (Adam on the relative squared error |y_hat - y|^2 / |y|^2, every trainable parameter of
the replacement: the weight side, coefficients and atom widths; the random projections stay frozen unless the
method trains them). The seed's LLM recipe (App. D.6.2) fits the replacement layers by supervised fine-tuning of
the whole model for 40k-64k steps before distilling; a CPU budget of tens of end-to-end steps cannot do that, and
this layer-wise fit on the dense model's own activations is the cheap stand-in (the end-to-end KD of RFT follows).
"""

from __future__ import annotations

import torch
from torch import nn

from state_reduction.ralimp.errors import RalimpError
from state_reduction.ralimp.gated import GATED_NAMES, GatedLinearization, gated_weights


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    lists = [m for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and n.endswith("layers")]
    if not lists:
        raise RalimpError(f"ralimp: {type(model).__name__} has no decoder `layers` list")
    return lists[0]


class LinearizedMLP(nn.Module):
    """Drop-in for a decoder layer's `mlp` (accepts and ignores the extra keyword arguments layers pass)."""

    def __init__(self, gated: GatedLinearization):
        super().__init__()
        self.gated = gated

    def forward(self, x: torch.Tensor, **_) -> torch.Tensor:
        return self.gated(x)


def check_layer_count(model: nn.Module, k) -> list[int]:
    """The indices of the last k decoder layers (k an integer, or "all")."""
    n = len(decoder_layers(model))
    if k == "all":
        k = n
    if isinstance(k, bool) or not isinstance(k, (int, float)) or int(k) != k or not 1 <= k <= n:
        raise RalimpError(f"ralimp: replace_layers={k!r} but {type(model).__name__} has {n} decoder layers "
                          f"(accepted: 1..{n} or 'all')")
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


def relative_error(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """|pred - target|^2 / |target|^2 over all entries."""
    return (pred - target).pow(2).sum() / target.pow(2).sum().clamp(min=1e-30)


def fit_to_dense(gated: GatedLinearization, x: torch.Tensor, y: torch.Tensor, *, steps: int, lr: float = 3e-3,
                 batch_size: int = 512, seed: int = 0) -> dict:
    """Train `gated` alone to map the calibration inputs x [N, d] to the dense MLP's outputs y [N, d_out] (module
    docstring); returns the relative error on all of x before and after."""
    if int(steps) != steps or steps < 0:
        raise RalimpError(f"ralimp: fit_steps must be an integer >= 0, got {steps!r}")
    if not lr > 0:
        raise RalimpError(f"ralimp: fit_lr must be > 0, got {lr!r}")
    with torch.no_grad():
        before = float(relative_error(gated(x), y))
    params = [p for p in gated.parameters() if p.requires_grad]
    if steps and params:
        opt = torch.optim.Adam(params, lr=lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=int(steps))
        gen = torch.Generator().manual_seed(int(seed))
        for _ in range(int(steps)):
            idx = torch.randint(0, x.shape[0], (min(batch_size, x.shape[0]),), generator=gen)
            loss = relative_error(gated(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
    with torch.no_grad():
        after = float(relative_error(gated(x), y))
    return {"rel_error_init": before, "rel_error_fit": after}


def replace_last_mlps(model: nn.Module, k, input_ids: torch.Tensor, *, method: str = "ralimp",
                      budget: int = 32, rank: int = 128, n_calib: int = 2000, seed: int = 0, fit_steps: int = 0,
                      fit_lr: float = 3e-3, report: dict | None = None, **options) -> list[int]:
    """Replace the MLPs of the last k layers (k an integer or "all") in place; returns their indices. RalimpError
    for k out of range or an MLP that is not gated. `fit_steps` > 0: local distillation of each replacement
    (fit_to_dense); `report` (a dict) receives per layer the relative errors of fit_to_dense."""
    indices = check_layer_count(model, k)
    layers = decoder_layers(model)
    for i in indices:
        if getattr(layers[i], "mlp", None) is None:
            raise RalimpError(f"ralimp: gated form requested but layer {i} of {type(model).__name__} has no MLP "
                              f"(needs a gated MLP with {', '.join(GATED_NAMES)})")
    weights = {i: gated_weights(layers[i].mlp, where=f"layer {i} mlp") for i in indices}
    inputs = mlp_inputs(model, indices, input_ids)
    with torch.no_grad():  # the dense outputs, before any layer is replaced (each fit sees the dense model's inputs)
        targets = {i: layers[i].mlp(inputs[i].to(weights[i][0].dtype)).float() for i in indices}
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
        fit = fit_to_dense(gated, x, targets[i], steps=fit_steps, lr=fit_lr, seed=int(seed) + i)
        if report is not None:
            report[i] = fit
        layers[i].mlp = LinearizedMLP(gated).to(g.device)
    return indices
