"""Table 20 renderer: numbers come from result files only; missing cells are marked, not invented."""

import importlib.util
import json
from pathlib import Path

import pytest

from state_reduction.table20 import run_table20

ROOT = Path(__file__).resolve().parents[1]


def _renderer(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("table20", ROOT / "paper_tables" / "table20.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "ROOT", tmp_path)
    return mod


def _result(family, method, rft, wiki):
    return {"config": {"family": family, "method": method, "ratio": 0.5, "rft": rft}, "metrics": {"wiki_ppl": wiki}}


def test_renders_results_and_marks_missing_cells(tmp_path, monkeypatch, capsys):
    mod = _renderer(tmp_path, monkeypatch)
    folder = tmp_path / "results" / "tiny" / "table20"
    folder.mkdir(parents=True)
    for i, r in enumerate([_result("deltanet", "baseline", False, 123.456), _result("deltanet", "drrqr", False, 140.04),
                           _result("mamba2", "grad", True, 99.95)]):
        (folder / f"{i}.json").write_text(json.dumps(r))
    assert mod.main(["--profile", "tiny"]) == 0
    tex = (tmp_path / "paper_tables" / "out" / "table20_tiny.tex").read_text()
    rows = [[c.strip(" \\") for c in line.split("&")] for line in tex.splitlines() if line.count("&") == 7]
    deltanet = rows[1:7]  # rows[0] is the header
    assert deltanet[0][0] == "DeltaNet"
    assert deltanet[5][1:] == ["Baseline", "123.5", "--", "--", "123.5", "--", "--"]  # dense row repeated post-RFT
    assert deltanet[2][1:] == ["DRRQR", "140.0", "--", "--", "--", "--", "--"]
    assert "Mamba-2" in tex and "100.0" in tex and "Gated DeltaNet" not in tex
    assert (tmp_path / "figures" / "table20_tiny.png").stat().st_size > 1000
    assert "not measured yet" in capsys.readouterr().out


def test_missing_results_folder_is_a_clear_error(tmp_path, monkeypatch):
    mod = _renderer(tmp_path, monkeypatch)
    with pytest.raises(FileNotFoundError, match="make table20 PROFILE=paper"):
        mod.main(["--profile", "paper"])


def test_paper_profile_is_refused_before_any_compute(tmp_path):
    with pytest.raises(NotImplementedError, match="paper"):
        run_table20("paper", tmp_path)
    assert not any(tmp_path.iterdir())


def test_cells_are_skipped_when_done_and_recomputed_when_settings_change(tmp_path):
    from state_reduction.table20 import Table20Settings

    small = Table20Settings(n_calib=2, calib_seq_len=64, eval_seq_len=128, eval_batch_size=32)
    first = run_table20("tiny", tmp_path, small, methods=("l1",), families=("deltanet",))
    assert [p.name for p in first] == ["deltanet-baseline-r0.json", "deltanet-l1-r50.json"]
    stamps = [p.stat().st_mtime_ns for p in first]
    pruned = json.loads(first[1].read_text())
    assert pruned["prune"]["key_dim_after"] == 32 and pruned["metrics"]["wiki_ppl"] > 1
    assert run_table20("tiny", tmp_path, small, methods=("l1",), families=("deltanet",)) == first
    assert [p.stat().st_mtime_ns for p in first] == stamps
    run_table20("tiny", tmp_path, Table20Settings(n_calib=2, calib_seq_len=64, eval_seq_len=128, eval_batch_size=32,
                                                 seed=1), methods=("l1",), families=("deltanet",))
    assert [p.stat().st_mtime_ns for p in first] != stamps
