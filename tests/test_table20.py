"""Table 20 renderer: numbers come from result files only; missing cells are marked, not invented."""

import importlib.util
import json
from pathlib import Path

import pytest

from state_reduction.baselines import evaluate_dense_baselines

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
        evaluate_dense_baselines("paper", tmp_path)
    assert not any(tmp_path.iterdir())
