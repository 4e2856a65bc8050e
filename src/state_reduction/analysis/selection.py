"""Selections seen from outside the pruning run: load selection.json, check it fits a model, and measure it.

- subspace conditioning of the retained joint [Q; K] columns (paper appendix C.2, Table 6),
- channel overlap between two selections (appendix C.2: median shared channels per head),
- Pearson correlation of per-head statistics (Table 5).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from state_reduction.analysis.rank import condition_number
from state_reduction.errors import InputError, MissingInputError
from state_reduction.pruning.types import KeyChannelSelection


@dataclass
class LoadedSelection:
    path: str
    model_type: str
    key_heads: int
    key_dim_before: int
    kept: int
    keep: dict[int, torch.Tensor]  # layer -> [H, K'] int64
    method: str | None = None
    model_dir: str | None = None  # the pruned checkpoint next to selection.json, if any


def load_selection(path: str | Path) -> LoadedSelection:
    """A pruned model folder (holding selection.json) or a selection.json file, validated (validate_keep)."""
    path = Path(path)
    file = path / "selection.json" if path.is_dir() else path
    if not file.is_file():
        raise MissingInputError(f"selection: {path} is neither a pruned model folder with selection.json nor a JSON file")
    try:
        record = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"selection: {file} is not valid JSON ({e})", hint=_REDO) from None
    if not isinstance(record, dict):
        raise InputError(f"selection: {file} is not a JSON object", hint=_REDO)
    missing = [k for k in ("model_type", "key_heads", "key_dim_before", "key_dim_after", "selection") if k not in record]
    if missing:
        raise InputError(f"selection: {file} lacks {', '.join(missing)} (not written by `state-reduction prune`?)")
    for k in ("key_heads", "key_dim_before", "key_dim_after"):
        if not _is_int(record[k]) or record[k] < 1:
            raise InputError(f"selection: {file}: {k} must be a positive integer, got {record[k]!r}", hint=_REDO)
    if not isinstance(record["selection"], dict) or not record["selection"]:
        raise InputError(f"selection: {file}: `selection` must map layer -> {{keep: [[...] per head]}}", hint=_REDO)
    keep = {}
    for layer, entry in record["selection"].items():
        if not isinstance(entry, dict) or "keep" not in entry:
            raise InputError(f"selection: {file} layer {layer} holds a rotation (PCA), not kept channel indices; "
                             f"conditioning, overlap and masking need axis-aligned selections")
        try:
            layer_index = int(layer)
        except ValueError:
            raise InputError(f"selection: {file}: layer key {layer!r} is not an integer", hint=_REDO) from None
        keep[layer_index] = validate_keep(entry["keep"], file, layer, int(record["key_heads"]),
                                          int(record["key_dim_before"]), int(record["key_dim_after"]))
    model_dir = str(file.parent) if (file.parent / "config.json").is_file() else None
    return LoadedSelection(str(file), record["model_type"], int(record["key_heads"]), int(record["key_dim_before"]),
                           int(record["key_dim_after"]), keep, (record.get("config") or {}).get("method"), model_dir)


def full_selection(model_dir: str, model_type: str, layers: list[int], heads: int, key_dim: int) -> LoadedSelection:
    """Every key channel of every head kept: the selection of a model analysed at full width beside the dense one
    (the dense+RFT control: the dense model fine-tuned, nothing pruned)."""
    keep = {layer: torch.arange(key_dim).expand(heads, key_dim).clone() for layer in layers}
    return LoadedSelection(f"{model_dir} (every key channel)", model_type, heads, key_dim, key_dim, keep, None, model_dir)


_REDO = "re-create it with `state-reduction prune` (a hand-edited or damaged selection changes every analysis)"


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def validate_keep(keep, file, layer, heads: int, key_dim: int, kept: int) -> torch.Tensor:
    """Kept channel indices of one layer: `heads` lists of `kept` integers, each in [0, key_dim), unique and
    sorted ascending (as every selector writes them); the first violation names the file, layer and head."""
    where = f"selection: {file} layer {layer}"
    if not isinstance(keep, list) or len(keep) != heads:
        n = len(keep) if isinstance(keep, list) else type(keep).__name__
        raise InputError(f"{where}: keep must hold one list per key head ({heads}), got {n}", hint=_REDO)
    for h, row in enumerate(keep):
        if not isinstance(row, list) or len(row) != kept:
            n = len(row) if isinstance(row, list) else type(row).__name__
            raise InputError(f"{where} head {h}: {n} indices, key_dim_after says {kept} (ragged selection)", hint=_REDO)
        bad = next((x for x in row if not _is_int(x)), None)
        if bad is not None:
            raise InputError(f"{where} head {h}: index {bad!r} is not an integer", hint=_REDO)
        out = next((x for x in row if not 0 <= x < key_dim), None)
        if out is not None:
            raise InputError(f"{where} head {h}: index {out} outside [0, {key_dim}) (key_dim_before {key_dim})",
                             hint=_REDO)
        if len(set(row)) != len(row):
            dup = sorted({x for x in row if row.count(x) > 1})
            raise InputError(f"{where} head {h}: indices {dup} appear more than once", hint=_REDO)
        if row != sorted(row):
            raise InputError(f"{where} head {h}: indices are not sorted ascending", hint=_REDO)
    return torch.tensor(keep, dtype=torch.long)


def check_fits(selection: LoadedSelection, model_name: str, model_type: str, layers: list[int], heads: int,
               key_dim: int) -> None:
    """The selection must come from this model's family, layer set, head count and (unpruned) key dim."""
    ours = f"model {model_name} ({model_type}: {len(layers)} reducible layers {layers}, {heads} key heads x {key_dim})"
    theirs = (f"selection {selection.path} ({selection.model_type}: {len(selection.keep)} layers "
              f"{sorted(selection.keep)}, {selection.key_heads} key heads x {selection.key_dim_before})")
    if (selection.model_type != model_type or sorted(selection.keep) != sorted(layers)
            or selection.key_heads != heads or selection.key_dim_before != key_dim):
        raise InputError(f"selection does not fit the model: {theirs} vs {ours}")
    for layer, keep in selection.keep.items():
        if keep.shape[0] != heads or int(keep.max()) >= key_dim or int(keep.min()) < 0:
            raise InputError(f"selection {selection.path} layer {layer}: keep {tuple(keep.shape)} with indices up to "
                             f"{int(keep.max())} does not fit {heads} heads x {key_dim} channels of {model_name}")


