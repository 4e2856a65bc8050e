"""Recurrent-state memory accounting.

State bytes per sequence come from the family adapters (`KeyChannelAdapter.state_bytes_per_sequence`), so the
accounting covers every family the pruning code covers: DeltaNet and Gated DeltaNet (H * K * V per layer),
Mamba-2 (heads * head_dim * state_size) and the Qwen3.5 hybrid (linear layers only). A reduction is applied to a
copy of the config with the adapter's own `update_config`, exactly as pruning rewrites it.
"""

from __future__ import annotations

import copy
import re

import torch

from state_reduction.errors import InputError
from state_reduction.models.families import get_adapter
from state_reduction.pruning.selectors import keep_count

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def parse_bytes(text: str | int) -> int:
    """'80GiB', '80 GB', '1.5TiB', '4096' -> bytes (GiB = 2**30, GB = 10**9)."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise InputError(f"memory size {text!r}: expected a number with an optional unit "
                         f"({', '.join(u for u in _UNITS if u)}), e.g. 80GiB")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value <= 0:
        raise InputError(f"memory size {text!r} must be positive")
    return int(value)


def reduced_config(config, keep: int):
    """A copy of `config` with `keep` key channels per head (the adapter's `update_config`)."""
    adapter = get_adapter(config)
    _, K = adapter.key_heads(config)
    if not (isinstance(keep, int) and 1 <= keep <= K):
        raise InputError(f"{config.model_type}: keep must be an int in [1, {K}] key channels per head, got {keep!r}")
    out = copy.deepcopy(config)
    if keep != K:
        adapter.update_config(out, keep)
    return out


def state_bytes(config, *, ratio: float = 0.0, keep: int | None = None, multiple: int | None = None,
                power_of_two: bool = False, dtype: torch.dtype = torch.bfloat16) -> int:
    """Recurrent-state bytes per sequence of the model described by `config` after removing `ratio` of its key
    channels (or keeping `keep` per head), in `dtype`."""
    adapter = get_adapter(config)
    _, K = adapter.key_heads(config)
    if keep is None:
        keep = keep_count(K, ratio, multiple, power_of_two=power_of_two)
    return adapter.state_bytes_per_sequence(reduced_config(config, keep), dtype)


def largest_batch(budget_bytes: int, per_sequence_bytes: int, fixed_bytes: int = 0) -> int:
    """The largest batch whose states fit: floor((budget - fixed) / per_sequence), 0 when nothing fits."""
    if per_sequence_bytes <= 0:
        raise InputError(f"per-sequence bytes must be positive, got {per_sequence_bytes}")
    if budget_bytes < 0 or fixed_bytes < 0:
        raise InputError(f"budget and fixed bytes must be >= 0, got {budget_bytes} and {fixed_bytes}")
    return max(0, (budget_bytes - fixed_bytes) // per_sequence_bytes)


def state_memory_rows(config, ratios=(0.0, 0.5, 0.75), keeps=(), budget_bytes: int | None = None,
                      fixed_bytes: int = 0, dtype: torch.dtype = torch.bfloat16) -> list[dict]:
    """Baseline and reduced rows: kept channels, state bytes per sequence, ratio to baseline, largest batch."""
    adapter = get_adapter(config)
    H, K = adapter.key_heads(config)
    base = adapter.state_bytes_per_sequence(config, dtype)
    wanted = [(keep_count(K, r), r) for r in ratios] + [(k, 1 - k / K) for k in keeps]
    rows = []
    for keep, ratio in wanted:
        b = state_bytes(config, keep=keep, dtype=dtype)
        row = {"model_type": config.model_type, "heads": H, "d_k": K, "kept": keep, "ratio": round(ratio, 6),
               "dtype": str(dtype).removeprefix("torch."), "state_bytes_per_sequence": b,
               "relative_to_baseline": b / base}
        if budget_bytes is not None:
            row.update(budget_bytes=budget_bytes, fixed_bytes=fixed_bytes,
                       largest_batch=largest_batch(budget_bytes, b, fixed_bytes),
                       largest_batch_baseline=largest_batch(budget_bytes, base, fixed_bytes))
        rows.append(row)
    return rows
