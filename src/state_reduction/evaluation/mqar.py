"""The offline `tiny_mqar` recall suite: MQAR accuracy by number of key-value pairs and context length.

Cells (n_pairs, length) are fixed sets of sequences from `state_reduction.data.mqar` (seeded per cell), with
at least `MIN_QUERIES` queries each, so one binomial standard error is at most 0.5/sqrt(MIN_QUERIES) <= 1.1
points at 50% accuracy and <= 1 point below 40% or above 60%. A query is correct when the argmax over the
whole vocabulary, at the queried key, is its value (greedy exact recall, as Zoology scores MQAR), so chance is
about 1/n_values (1/16) for a model that has learnt to answer with a value.

The suite uses the default `MQARVocab` (the one every `*_mqar.yaml` model trains with): a pruned checkpoint
carries no training record, so the suite cannot read the vocabulary from the model.

`build_mqar_suite(vocab, data_dir)` writes one .pt file per cell and a manifest with their sha256 under
`<data_dir>/eval/tiny_mqar/<vocab hash>/`; the same build gives byte-identical files.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import time
from pathlib import Path

import torch

from state_reduction.atomic import write_bytes_atomic, write_json_atomic
from state_reduction.data import resolve_data_dir
from state_reduction.data.mqar import IGNORE_INDEX, MQARVocab, mqar_sequences
from state_reduction.errors import InputError

BUILD_VERSION = 2  # 2: data files named relative to the manifest's folder
SEED = 0
# The recall models train at 32 tokens with 2-8 pairs; 64 tokens is twice the training length (the reach the
# long-context protocol allows), where 12 and 16 pairs go beyond what training showed.
CELL_PAIRS = {32: (2, 4, 6, 8), 64: (4, 8, 12, 16)}
LENGTHS = tuple(CELL_PAIRS)
MIN_QUERIES = 2500


def cell_name(n_pairs: int, length: int) -> str:
    return f"mqar_{length}_p{n_pairs}"


CELLS = {cell_name(p, n): (p, n) for n, pairs in CELL_PAIRS.items() for p in pairs}


@torch.no_grad()
def mqar_query_hits(model, input_ids: torch.Tensor, labels: torch.Tensor, batch_size: int = 32) -> torch.Tensor:
    """Per query, whether the greedy prediction at the queried key is its value: bool [n_queries].

    The LM head runs only at the queried keys (model.base_model gives the final hidden states for every
    family: fla's `model`, Mamba-2's `backbone`, Qwen3.5's `model`)."""
    model.eval()
    head = model.get_output_embeddings()
    device = next(model.parameters()).device
    hits = []
    for i in range(0, input_ids.shape[0], batch_size):
        x = input_ids[i:i + batch_size].to(device)
        targets = labels[i:i + batch_size, 1:].to(device)
        hidden = model.base_model(input_ids=x)[0][:, :-1]  # [B, T-1, D]
        scored = targets != IGNORE_INDEX
        pred = head(hidden[scored]).argmax(-1)
        hits.append((pred == targets[scored]).cpu())
    return torch.cat(hits)


def mqar_accuracy(model, input_ids, labels, batch_size: int = 32) -> tuple[int, int]:
    hits = mqar_query_hits(model, input_ids, labels, batch_size)
    return int(hits.sum()), int(hits.numel())


def suite_dir(vocab: MQARVocab, data_dir=None) -> Path:
    return Path(resolve_data_dir(data_dir)) / "eval" / "tiny_mqar" / vocab.sha256()[:16]


def _cell_bytes(input_ids: torch.Tensor, labels: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    torch.save({"input_ids": input_ids, "labels": labels}, buf)
    return buf.getvalue()


def build_mqar_suite(vocab: MQARVocab = MQARVocab(), data_dir=None, force: bool = False) -> dict:
    """Write every cell's sequences and `manifest.json`; return the manifest. Reuses files whose sha256 matches."""
    out = suite_dir(vocab, data_dir)
    manifest_path = out / "manifest.json"
    if manifest_path.is_file() and not force:
        manifest = _resolved(json.loads(manifest_path.read_text()), out)
        if (manifest.get("build_version") == BUILD_VERSION and manifest.get("vocab") == vocab.to_dict()
                and set(manifest.get("cells", {})) == set(CELLS)
                and all(Path(c["data_file"]).is_file()
                        and hashlib.sha256(Path(c["data_file"]).read_bytes()).hexdigest() == c["sha256"]
                        for c in manifest["cells"].values())):
            return manifest
    out.mkdir(parents=True, exist_ok=True)
    cells = {}
    for name, (n_pairs, length) in CELLS.items():
        n_seq = math.ceil(MIN_QUERIES / n_pairs)
        # One seed per cell, from its name: adding a cell never changes another.
        seed = int(hashlib.sha256(f"{SEED}:{name}".encode()).hexdigest()[:15], 16)
        ids, labels = mqar_sequences(n_seq, length, n_pairs, seed, vocab)
        data = _cell_bytes(ids, labels)
        path = write_bytes_atomic(out / f"{name}.pt", data)
        cells[name] = {"data_file": path.name, "sha256": hashlib.sha256(data).hexdigest(),
                       "n_pairs": n_pairs, "length": length, "n_sequences": n_seq, "n_queries": n_seq * n_pairs}
    manifest = {"suite": "tiny_mqar", "build_version": BUILD_VERSION, "seed": SEED, "vocab": vocab.to_dict(),
                "cells": cells}
    write_json_atomic(manifest_path, manifest)  # file names relative to its folder: a copied data dir reads its own
    return _resolved(manifest, out)


def _resolved(manifest: dict, out: Path) -> dict:
    """The manifest with each cell's data file as a path in `out` (the file stores names relative to it)."""
    cells = {n: {**c, "data_file": str((out / Path(c["data_file"]).name).resolve())}
             for n, c in manifest.get("cells", {}).items()}
    return {**manifest, "cells": cells}


def run_mqar_suite(model, vocab: MQARVocab = MQARVocab(), batch_size: int = 32, max_length: int | None = None,
                   data_dir=None, cells: list[str] | None = None, limit: int | None = None) -> dict:
    """Accuracy and its binomial standard error per cell, in the shape `evaluation.evaluate` returns.

    `limit` keeps the first `limit` sequences of each cell (tests and smoke runs only)."""
    vocab.check(model.config.vocab_size)
    manifest = build_mqar_suite(vocab, data_dir)
    names = [c for c in CELLS if cells is None or c in cells]
    if max_length is not None:
        too_long = [c for c in names if CELLS[c][1] > max_length]
        if too_long:
            raise InputError(f"suite 'tiny_mqar': cells {too_long} exceed max_length {max_length}")
    t0 = time.time()
    metrics, n_examples = {}, {}
    for name in names:
        entry = manifest["cells"][name]
        data = torch.load(entry["data_file"], weights_only=True)
        ids, labels = data["input_ids"][:limit], data["labels"][:limit]
        hits = mqar_query_hits(model, ids, labels, batch_size)
        acc = hits.double().mean().item()
        metrics[f"{name}_acc"] = acc
        metrics[f"{name}_acc_se"] = math.sqrt(acc * (1 - acc) / hits.numel())
        n_examples[name] = int(hits.numel())
    return {
        "suite": "tiny_mqar", "tasks": names, "metrics": metrics, "n_examples": n_examples,
        "data": {n: {"data_file": manifest["cells"][n]["data_file"], "sha256": manifest["cells"][n]["sha256"]}
                 for n in names},
        "model": {"class": type(model).__name__, "name_or_path": getattr(model, "name_or_path", None),
                  "n_parameters": sum(p.numel() for p in model.parameters())},
        "vocab": vocab.to_dict(), "batch_size": batch_size, "max_length": max_length, "limit": limit,
        "wall_time_s": time.time() - t0,
    }