def as_key_channel_selections(selection: LoadedSelection) -> dict[int, KeyChannelSelection]:
    return {layer: KeyChannelSelection(keep=keep) for layer, keep in selection.keep.items()}


def subspace_conditioning(gram: torch.Tensor, n_rows: int, keep: torch.Tensor | None = None) -> list[dict]:
    """Per head, the singular values of the retained columns of M = [Q_h; K_h] (2N rows), from its Gram
    matrix gram = M^T M [H, K, K] (float64): sigma_i(M_S) = sqrt(eig(gram[S, S])).

    Singular values are divided by sqrt(n_rows) (RMS scale, independent of the calibration size); the
    authors' numbers come from 5000 + 5000 subsampled rows, i.e. ours x 100. kappa is scale-free."""
    out = []
    for h in range(gram.shape[0]):
        g = gram[h] if keep is None else gram[h][keep[h]][:, keep[h]]
        ev = torch.linalg.eigvalsh(g.double()).clamp_min(0).flip(0)
        sv = ev.sqrt() / math.sqrt(max(n_rows, 1))
        if float(sv[0]) <= 0:
            out.append({"sigma_min": None, "sigma_max": None, "kappa": None, "degenerate": True})
            continue
        out.append({"sigma_min": float(sv[-1]), "sigma_max": float(sv[0]), "kappa": condition_number(sv),
                    "degenerate": False})
    return out


def channel_overlap(a: dict[int, torch.Tensor], b: dict[int, torch.Tensor]) -> dict[int, list[int]]:
    """Shared kept channels per (layer, head) of two selections over the same layers and heads."""
    if sorted(a) != sorted(b):
        raise InputError(f"channel overlap: the selections cover different layers, {sorted(a)} vs {sorted(b)}")
    out = {}
    for layer in sorted(a):
        if a[layer].shape[0] != b[layer].shape[0]:
            raise InputError(f"channel overlap: layer {layer} has {a[layer].shape[0]} vs {b[layer].shape[0]} heads")
        out[layer] = [len(set(x.tolist()) & set(y.tolist())) for x, y in zip(a[layer], b[layer])]
    return out


def pearson(x: list[float | None], y: list[float | None]) -> float | None:
    """Pearson correlation over the pairs where both are present; None with fewer than 2 or zero variance."""
    pairs = [(a, b) for a, b in zip(x, y) if a is not None and b is not None]
    if len(pairs) < 2:
        return None
    t = torch.tensor(pairs, dtype=torch.float64)
    t = t - t.mean(0)
    denom = float(t[:, 0].norm() * t[:, 1].norm())
    return None if denom <= 1e-300 else float((t[:, 0] * t[:, 1]).sum()) / denom


def median(values: list[float | None]) -> float | None:
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    m = len(vals) // 2
    return vals[m] if len(vals) % 2 else (vals[m - 1] + vals[m]) / 2
