"""A seeded ListOps generator (Nangia & Bowman 2018, the LRA ListOps task at small lengths), fully offline.

A sequence is a bracketed expression over the digits 0-9 with the operators MAX, MIN, MED (lower median)
and SM (sum modulo 10); its label is the expression's value (10 classes). Every split is a pure function of
(seed, split, sizes, length limits): the generator draws from `numpy.random.default_rng([seed, split_id])`,
and `manifest` records the sha256 of each split's token and label arrays so a run can prove what it read.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

import numpy as np

OPERATORS = ("MAX", "MIN", "MED", "SM")
PAD = 0
DIGIT0 = 1                                   # digits d -> DIGIT0 + d
OPEN = {op: 11 + i for i, op in enumerate(OPERATORS)}   # "[MAX" ... "[SM"
CLOSE = 15
VOCAB_SIZE = 16
N_CLASSES = 10
SPLITS = {"train": 0, "val": 1, "test": 2}


@dataclass(frozen=True)
class ListOpsSpec:
    seed: int = 0
    n_train: int = 20000
    n_val: int = 1000
    n_test: int = 2000
    min_len: int = 16
    max_len: int = 96
    max_depth: int = 5
    max_args: int = 4
    leaf_prob: float = 0.45

    def size(self, split: str) -> int:
        if split not in SPLITS:
            raise ValueError(f"ListOps split must be one of {', '.join(SPLITS)}, got {split!r}")
        return getattr(self, f"n_{split}")


def _apply(op: str, values: list[int]) -> int:
    if op == "MAX":
        return max(values)
    if op == "MIN":
        return min(values)
    if op == "MED":
        return sorted(values)[(len(values) - 1) // 2]
    return sum(values) % 10


class _TooLong(Exception):
    pass


def _tree(rng: np.random.Generator, depth: int, spec: ListOpsSpec, out: list[int]) -> int:
    """Append a random expression whose root sits at `depth` to `out` and return its value; raise _TooLong
    as soon as `out` passes max_len (so rejected draws cost at most max_len tokens)."""
    if len(out) >= spec.max_len:
        raise _TooLong
    if depth >= spec.max_depth or (depth > 0 and rng.random() < spec.leaf_prob):
        d = int(rng.integers(10))
        out.append(DIGIT0 + d)
        return d
    op = OPERATORS[int(rng.integers(len(OPERATORS)))]
    out.append(OPEN[op])
    values = [_tree(rng, depth + 1, spec, out) for _ in range(int(rng.integers(2, spec.max_args + 1)))]
    out.append(CLOSE)
    return _apply(op, values)


def evaluate_tokens(tokens: list[int]) -> int:
    """Value of a token sequence (padding ignored); the reference the generator's labels are tested against."""
    stack: list[list] = []
    for t in tokens:
        if t == PAD:
            continue
        if t in OPEN.values():
            stack.append([OPERATORS[t - 11]])
        elif t == CLOSE:
            op, *vals = stack.pop()
            v = _apply(op, vals)
            if not stack:
                return v
            stack[-1].append(v)
        else:
            if not stack:
                return t - DIGIT0
            stack[-1].append(t - DIGIT0)
    raise ValueError("ListOps sequence is not a complete expression")


def generate_split(spec: ListOpsSpec, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """tokens [N, max_len] int64 right-padded with PAD, lengths [N], labels [N]."""
    n = spec.size(split)
    rng = np.random.default_rng([spec.seed, SPLITS[split]])
    tokens = np.full((n, spec.max_len), PAD, dtype=np.int64)
    lengths = np.zeros(n, dtype=np.int64)
    labels = np.zeros(n, dtype=np.int64)
    i = 0
    while i < n:
        seq: list[int] = []
        try:
            value = _tree(rng, 0, spec, seq)
        except _TooLong:
            continue
        if not spec.min_len <= len(seq) <= spec.max_len:
            continue
        tokens[i, :len(seq)] = seq
        lengths[i], labels[i] = len(seq), value
        i += 1
    return tokens, lengths, labels


def split_sha256(tokens: np.ndarray, labels: np.ndarray) -> str:
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(tokens, dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(labels, dtype="<i8").tobytes())
    return h.hexdigest()


def generate(spec: ListOpsSpec) -> tuple[dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], dict]:
    """All three splits and their manifest {spec, splits: {name: {n, sha256, mean_len, label_counts}}}."""
    data, splits = {}, {}
    for split in SPLITS:
        tokens, lengths, labels = generate_split(spec, split)
        data[split] = (tokens, lengths, labels)
        splits[split] = {"n": int(len(labels)), "sha256": split_sha256(tokens, labels),
                         "mean_len": round(float(lengths.mean()), 2),
                         "label_counts": np.bincount(labels, minlength=N_CLASSES).tolist()}
    return data, {"generator": "state_reduction.ssm.listops", "spec": asdict(spec), "splits": splits}


def verify(data: dict, manifest: dict) -> None:
    """Raise when a generated split's sha256 differs from the manifest's (the generator changed)."""
    for split, entry in manifest["splits"].items():
        tokens, _, labels = data[split]
        got = split_sha256(tokens, labels)
        if got != entry["sha256"]:
            raise ValueError(f"ListOps split {split!r}: sha256 {got} differs from the manifest's {entry['sha256']}; "
                             f"the generator or its spec {manifest['spec']} changed")
