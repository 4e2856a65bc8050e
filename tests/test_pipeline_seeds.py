"""Replicate seeds and the dense+RFT control (issue 15): cells, keys, tasks, a real run and the rendered CIs."""

from pathlib import Path

import pytest
import torch
import yaml

from state_reduction.pipeline import (
    CONTROL,
    PipelineError,
    load_experiment,
    plan_table,
    plan_tasks,
    run_table,
    table_cells,
)
from state_reduction.results import build_result, config_key, read_result, write_result

from paper_tables import lm_tables


def spec(seeds=(0, 1, 2), control=True):
    return {
        "experiment": "seeds_test", "methods": ["l1", "rand"], "select": "kq",
        "profiles": {"tiny": {
            "models": {"deltanet": {"path": "experiments/tiny_models/checkpoints/deltanet",
                                    "stands_for": ["DeltaNet 370M"]}},
            "seeds": list(seeds),
            "prune": {"calib": "ptb", "n_calib": 2, "seq_len": 32, "seed": 0, "batch_size": 2},
            "rft": {"preset": "tiny", "steps": 2, "batch_size": 2, "seq_len": 32, "save_every": 1},
            "evaluate": {"suite": "tiny_ppl", "batch_size": 8, "max_length": 64, "limit": 2}}},
        "tables": {"table20": {"models": ["DeltaNet 370M"], "ratios": [0.5], "rft": [False, True],
                               "control": control,
                               "render": {"layout": "pre_post",
                                          "columns": ["wiki_word_perplexity", "lambada_ppl", "zero_shot_avg"]}}},
    }


def write(tmp_path, **kw):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(spec(**kw)))
    return str(path)


def test_cells_cross_seeds_and_the_first_seed_keeps_the_plain_name(tmp_path):
    _, cells, _ = table_cells(load_experiment(write(tmp_path)), "table20", "tiny")
    names = [c.name for c in cells]
    assert names == ["deltanet-l1-r50", "deltanet-l1-r50-seed_1", "deltanet-l1-r50-seed_2",
                     "deltanet-rand-r50", "deltanet-rand-r50-seed_1", "deltanet-rand-r50-seed_2",
                     f"deltanet-{CONTROL}-r0", f"deltanet-{CONTROL}-r0-seed_1", f"deltanet-{CONTROL}-r0-seed_2"]


def test_the_control_takes_only_the_seed_and_rft_settings_of_a_variation(tmp_path):
    """A control crossed with pruning settings (budgets, calibration) runs once per replicate and RFT budget."""
    raw = spec(seeds=(0, 1))
    raw["methods"] = ["l1"]
    raw["tables"]["table20"]["vary"] = [{"budget": ["uniform", "global-aire"], "n_calib": [2, 4]},
                                        {"rft_steps": [4]}]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    _, cells, _ = table_cells(load_experiment(str(path)), "table20", "tiny")
    controls = [c.name for c in cells if c.method == CONTROL]
    assert controls == [f"deltanet-{CONTROL}-r0", f"deltanet-{CONTROL}-r0-seed_1",
                        f"deltanet-{CONTROL}-r0-steps_4", f"deltanet-{CONTROL}-r0-steps_4-seed_1"]
    pruned = [c.name for c in cells if c.method == "l1"]
    assert len(pruned) == 2 * (4 + 1) and "deltanet-l1-r50-bud_global-aire-n_4-seed_1" in pruned


def test_plan_seeds_drive_calibration_and_rft_and_the_control_skips_pruning(tmp_path):
    plan = plan_table(write(tmp_path), "table20", "tiny")["stages"]
    prune = dict(plan["prune"])
    assert len(prune) == 6 and all(CONTROL not in n for n in prune)
    assert prune["deltanet-l1-r50-seed_2-prune"]["seed"] == 2 and prune["deltanet-l1-r50-prune"]["seed"] == 0
    rft = dict(plan["rft"])
    assert rft["deltanet-rand-r50-seed_1-rft"]["seed"] == 1 and "seed" not in rft["deltanet-rand-r50-rft"]
    assert rft[f"deltanet-{CONTROL}-r0-rft"]["pruned"] == CONTROL
    assert len(plan["eval-pre"]) == 6 and len(plan["eval-post"]) == 9
    # one seed: the same names and configurations as a table without seeds (existing results stay valid)
    one = plan_table(write(tmp_path, seeds=(0,), control=False), "table20", "tiny")["stages"]
    assert [n for n, _ in one["prune"]] == ["deltanet-l1-r50-prune", "deltanet-rand-r50-prune"]
    assert config_key(dict(one["rft"])["deltanet-l1-r50-rft"]) == config_key(rft["deltanet-l1-r50-rft"])


def test_seeds_override_replaces_the_tables_seeds(tmp_path):
    plan = plan_table(write(tmp_path, seeds=(0,)), "table20", "tiny", seeds=[0, 7])["stages"]
    assert [n for n, _ in plan["prune"]] == ["deltanet-l1-r50-prune", "deltanet-l1-r50-seed_7-prune",
                                            "deltanet-rand-r50-prune", "deltanet-rand-r50-seed_7-prune"]


