"""Applying key-channel selections to a whole model and saving it so that stock loaders rebuild it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from torch import nn

from state_reduction.checkpoints import save_model_atomic
from state_reduction.errors import InputError
from state_reduction.models.families import get_adapter, kdim_classes
from state_reduction.pruning.types import KeyChannelSelection


def reduce_model(model: nn.Module, selections: dict[int, KeyChannelSelection]) -> nn.Module:
    """Shrink every reducible mixer in place (one selection per decoder-layer index) and rewrite model.config.

    Every reducible layer needs a selection. When all keep the same number of channels the stock config expresses
    it; otherwise the model becomes its family's `<model_type>_kdim` variant (models/kdim_variant.py), whose config
    records each layer's K' (`layer_key_dims`) beside the stock field set to the largest."""
    adapter = get_adapter(model)
    mixers = {ref.layer: ref for ref in adapter.mixers(model)}
    missing, unknown = sorted(set(mixers) - set(selections)), sorted(set(selections) - set(mixers))
    if missing or unknown:
        raise InputError(
            f"{model.config.model_type}: selections must cover exactly the reducible layers {sorted(mixers)}; "
            f"missing {missing}, not reducible {unknown}."
        )
    kept = {layer: sel.kept for layer, sel in selections.items()}
    for layer, ref in mixers.items():
        adapter.apply_selection(ref.module, selections[layer])
    adapter.update_config(model.config, max(kept.values()))
    if len(set(kept.values())) > 1 or getattr(model.config, "layer_key_dims", None):
        config = model.config
        config_cls, model_cls = kdim_classes(config.model_type)
        config.__class__ = config_cls  # the same fields, the variant's model_type (as shed's surgery does)
        if "model_type" in vars(config):
            config.model_type = config_cls.model_type
        model.__class__ = model_cls
        config.layer_key_dims = {str(layer): k for layer, k in sorted(kept.items())}
        config.architectures = [model_cls.__name__]
    return model


def save_reduced(model: nn.Module, tokenizer, out_dir: str | os.PathLike, overwrite: bool = False,
                 write_extra: Callable[[Path], None] | None = None) -> Path:
    """Save the reduced model atomically (`save_model_atomic`); `write_extra(tmp_dir)` adds selection.json.

    Reload with `AutoModelForCausalLM.from_pretrained(out_dir)` after `import state_reduction`."""
    return save_model_atomic(model, tokenizer, out_dir, overwrite=overwrite, write_extra=write_extra)
