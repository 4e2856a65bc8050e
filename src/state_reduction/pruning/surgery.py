"""Applying key-channel selections to a whole model and saving it so that stock loaders rebuild it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from torch import nn

from state_reduction.checkpoints import save_model_atomic
from state_reduction.errors import InputError
from state_reduction.models.families import get_adapter
from state_reduction.pruning.types import KeyChannelSelection


def reduce_model(model: nn.Module, selections: dict[int, KeyChannelSelection]) -> nn.Module:
    """Shrink every reducible mixer in place (one selection per decoder-layer index) and rewrite model.config.

    The config holds one key dim for all layers, so every reducible layer needs a selection and all keep the
    same number of channels."""
    adapter = get_adapter(model)
    mixers = {ref.layer: ref for ref in adapter.mixers(model)}
    missing, unknown = sorted(set(mixers) - set(selections)), sorted(set(selections) - set(mixers))
    if missing or unknown:
        raise InputError(
            f"{model.config.model_type}: selections must cover exactly the reducible layers {sorted(mixers)}; "
            f"missing {missing}, not reducible {unknown}."
        )
    kept = {layer: sel.kept for layer, sel in selections.items()}
    if len(set(kept.values())) != 1:
        raise InputError(f"{model.config.model_type}: every layer must keep the same number of channels, got {kept}.")
    for layer, ref in mixers.items():
        adapter.apply_selection(ref.module, selections[layer])
    adapter.update_config(model.config, next(iter(kept.values())))
    return model


def save_reduced(model: nn.Module, tokenizer, out_dir: str | os.PathLike, overwrite: bool = False,
                 write_extra: Callable[[Path], None] | None = None) -> Path:
    """Save the reduced model atomically (`save_model_atomic`); `write_extra(tmp_dir)` adds selection.json.

    Reload with `AutoModelForCausalLM.from_pretrained(out_dir)` after `import state_reduction`."""
    return save_model_atomic(model, tokenizer, out_dir, overwrite=overwrite, write_extra=write_extra)
