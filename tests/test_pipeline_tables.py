"""Which cells each experiment's tables need (Mamba-2: Tables 3, 8-10; Qwen3.5: Tables 12, 13), a table's
method subset, finding the experiment that declares a table, the paper profile's plan without the hub, and
the Mamba-2/Qwen3.5 layouts rendered from synthetic results."""

from pathlib import Path

import pytest

from state_reduction import cli, pipeline
from state_reduction.pipeline import (
    PipelineError,
    find_experiment,
    load_experiment,
    plan_table,
    table_cells,
)
from state_reduction.results import build_result, write_result

from paper_tables import lm_tables


def grid(cells):
    """(model, method, ratio %) of the base cells: a calibration-seed replicate (a `seed` override) is not listed
    again, and a base cell planned twice still is."""
    return sorted((c.model, c.method, round(c.ratio * 100)) for c in cells if "seed" not in dict(c.vary))


def seeds_per_cell(cells):
    """{(model, method, ratio %): sorted calibration seeds}; the base cell (no `seed` override) is seed 0."""
    out = {}
    for c in cells:
        out.setdefault((c.model, c.method, round(c.ratio * 100)), []).append(dict(c.vary).get("seed", 0))
    return {k: sorted(v) for k, v in out.items()}


@pytest.mark.parametrize("profile, codestral, m370", [("tiny", "mamba2", "mamba2"), ("paper", "codestral-7b", "mamba2-370m")])
def test_mamba2_tables(profile, codestral, m370):
    spec = load_experiment("mamba2")
    models, cells, rft = table_cells(spec, "table3", profile)
    assert models == [codestral] and rft == (False,)
    assert grid(cells) == sorted((codestral, m, 50) for m in ("grad", "drrqr", "l1"))
    models, cells, rft = table_cells(spec, "table8", profile)
    assert models == [m370] and {c.ratio for c in cells} == {0.75}
    assert list(dict.fromkeys(c.method for c in cells)) == ["grad", "drrqr", "wanda", "l1", "rand"]  # Table 8's row order
    models, cells, _ = table_cells(spec, "table10", profile)
    assert grid(cells) == sorted((codestral, m, r) for m in ("grad", "drrqr", "l1") for r in (50, 75))
    models, cells, _ = table_cells(spec, "table9", profile)
    assert models == ([m370] if profile == "tiny" else [m370, codestral])  # one stand-in for both on tiny
    n_seeds = 3 if profile == "tiny" else 1  # tiny replicates each cell over calibration seeds 0-2
    assert len(cells) == len(models) * 2 * 3 * n_seeds
    for table in ("table3", "table8", "table9", "table10"):
        _, cells, _ = table_cells(spec, table, profile)
        assert set(map(tuple, seeds_per_cell(cells).values())) == {tuple(range(n_seeds))}, table


@pytest.mark.parametrize("profile, key", [("tiny", "qwen3_5"), ("paper", "qwen3_5-9b")])
def test_qwen3_5_tables_use_the_tables_methods(profile, key):
    spec = load_experiment("qwen3_5")
    models, cells, rft = table_cells(spec, "table13", profile)
    assert models == [key] and rft == (False,)
    assert grid(cells) == sorted((key, m, r) for m in ("drrqr", "l1") for r in (25, 50))
    models, cells, rft = table_cells(spec, "table12", profile)  # with the dense+RFT control (control: true)
    assert grid(cells) == [(key, "dense", 0), (key, "drrqr", 50)] and rft == (True,)


def test_a_table_without_methods_runs_every_method_of_its_experiment():
    spec = load_experiment("deltanet_gdn")
    _, cells, _ = table_cells(spec, "table20", "tiny")
    assert [c.method for c in cells[:5]] == spec["methods"] == ["l1", "rand", "drrqr", "grad", "wanda"]


def test_a_table_method_outside_the_experiment_is_an_error():
    spec = load_experiment("qwen3_5")
    spec["tables"]["table13"] = {**spec["tables"]["table13"], "methods": ["drrqr", "grad"]}
    with pytest.raises(PipelineError, match=r"\['grad'\].*its methods: drrqr, l1"):
        table_cells(spec, "table13", "tiny")


