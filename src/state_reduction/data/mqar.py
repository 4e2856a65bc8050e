"""Multi-query associative recall (MQAR; Arora et al. 2023, "Zoology", arXiv 2312.04927): seeded and offline.

A sequence of `length` tokens holds `n_pairs` key-value pairs, a gap of noise tokens, then every key of
the pairs once more, in a new random order, each followed by its value:

    k1 v1 k2 v2 ... kN vN  g g ... g  k_s(1) v_s(1) ... k_s(N) v_s(N)          [T] = 2N + G + 2N

The labels (HF convention: aligned with `input_ids`, the model shifts them) are the values of the query
part and -100 elsewhere, so only a recalled value is scored: the prediction made at a queried key. Keys
within a sequence are distinct. Keys, values and noise are three disjoint blocks of token ids of the
model's own vocabulary (`MQARVocab`), so the same models read text and MQAR. Zoology places queries at
random positions of the tail; here they come last and are preceded by the gap, so context length and
number of pairs vary independently (the suite's two axes).

Everything is a pure function of (seed, arguments): torch.Generator on the CPU.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

import torch

from state_reduction.hashing import config_key

IGNORE_INDEX = -100


@dataclass(frozen=True)
class MQARVocab:
    """Token-id blocks: keys [first, first+n_keys), then values, then noise tokens."""

    n_keys: int = 16
    n_values: int = 16
    n_noise: int = 16
    first: int = 1024  # above the byte-level BPE tokenizer's byte tokens and specials

    @property
    def keys(self) -> torch.Tensor:
        return torch.arange(self.first, self.first + self.n_keys)

    @property
    def values(self) -> torch.Tensor:
        start = self.first + self.n_keys
        return torch.arange(start, start + self.n_values)

    @property
    def noise(self) -> torch.Tensor:
        start = self.first + self.n_keys + self.n_values
        return torch.arange(start, start + self.n_noise)

    def check(self, vocab_size: int) -> None:
        end = self.first + self.n_keys + self.n_values + self.n_noise
        if end > vocab_size:
            raise ValueError(f"MQAR vocabulary needs token ids up to {end - 1}, but the model's vocabulary has "
                             f"{vocab_size} ids; lower mqar n_keys/n_values/n_noise/first")

    def to_dict(self) -> dict:
        return asdict(self)

    def sha256(self) -> str:
        return config_key(self.to_dict(), digits=None)


def mqar_sequences(n: int, length: int, n_pairs: int, seed: int, vocab: MQARVocab = MQARVocab()
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` MQAR sequences of `length` tokens with `n_pairs` pairs: (input_ids [n, T], labels [n, T])."""
    if n_pairs < 1 or n_pairs > vocab.n_keys:
        raise ValueError(f"MQAR n_pairs={n_pairs}: accepted 1..{vocab.n_keys} (the number of distinct keys)")
    gap = length - 4 * n_pairs
    if gap < 0:
        raise ValueError(f"MQAR length={length} cannot hold n_pairs={n_pairs}: it needs at least {4 * n_pairs} "
                         "tokens (pairs and queries)")
    g = torch.Generator().manual_seed(seed)
    key_idx = torch.rand(n, vocab.n_keys, generator=g).argsort(dim=1)[:, :n_pairs]  # distinct keys [n, N]
    keys = vocab.keys[key_idx]
    values = vocab.values[torch.randint(0, vocab.n_values, (n, n_pairs), generator=g)]
    order = torch.rand(n, n_pairs, generator=g).argsort(dim=1)  # query order [n, N]
    noise = vocab.noise[torch.randint(0, vocab.n_noise, (n, gap), generator=g)]

    pairs = torch.stack([keys, values], dim=2).reshape(n, 2 * n_pairs)
    q_keys, q_values = keys.gather(1, order), values.gather(1, order)
    queries = torch.stack([q_keys, q_values], dim=2).reshape(n, 2 * n_pairs)
    input_ids = torch.cat([pairs, noise, queries], dim=1)
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[:, 2 * n_pairs + gap + 1::2] = q_values
    return input_ids, labels


def mqar_mixed_pairs(n: int, length: int, min_pairs: int, max_pairs: int, seed: int,
                     vocab: MQARVocab = MQARVocab()) -> tuple[torch.Tensor, torch.Tensor]:
    """Training batch: `n` sequences, each with its own number of pairs drawn uniformly from [min, max]."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(min_pairs, max_pairs + 1, (n,), generator=g).tolist()
    seeds = torch.randint(0, 2**62, (n,), generator=g).tolist()
    rows = [mqar_sequences(1, length, c, s, vocab) for c, s in zip(counts, seeds)]
    return torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])


def manifest_entry(input_ids: torch.Tensor, labels: torch.Tensor) -> str:
    """sha256 of a set of sequences (int64 little-endian input ids, then labels)."""
    h = hashlib.sha256()
    h.update(input_ids.to(torch.int64).contiguous().numpy().tobytes())
    h.update(labels.to(torch.int64).contiguous().numpy().tobytes())
    return h.hexdigest()
