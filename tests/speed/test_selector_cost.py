"""`bench selectors`: one fresh prune process per model and selector; its seconds and the memory above the loaded
model come from that prune's selection.json; a selector a family cannot serve is a row with prune's reason."""

import pytest
import yaml

from state_reduction.cli import main
from state_reduction.errors import InputError
from state_reduction.results import read_result
from state_reduction.speed.selector_cost import bench_selectors, format_selectors, selectors_markdown


def _spec(tmp_path) -> str:
    spec = {
        "experiment": "bench_selectors_test", "methods": ["l1", "grad", "ghost"], "select": "kq",
        "profiles": {"tiny": {
            "models": {"deltanet": {"path": "experiments/tiny_models/checkpoints/deltanet",
                                    "stands_for": ["DeltaNet"]}},
            "prune": {"calib": "ptb", "n_calib": 2, "seq_len": 32, "seed": 0, "batch_size": 2},
            "rft": {"preset": "tiny", "steps": 1},
            "evaluate": {"suite": "tiny_wiki", "batch_size": 8, "max_length": 64, "limit": 1}}},
        # with the dense+RFT control (a ratio-0 cell): the cost is taken at the smallest pruning ratio
        "tables": {"grid": {"models": ["DeltaNet"], "ratios": [0.75, 0.5], "rft": [False, True], "control": True,
                            "methods": ["l1", "grad"]}},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_each_selector_is_costed_in_its_own_prune_and_a_family_it_cannot_serve_is_a_refused_row(tmp_path):
    record = bench_selectors(experiment=_spec(tmp_path), table="grid")
    assert record["kind"] == "bench" and record["schema"] == "state-reduction/result"
    assert record["config"]["ratio"] == 0.5 and [r["method"] for r in record["extra"]["rows"]] == ["l1", "grad", "ghost"]
    l1, grad, ghost = record["extra"]["rows"]
    for r in (l1, grad):
        assert r["status"] == "ok" and r["key_dim_after"] == 32
        assert r["calibration_s"] >= 0 and r["selection_s"] >= 0
        assert r["extra_bytes"] == r["peak_rss_through_selection_bytes"] - r["rss_after_load_bytes"] >= 0
    assert l1["calibration_s"] < 0.05 < grad["calibration_s"]  # L1 reads the weights alone: no calibration pass
    assert grad["extra_bytes"] > 0  # the backward pass keeps activations and gradients
    assert ghost["status"] == "refused"
    assert "ghost" in ghost["reason"] and "DeltaNet" in ghost["reason"] and "decay" in ghost["reason"]
    text, md = format_selectors(record), selectors_markdown(record)
    assert "refused: " in text and "| ghost | n/a (refused) |" in md and md.count("\n| ") == 3


def test_unknown_selectors_and_models_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(InputError, match=r"method\(s\) \['drrqrr'\] are not in experiment .*its methods: l1, grad, ghost"):
        bench_selectors(experiment=_spec(tmp_path), table="grid", methods=["drrqrr"])
    with pytest.raises(InputError, match=r"model\(s\) \['mamba2'\] are not in table grid"):
        bench_selectors(experiment=_spec(tmp_path), table="grid", models=["mamba2"])


def test_the_command_writes_the_record_and_the_markdown(tmp_path, capsys):
    out, md = tmp_path / "cost.json", tmp_path / "cost.md"
    assert main(["bench", "selectors", "--experiment", _spec(tmp_path), "--table", "grid", "--methods", "l1",
                 "--out", str(out), "--markdown", str(md)]) == 0
    assert read_result(out)["extra"]["rows"][0]["status"] == "ok"  # a result file: the experiment's tables read past it
    assert md.read_text().startswith("| selector | deltanet: calib s / select s / extra MiB |")
    assert "selection cost, grid of" in capsys.readouterr().out
