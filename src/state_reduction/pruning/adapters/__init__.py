"""One key-channel adapter per model family, and the adapters of the derived variants; the family registry
(`state_reduction.models.families.get_adapter`) finds a model's adapter by config `model_type`."""

from __future__ import annotations

import copy

import torch

from state_reduction.pruning.adapters.deltanet import (
    DeltaNetAdapter,
    SharedConvDeltaNetAdapter,
)
from state_reduction.pruning.adapters.gated_deltanet import GatedDeltaNetAdapter
from state_reduction.pruning.adapters.mamba2 import Mamba2Adapter
from state_reduction.pruning.adapters.qwen3_5 import Qwen3_5Adapter
from state_reduction.pruning.types import KeyChannelAdapter


def shed_variant(adapter: KeyChannelAdapter) -> KeyChannelAdapter:
    """The adapter of `<model_type>_shed` (state_reduction.models.shed): the same family with some mixers removed,
    whose recurrent state then lies in the remaining recurrent mixers only."""
    base = type(adapter)

    def state_bytes_per_sequence(self, config, dtype=torch.bfloat16) -> int:
        recurrent = [i for i in range(config.num_hidden_layers) if self.structure.is_recurrent(config, i)]
        removed = set(getattr(config, "shed_removed_mixers", None) or []) & set(recurrent)
        if not recurrent:
            return 0
        return base.state_bytes_per_sequence(self, config, dtype) // len(recurrent) * (len(recurrent) - len(removed))

    cls = type(f"Shed{base.__name__}", (base,), {
        "model_type": adapter.model_type + "_shed", "family": base.family,
        "state_bytes_per_sequence": state_bytes_per_sequence, "__module__": __name__})
    return cls()


def kdim_variant(adapter: KeyChannelAdapter, model_type: str) -> KeyChannelAdapter:
    """The adapter of `<model_type>_kdim` (state_reduction.models.kdim_variant): the family's mixers with a key
    dimension per layer (`config.layer_key_dims`); the stock config field holds the largest. State bytes are the
    sum over layers of the stock formula at each layer's K' (exact: the stock formula is layers x one layer's); a layer
    at K' = 0 (its mixer removed) holds none."""
    base = type(adapter)

    def state_bytes_per_sequence(self, config, dtype=torch.bfloat16) -> int:
        dims = getattr(config, "layer_key_dims", None) or {}
        if not dims:
            return base.state_bytes_per_sequence(self, config, dtype)
        total = 0
        for k in dims.values():
            if int(k) == 0:  # a removed token mixer (config.removed_mixers) holds no state
                continue
            one = copy.deepcopy(config)
            base.update_config(self, one, int(k))
            total += base.state_bytes_per_sequence(self, one, dtype)
        return total // len(dims)

    cls = type(f"KDim{base.__name__}", (base,), {
        "model_type": model_type, "family": base.family,
        "state_bytes_per_sequence": state_bytes_per_sequence, "__module__": __name__})
    return cls()


def ralimp_variant(adapter: KeyChannelAdapter, model_type: str) -> KeyChannelAdapter:
    """The adapter of a RaLiMP variant (state_reduction.models.ralimp_variant): the family's mixers are kept, so it
    is the family's adapter under the variant's model_type."""
    out = type(adapter)()
    out.model_type = model_type
    return out


__all__ = ["DeltaNetAdapter", "GatedDeltaNetAdapter", "Mamba2Adapter", "Qwen3_5Adapter", "SharedConvDeltaNetAdapter",
           "kdim_variant", "ralimp_variant", "shed_variant"]
