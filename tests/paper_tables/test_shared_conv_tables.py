"""Tables 14 and 15 (experiment pca_vs_shared_conv): the cells and evaluation settings each table asks of the
pipeline, and the renderers on synthetic results (marks, holes, the other table's results ignored, the paper's
numbers and claims beside ours)."""

from pathlib import Path

import pytest

from state_reduction.pipeline import (
    Cell,
    PipelineError,
    _Runner,
    _stage_jobs,
    load_experiment,
    table_cells,
    table_evaluate,
)
from state_reduction.results import build_result, write_result

from paper_tables import shared_conv_tables

EXPERIMENT = "pca_vs_shared_conv"


def test_table14_evaluates_three_dense_variants_with_the_zero_shot_suite():
    spec = load_experiment(EXPERIMENT)
    models, cells, rft = table_cells(spec, "table14", "tiny")
    assert models == ["deltanet", "deltanet_shared_head", "deltanet_shared_all"] and cells == [] and rft == (False,)
    settings, suffix = table_evaluate(spec, "table14", "tiny")
    assert settings["suite"] == "tiny" and settings["limit"] == 100 and suffix == "-limit_100-suite_tiny"
    assert table_evaluate(spec, "table14", "paper")[0]["suite"] == "paper"
    runner = _Runner(spec, "tiny", dry_run=True, evaluate=(settings, suffix))
    stage, jobs, _ = next(_stage_jobs(runner, models, cells, rft, ("baseline", "prune", "eval-pre")))
    assert stage == "baseline" and jobs[0][0] == "deltanet-baseline-r0-eval-limit_100-suite_tiny"
    assert all(c["suite"] == "tiny" and c["limit"] == 100 for _, c in jobs)


def test_table15_prunes_non_shared_and_per_head_shared_models_with_pca_and_grad():
    spec = load_experiment(EXPERIMENT)
    models, cells, _ = table_cells(spec, "table15", "tiny")
    assert models == ["deltanet", "deltanet_shared_head"]
    assert {(c.method, c.ratio) for c in cells} == {(m, r) for m in ("pca-adv", "pca", "grad") for r in (0.75, 0.5)}
    assert table_evaluate(spec, "table15", "tiny") == (spec["profiles"]["tiny"]["evaluate"], "")
    assert len(table_cells(spec, "table15", "paper")[1]) == 12


def test_an_unknown_evaluate_override_is_a_clear_error():
    spec = load_experiment(EXPERIMENT)
    spec["tables"]["table14"]["evaluate"] = {"tiny": {"suite": "tiny", "shots": 5}}
    with pytest.raises(PipelineError, match=r"overrides evaluate settings \['shots'\]"):
        table_evaluate(spec, "table14", "tiny")


def put(root, table, model, method, ratio, metrics):
    settings, suffix = table_evaluate(load_experiment(EXPERIMENT), table, "tiny")
    config = {"experiment": EXPERIMENT, "model": model, "method": method, "ratio": ratio, "rft": False, **settings}
    name = Cell(model, method, ratio).name + ("-eval" if method == "baseline" else "-eval-pre") + suffix
    write_result(Path(root) / "tiny" / EXPERIMENT / f"{name}.json",
                 build_result("evaluate", profile="tiny", experiment=EXPERIMENT, config=config, metrics=metrics,
                              wall_time_s=1.0))


def rows(path):
    return [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in path.read_text().splitlines()[2:]
            if ln.startswith("|")]