def test_find_experiment_names_the_experiment_that_declares_the_table():
    assert find_experiment("table3") == find_experiment("table10") == "mamba2"
    assert find_experiment("table13") == find_experiment("table12") == "qwen3_5"
    assert find_experiment("table20") == "deltanet_gdn"
    with pytest.raises(PipelineError, match=r"'table99' is declared by 0 experiments.*table13"):
        find_experiment("table99")


def test_paper_plan_resolves_without_the_hub_or_a_model(monkeypatch, capsys):
    def refuse(*a, **k):
        raise AssertionError("the dry run read a model")

    monkeypatch.setattr(pipeline.stages, "model_entry", refuse)
    monkeypatch.delenv("SR_CHECKPOINTS", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    plan = plan_table(None, "table9", "paper")
    assert plan["experiment"] == "mamba2"
    assert plan["models"] == {"mamba2-370m": "${SR_CHECKPOINTS}/mamba2-370M",
                              "codestral-7b": "mistralai/Mamba-Codestral-7B-v0.1"}
    assert list(plan["stages"]) == ["baseline", "prune", "eval-pre"]  # pre-RFT only
    assert len(plan["stages"]["prune"]) == 2 * 2 * 3
    name, config = plan["stages"]["prune"][0]
    assert name == "mamba2-370m-grad-r50-prune"
    assert config["calib"] == "fineweb-edu" and config["n_calib"] == 128 and config["seq_len"] == 2048
    assert config["stream_layers"] is True and config["device"] == "cuda"  # 7B: one block at a time (issue 8)
    assert plan["stages"]["eval-pre"][0][1]["suite"] == "paper"

    assert cli.main(["run-table", "table12", "--profile", "paper", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "experiment qwen3_5" in out and "${SR_CHECKPOINTS}/qwen3_5-9b-text" in out
    # DRRQR 50% and the dense+RFT control (no prune): one seed on the paper profile
    for stage in ("baseline: 1 runs", "prune: 1 runs", "rft: 2 runs", "eval-post: 2 runs"):
        assert f"stage {stage}" in out
    assert "stage eval-pre" not in out and '"preset": "paper"' in out


def put(root, experiment, model, method, ratio, rft, **metrics):
    stage = "baseline" if method == "baseline" else ("eval-post" if rft else "eval-pre")
    config = {"experiment": experiment, "stage": stage, "model": model, "method": method, "ratio": ratio, "rft": rft}
    write_result(Path(root) / "tiny" / experiment / f"{model}-{method}-r{round(ratio * 100)}-{stage}.json",
                 build_result("evaluate", profile="tiny", experiment=experiment, config=config, metrics=metrics,
                              wall_time_s=1.0))


def tex_rows(path):
    lines = [ln.strip().removesuffix("\\\\").strip() for ln in path.read_text().splitlines() if "&" in ln]
    return [[c.strip() for c in ln.split("&")] for ln in lines]


def test_table13_renders_configurations_in_the_papers_order(tmp_path):
    results = tmp_path / "results"
    put(results, "qwen3_5", "qwen3_5", "baseline", 0.0, False, wiki_word_perplexity=50.0, lambada_ppl=60.0,
        zero_shot_avg=0.4)
    for method, ratio, wiki in (("drrqr", 0.25, 52.0), ("drrqr", 0.5, 58.0), ("l1", 0.25, 70.0)):  # l1 50% missing
        put(results, "qwen3_5", "qwen3_5", method, ratio, False, wiki_word_perplexity=wiki, lambada_ppl=wiki + 10,
            zero_shot_avg=0.38)
    out = lm_tables.render("table13", "tiny", results_root=results, out_root=tmp_path / "out",
                           figures_root=tmp_path / "figures", quiet=True)
    rows = tex_rows(out["tex"])
    assert rows[0] == ["Model", "Configuration", "Wiki $\\downarrow$", "LAMBADA $\\downarrow$", "Zero-shot $\\uparrow$"]
    body = {r[1]: r[2:] for r in rows[1:]}
    assert list(body) == ["Baseline", "DRRQR 25\\%", "DRRQR 50\\%", "L1 25\\%", "L1 50\\%"]
    assert body["Baseline"] == ["50.0", "60.0", "40.0"]
    # two methods: the better one at a ratio is bold, the other plain; a lone value at its ratio is bold
    assert body["DRRQR 25\\%"][0] == "\\textbf{52.0}" and body["L1 25\\%"][0] == "70.0"
    assert body["DRRQR 50\\%"][0] == "\\textbf{58.0}" and body["L1 50\\%"] == ["--"] * 3
    # the tiny table asks for calibration seeds 0-2: the first seed keeps the plain name, seeds 1-2 are replicates
    replicates = [f"qwen3_5-{m}-r{r}-seed_{s}-eval-pre" for m in ("drrqr", "l1") for r in (25, 50) for s in (1, 2)]
    assert sorted(out["missing"]) == sorted(["qwen3_5-l1-r50-eval-pre", *replicates])
    vs = out["vs_paper"].read_text()
    line = next(ln for ln in vs.splitlines() if ln.startswith("| Qwen3.5 9B | qwen3_5 | DRRQR | 25% | no |"))
    assert "| 52.0 | 9.7 | 62.0 | 4.3 | 38.0 | 73.0 |" in line
    assert out["figures"][0].stat().st_size > 5000


def test_table9_marks_best_and_second_among_three_methods_per_ratio(tmp_path):
    results = tmp_path / "results"
    put(results, "mamba2", "mamba2", "baseline", 0.0, False, wiki_word_perplexity=30.0, zero_shot_avg=0.4)
    for (method, ratio), wiki in {("grad", 0.5): 34.0, ("drrqr", 0.5): 35.0, ("l1", 0.5): 36.0,
                                  ("grad", 0.75): 50.0, ("drrqr", 0.75): 45.0}.items():
        put(results, "mamba2", "mamba2", method, ratio, False, wiki_word_perplexity=wiki, zero_shot_avg=0.3)
    out = lm_tables.render("table9", "tiny", results_root=results, out_root=tmp_path / "out",
                           figures_root=tmp_path / "figures", quiet=True)
    rows = tex_rows(out["tex"])
    assert rows[0] == ["Model", "Method", "Compression", "Wiki $\\downarrow$", "Zero-shot $\\uparrow$"]
    assert rows[1][:3] == ["tiny mamba2 (for Mamba-2 370M, Mamba-Codestral 7B)", "Baseline", "0\\%"]
    wiki = {(r[1], r[2]): r[3] for r in rows[1:]}
    assert wiki[("Grad", "50\\%")] == "\\textbf{34.0}" and wiki[("DRRQR", "50\\%")] == "\\underline{35.0}"
    assert wiki[("L1", "50\\%")] == "36.0"
    assert wiki[("DRRQR", "75\\%")] == "\\textbf{45.0}" and wiki[("Grad", "75\\%")] == "\\underline{50.0}"
    assert wiki[("L1", "75\\%")] == "--"
    assert "| Mamba-Codestral 7B | mamba2 | L1 | 75% | no | -- | 58.1 |" in out["vs_paper"].read_text()


def test_table12_names_the_columns_no_result_has(tmp_path):
    results = tmp_path / "results"
    put(results, "qwen3_5", "qwen3_5", "baseline", 0.0, False, ruler_256_acc=0.9)
    put(results, "qwen3_5", "qwen3_5", "drrqr", 0.5, True, ruler_256_acc=0.8)
    out = lm_tables.render("table12", "tiny", results_root=results, out_root=tmp_path / "out",
                           figures_root=tmp_path / "figures", quiet=True)
    rows = tex_rows(out["tex"])
    assert [r[1] for r in rows[1:]] == ["Baseline", "Dense+RFT", "DRRQR 50\\%"]
    assert rows[1][2] == "90.0" and rows[2][2:] == ["--"] * 6 and rows[3][2] == "80.0" and rows[3][3:] == ["--"] * 5
    # three long-context columns and the two MQAR columns of the recall companion (recall_table12), whose runs are
    # missing, as are the dense+RFT control's and the seeds 1-2 replicates'
    assert all("qwen3_5_recall-" in m or "-dense-" in m or "-seed_" in m for m in out["missing"])
    assert {"qwen3_5-dense-r0-eval-post", "qwen3_5-drrqr-r50-seed_1-eval-post"} <= set(out["missing"])
    assert len(out["empty_columns"]) == 5 and "RULER 256 $\\uparrow$" not in out["empty_columns"]
