"""run-table --workers (issue 20): a table's tasks in several processes give the result files, config keys and
metrics of one process, a rerun runs nothing, and a bad worker count is one line."""

from pathlib import Path

import pytest
import yaml

from state_reduction.cli import main
from state_reduction.pipeline import run_table
from state_reduction.pipeline.spec import PipelineError
from state_reduction.results import compare_results

CI_EXPERIMENT = str(Path(__file__).resolve().parents[1] / ".ci" / "slurm_table20.yaml")


def _experiment(tmp_path) -> str:
    """The CI Slurm sweep (dense baseline, L1 and DRRQR at 50% of the tiny DeltaNet), smaller: pre-RFT only, 2 x 64
    calibration tokens, 2 documents of the perplexity suite; 3 tasks."""
    spec = yaml.safe_load(Path(CI_EXPERIMENT).read_text())
    spec["profiles"]["tiny"].update(prune={"calib": "ptb", "n_calib": 2, "seq_len": 64, "seed": 0, "batch_size": 2},
                                    evaluate={"suite": "tiny_ppl", "batch_size": 16, "max_length": 128, "limit": 2})
    spec["tables"]["table20"]["rft"] = [False]
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


@pytest.mark.slow
def test_two_workers_write_the_results_of_one_process(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    exp = _experiment(tmp_path)
    one = run_table(exp, "table20", "tiny", results_root=tmp_path / "one")
    two = run_table(exp, "table20", "tiny", results_root=tmp_path / "two", workers=2)
    assert sorted(p.name for p in two) == sorted(p.name for p in one)
    assert len(one) == 5  # baseline, 2 prunes, 2 pre-RFT evaluations
    folder = Path("tiny") / "deltanet_gdn"
    assert compare_results(tmp_path / "one" / folder, tmp_path / "two" / folder) == []
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "two" / folder).glob("*.json")}
    run_table(exp, "table20", "tiny", results_root=tmp_path / "two", workers=2)
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "two" / folder).glob("*.json")} == before


def test_a_bad_worker_count_is_one_line(tmp_path, capsys):
    with pytest.raises(PipelineError, match="--workers must be an integer >= 1, got 0"):
        run_table(_experiment(tmp_path), "table20", "tiny", results_root=tmp_path, workers=0)
    with pytest.raises(SystemExit) as e:
        main(["run-table", "table20", "--experiment", _experiment(tmp_path), "--workers", "0"])
    assert e.value.code == 2 and "--workers" in capsys.readouterr().err


def test_a_workers_error_reaches_the_parent_whole():
    """A worker's project error crosses the process boundary by pickle with its type, message and hint."""
    import pickle

    from state_reduction.rft import RFTError

    e = pickle.loads(pickle.dumps(RFTError("run exists", hint="rerun with --overwrite")))
    assert type(e) is RFTError and isinstance(e, ValueError) and str(e) == "run exists; rerun with --overwrite"

