"""One key-channel adapter per model family; `get_adapter` finds it by config `model_type` in the family registry
(`state_reduction.models.families`)."""

from __future__ import annotations

import difflib

import torch

from state_reduction.errors import InputError, UnknownNameError
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


def ralimp_variant(adapter: KeyChannelAdapter, model_type: str) -> KeyChannelAdapter:
    """The adapter of a RaLiMP variant (state_reduction.models.ralimp_variant): the family's mixers are kept, so it
    is the family's adapter under the variant's model_type."""
    out = type(adapter)()
    out.model_type = model_type
    return out


def _wrappers() -> dict[str, str]:
    """Model types that wrap a supported one (e.g. vision-language), for configs that do not say which (no
    text_config): wrapper model_type -> the family's model_type."""
    from state_reduction.models.families import FAMILIES

    return {w: f.model_type for f in FAMILIES.values() for w in f.wrapper_model_types}


def _text_model_hint(config, model_type: str | None, expected: str) -> str:
    """How to reach the `expected` text model from a wrapper config (vision-language models keep it in text_config)."""
    text = getattr(config, "text_config", None)
    inner = text.get("model_type") if isinstance(text, dict) else getattr(text, "model_type", None)
    wrappers = _wrappers()
    if text is None and model_type not in wrappers:
        return ""
    inner = inner or wrappers.get(model_type, expected)
    return (f"; model_type {model_type!r} is a wrapper (e.g. vision-language) around a {inner!r} text model in "
            f"config.text_config: extract it with transformers.AutoModelForCausalLM.from_pretrained(path) (which builds "
            f"the text model, e.g. Qwen3_5ForCausalLM for qwen3_5, from text_config) followed by "
            f".save_pretrained(text_dir) and its tokenizer, and reduce text_dir (its config has model_type {inner!r})")


def get_adapter(model_or_config) -> KeyChannelAdapter:
    """The adapter for a model or its config, looked up by `config.model_type`; the config must have the fields the
    adapter reads (`required_fields`)."""
    from state_reduction.models.families import MODEL_TYPES  # the registry imports the adapters

    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    if model_type in MODEL_TYPES:
        adapter = MODEL_TYPES[model_type].adapter
        missing = [f for f in adapter.required_fields if not hasattr(config, f)]
        if missing:
            raise InputError(
                f"{adapter.family} adapter: the config of model_type {model_type!r} lacks {', '.join(missing)}; "
                f"expected a {adapter.model_type!r} config with {', '.join(adapter.required_fields)}"
                + _text_model_hint(config, model_type, adapter.model_type))
        return adapter
    text = getattr(config, "text_config", None)
    inner = text.get("model_type") if isinstance(text, dict) else getattr(text, "model_type", None)
    wrappers = _wrappers()
    if inner in MODEL_TYPES or model_type in wrappers:
        hint = _text_model_hint(config, model_type, inner or wrappers[model_type])
    else:
        close = difflib.get_close_matches(str(model_type), list(MODEL_TYPES), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
    raise UnknownNameError(f"no key-channel adapter for model_type {model_type!r}{hint} "
                           f"(supported: {', '.join(MODEL_TYPES)})")


__all__ = ["DeltaNetAdapter", "GatedDeltaNetAdapter", "Mamba2Adapter", "Qwen3_5Adapter", "SharedConvDeltaNetAdapter",
           "get_adapter", "ralimp_variant", "shed_variant"]
