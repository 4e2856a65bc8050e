"""Writing checkpoints so that an interrupted save leaves nothing half-written."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def save_model_atomic(model, tokenizer, out_dir: str | os.PathLike, overwrite: bool = False,
                      write_extra: Callable[[Path], None] | None = None) -> Path:
    """save_pretrained (safetensors) into a temporary sibling directory, then rename it to `out_dir`.

    `write_extra(tmp_dir)` adds files (a selection or training record) before the rename, so they land
    together with the weights. An existing `out_dir` is refused unless `overwrite`."""
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists; pass overwrite=True (--overwrite) to replace it.")
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