def test_tasks_cover_exactly_the_local_sweep(tmp_path):
    config = write(tmp_path)
    plan = plan_table(config, "table20", "tiny")["stages"]
    local = {name for jobs in plan.values() for name, _ in jobs}
    tasks = plan_tasks(config, "tiny")
    assert {n for t in tasks for n in t.result_names} == local
    control = next(t for t in tasks if t.name == f"deltanet-{CONTROL}-r0")
    assert control.stages == ("rft", "eval-post")


@pytest.mark.parametrize("bad, expected", [
    ([], "seeds must be a list of distinct ints"), ([0, 0], "seeds must be a list of distinct ints"),
    ([0.5], r"config.yaml: profiles\.tiny\.seeds\[0\] must be int"),  # wrong types: the spec's errors
    ("0", r"config.yaml: profiles\.tiny\.seeds must be a list of int or null")])
def test_bad_seeds_are_refused(tmp_path, bad, expected):
    s = spec()
    s["profiles"]["tiny"]["seeds"] = bad
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(s))
    with pytest.raises(PipelineError, match=expected):
        table_cells(load_experiment(str(path)), "table20", "tiny")


@pytest.mark.slow
def test_control_run_fine_tunes_the_dense_model(tmp_path):
    """The dense+RFT control end to end: RFT starts from the dense weights, and its evaluation is post-RFT."""
    torch.set_num_threads(1)
    s = spec(seeds=(0,))
    s["methods"] = ["l1"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(s))
    results = tmp_path / "results"
    run_table(str(path), "table20", "tiny", results_root=results)
    folder = results / "tiny" / "seeds_test"
    rft = read_result(folder / f"deltanet-{CONTROL}-r0-rft.json")
    post = read_result(folder / f"deltanet-{CONTROL}-r0-eval-post.json")
    base = read_result(folder / "deltanet-baseline-r0-eval.json")
    assert rft["config"]["pruned"] == CONTROL and post["config"]["rft"] is True
    assert post["model"]["weights_sha256"] != base["model"]["weights_sha256"]  # fine-tuned, at the dense size
    assert not (folder / f"deltanet-{CONTROL}-r0-prune.json").exists()
    assert not (folder / f"deltanet-{CONTROL}-r0-eval-pre.json").exists()


def _put(root, method, ratio, rft, vary, wiki):
    stage = "baseline" if method == "baseline" else ("eval-post" if rft else "eval-pre")
    config = {"experiment": "seeds_test", "stage": stage, "model": "deltanet", "method": method, "ratio": ratio,
              "rft": rft, "suite": "tiny_ppl", "batch_size": 8, "max_length": 64, "limit": 2,
              **({"vary": vary} if vary else {})}
    name = f"{method}-{ratio}-{rft}-{vary}"
    write_result(Path(root) / "tiny" / "seeds_test" / f"{name}.json",
                 build_result("evaluate", profile="tiny", experiment="seeds_test", config=config,
                              metrics={"wiki_word_perplexity": wiki, "lambada_ppl": None, "zero_shot_avg": None},
                              wall_time_s=1.0))


def test_rendered_cells_show_mean_and_ci_over_replicates(tmp_path):
    config = write(tmp_path)
    results = tmp_path / "results"
    _put(results, "baseline", 0.0, False, {}, 100.0)
    for i, seed_vary in enumerate([{}, {"seed": 1}, {"seed": 2}]):
        _put(results, "l1", 0.5, False, seed_vary, 120.0 + i)      # 120, 121, 122
        _put(results, "l1", 0.5, True, seed_vary, 104.0)           # identical: CI of width 0
        _put(results, "rand", 0.5, False, seed_vary, 150.0 + 10 * i)
        _put(results, CONTROL, 0.0, True, seed_vary, 98.0 + i)
    out = lm_tables.render("table20", "tiny", experiment=config, results_root=results, out_root=tmp_path / "out",
                           figures_root=tmp_path / "figures", quiet=True)
    md = out["md"].read_text()
    rows = {r.split("|")[2].strip(): [c.strip() for c in r.split("|")[3:-1]] for r in md.splitlines()[2:] if "|" in r}
    half = 4.302653 * 1.0 / 3 ** 0.5  # t(0.975, 2) * sd / sqrt(3), sd of 120, 121, 122 is 1
    assert rows["L1"][0] == f"**121.0 ± {half:.1f}**"
    assert rows["Rand"][0] == f"160.0 ± {4.302653 * 10 / 3 ** 0.5:.1f}"  # of two methods the other is plain
    assert rows["Baseline"][0] == "100.0"  # one deterministic evaluation: no ±
    assert rows["Dense+RFT"][3] == f"99.0 ± {half:.1f}" and rows["Dense+RFT"][0] == "--"
    assert "95% t-interval over 3 replicates" in md and "Dense+RFT: the dense model fine-tuned" in md
    assert "\\scriptsize$\\pm$" in out["tex"].read_text()
    assert out["missing"] == ["deltanet-rand-r50-eval-post", "deltanet-rand-r50-seed_1-eval-post",
                              "deltanet-rand-r50-seed_2-eval-post"]
