"""The offline `tiny` suite: lm-eval task data built from the held-out (test) splits of the tiny corpora.

`build_tiny_suite(data_dir)` writes one JSONL file per task under `<data_dir>/eval/tiny/` and a
manifest with their sha256; the same corpora give byte-identical files. `render_task_yamls(manifest,
out_dir)` fills the packaged task YAML templates (`tasks/*.yaml`) with the absolute data-file paths,
for `lm_eval.tasks.TaskManager(include_path=out_dir)`.

Tasks (all from `test` splits, never `train`):
  tiny_wiki_ppl, tiny_ptb_ppl,
  tiny_books_ppl               rolling log-likelihood over each test document (as lm-eval's wikitext); books is
                               the second corpus held out from ptb calibration (the selector benchmark's).
  tiny_lambada                 last-word prediction on 3-6 sentence passages of books and wiki
                               (as lm-eval's lambada_openai: context, target = " " + last word).
  tiny_continuation            HellaSwag-like: a context, its true next sentence and 3 sentences
                               drawn from other documents of the same corpus (wiki, books, ptb).
  tiny_next_sentence           WinoGrande-like 2-way choice: the true next sentence or a sentence
                               from far away in the same document.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from state_reduction.atomic import write_bytes_atomic, write_json_atomic, write_text_atomic
from state_reduction.data import get_corpus_info, load_corpus, resolve_data_dir
from state_reduction.errors import InputError

BUILD_VERSION = 1
SEED = 0
SPLIT = "test"
TEMPLATE_DIR = Path(__file__).parent / "tasks"
DATA_FILE_PLACEHOLDER = "@DATA_FILE@"
TASK_PLACEHOLDER = "@TASK@"
N_LAMBADA = 300
N_CONTINUATION = 300
N_NEXT_SENTENCE = 300
MAX_PASSAGE_CHARS = 700  # a passage plus a choice stays well inside 256 tiny-tokenizer tokens
MIN_SENTENCE_WORDS = 4
NEXT_SENTENCE_MIN_GAP = 5

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
_LAST_WORD = re.compile(r"^(?P<context>.*\S)\s+(?P<word>[A-Za-z]+)[.!?\"')]*$", re.DOTALL)
_STOP_WORDS_TEXT = (
    "the and for are but not you all any can had her was one our out his has him how its may new now "
    "see two who did she use way man men own say too let put yet thee thou thy thine hath doth shall "
    "will with that this from they them then than there their what when where which while whom whose "
    "have been were into upon unto such some more most very much also only over your here"
)
_STOP_WORDS = frozenset(_STOP_WORDS_TEXT.split())


@dataclass(frozen=True)
class TaskData:
    """One task of the suite: its name, the corpora it reads and how its rows are built."""

    name: str
    corpora: tuple[str, ...]
    description: str


TASKS: dict[str, TaskData] = {t.name: t for t in (
    TaskData("tiny_wiki_ppl", ("wiki",), "rolling log-likelihood over the wiki test documents"),
    TaskData("tiny_ptb_ppl", ("ptb",), "rolling log-likelihood over the ptb test documents"),
    TaskData("tiny_books_ppl", ("books",), "rolling log-likelihood over the books test documents"),
    TaskData("tiny_lambada", ("books", "wiki"), "last word of 3-6 sentence passages (LAMBADA-like)"),
    TaskData("tiny_continuation", ("wiki", "books", "ptb"),
             "true next sentence vs 3 from other documents (HellaSwag-like, 4-way)"),
    TaskData("tiny_next_sentence", ("wiki", "books", "ptb"),
             "true next sentence vs one from far away in the same document (WinoGrande-like, 2-way)"),
)}


def _paragraphs(corpus: str, text: str) -> list[list[str]]:
    """A document -> paragraphs, each a list of sentences of at least MIN_SENTENCE_WORDS words."""
    if corpus == "ptb":
        # One sentence a line, no document structure: the whole document is one paragraph.
        blocks = [[line.strip() for line in text.split("\n")]]
    else:
        blocks = []
        for block in re.split(r"\n\s*\n", text):
            lines = [line.strip() for line in block.split("\n") if line.strip()]
            if corpus == "books":
                # Speaker names and stage directions ("KING.", "Enter HOTSPUR.") are upper case.
                lines = [line for line in lines if not line.isupper() and not line.startswith(("Enter ", "Exit", "Exeunt"))]
            blocks.append(_SENTENCE_END.split(" ".join(lines)))
    return [[s for s in block if len(s.split()) >= MIN_SENTENCE_WORDS] for block in blocks]


def _documents(corpus: str, ds) -> list[tuple[str, list[list[str]]]]:
    """The documents of a loaded split (`load_corpus`) as (id, paragraphs)."""
    return [(f"{corpus}/{doc_id}", _paragraphs(corpus, text)) for doc_id, text in zip(ds["id"], ds["text"])]


def _windows(paragraph: list[str], rng: random.Random, low: int, high: int):
    """Non-overlapping runs of `low..high` consecutive sentences (length drawn from rng)."""
    start = 0
    while True:
        size = rng.randint(low, high)
        if start + size > len(paragraph):
            return
        yield start, paragraph[start:start + size]
        start += size


def _lambada_rows(docs_by_corpus: dict, rng: random.Random) -> list[dict]:
    candidates = []
    for corpus in TASKS["tiny_lambada"].corpora:
        for doc_id, paragraphs in docs_by_corpus[corpus]:
            for p, paragraph in enumerate(paragraphs):
                for start, sentences in _windows(paragraph, rng, 3, 6):
                    passage = " ".join(sentences)
                    match = _LAST_WORD.match(passage)
                    if (len(passage) > MAX_PASSAGE_CHARS or match is None or len(match["word"]) < 3
                            or match["word"].lower() in _STOP_WORDS):
                        continue
                    candidates.append({"id": f"{doc_id}/{p}/{start}", "corpus": corpus,
                                       "context": match["context"], "target": " " + match["word"]})
    return _sample(candidates, N_LAMBADA, rng)


def _context_and_next(paragraph: list[str], rng: random.Random):
    """(start, context sentences, index of the next sentence) for non-overlapping 2-4 sentence contexts."""
    for start, sentences in _windows(paragraph, rng, 3, 5):
        context = " ".join(sentences[:-1])
        if len(context) + len(sentences[-1]) <= MAX_PASSAGE_CHARS:
            yield start, context, start + len(sentences) - 1


def _continuation_rows(docs_by_corpus: dict, rng: random.Random) -> list[dict]:
    candidates = []
    for corpus in TASKS["tiny_continuation"].corpora:
        docs = docs_by_corpus[corpus]
        pool = {doc_id: [s for para in paras for s in para if len(s) <= MAX_PASSAGE_CHARS // 2]
                for doc_id, paras in docs}
        for doc_id, paragraphs in docs:
            others = [s for other, sentences in pool.items() if other != doc_id for s in sentences]
            for p, paragraph in enumerate(paragraphs):
                for start, context, nxt in _context_and_next(paragraph, rng):
                    gold = paragraph[nxt]
                    if len(gold) > MAX_PASSAGE_CHARS // 2:
                        continue
                    endings = [gold, *rng.sample(others, 3)]
                    order = list(range(4))
                    rng.shuffle(order)
                    candidates.append({"id": f"{doc_id}/{p}/{start}", "corpus": corpus, "context": context,
                                       "endings": [endings[i] for i in order], "label": order.index(0)})
    return _sample(candidates, N_CONTINUATION, rng, balance_by="corpus")


def _next_sentence_rows(docs_by_corpus: dict, rng: random.Random) -> list[dict]:
    candidates = []
    for corpus in TASKS["tiny_next_sentence"].corpora:
        for doc_id, paragraphs in docs_by_corpus[corpus]:
            sentences = [s for para in paragraphs for s in para]
            offset = 0
            for p, paragraph in enumerate(paragraphs):
                for start, context, nxt in _context_and_next(paragraph, rng):
                    here = offset + nxt
                    far = [i for i, s in enumerate(sentences)
                           if abs(i - here) >= NEXT_SENTENCE_MIN_GAP and s != paragraph[nxt]
                           and len(s) <= MAX_PASSAGE_CHARS // 2]
                    if not far or len(paragraph[nxt]) > MAX_PASSAGE_CHARS // 2:
                        continue
                    options = [paragraph[nxt], sentences[rng.choice(far)]]
                    label = rng.randrange(2)
                    if label == 1:
                        options.reverse()
                    candidates.append({"id": f"{doc_id}/{p}/{start}", "corpus": corpus, "context": context,
                                       "options": options, "label": label})
                offset += len(paragraph)
    return _sample(candidates, N_NEXT_SENTENCE, rng, balance_by="corpus")


def _sample(candidates: list[dict], n: int, rng: random.Random, balance_by: str | None = None) -> list[dict]:
    """n rows drawn without replacement (as equal a share per `balance_by` value as the pools allow),
    returned in candidate order."""
    index = {id(c): i for i, c in enumerate(candidates)}
    if balance_by is None:
        chosen = rng.sample(candidates, min(n, len(candidates)))
    else:
        pools: dict[str, list[dict]] = {}
        for c in candidates:
            pools.setdefault(c[balance_by], []).append(c)
        chosen, remaining = [], n
        for k, key in enumerate(sorted(pools, key=lambda key: len(pools[key]))):
            share = min(len(pools[key]), remaining // (len(pools) - k))
            chosen += rng.sample(pools[key], share)
            remaining -= share
    return sorted(chosen, key=lambda c: index[id(c)])


def _ppl_rows(docs: list[tuple[str, str]]) -> list[dict]:
    return [{"id": doc_id, "text": text} for doc_id, text in docs]


def _write_jsonl(path: Path, rows: list[dict]) -> str:
    data = "".join(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in rows).encode("utf-8")
    write_bytes_atomic(path, data)
    return hashlib.sha256(data).hexdigest()


def _located(manifest: dict, folder: Path) -> dict:
    """The manifest with each task's data file as a path in `folder`: the file on disk names files relative to
    its own folder, so a copied or moved data directory reads its own files."""
    tasks = {name: {**t, "data_file": str((folder / Path(t["data_file"]).name).resolve())}
             for name, t in manifest.get("tasks", {}).items()}
    return {**manifest, "tasks": tasks}


def suite_dir(data_dir=None) -> Path:
    return Path(resolve_data_dir(data_dir)) / "eval" / "tiny"


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_tiny_suite(data_dir=None, force: bool = False) -> dict:
    """Write the suite's JSONL files and `manifest.json` under `<data_dir>/eval/tiny/`; return the manifest.

    Reuses existing files when the manifest's build version and corpus hashes match and every file
    still has its recorded sha256.
    """
    out = suite_dir(data_dir)
    manifest_path = out / "manifest.json"
    corpora = sorted({c for task in TASKS.values() for c in task.corpora})
    corpus_sha = {c: get_corpus_info(c).sha256 for c in corpora}
    if manifest_path.is_file() and not force:
        manifest = _located(json.loads(manifest_path.read_text()), out)
        if (manifest.get("build_version") == BUILD_VERSION and manifest.get("corpora") == corpus_sha
                and set(manifest.get("tasks", {})) == set(TASKS)
                and all(Path(t["data_file"]).is_file() and _file_sha256(Path(t["data_file"])) == t["sha256"]
                        for t in manifest["tasks"].values())):
            return manifest

    out.mkdir(parents=True, exist_ok=True)
    splits = {c: load_corpus(c, SPLIT, data_dir=data_dir) for c in ("wiki", "books", "ptb")}  # each read once
    docs_by_corpus = {c: _documents(c, ds) for c, ds in splits.items()}
    rows = {}
    for corpus in ("wiki", "ptb", "books"):
        ds = splits[corpus]
        rows[f"tiny_{corpus}_ppl"] = _ppl_rows([(f"{corpus}/{i}", t) for i, t in zip(ds["id"], ds["text"])])
    # One generator per task, seeded by its name: changing one task never reshuffles another.
    rows["tiny_lambada"] = _lambada_rows(docs_by_corpus, random.Random(f"{SEED}:tiny_lambada"))
    rows["tiny_continuation"] = _continuation_rows(docs_by_corpus, random.Random(f"{SEED}:tiny_continuation"))
    rows["tiny_next_sentence"] = _next_sentence_rows(docs_by_corpus, random.Random(f"{SEED}:tiny_next_sentence"))

    tasks = {}
    for name, task in TASKS.items():
        path = out / f"{name}.jsonl"
        tasks[name] = {"data_file": path.name, "sha256": _write_jsonl(path, rows[name]),
                       "n_examples": len(rows[name]), "corpora": list(task.corpora), "split": SPLIT,
                       "description": task.description}
    manifest = {"suite": "tiny", "build_version": BUILD_VERSION, "seed": SEED, "corpora": corpus_sha, "tasks": tasks}
    write_json_atomic(manifest_path, manifest)
    return _located(manifest, out)


def task_sizes(data_dir=None) -> dict[str, dict]:
    """What each task of the built suite holds, for the tables' data captions: {task: {"n_examples": N}}, with
    "n_words" (whitespace-separated, as lm-eval's word perplexity counts them) for the rolling-perplexity tasks.
    {} when the suite has not been built under data_dir (nothing is built here)."""
    path = suite_dir(data_dir) / "manifest.json"
    if not path.is_file():
        return {}
    manifest = _located(json.loads(path.read_text()), path.parent)
    sizes = {}
    for name, task in manifest["tasks"].items():
        sizes[name] = {"n_examples": int(task["n_examples"])}
        data_file = Path(task["data_file"])
        if name.endswith("_ppl") and data_file.is_file():
            rows = [json.loads(line) for line in data_file.read_text(encoding="utf-8").splitlines() if line]
            sizes[name]["n_words"] = sum(len(re.split(r"\s+", row["text"])) for row in rows)
    return sizes


def render_task_yamls(manifest: dict, out_dir: str | Path) -> Path:
    """Fill each packaged `tasks/<template>.yaml` (the task's `template`, else its name) with its absolute
    data-file path (and its name, where the template is shared: `@TASK@`); write them to out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, task in manifest["tasks"].items():
        path = TEMPLATE_DIR / f"{task.get('template', name)}.yaml"
        template = path.read_text()
        if DATA_FILE_PLACEHOLDER not in template:
            raise InputError(f"task template {path} has no {DATA_FILE_PLACEHOLDER}")
        # json.dumps quotes the path as a YAML string whatever characters it holds.
        text = template.replace(f'"{DATA_FILE_PLACEHOLDER}"', json.dumps(task["data_file"]))
        write_text_atomic(out_dir / f"{name}.yaml", text.replace(f'"{TASK_PLACEHOLDER}"', json.dumps(name)))
        config = yaml.safe_load((out_dir / f"{name}.yaml").read_text())
        if config["task"] != name or config["dataset_kwargs"]["data_files"]["test"] != task["data_file"]:
            raise InputError(f"rendered task {name}: unexpected task name or data file in {out_dir / name}.yaml")
    return out_dir
