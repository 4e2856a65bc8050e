"""Offline compute nodes: prefetch a table's needs into a cache, run the table with the network blocked, and get
a one-line error naming the artefact when one is missing from the cache (issue 22)."""

import os
import socket
from pathlib import Path

import pytest
import torch
import yaml

from state_reduction.cli import main
from state_reduction.prefetch import Artefact, OfflineError, check_offline, needs, prefetch

ROOT = Path(__file__).resolve().parents[1]


def _spec(tmp_path) -> str:
    spec = {
        "experiment": "offline_test", "methods": ["l1"], "select": "kq",
        "profiles": {"tiny": {
            "models": {"deltanet": {"path": "experiments/tiny_models/checkpoints/deltanet",
                                    "stands_for": ["DeltaNet 370M"]}},
            "prune": {"calib": "ptb", "n_calib": 2, "seq_len": 32, "seed": 0, "batch_size": 2},
            "rft": {"preset": "tiny", "steps": 1, "batch_size": 2, "seq_len": 32, "save_every": 1,
                    "corpora": ["ptb"]},
            "evaluate": {"suite": "tiny_ppl", "batch_size": 8, "max_length": 128, "limit": 2}}},
        "tables": {"table20": {"models": ["DeltaNet 370M"], "ratios": [0.5], "rft": [True]}},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def _seeded_cache(tmp_path) -> Path:
    """A cache whose download folder already holds the pinned archives (no pip download in a test)."""
    cache = tmp_path / "cache"
    (cache / "data" / "downloads").mkdir(parents=True)
    for archive in (ROOT / "data_cache" / "downloads").iterdir():
        os.symlink(archive, cache / "data" / "downloads" / archive.name)
    return cache


@pytest.fixture
def no_network(monkeypatch):
    def refuse(self, address, *args, **kwargs):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise OSError(f"network disabled in this test (connect to {address})")
        return real(self, address, *args, **kwargs)

    real = socket.socket.connect
    monkeypatch.setattr(socket.socket, "connect", refuse)


def test_needs_of_the_paper_profile_name_models_corpora_tasks_and_the_ruler_haystack():
    got = needs("paper", ["table20", "table11"])
    assert Artefact("model", "fla-hub/delta_net-1.3B-100B") in got
    assert Artefact("model", "m-a-p/1.3B-100B-GatedDeltaNet-pure") in got
    assert Artefact("corpus", "fineweb-edu") in got
    assert Artefact("lm_eval_task", "arc_easy") in got and Artefact("lm_eval_task", "wikitext") in got
    assert any(a.kind == "ruler_haystack" for a in got)


def test_the_second_held_out_corpus_is_c4_on_the_paper_profile_and_only_its_first_shards_are_fetched(tmp_path,
                                                                                                  monkeypatch):
    import state_reduction.prefetch as prefetch_module

    got = needs("paper", ["selector_benchmark_books"])
    assert Artefact("lm_eval_task", "c4") in got and Artefact("lm_eval_task", "wikitext") not in got
    assert Artefact("corpus", "books") in needs("tiny", ["selector_benchmark_books"])
    for key in prefetch_module.cache_env(tmp_path):  # fetch points the environment at the cache: restored after
        monkeypatch.setenv(key, os.environ.get(key, ""))
    calls = []
    monkeypatch.setattr(prefetch_module, "snapshot_download", lambda repo, **kw: calls.append((repo, kw)))
    prefetch_module.fetch(Artefact("lm_eval_task", "c4"), tmp_path)
    (repo, kw), = calls
    assert repo == "allenai/c4" and kw["repo_type"] == "dataset"
    assert kw["allow_patterns"] == ["en/c4-train.00000-of-01024.json.gz", "en/c4-validation.00000-of-00008.json.gz"]
    prefetch_module.fetch(Artefact("lm_eval_task", "wikitext"), tmp_path)
    assert calls[1][1]["allow_patterns"] is None


@pytest.mark.slow
def test_a_prefetched_table_runs_without_network_and_a_deleted_artefact_is_named(tmp_path, monkeypatch, no_network,
                                                                                capsys):
    from state_reduction.pipeline import run_table

    torch.set_num_threads(1)
    spec, cache = _spec(tmp_path), _seeded_cache(tmp_path)
    got = prefetch("tiny", ["table20"], cache, experiment=spec)
    assert Artefact("corpus", "ptb") in got and Artefact("corpus", "wiki") in got
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("STATE_REDUCTION_CACHE", str(cache))
    monkeypatch.setenv("STATE_REDUCTION_DATA", str(cache / "data"))
    paths = run_table(spec, "table20", "tiny", results_root=tmp_path / "results", data_dir=str(cache / "data"))
    names = sorted(p.stem for p in paths)
    assert "deltanet-l1-r50-eval-post" in names and "deltanet-baseline-r0-eval" in names

    (cache / "data" / "corpora" / "ptb.jsonl").unlink()
    with pytest.raises(OfflineError, match=r"corpus ptb is not in the cache"):
        check_offline("tiny", ["table20"], cache, experiment=spec)
    capsys.readouterr()  # what prefetch and the table run printed so far
    rc = main(["run-table", "table20", "--experiment", spec, "--results-root", str(tmp_path / "fresh")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert err[0].startswith("state-reduction run-table: error: offline (tiny profile, table20): corpus ptb is not in")
    assert not (tmp_path / "fresh").exists()  # nothing ran
