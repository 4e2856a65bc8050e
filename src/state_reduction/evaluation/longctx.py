"""Long-context retrieval (paper section 5, Table 4; appendix C.4, Table 11): the offline `tiny_longctx` suite and
the context-length check that runs before any evaluation.

Tiny suite: synthetic retrieval tasks whose haystack is held-out text (the `test` splits of wiki, books and
ptb), sized in tokens of the evaluated model's tokenizer to fill exactly a context of L tokens (answer
included), for L in LENGTHS (the tiny models' training length, 256, and twice that, as the paper evaluates
its 2K-trained models at 2K and 4K):

  tiny_passkey_<L>  one needle ("The secret word is W. Remember it: the secret word is W.") at a depth of
                    10..90% of the haystack; the question at the end. RULER's single-needle NIAH.
  tiny_kv_<L>       four needles ("The word for K is V."), one queried. RULER's multi-key NIAH.

Scoring is lm-eval `multiple_choice` (log-likelihood of each choice, `acc`), not generation: keys, values
and distractors are single tokens of the tokenizer, so one forward per example scores all choices, and a
~2M-parameter model that cannot yet generate an exact answer still shows how much of the needle reaches
the end of the context. The passkey distractors are words absent from the context (a model that copies
any word of the context wins: a floor of in-context recall); the key-value distractors are the other
needles' values, all in the context (only binding the queried key to its value wins). Chance is 25%.

`build_longctx_suite(tokenizer)` writes one JSONL file per task and a manifest with their sha256 under
`<data_dir>/eval/tiny_longctx/<tokenizer hash>/`; the same corpora and tokenizer give byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from state_reduction.atomic import write_json_atomic
from state_reduction.checkpoints import load_config, load_tokenizer
from state_reduction.data import get_corpus_info, load_corpus, resolve_data_dir
from state_reduction.errors import Error, InputError
from state_reduction.evaluation.tiny_suite import (
    SPLIT,
    _file_sha256,
    _located,
    _paragraphs,
    _write_jsonl,
)

BUILD_VERSION = 1
SEED = 0
LENGTHS = (256, 512)
CORPORA = ("wiki", "books", "ptb")
N_EXAMPLES = 100
N_CHOICES = 4
N_KV_NEEDLES = 4
DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
# The paper evaluates models trained at 2K at 2K and 4K: twice the training length is the protocol's reach.
MAX_EXTRAPOLATION = 2
# Common concrete nouns; those that are one token of the tokenizer (with a leading space) are the keys,
# values and distractors.
_WORD_POOL_TEXT = (
    "river stone horse tree bread house water fire table chair window garden mountain city village road "
    "bridge ship boat island forest field flower bird fish dog cat king queen church castle tower wall gate "
    "door book letter paper money gold silver iron glass wine milk salt sugar apple grape coat hat shoe ring "
    "sword shield bell drum clock lamp candle star moon cloud rain snow wind storm sea lake hill valley farm "
    "market school army soldier captain doctor teacher child mother father brother sister friend enemy "
    "plate spoon knife cup bottle box bag rope chain wheel wagon train engine machine"
)
WORD_POOL = tuple(_WORD_POOL_TEXT.split())


class ContextLengthError(Error, ValueError):
    """A requested context length exceeds what the model or tokenizer supports; the message names both."""


@dataclass(frozen=True)
class LongTask:
    name: str
    family: str  # "passkey" or "kv": the YAML template (tasks/tiny_<family>.yaml)
    length: int  # context + answer, in tokens


TASKS: dict[str, LongTask] = {f"tiny_{family}_{n}": LongTask(f"tiny_{family}_{n}", family, n)
                              for family in ("passkey", "kv") for n in LENGTHS}


# -- context-length check ---------------------------------------------------------------------------------
def _uses_positions(config) -> bool:
    """Whether the model encodes positions (RoPE, learned): then max_position_embeddings is a limit. The
    recurrent families (fla DeltaNet/Gated DeltaNet without attention layers, Mamba-2) have none, and their
    configs' max_position_embeddings is nominal."""
    if getattr(config, "attn", None):  # an fla model with softmax-attention layers (RoPE)
        return True
    return any(getattr(config, k, None) is not None
               for k in ("rope_parameters", "rope_theta", "rope_scaling", "position_embedding_type"))


