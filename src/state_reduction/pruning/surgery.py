"""Applying key-channel selections to a whole model and saving it so that stock loaders rebuild it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from torch import nn

from state_reduction.checkpoints import save_model_atomic
from state_reduction.errors import InputError
from state_reduction.models.families import get_adapter, kdim_classes
from state_reduction.models.shed import remove_mixer
from state_reduction.pruning.types import KeyChannelSelection


def reduce_model(model: nn.Module, selections: dict[int, KeyChannelSelection],
                 removed_mixers: list[int] | tuple = ()) -> nn.Module:
    """Shrink every reducible mixer in place (one selection per decoder-layer index) and rewrite model.config.

    `removed_mixers`: layers whose token mixer is removed instead (K' = 0, `prune --allow-layer-removal`; the
    family's `StructureLayout` places it, models/shed.remove_mixer); they take no selection and make the model
    the `_kdim` variant, which records them. Every other reducible layer needs a selection. When all keep the same number of channels the stock config expresses
    it; otherwise the model becomes its family's `<model_type>_kdim` variant (models/kdim_variant.py), whose config
    records each layer's K' (`layer_key_dims`) beside the stock field set to the largest."""
    adapter = get_adapter(model)
    if removed_mixers:
        if adapter.structure is None:
            raise InputError(f"--allow-layer-removal: {adapter.family} has no StructureLayout, so removing the "
                             f"token mixer of layer(s) {', '.join(map(str, removed_mixers))} is not defined for "
                             f"model_type {model.config.model_type!r}; use a --budget-floor >= 1")
        blocks = adapter.structure.blocks(model)
        for layer in removed_mixers:
            remove_mixer(blocks[layer], adapter.structure)
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
    if len(set(kept.values())) > 1 or removed_mixers or getattr(model.config, "layer_key_dims", None):
        config = model.config
        config_cls, model_cls = kdim_classes(config.model_type)
        config.__class__ = config_cls  # the same fields, the variant's model_type (as shed's surgery does)
        if "model_type" in vars(config):
            config.model_type = config_cls.model_type
        model.__class__ = model_cls
        kept.update({layer: 0 for layer in removed_mixers})
        config.layer_key_dims = {str(layer): k for layer, k in sorted(kept.items())}
        config.removed_mixers = sorted(removed_mixers)
        config.architectures = [model_cls.__name__]
    return model


def save_reduced(model: nn.Module, tokenizer, out_dir: str | os.PathLike, overwrite: bool = False,
                 write_extra: Callable[[Path], None] | None = None) -> Path:
    """Save the reduced model atomically (`save_model_atomic`); `write_extra(tmp_dir)` adds selection.json.

    Reload with `AutoModelForCausalLM.from_pretrained(out_dir)` after `import state_reduction`."""
    return save_model_atomic(model, tokenizer, out_dir, overwrite=overwrite, write_extra=write_extra)
