"""`bench pipeline` times one cell through the pipeline's own stages and replays the evaluation's batches."""

import pytest
import torch
import yaml

from state_reduction.cli import main
from state_reduction.speed.cell_profile import bare_forward_seconds, bench_pipeline, format_pipeline, forward_recorder


def _spec(tmp_path) -> str:
    spec = {
        "experiment": "bench_pipeline_test", "methods": ["l1"], "select": "kq",
        "profiles": {"tiny": {
            "models": {"deltanet": {"path": "experiments/tiny_models/checkpoints/deltanet",
                                    "stands_for": ["DeltaNet 370M"]}},
            "prune": {"calib": "ptb", "n_calib": 2, "seq_len": 32, "seed": 0, "batch_size": 2},
            "rft": {"preset": "tiny", "steps": 1, "batch_size": 2, "seq_len": 32, "save_every": 1, "corpora": ["ptb"]},
            "evaluate": {"suite": "tiny_ppl", "batch_size": 8, "max_length": 64, "limit": 2}}},
        "tables": {"table20": {"models": ["DeltaNet 370M"], "ratios": [0.5], "rft": [True]}},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_the_recorder_sees_every_forward_and_restores_the_model():
    model = torch.nn.Linear(3, 3)
    with forward_recorder(model) as (inputs, seconds):
        model(torch.ones(2, 3))
        model(torch.zeros(1, 3))
    assert len(inputs) == len(seconds) == 2 and inputs[0].shape == (2, 3)
    assert "forward" not in vars(model)
    hook = model.forward  # a bound method set on the instance (as hooks do) is put back, not deleted
    model.forward = hook
    with forward_recorder(model):
        model(torch.ones(1, 3))
    assert vars(model)["forward"] is hook
    seen = []
    assert bare_forward_seconds(lambda input_ids: seen.append(input_ids), inputs) >= 0
    assert seen == inputs  # the replay feeds the recorded batches, in order


def test_one_cell_is_timed_stage_by_stage_against_the_bare_forward(tmp_path):
    torch.set_num_threads(1)
    record = bench_pipeline(_spec(tmp_path), "deltanet", "l1", 0.5, work_dir=tmp_path / "work")
    stages, m = record["extra"]["stages"], record["metrics"]
    assert {"prune.load", "prune.calibration", "prune.selection", "prune.surgery", "prune.save", "rft",
            "evaluation.model_forward", "evaluation.harness_overhead", "evaluation"} <= set(stages)
    assert stages["evaluation.model_forward"] + stages["evaluation.harness_overhead"] == pytest.approx(
        stages["evaluation"], abs=2e-3)
    assert record["extra"]["forward_calls"] > 0 and record["extra"]["tokens_fed"] > 0
    assert m["evaluation_vs_bare"] == pytest.approx(m["evaluation_s"] / m["bare_forward_s"])
    assert "wiki_word_perplexity" in record["extra"]["suite_metrics"]
    assert record["kind"] == "bench" and record["config"]["mode"] == "pipeline"
    assert "evaluation / bare forward" in format_pipeline(record)


def test_an_unknown_cell_model_is_one_line(tmp_path, capsys):
    rc = main(["bench", "pipeline", "--experiment", _spec(tmp_path), "--cell-model", "mamba2", "--out",
               str(tmp_path / "x.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "model 'mamba2' is not in experiment" in err[0]
