"""Config variants for key dimensions that differ per layer (layer-adaptive budgets, `pruning.budgets`; issue 17).

Each stock config holds one key dimension for every layer (DeltaNet `expand_k`, Gated DeltaNet `head_dim`,
Mamba-2 `state_size`, Qwen3.5 `linear_key_head_dim`). A model type `<stock>_kdim` (one per family, a subclass of the
stock config and model) keeps the stock field at the largest K' and records each reducible layer's own K' in

- `layer_key_dims`: {layer index (str, as JSON writes it): K'},
- `removed_mixers`: layers whose K' is 0 (`prune --allow-layer-removal`): their token mixer is a `ZeroMixer`
  (models/shed.py, the residual passes through), placed by the family's `StructureLayout`,

then builds the stock model and narrows each listed mixer to its K' through the family's own key-channel surgery
(`adapter.apply_selection` with the first K' channels: shapes only, `from_pretrained` then loads the weights), so
`AutoModelForCausalLM.from_pretrained` reloads it. A uniform budget never produces this variant.
"""

from __future__ import annotations

import torch

from state_reduction.models.shed import remove_mixer
from state_reduction.pruning.types import KeyChannelSelection

KDIM_SUFFIX = "_kdim"


def narrow_mixers(model, layer_key_dims: dict, adapter) -> None:
    """Narrow every mixer listed in `layer_key_dims` to its K' (the first K' channels of each key head)."""
    for ref in adapter.mixers(model):
        k = layer_key_dims.get(str(ref.layer))
        w_q, _ = adapter.qk_weights(ref.module)
        heads, channels = w_q.shape[:2]
        if k is not None and k != channels:
            keep = torch.arange(k, device="cpu").expand(heads, k).clone()  # cpu: from_pretrained builds on meta
            adapter.apply_selection(ref.module, KeyChannelSelection(keep=keep))


def make_kdim_variant(base_config: type, base_model: type, model_type: str, adapter) -> tuple[type, type]:
    """The config and causal-LM classes of `model_type` (`<stock>_kdim`); the registry
    (`state_reduction.models.families`) derives one per family and passes the family's (stock) adapter."""

    class Config(base_config):
        def __init__(self, layer_key_dims=None, removed_mixers=None, **kwargs):
            self.layer_key_dims = {str(k): int(v) for k, v in (layer_key_dims or {}).items()}
            self.removed_mixers = [int(i) for i in removed_mixers or []]
            super().__init__(**kwargs)

    Config.model_type = model_type
    Config.base_model_type = base_config.model_type  # the family: teacher pairing
    Config.__name__ = Config.__qualname__ = f"KDim{base_config.__name__}"

    class Model(base_model):
        config_class = Config

        def __init__(self, config):
            super().__init__(config)
            removed = getattr(config, "removed_mixers", None)
            if removed:
                blocks = adapter.structure.blocks(self)
                for layer in removed:
                    remove_mixer(blocks[layer], adapter.structure)
            narrow_mixers(self, config.layer_key_dims, adapter)

    Model.__name__ = Model.__qualname__ = f"KDim{base_model.__name__}"
    return Config, Model
