"""Token windows for pretraining, calibration, fine-tuning and evaluation, from disjoint documents.

The train split's documents are partitioned once per corpus into three pools (`pretrain`,
`calibration`, `finetune`), so calibration and recovery fine-tuning never see the same text (the
authors' code drew both from one seeded stream). `evaluation` reads the validation (default) or
test split. A stream's documents are concatenated, each followed by EOS, cut into non-overlapping
windows of `seq_len`, and `n` windows are taken in the order of a permutation seeded by `seed`.

Materialised corpora (tiny, wikitext2) partition groups of documents by `partition_groups`
(fractions of characters); streaming corpora put each document in a pool by a hash of its text and
read a shuffled stream until they have twice the tokens asked for.
"""

from __future__ import annotations

import hashlib
import inspect
import io
import json
import zipfile
from pathlib import Path
from typing import Callable, Protocol, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from state_reduction.atomic import write_bytes_atomic
from state_reduction.data.corpora import load_corpus, tiny_documents
from state_reduction.data.fetch import resolve_data_dir
from state_reduction.data.partition import bucket, partition_groups, unit_interval
from state_reduction.data.registry import get_corpus_info
from state_reduction.errors import InputError

STREAMS = ("pretrain", "calibration", "finetune", "evaluation")
# Shares of the train split's characters; evaluation uses the held-out splits instead.
TRAIN_POOL_FRACTIONS = {"pretrain": 0.80, "calibration": 0.10, "finetune": 0.10}
STREAMING_OVERSAMPLE = 2
STREAMING_SHUFFLE_BUFFER = 10_000
_ENCODE_BATCH = 64
_PROBE = "The quick brown fox jumps over the lazy dog.\n Ünïcödé 漢字 12345 <unk> N, 'tis\t!"


class Tokenizer(Protocol):
    eos_token_id: int | None

    def encode(self, text: str) -> Sequence[int]: ...


def _encoder(tokenizer) -> Callable[[str], list[int]]:
    """text -> ids, without the BOS/EOS an HF tokenizer would add by default."""
    try:
        params = inspect.signature(tokenizer.encode).parameters
    except (TypeError, ValueError):
        params = {}
    kwargs = {"add_special_tokens": False} if "add_special_tokens" in params else {}

    def encode(text: str) -> list[int]:
        out = tokenizer.encode(text, **kwargs)
        return list(getattr(out, "ids", out))

    return encode


def _batch_encoder(tokenizer) -> Callable[[list[str]], list[list[int]]]:
    """Like `_encoder` over a list; HF fast tokenizers encode the batch in parallel in Rust."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and callable(getattr(backend, "encode_batch", None)):
        return lambda texts: [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    encode = _encoder(tokenizer)
    return lambda texts: [encode(t) for t in texts]


def _eos_id(tokenizer) -> int:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise InputError(
            f"tokenizer {type(tokenizer).__name__} has no eos_token_id; the sampler separates "
            "documents with it"
        )
    return int(eos)


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of what the tokenizer does: its full serialisation when it has one, else its class,
    vocabulary and the ids it gives a probe string."""
    h = hashlib.sha256()
    cls = type(tokenizer)
    h.update(f"{cls.__module__}.{cls.__qualname__}|eos={_eos_id(tokenizer)}".encode())
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if callable(getattr(backend, "to_str", None)):
        h.update(backend.to_str().encode())
    elif callable(getattr(tokenizer, "get_vocab", None)):
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update(json.dumps(_encoder(tokenizer)(_PROBE)).encode())
    return h.hexdigest()


def _resolve_split(corpus: str, stream: str, split: str | None) -> str:
    if stream not in STREAMS:
        raise InputError(
            f"unknown stream {stream!r} for corpus {corpus!r}; accepted: {', '.join(STREAMS)}"
        )
    if stream == "evaluation":
        split = split or "validation"
        if split not in ("validation", "test"):
            raise InputError(
                f"stream 'evaluation' of corpus {corpus!r} reads 'validation' or 'test', "
                f"not {split!r}"
            )
        return split
    if split not in (None, "train"):
        raise InputError(
            f"stream {stream!r} of corpus {corpus!r} is a pool of the train split; split must be "
            f"None or 'train', not {split!r}"
        )
    return "train"


