"""The analyses behind the rank-analysis figures and tables (analysis/experiment.py): their plan on both profiles,
a real small run end to end (prune -> analyze -> render), and errors in the experiment's configuration."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from state_reduction.analysis.experiment import (
    analysis_name,
    plan_analyses,
    run_analyses,
)
from state_reduction.cli import main
from state_reduction.pipeline import PipelineError
from state_reduction.results import config_key, read_result

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ("figure2", "figure3", "figure5", "figure6", "figure7", "table5", "table6", "tableC2")


@pytest.mark.parametrize("profile", ["tiny", "paper"])
def test_every_target_plans_its_analyses_without_running(profile, monkeypatch):
    monkeypatch.delenv("SR_CHECKPOINTS", raising=False)
    model = "deltanet" if profile == "tiny" else "deltanet-370m"
    for target in TARGETS:
        plan = plan_analyses(target, profile)
        names = [n for n, _ in plan["stages"]["analyze"]]
        assert names[0] == analysis_name(model) and len(set(names)) == len(names)
        assert not {"baseline", "eval-pre", "eval-post"} & set(plan["stages"])  # no evaluation
    figure6 = [n for n, _ in plan_analyses("figure6", profile)["stages"]["analyze"]]
    seeds = [(), (("seed", 1),), (("seed", 2),)] if profile == "tiny" else [()]
    assert figure6 == [analysis_name(model, vary=v) for v in seeds] + [
        analysis_name(model, m, 0.75, rft, vary=v) for m in ("drrqr", "grad", "l1") for v in seeds
        for rft in (False, True)] + [analysis_name(model, "dense", 0.0, True, vary=v) for v in seeds]  # the control
    control = dict(plan_analyses("figure6", profile)["stages"]["analyze"])[analysis_name(model, "dense", 0.0, True)]
    rft = dict(plan_analyses("figure6", profile)["stages"]["rft"])[f"{model}-dense-r0-rft"]
    assert control["of"] == config_key(rft) and rft["pruned"] == "dense"  # the dense model's RFT, nothing pruned
    c2 = plan_analyses("tableC2", profile)["stages"]["analyze"]
    pair = dict(c2)[analysis_name(model, "drrqr", 0.75, compare="rand")]
    assert pair["compare"] == "rand" and pair["of"] != pair["compare_of"]
    assert [n for n, _ in plan_analyses("figure7", profile)["stages"]["analyze"]] == [analysis_name(model, vary=v)
                                                                                     for v in seeds]


def test_each_replicate_seed_has_its_own_analyses_and_the_first_keeps_a_single_seed_runs_keys(tmp_path):
    spec = yaml.safe_load((ROOT / "experiments" / "rank_analysis" / "config.yaml").read_text())
    one = tmp_path / "one.yaml"
    one.write_text(yaml.safe_dump({**spec, "tables": {t: {**v, "seeds": {"tiny": [0]}}
                                                      for t, v in spec["tables"].items()}}))
    for target in ("tableC2", "table5"):
        three = dict(plan_analyses(target, "tiny")["stages"]["analyze"])
        single = dict(plan_analyses(target, "tiny", str(one))["stages"]["analyze"])
        assert {n: config_key(c) for n, c in single.items()} == {n: config_key(three[n]) for n in single}
        assert all("seed_" not in n and c["seed"] == 0 and "vary" not in c for n, c in single.items())
        assert len(three) == 3 * len(single)
        for n, c in three.items():
            seed = c.get("vary", {}).get("seed", 0)
            assert c["seed"] == seed and (seed == 0) == (n in single)  # the windows follow the replicate
    c2 = dict(plan_analyses("tableC2", "tiny")["stages"]["analyze"])
    plan = plan_analyses("tableC2", "tiny")["stages"]["prune"]
    prunes = {n[:-len("-prune")]: config_key(c) for n, c in plan}
    pair = c2[analysis_name("deltanet", "drrqr", 0.75, compare="rand", vary=(("seed", 2),))]
    assert pair["of"] == prunes["deltanet-drrqr-r75-seed_2"] and pair["compare_of"] == prunes["deltanet-rand-r75-seed_2"]
    assert analysis_name("deltanet", "l1", 0.75, True, vary=(("seed", 1),)) == "deltanet-l1-r75-seed_1-rft-analyze"
    assert analysis_name("deltanet", vary=(("seed", 1),)) == "deltanet-dense-seed_1-analyze"


def test_run_analysis_dry_run_on_the_command_line(capsys):
    assert main(["run-analysis", "table5", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "stage rft: 9 runs" in out and "deltanet-dense-r0-seed_2-rft-analyze" in out and "deltanet-l1-r75-rft-analyze" in out and "deltanet-l1-r75-seed_2-rft-analyze" in out


def _experiment(tmp_path, overlap=(("l1", "rand"),)) -> Path:
    spec = yaml.safe_load((ROOT / "experiments" / "rank_analysis" / "config.yaml").read_text())
    spec["methods"] = ["l1", "rand"]
    tiny = spec["profiles"]["tiny"]
    tiny["prune"].update(n_calib=2, seq_len=64)
    tiny["analyze"].update(n_calib=2, seq_len=64, stride=16, batch_size=2)
    table = {"models": ["DeltaNet 370M"], "ratios": [0.75], "rft": [False], "overlap": [list(p) for p in overlap]}
    spec["tables"] = {"tableC2": table, "table6": {k: v for k, v in table.items() if k != "overlap"}}
    path = tmp_path / "rank.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_small_run_end_to_end_and_a_rerun_does_nothing(tmp_path):
    experiment = _experiment(tmp_path)
    root = tmp_path / "results"
    paths = run_analyses("tableC2", "tiny", str(experiment), results_root=root)
    assert [p.name for p in paths] == [analysis_name("deltanet") + ".json"] + [
        analysis_name("deltanet", m, 0.75, **kw) + ".json" for m, kw in (("l1", {}), ("rand", {}), ("l1", {"compare": "rand"}))]
    pair = read_result(paths[-1])
    assert pair["extra"]["overlap"]["kept"] == [16, 16] and 0 <= pair["metrics"]["overlap_median"] <= 16
    assert pair["extra"]["dense"]["states"]["0"]["positions"] == [16, 32, 48, 64]
    stamps = [p.stat().st_mtime_ns for p in paths]
    assert run_analyses("table6", "tiny", str(experiment), results_root=root) == paths[:3]
    assert [p.stat().st_mtime_ns for p in paths] == stamps

    from paper_tables.rank_tables import render

    out = render("tableC2", "tiny", str(experiment), root, out_root=tmp_path / "out", quiet=True)
    assert out["missing"] == [] and "| L1 & Rand |" in out["md"].read_text()
    table6 = render("table6", "tiny", str(experiment), root, out_root=tmp_path / "out", quiet=True)
    md = table6["md"].read_text()
    assert table6["missing"] == [] and "| L1 |" in md and "| Rand |" in md and "| -- |" not in md


def test_an_overlap_pair_outside_the_experiments_methods_is_named(tmp_path):
    experiment = _experiment(tmp_path, overlap=(("l1", "drrqr"),))
    with pytest.raises(PipelineError, match=r"overlap pair \['l1', 'drrqr'\].*l1, rand"):
        plan_analyses("tableC2", "tiny", str(experiment))
