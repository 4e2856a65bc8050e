"""`state-reduction evaluate`: a result JSON with metrics, data hashes, weight hash and provenance."""

import json
import math
from pathlib import Path

from state_reduction.cli import main

CHECKPOINT = Path(__file__).resolve().parents[2] / "experiments" / "tiny_models" / "checkpoints" / "deltanet"


def test_evaluate_writes_a_result_with_provenance(tmp_path):
    out = tmp_path / "r.json"
    assert main(["evaluate", str(CHECKPOINT), "--suite", "tiny", "--limit", "3", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["kind"] == "evaluate" and result["extra"]["suite"] == "tiny" and result["schema_version"] == 1
    assert math.isfinite(result["metrics"]["wiki_word_perplexity"]) and 0 <= result["metrics"]["zero_shot_avg"] <= 1
    assert len(result["model"]["weights_sha256"]) == 64 and result["provenance"]["git_commit"]
    assert result["data"] and all(len(h) == 64 for h in result["data"].values())


def test_unknown_suite_is_one_line_error(tmp_path, capsys):
    assert main(["evaluate", str(CHECKPOINT), "--suite", "papr", "--out", str(tmp_path / "r.json")]) == 2
    assert "paper" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_missing_model_path_is_one_line_error(tmp_path, capsys):
    assert main(["evaluate", str(tmp_path / "nope"), "--out", str(tmp_path / "r.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_model_that_is_not_a_causal_lm_is_refused(tmp_path, capsys):
    folder = tmp_path / "vit"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "vit", "architectures": ["ViTModel"]}))
    assert main(["evaluate", str(folder), "--out", str(tmp_path / "r.json")]) == 2
    assert "not a causal language model" in capsys.readouterr().err