def context_limits(config, tokenizer=None, model_dir=None) -> list[tuple[int, str]]:
    """The limits on the context length of a model, each with where it comes from."""
    limits = []
    if tokenizer is not None:
        n = getattr(tokenizer, "model_max_length", None)
        if isinstance(n, int) and n < 10**12:  # transformers' VERY_LARGE_INTEGER means "not set"
            limits.append((n, "tokenizer model_max_length"))
    n = getattr(config, "max_position_embeddings", None)
    if n and _uses_positions(config):
        limits.append((int(n), "config max_position_embeddings (the model encodes positions)"))
    trained = training_length(model_dir)
    if trained is not None:
        seq_len, source = trained
        limits.append((MAX_EXTRAPOLATION * seq_len, f"{MAX_EXTRAPOLATION} x the training length {seq_len} ({source})"))
    return limits


def training_length(model_dir) -> tuple[int, str] | None:
    """(sequence length the model was pretrained at, the file that says so): the folder's training_record.json,
    else that of the model it was made from (a pruned folder's selection.json names its dense model, an RFT
    model's rft_config.json its student); None when no record is found."""
    folder = Path(model_dir) if model_dir else None
    for _ in range(4):
        if folder is None or not folder.is_dir():
            return None
        try:
            if (folder / "training_record.json").is_file():
                seq_len = json.loads((folder / "training_record.json").read_text()).get("config", {}).get("seq_len")
                return (int(seq_len), str(folder / "training_record.json")) if seq_len else None
            if (folder / "selection.json").is_file():
                folder = Path(json.loads((folder / "selection.json").read_text())["config"]["model"])
            elif (folder / "rft_config.json").is_file():
                folder = Path(json.loads((folder / "rft_config.json").read_text())["student"])
            else:
                return None
        except (ValueError, KeyError, TypeError, OSError):
            return None
    return None


def check_length_option(length: int, option: str, config, tokenizer=None, model_dir=None, name=None) -> None:
    """Before compute: `option` (a context length in tokens) within the model's and tokenizer's limits
    (context_limits) or a ContextLengthError naming both; beyond the training length only a warning."""
    name = name or model_dir or getattr(config, "model_type", "model")
    for limit, source in context_limits(config, tokenizer, model_dir):
        if length > limit:
            raise ContextLengthError(f"{option} {length} exceeds the limit {limit} of model {name} ({source})",
                                     hint=f"use {option} <= {limit}")
    trained = training_length(model_dir)
    if trained is not None and length > trained[0]:
        warnings.warn(f"{option} {length} is beyond the training length {trained[0]} of model {name} "
                      f"({trained[1]}); the model extrapolates", stacklevel=2)


def check_context_length(length: int, config, tokenizer=None, model_dir=None, name: str | None = None,
                         max_length: int | None = None) -> None:
    """Raise ContextLengthError when `length` tokens exceed a limit of the model or tokenizer, or the
    evaluation's `max_length` (lm-eval would silently cut the context from the left, dropping the needle)."""
    name = name or getattr(config, "_name_or_path", None) or getattr(config, "model_type", "model")
    if max_length is not None and length > max_length:
        raise ContextLengthError(
            f"context length {length} exceeds the evaluation's max_length {max_length} for model {name}: lm-eval "
            f"would cut the context from the left; set max_length >= {length}")
    for limit, source in context_limits(config, tokenizer, model_dir):
        if length > limit:
            raise ContextLengthError(
                f"context length {length} exceeds the limit {limit} of model {name} ({source}); "
                f"evaluate at <= {limit} tokens or use a model that supports {length}")


def check_model_path(path: str, length: int, max_length: int | None = None) -> None:
    """check_context_length for a local checkpoint folder, reading only its config files (no weights)."""
    config = load_config(path)
    tokenizer = load_tokenizer(path)
    check_context_length(length, config, tokenizer, model_dir=path, name=path, max_length=max_length)


