"""The tiny profile's byte-level BPE tokenizer: trained on the tiny training mix, committed,
loadable with `AutoTokenizer.from_pretrained`."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from state_reduction.errors import MissingInputError

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 8192, min_frequency: int = 2) -> PreTrainedTokenizerFast:
    """Byte-level BPE (GPT-2 style pre-tokenisation), special tokens first: eos (also bos) and pad."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=True,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN, pad_token=PAD_TOKEN, unk_token=None,
        model_max_length=1_000_000,
    )


def tokenizer_hash(path: str | Path) -> str:
    """sha256 of the tokenizer's vocabulary and merges (tokenizer.json), independent of save metadata."""
    data = json.loads((Path(path) / "tokenizer.json").read_text())
    canonical = json.dumps({"model": data["model"], "added_tokens": data["added_tokens"]}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    path = Path(path)
    if not (path / "tokenizer.json").is_file():
        raise MissingInputError(f"no tokenizer.json in {path}; train one with `make tokenizer`")
    return AutoTokenizer.from_pretrained(str(path))