def test_table14_ranks_the_variants_and_reads_only_zero_shot_results(tmp_path):
    results = tmp_path / "results"
    zs = {"lambada_acc": 0.1, "continuation_acc_norm": 0.3, "next_sentence_acc": 0.5, "lambada_ppl": 900.0}
    put(results, "table14", "deltanet", "baseline", 0.0, {"wiki_word_perplexity": 500.0, "zero_shot_avg": 0.30, **zs})
    put(results, "table14", "deltanet_shared_head", "baseline", 0.0, {"wiki_word_perplexity": 450.0, "zero_shot_avg": 0.32, **zs})
    put(results, "table15", "deltanet_shared_all", "baseline", 0.0, {"wiki_word_perplexity": 1.0})  # perplexity suite
    out = shared_conv_tables.render("table14", "tiny", results_root=results, out_root=tmp_path / "out",
                                    figures_root=tmp_path / "fig", quiet=True)
    body = rows(out["md"])
    assert [r[1] for r in body] == ["××", "×✓", "✓✓"]
    assert [r[2] for r in body] == ["<u>500.0</u>", "**450.0**", "--"]  # Wiki: lower is better
    assert [r[-1] for r in body] == ["<u>30.0</u>", "**32.0**", "--"]  # Avg, percent: higher is better
    assert out["missing"] == ["deltanet_shared_all-baseline-r0-eval-limit_100-suite_tiny"]
    vs = out["vs_paper"].read_text()
    assert "| DeltaNet 370M (conv shared within heads) | deltanet_shared_head | Baseline | 0% | no | 450.0 | 29.5 |" in vs
    assert all(p.exists() for p in out["figures"])


def test_table15_marks_methods_per_ratio_and_checks_the_papers_claims(tmp_path):
    results = tmp_path / "results"
    wiki = {("deltanet", "pca-adv"): 9000.0, ("deltanet", "pca"): 12000.0, ("deltanet", "grad"): 700.0,
            ("deltanet_shared_head", "pca-adv"): 8000.0, ("deltanet_shared_head", "pca"): 900.0,
            ("deltanet_shared_head", "grad"): 600.0}
    for (model, method), v in wiki.items():
        put(results, "table15", model, method, 0.75, {"wiki_word_perplexity": v})
    put(results, "table15", "deltanet", "baseline", 0.0, {"wiki_word_perplexity": 400.0})
    put(results, "table14", "deltanet_shared_head", "baseline", 0.0, {"wiki_word_perplexity": 1.0})  # other suite
    out = shared_conv_tables.render("table15", "tiny", results_root=results, out_root=tmp_path / "out",
                                    figures_root=tmp_path / "fig", quiet=True)
    body = rows(out["md"])
    assert body[0] == ["75%", "PCA (adv.)", "<u>9000.0</u>", "8000.0"]
    assert body[1] == ["", "PCA (prop.)", "12000.0", "<u>900.0</u>"]
    assert body[2] == ["", "Grad", "**700.0**", "**600.0**"]
    assert body[3][0] == "50%" and body[3][2:] == ["--", "--"]
    assert body[-1] == ["0%", "--", "400.0", "--"]
    assert "deltanet_shared_head-baseline-r0-eval" in out["missing"]
    vs = out["vs_paper"].read_text()
    assert "| DeltaNet 370M (conv shared within heads) | deltanet_shared_head | PCA (prop.) | 75% | 900.0 | 184.5 |" in vs
    claims = {r[0] + " " + r[1]: r for r in rows(out["vs_paper"]) if r[1] in ("75%", "50%") and "(" in r[0]}
    shared = claims["DeltaNet 370M (conv shared within heads) (deltanet_shared_head) 75%"]
    assert shared[2:] == ["yes (900.0 vs 8000.0)", "yes (184.5 vs 2.1e+05)", "yes (600.0 vs 900.0)", "yes (69.8 vs 184.5)"]
    non_shared = claims["DeltaNet 370M (no shared conv) (deltanet) 75%"]
    assert non_shared[2] == "no (12000.0 vs 9000.0)" and non_shared[3] == "no (3.3e+05 vs 3.1e+05)"


def test_a_missing_tiny_checkpoint_is_named(tmp_path):
    spec = load_experiment(EXPERIMENT)
    spec["profiles"]["tiny"]["models"]["deltanet_shared_all"]["path"] = str(tmp_path / "not_trained")
    runner = _Runner(spec, "tiny", results_root=tmp_path)
    with pytest.raises(PipelineError, match="model 'deltanet_shared_all' of profile 'tiny': no checkpoint folder"):
        runner.dense("deltanet_shared_all")