# -- the tiny suite ---------------------------------------------------------------------------------------
def tokenizer_sha256(tokenizer) -> str:
    """sha256 of the vocabulary and merges (as state_reduction.tokenizer.tokenizer_hash, from the object)."""
    data = json.loads(tokenizer.backend_tokenizer.to_str())
    canonical = json.dumps({"model": data["model"], "added_tokens": data["added_tokens"]}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def single_token_words(tokenizer) -> list[str]:
    """WORD_POOL words that are one token with a leading space (so each choice is one token), in pool order."""
    words = [w for w in dict.fromkeys(WORD_POOL) if len(tokenizer(" " + w, add_special_tokens=False).input_ids) == 1]
    if len(words) < 2 * N_KV_NEEDLES + N_CHOICES:
        raise InputError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has only {len(words)} of the "
                         f"{len(WORD_POOL)} pool words as single tokens; the suite needs {2 * N_KV_NEEDLES + N_CHOICES}")
    return words


def _sentences(data_dir) -> list[list[str]]:
    """Per held-out document (corpora in CORPORA order) its sentences, in order."""
    docs = []
    for corpus in CORPORA:
        for text in load_corpus(corpus, SPLIT, data_dir=data_dir)["text"]:
            sentences = [s for para in _paragraphs(corpus, text) for s in para]
            if sentences:
                docs.append(sentences)
    return docs


