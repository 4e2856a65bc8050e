"""Applying key-channel selections to a whole model and saving it so that stock loaders rebuild it."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from torch import nn

from state_reduction.pruning.adapters import get_adapter
from state_reduction.pruning.types import KeyChannelSelection


def reduce_model(model: nn.Module, selections: dict[int, KeyChannelSelection]) -> nn.Module:
    """Shrink every reducible mixer in place (one selection per decoder-layer index) and rewrite model.config.

    The config holds one key dim for all layers, so every reducible layer needs a selection and all keep the
    same number of channels."""
    adapter = get_adapter(model)
    mixers = {ref.layer: ref for ref in adapter.mixers(model)}
    missing, unknown = sorted(set(mixers) - set(selections)), sorted(set(selections) - set(mixers))
    if missing or unknown:
        raise ValueError(
            f"{model.config.model_type}: selections must cover exactly the reducible layers {sorted(mixers)}; "
            f"missing {missing}, not reducible {unknown}."
        )
    kept = {layer: sel.kept for layer, sel in selections.items()}
    if len(set(kept.values())) != 1:
        raise ValueError(f"{model.config.model_type}: every layer must keep the same number of channels, got {kept}.")
    for layer, ref in mixers.items():
        adapter.apply_selection(ref.module, selections[layer])
    adapter.update_config(model.config, next(iter(kept.values())))
    return model


def save_reduced(model: nn.Module, tokenizer, out_dir: str | os.PathLike, overwrite: bool = False,
                 write_extra: Callable[[Path], None] | None = None) -> Path:
    """save_pretrained into a temporary sibling directory, then rename it to `out_dir` (no half-written model).
    `write_extra(tmp_dir)` adds files (e.g. selection.json) before the rename, so they land with the weights.

    Reload with `AutoModelForCausalLM.from_pretrained(out_dir)` after `import state_reduction`."""
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise FileExistsError(f"save_reduced: {out} already exists; pass overwrite=True to replace it.")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if write_extra is not None:
            write_extra(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
