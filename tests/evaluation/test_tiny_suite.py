"""The tiny suite's data: deterministic, built from held-out splits only, rendered to valid lm-eval YAML."""

import json
import re
from pathlib import Path

import pytest
import yaml

from state_reduction.data import load_corpus, resolve_data_dir
from state_reduction.evaluation import (
    TASKS,
    TINY_METRICS,
    build_tiny_suite,
    render_task_yamls,
    task_sizes,
)
from state_reduction.evaluation.run import HELDOUT_METRICS


@pytest.fixture(scope="module")
def manifest():
    return build_tiny_suite(resolve_data_dir())


def test_build_is_deterministic(tmp_path, manifest):
    # A fresh build in another data dir (corpora copied, suite rebuilt) gives the same bytes.
    src = resolve_data_dir()
    (tmp_path / "corpora").symlink_to(src / "corpora")
    again = build_tiny_suite(tmp_path)
    assert {t: v["sha256"] for t, v in again["tasks"].items()} == {t: v["sha256"] for t, v in manifest["tasks"].items()}
    assert Path(again["tasks"]["tiny_lambada"]["data_file"]).parent == tmp_path / "eval" / "tiny"
    # every task is scored by the tiny suite or is the selector benchmark's second held-out corpus
    assert set(manifest["tasks"]) == set(TASKS) == set(TINY_METRICS) | {t for t in HELDOUT_METRICS if t in TASKS}
    assert "tiny_books_ppl" in TASKS and "tiny_books_ppl" not in TINY_METRICS  # not part of table20's suite


def test_a_copied_data_dir_reads_its_own_files(tmp_path):
    """manifest.json names its files relative to its folder: a copy of the data directory never reads the
    original's files (issue 21)."""
    import shutil

    src = resolve_data_dir()
    (tmp_path / "a" / "corpora").parent.mkdir()
    (tmp_path / "a" / "corpora").symlink_to(src / "corpora")
    build_tiny_suite(tmp_path / "a")
    on_disk = json.loads((tmp_path / "a" / "eval" / "tiny" / "manifest.json").read_text())
    assert all(not Path(t["data_file"]).is_absolute() for t in on_disk["tasks"].values())
    shutil.copytree(tmp_path / "a", tmp_path / "b", symlinks=True)
    shutil.rmtree(tmp_path / "a" / "eval")
    copied = build_tiny_suite(tmp_path / "b")
    assert all(Path(t["data_file"]).parent == tmp_path / "b" / "eval" / "tiny" and Path(t["data_file"]).is_file()
               for t in copied["tasks"].values())


def _rows(manifest, task):
    return [json.loads(line) for line in Path(manifest["tasks"][task]["data_file"]).read_text().splitlines()]


def test_sizes_and_formats(manifest):
    n = {t: v["n_examples"] for t, v in manifest["tasks"].items()}
    assert n["tiny_wiki_ppl"] == len(load_corpus("wiki", "test"))
    assert n["tiny_ptb_ppl"] == len(load_corpus("ptb", "test"))
    assert n["tiny_books_ppl"] == len(load_corpus("books", "test"))
    assert 200 <= n["tiny_lambada"] <= 300 and n["tiny_continuation"] == n["tiny_next_sentence"] == 300
    for row in _rows(manifest, "tiny_lambada"):
        assert row["target"].startswith(" ") and row["target"][1:].isalpha() and len(row["target"]) >= 4
        assert not row["context"].endswith(" ")
    for task, field, k in (("tiny_continuation", "endings", 4), ("tiny_next_sentence", "options", 2)):
        rows = _rows(manifest, task)
        assert all(len(r[field]) == k and 0 <= r["label"] < k and len(set(r[field])) == k for r in rows)
        # Labels are shuffled, not always the first option.
        assert len({r["label"] for r in rows}) == k


def test_task_sizes_count_the_built_suite(tmp_path, manifest):
    """The tables' data captions read the built suite: examples per task, and the words of each perplexity task's
    documents as lm-eval's word perplexity counts them; nothing where no suite is built (and nothing is built)."""
    sizes = task_sizes(resolve_data_dir())
    assert {t: s["n_examples"] for t, s in sizes.items()} == {t: v["n_examples"] for t, v in manifest["tasks"].items()}
    for corpus in ("wiki", "ptb", "books"):
        words = sum(len(re.split(r"\s+", text)) for text in load_corpus(corpus, "test")["text"])
        assert sizes[f"tiny_{corpus}_ppl"]["n_words"] == words
    assert "n_words" not in sizes["tiny_lambada"]
    assert task_sizes(tmp_path) == {} and not (tmp_path / "eval").exists()


def test_examples_come_from_held_out_text(manifest):
    train = {c: "\n".join(load_corpus(c, "train")["text"]) for c in ("wiki", "books", "ptb")}
    test = {c: "\n".join(load_corpus(c, "test")["text"]) for c in ("wiki", "books", "ptb")}
    for task in ("tiny_lambada", "tiny_continuation", "tiny_next_sentence"):
        for row in _rows(manifest, task)[::10]:
            assert row["context"] not in train[row["corpus"]], (task, row["id"])
            assert row["context"].split(" ")[-1] in test[row["corpus"]]
    for task, corpus in (("tiny_wiki_ppl", "wiki"), ("tiny_ptb_ppl", "ptb"), ("tiny_books_ppl", "books")):
        assert [r["text"] for r in _rows(manifest, task)] == list(load_corpus(corpus, "test")["text"])


def test_rendered_yamls_point_at_the_data(tmp_path, manifest):
    out = render_task_yamls(manifest, tmp_path)
    for name, task in manifest["tasks"].items():
        config = yaml.safe_load((out / f"{name}.yaml").read_text())
        assert config["dataset_path"] == "json"
        assert config["dataset_kwargs"]["data_files"]["test"] == task["data_file"]
        assert Path(task["data_file"]).is_absolute()
