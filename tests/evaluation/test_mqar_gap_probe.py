"""scripts/mqar_gap_probe.py: recall per (pairs, gap) for a dense recall model and its reductions; bad input is a
one-line error."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "experiments" / "tiny_models" / "checkpoints" / "deltanet_mqar"


def _probe():
    spec = importlib.util.spec_from_file_location("mqar_gap_probe", ROOT / "scripts" / "mqar_gap_probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_grid_of_dense_and_pruned_recall_as_a_result(tmp_path, capsys):
    out = tmp_path / "probe.json"
    assert _probe().main([str(MODEL), "--methods", "l1", "--pairs", "2", "--gaps", "0", "24", "--queries", "200",
                          "--out", str(out)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("|")]
    assert lines[0] == "| deltanet_mqar | p2 gap0 | p2 gap24 |" and lines[3].startswith("| l1 50% |")
    result = json.loads(out.read_text())
    assert result["kind"] == "analyze" and result["config"]["gaps"] == [0, 24]
    metrics = result["metrics"]
    assert set(metrics) == {"dense_p2_gap0", "dense_p2_gap24", "l1_p2_gap0", "l1_p2_gap24"}
    assert metrics["dense_p2_gap0"] >= 90.0  # the committed recall model recalls 2 pairs (README: 100%)
    assert all(0.0 <= v <= 100.0 for v in metrics.values())


def test_by_query_scores_each_query_position_and_averages_to_the_cell(tmp_path, capsys):
    out = tmp_path / "probe.json"
    assert _probe().main([str(MODEL), "--methods", "l1", "--pairs", "2", "--gaps", "0", "--queries", "200",
                          "--by-query", "--out", str(out)]) == 0
    header = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("|"))
    assert header == "| deltanet_mqar | p2 gap0 | p2 gap0 q1 | p2 gap0 q2 |"
    metrics = json.loads(out.read_text())["metrics"]
    for name in ("dense", "l1"):
        # 100 sequences of 2 queries: the cell is the mean of its two positions
        assert metrics[f"{name}_p2_gap0"] == pytest.approx((metrics[f"{name}_p2_gap0_q1"]
                                                            + metrics[f"{name}_p2_gap0_q2"]) / 2)


@pytest.mark.parametrize("args, message", [(["/nonexistent"], "is not a checkpoint folder"),
                                           ([str(MODEL), "--gaps", "-1"], "gaps must be >= 0")])
def test_bad_input_is_a_one_line_error(args, message, capsys):
    assert _probe().main(args) == 2
    assert message in capsys.readouterr().err