class _Builder:
    def __init__(self, tokenizer, docs: list[list[str]], words: list[str]):
        self.tok, self.docs, self.words = tokenizer, docs, words

    def n_tokens(self, text: str) -> int:
        return len(self.tok(text, add_special_tokens=False).input_ids)

    def haystack(self, rng: random.Random, budget: int, banned: set[str]) -> list[str]:
        """Words of consecutive held-out sentences (from a random document and sentence on, wrapping to the
        next documents) until `budget` tokens; sentences holding a banned word are skipped."""
        d = rng.randrange(len(self.docs))
        s = rng.randrange(len(self.docs[d]))
        words: list[str] = []
        total = 0
        while total < budget:
            sentence = self.docs[d][s]
            if not banned & set(re.findall(r"[a-z]+", sentence.lower())):
                words += sentence.split()
                total += self.n_tokens(" " + sentence)
            s += 1
            if s == len(self.docs[d]):
                d, s = (d + 1) % len(self.docs), 0
        return words

    def fill(self, rng, length: int, needles: list[tuple[float, str]], question: str, banned: set[str]) -> dict:
        """A context of exactly `length - 1` tokens (the one-token answer completes `length`): haystack words
        with each needle inserted where the haystack tokens before it are `depth` of the haystack's."""
        fixed = sum(self.n_tokens(" " + n) for _, n in needles) + self.n_tokens(" " + question)
        words = self.haystack(rng, length - 1 - fixed + 8, banned)
        while True:
            context, starts = self._assemble(words, needles, question)
            n = self.n_tokens(context)
            if n <= length - 1:
                break
            words = words[:-max(1, (n - length + 1) // 2)]  # a word is at least one token: converges from above
        return {"context": context, "n_tokens": n + 1, "needle_char_starts": starts}

    def _assemble(self, words, needles, question):
        n_hay = self.n_tokens(" ".join(words))
        cuts = [self._word_index(words, depth * n_hay) for depth, _ in needles]
        text, starts, prev = "", [], 0

        def add(piece: str) -> None:
            nonlocal text
            if piece:
                text = f"{text} {piece}" if text else piece

        for cut, (_, needle) in zip(cuts, needles):  # depths ascending, so cuts are too
            add(" ".join(words[prev:cut]))
            starts.append(len(text) + (1 if text else 0))
            add(needle)
            prev = cut
        add(" ".join(words[prev:]))
        add(question)
        return text, starts

    def _word_index(self, words, target_tokens: float) -> int:
        """The word boundary whose prefix has the token count nearest `target_tokens` (binary search)."""
        lo, hi = 0, len(words)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.n_tokens(" ".join(words[:mid])) < target_tokens:
                lo = mid + 1
            else:
                hi = mid
        return lo


def _passkey_rows(b: _Builder, length: int, rng: random.Random) -> list[dict]:
    rows = []
    for i in range(N_EXAMPLES):
        chosen = rng.sample(b.words, N_CHOICES)
        value, depth = chosen[0], DEPTHS[i % len(DEPTHS)]
        needle = f"The secret word is {value}. Remember it: the secret word is {value}."
        question = "What is the secret word? The secret word is"
        row = b.fill(rng, length, [(depth, needle)], question, banned=set(chosen))
        order = list(range(N_CHOICES))
        rng.shuffle(order)
        rows.append({"id": f"passkey-{length}-{i}", **row, "needles": [needle], "depths": [depth],
                     "choices": [chosen[j] for j in order], "label": order.index(0), "answer": value})
    return rows


def _kv_rows(b: _Builder, length: int, rng: random.Random) -> list[dict]:
    rows = []
    for i in range(N_EXAMPLES):
        drawn = rng.sample(b.words, 2 * N_KV_NEEDLES)
        keys, values = drawn[:N_KV_NEEDLES], drawn[N_KV_NEEDLES:]
        depths = sorted(rng.uniform(0.05, 0.95) for _ in keys)
        needles = [f"The word for {k} is {v}." for k, v in zip(keys, values)]
        q = rng.randrange(N_KV_NEEDLES)
        question = f"What is the word for {keys[q]}? The word for {keys[q]} is"
        row = b.fill(rng, length, list(zip(depths, needles)), question, banned=set(drawn))
        rows.append({"id": f"kv-{length}-{i}", **row, "needles": needles, "depths": depths, "query": keys[q],
                     "choices": values, "label": q, "answer": values[q]})
    return rows


def suite_dir(tokenizer, data_dir=None) -> Path:
    return Path(resolve_data_dir(data_dir)) / "eval" / "tiny_longctx" / tokenizer_sha256(tokenizer)[:16]


def build_longctx_suite(tokenizer, data_dir=None, force: bool = False) -> dict:
    """Write the suite's JSONL files and `manifest.json`; return the manifest. Reuses existing files when the
    build version, corpus hashes and tokenizer hash match and every file still has its recorded sha256."""
    out = suite_dir(tokenizer, data_dir)
    manifest_path = out / "manifest.json"
    corpus_sha = {c: get_corpus_info(c).sha256 for c in CORPORA}
    tok_sha = tokenizer_sha256(tokenizer)
    if manifest_path.is_file() and not force:
        manifest = _located(json.loads(manifest_path.read_text()), out)
        if (manifest.get("build_version") == BUILD_VERSION and manifest.get("corpora") == corpus_sha
                and manifest.get("tokenizer_sha256") == tok_sha and set(manifest.get("tasks", {})) == set(TASKS)
                and all(Path(t["data_file"]).is_file() and _file_sha256(Path(t["data_file"])) == t["sha256"]
                        for t in manifest["tasks"].values())):
            return manifest
    out.mkdir(parents=True, exist_ok=True)
    builder = _Builder(tokenizer, _sentences(data_dir), single_token_words(tokenizer))
    make = {"passkey": _passkey_rows, "kv": _kv_rows}
    tasks = {}
    for name, task in TASKS.items():
        # One generator per task, seeded by its name: changing one task never reshuffles another.
        rows = make[task.family](builder, task.length, random.Random(f"{SEED}:{name}"))
        path = out / f"{name}.jsonl"
        tasks[name] = {"data_file": path.name, "sha256": _write_jsonl(path, rows), "n_examples": len(rows),
                       "template": f"tiny_{task.family}", "length": task.length, "corpora": list(CORPORA),
                       "split": SPLIT}
    manifest = {"suite": "tiny_longctx", "build_version": BUILD_VERSION, "seed": SEED, "corpora": corpus_sha,
                "tokenizer_sha256": tok_sha, "tasks": tasks}
    write_json_atomic(manifest_path, manifest)
    return _located(manifest, out)
