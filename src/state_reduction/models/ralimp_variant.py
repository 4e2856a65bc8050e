"""Config variants of the model families whose last MLPs are RaLiMP linearizations (state_reduction.ralimp), so a
linearized checkpoint reloads with AutoModelForCausalLM (the registry, models/families, derives one variant per family
with gated MLPs and registers it).

`ralimp_layers` lists the replaced decoder layers; `ralimp` holds the linearization's construction options
(method, budget, rank and the method's own options). The variant model builds placeholder linearizations of the
right shapes (their least-squares init runs on a fixed grid of pre-activations, never on data) and
from_pretrained then overwrites every parameter and buffer (projections, coefficients, sketch, folded weights).
"""

from __future__ import annotations

import torch
from state_reduction.ralimp.gated import GatedLinearization, gated_weights
from state_reduction.ralimp.model import LinearizedMLP, decoder_layers


RALIMP_SUFFIX = "_ralimp"
PLACEHOLDER_T = torch.linspace(-3.0, 3.0, 64, dtype=torch.float64)


def install_placeholders(model, layers: list[int], spec: dict) -> None:
    spec = dict(spec)
    method, budget, rank = spec.pop("method", "ralimp"), spec.pop("budget", 32), spec.pop("rank", 128)
    if spec.get("sphere"):
        spec["x_rms"] = 1.0
    dec = decoder_layers(model)
    gen = torch.Generator().manual_seed(0)
    for i in layers:
        # shapes only: from_pretrained builds the model on the meta device, and overwrites these values
        g, u, d = (torch.randn(w.shape, generator=gen) * 0.02
                   for w in gated_weights(dec[i].mlp, where=f"layer {i} mlp"))
        with torch.device("cpu"):
            dec[i].mlp = LinearizedMLP(GatedLinearization(g, u, d, rank=rank, method=method, budget=budget,
                                                          calib_t=PLACEHOLDER_T, seed=i, **spec))


def make_ralimp_variant(base_config: type, base_model: type, model_type: str) -> tuple[type, type]:
    """The config and causal-LM classes of `model_type` (`<stock>_ralimp`); the registry
    (`state_reduction.models.families`) derives one per family with gated MLPs."""

    class Config(base_config):
        def __init__(self, ralimp_layers=(), ralimp=None, **kwargs):
            self.ralimp_layers = [int(i) for i in ralimp_layers]
            self.ralimp = dict(ralimp or {})
            super().__init__(**kwargs)

    Config.model_type = model_type
    Config.base_model_type = base_config.model_type   # the family: teacher pairing
    Config.__name__ = Config.__qualname__ = f"RaLiMP{base_config.__name__}"

    class Model(base_model):
        config_class = Config

        def __init__(self, config):
            super().__init__(config)
            install_placeholders(self, config.ralimp_layers, config.ralimp)

    Model.__name__ = Model.__qualname__ = f"RaLiMP{base_model.__name__}"
    return Config, Model
