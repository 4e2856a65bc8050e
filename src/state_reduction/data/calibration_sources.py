"""Where `prune --calib NAME` draws its calibration sequences: a registered corpus, or a registered source.

Every corpus of the corpus registry (`register_corpus`) is a calibration source: windows of its `calibration`
stream (`sample_sequences`), identified by the corpus text's sha256. Sources that are not text corpora register
here (`register_calibration_source`); `mqar` draws synthetic recall sequences from the MQAR generator
(`data.mqar`) with the settings the model was pretrained with (the `mqar:` section of its training record), so
that a recall model can be calibrated on the task it is evaluated on (distribution shift, issue 15 item 6).

`calibration_windows(name, model_dir, tokenizer, n, seq_len, seed)` -> (LongTensor [n, seq_len], the record that
prune writes as selection.json's `calibration`). `check_calibration_source(name, model_dir)` refuses a source the
model cannot be calibrated on before its weights load.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from state_reduction.data.mqar import MQARVocab, manifest_entry, mqar_mixed_pairs
from state_reduction.data.registry import CorpusError, get_corpus_info, list_corpora
from state_reduction.data.sampler import sample_sequences
from state_reduction.errors import InputError


@dataclass(frozen=True)
class CalibrationSource:
    """A non-corpus source: `draw(model_dir, n, seq_len, seed, vocab_size)` -> (windows [n, T], record);
    `check(model_dir)` raises an InputError when the model cannot be calibrated on it."""

    name: str
    description: str
    draw: Callable[..., tuple[torch.Tensor, dict]]
    check: Callable[[str], None]


_SOURCES: dict[str, CalibrationSource] = {}


def _corpora() -> list[str]:
    return [c.name for c in list_corpora()]


def register_calibration_source(name: str, description: str, check: Callable[[str], None]):
    """Decorator: register `draw` as calibration source `name` (a name no corpus has)."""

    def wrap(draw):
        if name in _SOURCES or name in _corpora():
            raise InputError(f"calibration source {name!r} is registered twice (or is a corpus name)")
        _SOURCES[name] = CalibrationSource(name, description, draw, check)
        return draw

    return wrap


def calibration_source_names() -> list[str]:
    """Every name `--calib` accepts: the corpora, then the other sources."""
    return sorted(_corpora()) + sorted(_SOURCES)


def _unknown(name: str) -> CorpusError:
    known = calibration_source_names()
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return CorpusError(f"unknown calibration source {name!r}.{hint} Known: {', '.join(known)} (corpora and "
                       f"{', '.join(sorted(_SOURCES))}).")


def check_calibration_source(name: str, model_dir) -> None:
    """Refuse early an unknown source, or one that `model_dir` cannot be calibrated on."""
    if name in _SOURCES:
        _SOURCES[name].check(str(model_dir))
    elif name not in _corpora():
        raise _unknown(name)


def calibration_windows(name: str, *, model_dir, tokenizer, n: int, seq_len: int, seed: int, data_dir=None,
                        vocab_size: int | None = None) -> tuple[torch.Tensor, dict]:
    """`n` calibration sequences of `seq_len` tokens from source `name`, and their record. `vocab_size`: the
    model's (a synthetic source checks its token ids against it; default: the tokenizer's length)."""
    if name in _SOURCES:
        source = _SOURCES[name]
        source.check(str(model_dir))
        vocab_size = vocab_size if vocab_size is not None else len(tokenizer)
        return source.draw(str(model_dir), n=n, seq_len=seq_len, seed=seed, vocab_size=vocab_size)
    if name not in _corpora():
        raise _unknown(name)
    windows = sample_sequences(tokenizer, name, n=n, seq_len=seq_len, seed=seed, stream="calibration",
                               data_dir=data_dir)
    return windows, {"corpus": name, "stream": "calibration", "n": n, "seq_len": seq_len,
                     "tokens": int(windows.numel()), "seed": seed, "sha256": get_corpus_info(name).sha256}


# -- MQAR --------------------------------------------------------------------------------------------------------
def training_mqar(model_dir: str) -> tuple[dict, int, Path]:
    """(the `mqar:` section of the model's training record, its training seq_len, the record's path); one line
    naming the model and what is missing otherwise."""
    path = Path(model_dir) / "training_record.json"
    what = "MQAR calibration draws sequences with the generator settings the model was pretrained with"
    if not path.is_file():
        raise InputError(f"--calib mqar: model {model_dir} has no training_record.json, so no `mqar:` training "
                         f"section ({what}); use a recall model (experiments/tiny_models/configs/*_mqar.yaml) or a "
                         f"text corpus")
    try:
        config = json.loads(path.read_text()).get("config") or {}
    except (OSError, ValueError) as e:
        raise InputError(f"--calib mqar: {path} cannot be read as JSON ({e})") from None
    section = config.get("mqar")
    if not section:
        raise InputError(f"--calib mqar: model {model_dir} was not pretrained on MQAR: its training record {path} "
                         f"has no `mqar:` section in `config` ({what}); use a recall model "
                         "(experiments/tiny_models/configs/*_mqar.yaml) or a text corpus")
    missing = [k for k in ("min_pairs", "max_pairs") if k not in section]
    if missing:
        raise InputError(f"--calib mqar: the `mqar:` section of {path} lacks {missing}")
    return section, int(config.get("seq_len", 0)), path


def _check_mqar(model_dir: str) -> None:
    training_mqar(model_dir)


def mqar_seed(seed: int) -> int:
    """The generator seed of calibration draw `seed`: hashed, so it is none of the training steps' seeds
    (pretrain.mqar_training_batch: seed * 1_000_003 + 7919 * step + 1) nor a tiny_mqar cell's."""
    return int(hashlib.sha256(f"calibration:{seed}".encode()).hexdigest()[:15], 16)


@register_calibration_source(
    "mqar", "MQAR sequences (data.mqar) with the pair counts and vocabulary of the model's training record",
    check=_check_mqar)
def _draw_mqar(model_dir: str, n: int, seq_len: int, seed: int, vocab_size: int) -> tuple[torch.Tensor, dict]:
    section, trained_len, path = training_mqar(model_dir)
    vocab = MQARVocab(**section.get("vocab", {}))
    try:
        vocab.check(vocab_size)
    except ValueError as e:
        raise InputError(f"--calib mqar: model {model_dir}: {e}") from None
    lo, hi = int(section["min_pairs"]), int(section["max_pairs"])
    if seq_len < 4 * hi:
        raise InputError(f"--calib mqar: --seq-len {seq_len} cannot hold the {hi} pairs model {model_dir} was "
                         f"trained with (MQAR needs 4 x pairs = {4 * hi} tokens; it trained at {trained_len})")
    ids, labels = mqar_mixed_pairs(n, seq_len, lo, hi, seed=mqar_seed(seed), vocab=vocab)
    return ids, {
        "corpus": "mqar", "stream": "calibration", "n": n, "seq_len": seq_len, "tokens": int(ids.numel()),
        "seed": seed, "sha256": None,
        "sha256_note": "synthetic sequences, no corpus file: identified by the generator settings and "
                       "sequences_sha256 (int64 input ids then labels, data.mqar.manifest_entry)",
        "sequences_sha256": manifest_entry(ids, labels),
        "generator": {"module": "state_reduction.data.mqar.mqar_mixed_pairs", "seed": mqar_seed(seed),
                      "min_pairs": lo, "max_pairs": hi, "vocab": vocab.to_dict(), "training_seq_len": trained_len,
                      "training_record": str(path)},
    }
