"""Checkpoints in and out: saving publishes a complete folder (atomic.publish_folder); loading checks the
files, the config and every weight before a model is used, and says in one line which file is damaged."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from state_reduction.atomic import publish_folder
from state_reduction.backend.vocabulary import fp32_except_vocabulary
from state_reduction.devices import checkpoint_dtype
from state_reduction.errors import InputError

RECREATE = "re-create it (rerun what wrote it with --overwrite) or restore the folder from a good copy"


def save_model_atomic(model, tokenizer, out_dir: str | os.PathLike, overwrite: bool = False,
                      write_extra: Callable[[Path], None] | None = None) -> Path:
    """save_pretrained (safetensors) and the tokenizer into a temporary sibling folder, published as `out_dir`
    (an existing one is kept until the new one is complete). `write_extra(tmp_dir)` adds files (a selection or
    training record) so they land together with the weights. An existing `out_dir` is refused unless
    `overwrite`."""
    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if write_extra is not None:
            write_extra(tmp)

    return publish_folder(out_dir, fill, overwrite=overwrite)


def is_local_path(path: str) -> bool:
    """A path meant as a folder on disk rather than a hub id (`org/name`)."""
    return Path(path).exists() or str(path).startswith((".", "/", "~")) or str(path).count("/") > 1


def check_safetensors(file: Path) -> list[str]:
    """The tensor names of a safetensors file whose header parses and whose data offsets fit the file."""
    size = file.stat().st_size
    try:
        with open(file, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                raise ValueError(f"header length {n} exceeds the file ({size} bytes)")
            header = json.loads(f.read(n))
        end = 0
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            begin, stop = entry["data_offsets"]
            end = max(end, stop)
        if 8 + n + end > size:
            raise ValueError(f"the tensors need {8 + n + end} bytes, the file has {size} (truncated)")
    except (struct.error, ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise InputError(f"weights file {file} is damaged: {e}", hint=RECREATE) from None
    return [k for k in header if k != "__metadata__"]


def check_checkpoint_files(path: str | os.PathLike, what: str = "model", weights: bool = True) -> Path:
    """A local checkpoint folder: it exists, its config.json is a JSON object with a model_type, and (`weights`)
    it has weights and every *.safetensors file is whole."""
    folder = Path(path)
    if not folder.is_dir():
        raise InputError(f"{what} {path} does not exist" if not folder.exists() else f"{what} {path} is not a folder",
                         hint="pass a checkpoint folder (config.json, *.safetensors, tokenizer files)")
    cfg = folder / "config.json"
    if not cfg.is_file():
        raise InputError(f"{what} {path} has no config.json; not a checkpoint folder",
                         hint="pass the folder that `prune`, `rft` or `pretrain` wrote")
    try:
        config = json.loads(cfg.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"{what} {cfg} is not valid JSON ({e})", hint=RECREATE) from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise InputError(f"{what} {cfg} has no model_type", hint=RECREATE)
    if not weights:
        return folder
    files = sorted(folder.glob("*.safetensors"))
    if not files and not list(folder.glob("*.bin")):
        raise InputError(f"{what} {path} holds no *.safetensors weights", hint=RECREATE)
    for f in files:
        check_safetensors(f)
    return folder


FINITE_CHUNK = 1 << 22  # elements per isfinite call: its temporaries (~1.75x its input) stay ~28 MiB in fp32


def _all_finite(t: torch.Tensor) -> bool:
    """`torch.isfinite(t).all()` without its temporaries (on the whole tensor 1.75x the largest weight, 6.6 GiB for
    the fp32 Qwen3.5 9B embedding: the peak of a CPU load, issue 22): a finite sum means every element is finite
    (a NaN or inf makes it NaN or inf), one pass 12x faster than isfinite on a CPU; only a non-finite sum (or a
    finite tensor whose sum overflows) is checked element by element, in chunks of FINITE_CHUNK."""
    flat = t.detach().reshape(-1)
    if bool(torch.isfinite(flat.sum())):
        return True
    return _count_non_finite(flat) == 0


def _count_non_finite(flat: torch.Tensor) -> int:
    return sum(int((~torch.isfinite(flat[i:i + FINITE_CHUNK])).sum()) for i in range(0, flat.numel(), FINITE_CHUNK))


def check_finite(model, path: str | os.PathLike, what: str = "model") -> None:
    """Every floating parameter and buffer is finite; the first that is not is named."""
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t.is_floating_point() and t.device.type != "meta" and not _all_finite(t):
            bad = _count_non_finite(t.detach().reshape(-1))
            raise InputError(f"{what} {path}: tensor {name} {tuple(t.shape)} has {bad} non-finite values (NaN/inf)",
                             hint=RECREATE)


# What transformers raises for a config with a missing field, a wrong type or weights of other shapes.
LOAD_ERRORS = (OSError, ValueError, KeyError, TypeError, AttributeError, RuntimeError, AssertionError)


def load_config(path: str, what: str = "model"):
    if is_local_path(path):
        check_checkpoint_files(path, what, weights=False)
    try:
        return AutoConfig.from_pretrained(path)
    except LOAD_ERRORS as e:
        raise InputError(f"cannot read the config of {what} {path}: {type(e).__name__}: {_first_line(e)}",
                         hint=RECREATE if is_local_path(path) else "check the hub id and your network") from None


def load_model(path: str, what: str = "model", *, vocabulary_in_storage: bool = True, **kwargs):
    """AutoModelForCausalLM.from_pretrained with the checks above and a finite-weights check. `dtype=torch.float32`
    on a 16-bit checkpoint (fp32 compute on a CPU) keeps the embedding and head in the checkpoint's dtype, computing
    in fp32 (backend.vocabulary; `vocabulary_in_storage=False`: every weight in fp32)."""
    config = load_config(path, what)
    if is_local_path(path):
        check_checkpoint_files(path, what)
    saved = checkpoint_dtype(config)
    vocabulary_in_storage = vocabulary_in_storage and kwargs.get("dtype") is torch.float32 and \
        saved in (torch.bfloat16, torch.float16)
    if vocabulary_in_storage:
        kwargs["dtype"] = saved
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        if vocabulary_in_storage:
            fp32_except_vocabulary(model)
    except LOAD_ERRORS as e:
        raise InputError(f"cannot build {what} {path} from its config.json and weights: {type(e).__name__}: "
                         f"{_first_line(e)}",
                         hint=RECREATE if is_local_path(path) else "check the hub id and your network") from None
    check_finite(model, path, what)
    return model


def load_tokenizer(path: str, what: str = "model"):
    try:
        return AutoTokenizer.from_pretrained(path)
    except LOAD_ERRORS as e:
        present = sorted(p.name for p in Path(path).glob("tokenizer*")) if Path(path).is_dir() else []
        raise InputError(f"cannot load the tokenizer of {what} {path} (tokenizer files there: "
                         f"{', '.join(present) or 'none'}): {type(e).__name__}: {_first_line(e)}",
                         hint="copy tokenizer.json and tokenizer_config.json of the model it came from into the "
                              "folder") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return " ".join(text.splitlines()[0].split()) if text else ""


class RunStateError(InputError):
    """A training run's resumable state that cannot be resumed (damaged, foreign, or of another config)."""


def load_run_state(path: str | os.PathLike, config_hash: str, keys: tuple[str, ...], what: str,
                   hint: str) -> dict:
    """The resumable state a training loop saved at `path` (through `atomic.save_torch_atomic`), checked: it loads,
    holds `keys` and was written by the config whose hash is `config_hash`. Every failure is a `RunStateError`
    naming `what` (the run), the file and `hint` (how to start over)."""
    path = Path(path)
    try:
        state = torch.load(path, weights_only=False, map_location="cpu")
    except Exception as e:  # torch.load raises many types for damaged files (EOFError, RuntimeError, UnpicklingError)
        raise RunStateError(f"{what} state {path} is damaged: {type(e).__name__}: {_first_line(e)[:200]}",
                            hint=hint) from None
    missing = [k for k in ("config_hash", *keys) if not isinstance(state, dict) or k not in state]
    if missing:
        raise RunStateError(f"{what} state {path} is not one this code wrote (lacks {', '.join(missing)})", hint=hint)
    if state["config_hash"] != config_hash:
        raise RunStateError(f"{what} state {path} belongs to another config (hash {state['config_hash']} != "
                            f"{config_hash})", hint=hint)
    return state
