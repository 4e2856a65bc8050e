"""One key-channel adapter per model family, registered by config `model_type`."""

from __future__ import annotations

import difflib

from state_reduction.pruning.adapters.deltanet import (
    DeltaNetAdapter,
    SharedConvDeltaNetAdapter,
)
from state_reduction.pruning.adapters.gated_deltanet import GatedDeltaNetAdapter
from state_reduction.pruning.adapters.mamba2 import Mamba2Adapter
from state_reduction.pruning.adapters.qwen3_5 import Qwen3_5Adapter
from state_reduction.pruning.types import KeyChannelAdapter

ADAPTERS: dict[str, KeyChannelAdapter] = {
    a.model_type: a for a in (DeltaNetAdapter(), SharedConvDeltaNetAdapter(), GatedDeltaNetAdapter(), Mamba2Adapter(),
                              Qwen3_5Adapter())
}

# model types that wrap a supported one: how to reach it
_WRAPPERS = {
    "qwen3_5": "qwen3_5 is the vision-language wrapper; reduce its text model: load it with "
               "transformers.Qwen3_5ForCausalLM.from_pretrained(path) (config.text_config has model_type qwen3_5_text)",
}


def get_adapter(model_or_config) -> KeyChannelAdapter:
    """The adapter for a model or its config, looked up by `config.model_type`."""
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    if model_type in ADAPTERS:
        return ADAPTERS[model_type]
    if model_type in _WRAPPERS:
        hint = f"; {_WRAPPERS[model_type]}"
    else:
        close = difflib.get_close_matches(str(model_type), list(ADAPTERS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
    raise KeyError(f"no key-channel adapter for model_type {model_type!r}{hint} (supported: {', '.join(ADAPTERS)})")


__all__ = ["ADAPTERS", "DeltaNetAdapter", "GatedDeltaNetAdapter", "Mamba2Adapter", "Qwen3_5Adapter",
           "SharedConvDeltaNetAdapter", "get_adapter"]