def _tokenize_documents(
    tokenizer, texts: Sequence[str], desc: str
) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated ids of every text followed by EOS (stored in the smallest integer dtype that
    holds them), and the [len(texts) + 1] offsets."""
    encode, eos = _batch_encoder(tokenizer), _eos_id(tokenizer)
    pieces, offsets = [], [0]
    with tqdm(total=len(texts), desc=desc, unit="doc", delay=1.0, leave=False) as bar:
        for start in range(0, len(texts), _ENCODE_BATCH):
            for ids in encode(list(texts[start:start + _ENCODE_BATCH])):
                ids.append(eos)
                pieces.append(np.asarray(ids, dtype=np.int64))
                offsets.append(offsets[-1] + len(ids))
            bar.update(min(_ENCODE_BATCH, len(texts) - start))
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    return tokens.astype(_smallest_dtype(tokens)), np.asarray(offsets, dtype=np.int64)


def _smallest_dtype(tokens: np.ndarray) -> type:
    top = int(tokens.max()) if tokens.size else 0
    return np.uint16 if top < 2**16 else np.int32 if top < 2**31 else np.int64


def _cached_split_tokens(
    tokenizer, texts: Sequence[str], cache_key: str, cache_dir: Path, desc: str
) -> tuple[np.ndarray, np.ndarray]:
    """`_tokenize_documents`, memoised in `cache_dir/<cache_key>.npz` (written atomically)."""
    path = cache_dir / f"{cache_key}.npz"
    if path.is_file():
        try:
            with np.load(path) as z:
                tokens, offsets = z["tokens"], z["offsets"]
            if len(offsets) == len(texts) + 1 and offsets[-1] == len(tokens):
                return tokens, offsets
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            pass  # a damaged cache file is rebuilt below
    tokens, offsets = _tokenize_documents(tokenizer, texts, desc)
    cache_dir.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    np.savez(buffer, tokens=tokens, offsets=offsets)
    write_bytes_atomic(path, buffer.getvalue())
    return tokens, offsets


def _pool_of_groups(corpus: str, groups: Sequence[str], texts: Sequence[str]) -> dict[str, str]:
    sizes: dict[str, int] = {}
    for group, text in zip(groups, texts):
        sizes[group] = sizes.get(group, 0) + len(text)
    return partition_groups(sizes, TRAIN_POOL_FRACTIONS, salt=f"{corpus}:streams")


def stream_document_ids(
    corpus: str, stream: str, split: str | None = None, data_dir=None
) -> list[str]:
    """The ids of the documents a stream of a tiny corpus draws from (for audits and tests)."""
    split = _resolve_split(corpus, stream, split)
    docs = tiny_documents(corpus, split, data_dir)
    if stream == "evaluation":
        return [d.doc_id for d in docs]
    pool = _pool_of_groups(corpus, [d.group for d in docs], [d.text for d in docs])
    return [d.doc_id for d in docs if pool[d.group] == stream]


def _materialised_stream_tokens(
    tokenizer, corpus: str, stream: str, split: str, data_dir
) -> np.ndarray:
    info = get_corpus_info(corpus)
    if info.profile == "tiny":
        docs = tiny_documents(corpus, split, data_dir)
        groups, texts = [d.group for d in docs], [d.text for d in docs]
        source_hash = info.sha256
    else:
        texts = list(load_corpus(corpus, split)["text"])
        groups = [str(i) for i in range(len(texts))]
        source_hash = hashlib.sha256("\0".join(texts).encode()).hexdigest()
    key = f"{source_hash}|{split}|{tokenizer_fingerprint(tokenizer)}"
    key = hashlib.sha256(key.encode()).hexdigest()
    cache_dir = resolve_data_dir(data_dir) / "tokens"
    tokens, offsets = _cached_split_tokens(
        tokenizer, texts, f"{corpus}-{split}-{key[:16]}", cache_dir, f"tokenize {corpus}/{split}"
    )
    if stream == "evaluation":
        return tokens.astype(np.int64)
    pool = _pool_of_groups(corpus, groups, texts)
    keep = [i for i, g in enumerate(groups) if pool[g] == stream]
    return np.concatenate([tokens[offsets[i]:offsets[i + 1]] for i in keep]).astype(np.int64)


def _streamed_tokens(
    tokenizer, corpus: str, stream: str, split: str, budget: int, seed: int
) -> np.ndarray:
    ds = load_corpus(corpus, split)
    if stream != "evaluation":

        def in_stream(row) -> bool:
            u = unit_interval(corpus, "streams", row["text"])
            return bucket(u, TRAIN_POOL_FRACTIONS) == stream

        ds = ds.filter(in_stream)
    ds = ds.shuffle(seed=seed, buffer_size=STREAMING_SHUFFLE_BUFFER)
    encode, eos = _encoder(tokenizer), _eos_id(tokenizer)
    pieces, total = [], 0
    desc = f"tokenize {corpus}/{split}/{stream}"
    with tqdm(total=budget, desc=desc, unit="tok", delay=1.0, leave=False) as bar:
        for row in ds:
            ids = encode(row["text"]) + [eos]
            pieces.append(np.asarray(ids, dtype=np.int64))
            total += len(ids)
            bar.update(len(ids))
            if total >= budget:
                break
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


def stream_tokens(
    tokenizer,
    corpus: str,
    stream: str,
    split: str | None = None,
    data_dir=None,
    budget: int | None = None,
    seed: int = 0,
) -> np.ndarray:
    """All token ids of a stream, int64 [N], each document followed by EOS.

    Streaming corpora stop once they hold `budget` tokens, read in an order shuffled by `seed`.
    """
    split = _resolve_split(corpus, stream, split)
    info = get_corpus_info(corpus)
    if info.streaming:
        if budget is None:
            raise InputError(f"corpus {corpus!r} is streamed; stream_tokens needs a token budget")
        return _streamed_tokens(tokenizer, corpus, stream, split, budget, seed)
    return _materialised_stream_tokens(tokenizer, corpus, stream, split, data_dir)


def sample_sequences(
    tokenizer: Tokenizer,
    corpus: str,
    n: int,
    seq_len: int,
    seed: int,
    stream: str,
    split: str | None = None,
    data_dir=None,
) -> torch.Tensor:
    """`n` windows of `seq_len` tokens from one stream of a corpus: LongTensor [n, seq_len].

    Same arguments give the same tensor; the streams share no document, hence no window. A
    window may span the EOS between two documents of its stream (packed sequences).
    """
    if n <= 0 or seq_len <= 0:
        raise InputError(f"n and seq_len must be positive, got n={n}, seq_len={seq_len}")
    split = _resolve_split(corpus, stream, split)
    budget = STREAMING_OVERSAMPLE * n * seq_len
    tokens = stream_tokens(tokenizer, corpus, stream, split, data_dir, budget=budget, seed=seed)
    available = len(tokens) // seq_len
    if available < n:
        raise InputError(
            f"stream {stream!r} of corpus {corpus!r} (split {split!r}) has {len(tokens)} tokens, "
            f"{available} windows of seq_len={seq_len}; asked for n={n} ({n * seq_len} tokens)"
        )
    rng = np.random.default_rng([seed, STREAMS.index(stream)])
    starts = rng.choice(available, size=n, replace=False) * seq_len
    windows = tokens[starts[:, None] + np.arange(seq_len)[None, :]]  # [n, seq_len]
    return torch.from_numpy(windows)
