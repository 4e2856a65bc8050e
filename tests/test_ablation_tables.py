"""The pruning ablations (Tables 2, 7, 16): a table's `vary:` crosses pruning settings with its cells (names
and configuration keys), the Table 20 cells keep their names and keys, and the renderers mark best values,
holes and the paper's numbers from synthetic results."""

from pathlib import Path

import pytest

from state_reduction.pipeline import (
    CONTROL,
    Cell,
    PipelineError,
    _Runner,
    load_experiment,
    table_cells,
    table_variations,
)
from state_reduction.results import build_result, config_key, write_result

from paper_tables import ablation_tables

# (prune key, eval-pre key) of every Table 20 cell as they were before `vary:` existed: results on disk stay valid
TABLE20_KEYS = {
    "deltanet-l1-r50": ["a0d5ebbfe88a21ef", "783e026df21054ef"],
    "deltanet-rand-r50": ["5e07dbfbd826fa7c", "c41d909be07e5ce2"],
    "deltanet-drrqr-r50": ["6e7899101829a905", "c71ab168cc86180a"],
    "deltanet-grad-r50": ["4c043f29e20130a4", "e0dd81de4538e734"],
    "deltanet-wanda-r50": ["637ba78f21727994", "20acf32edcf38de0"],
    "gated_deltanet-l1-r50": ["ef1599aab4c28c00", "6c4894ceaab5c11d"],
    "gated_deltanet-rand-r50": ["673b19aafe3e7b17", "d6f89cdaa1ef1eaf"],
    "gated_deltanet-drrqr-r50": ["d41630de26acb31f", "893f8d4e9688394b"],
    "gated_deltanet-grad-r50": ["51636e19e338f7a6", "65e3812777d28e01"],
    "gated_deltanet-wanda-r50": ["a621255a1f90966d", "94ad692f5c935e2f"],
}


def test_table20_names_and_keys_are_unchanged():
    spec = load_experiment("deltanet_gdn")
    _, cells, _ = table_cells(spec, "table20", "tiny")
    runner = _Runner(spec, "tiny")
    assert all(c.vary == () for c in cells)
    pruned = [c for c in cells if c.method != CONTROL]  # the dense+RFT control is new (issue 15), post-RFT only
    assert {c.name: [config_key(runner.prune_config(c)), config_key(runner.eval_config(c, False))]
            for c in pruned} == TABLE20_KEYS
    assert [c.name for c in cells if c.method == CONTROL] == ["deltanet-dense-r0", "gated_deltanet-dense-r0"]


def test_table16_crosses_selection_with_every_method_and_model():
    spec = load_experiment("coupled_selection")
    models, cells, rft = table_cells(spec, "table16", "tiny")
    # tiny: 3 replicate calibration draws (seeds 0, 1, 2; seed 0 is the profile's own and carries no suffix)
    assert models == ["deltanet", "gated_deltanet"] and rft == (False,) and len(cells) == 2 * 4 * 3 * 3
    names = [c.name for c in cells]
    first = [n for n in names if "seed" not in n]
    assert len(first) == 2 * 4 * 3
    assert first[:3] == ["deltanet-l1-r50", "deltanet-l1-r50-sel_k", "deltanet-l1-r50-sel_q"]  # kq: the default
    assert {dict(c.vary).get("seed") for c in cells} == {None, 1, 2}
    assert {c.method for c in cells} == {"l1", "drrqr", "grad", "wanda"} and {c.ratio for c in cells} == {0.5}
    models, cells, _ = table_cells(spec, "table16", "paper")
    assert len(models) == 4 and len(cells) == 4 * 4 * 3


def test_calibration_tables_vary_corpus_count_and_seed_per_profile():
    spec = load_experiment("calibration_sensitivity")
    assert table_variations(spec, "table2", "tiny") == [(), (("calib", "wiki"),), (("calib", "books"),)]
    assert table_variations(spec, "table2", "paper") == [(), (("calib", "pg19"),), (("calib", "pile"),)]
    # Table 7 is a union of three sweeps around the default; n = 128 is the default cell, listed once
    t7 = table_variations(spec, "table7", "tiny")
    assert t7 == [(("n_calib", 8),), (("n_calib", 32),), (), (("n_calib", 512),), (("seed", 111),),
                  (("seed", 1234),), (("calib", "wiki"),), (("calib", "books"),)]
    _, paper, _ = table_cells(spec, "table7", "paper")
    assert len(paper) == 2 * 8  # one draw per row, as the paper
    _, cells, _ = table_cells(spec, "table7", "tiny")
    # tiny: the rows that do not name a seed are replicated over draws 42, 111, 1234; the n = 128 row's draws are
    # the seed rows' cells and the corpus rows' are Table 2's (listed once): 3 sizes x 3 + 3 + 2 corpora x 3
    assert len(cells) == 2 * (3 * 3 + 3 + 2 * 3)
    names = {c.name for c in cells}
    assert {"deltanet-grad-r75-n_512", "deltanet-drrqr-r75-seed_111", "deltanet-drrqr-r75-n_8-seed_1234"} <= names
    _, t2, _ = table_cells(spec, "table2", "tiny")
    # Table 2 replicates its three corpus rows over three calibration draws: all of them Table 7's cells too
    assert len(t2) == 2 * 3 * 3 and {dict(c.vary).get("seed") for c in t2} == {None, 111, 1234}
    assert set(t2) < set(cells)


def test_a_varied_cell_prunes_with_its_overrides_under_its_own_key():
    spec = load_experiment("coupled_selection")
    runner = _Runner(spec, "tiny")
    plain, k_only = Cell("deltanet", "l1", 0.5), Cell("deltanet", "l1", 0.5, (("select", "k"),))
    assert runner.prune_config(plain)["select"] == "kq" and "vary" not in runner.prune_config(plain)
    config = runner.prune_config(k_only)
    assert config["select"] == "k" and config["vary"] == {"select": "k"}
    assert config_key(config) != config_key(runner.prune_config(plain))
    assert runner.eval_config(k_only, False)["of"] == config_key(config)
    assert runner._cell(runner.eval_config(k_only, False)) == k_only  # the stage finds the cell's pruned model


@pytest.mark.parametrize("vary, message", [
    ({"ratio": [0.5]}, "settings that can vary: select"),
    ({"calib": {"paper": ["pile"]}}, "no values for profile 'tiny'"),
])
def test_bad_vary_is_a_clear_error(vary, message):
    spec = load_experiment("coupled_selection")
    spec["tables"]["table16"]["vary"] = vary
    with pytest.raises(PipelineError, match=message):
        table_cells(spec, "table16", "tiny")


def put(root, experiment, model, method, ratio, wiki, vary=None):
    config = {"experiment": experiment, "model": model, "method": method, "ratio": ratio, "rft": False,
              **({"vary": vary} if vary else {})}
    name = Cell(model, method, ratio, tuple(sorted((vary or {}).items()))).name
    write_result(Path(root) / "tiny" / experiment / f"{name}-eval.json",
                 build_result("evaluate", profile="tiny", experiment=experiment, config=config,
                              metrics={"wiki_word_perplexity": wiki}, wall_time_s=1.0))


def rows(path):
    return [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in path.read_text().splitlines()[2:]]


def test_table16_marks_the_best_selection_per_method_and_shows_the_paper(tmp_path):
    results = tmp_path / "results"
    put(results, "coupled_selection", "deltanet", "baseline", 0.0, 100.0)
    for select, wiki in {"kq": 120.0, "k": 900.0, "q": 110.0}.items():
        put(results, "coupled_selection", "deltanet", "l1", 0.5, wiki, None if select == "kq" else {"select": select})
    put(results, "coupled_selection", "deltanet", "grad", 0.5, 105.0)  # K and Q of Grad missing
    out = ablation_tables.render("table16", "tiny", results_root=results, out_root=tmp_path / "out", quiet=True)
    body = {r[0]: r for r in rows(out["md"])}
    assert body["L1"][1:4] == ["<u>120.0</u>", "900.0", "**110.0**"]
    assert body["Grad"][1:4] == ["**105.0**", "--", "--"] and body["DRRQR"][1:] == ["--"] * 6
    assert body["Baseline"][1] == "100.0"
    assert "deltanet-grad-r50-sel_k-eval-pre" in out["missing"] and "gated_deltanet-baseline-r0-eval" in out["missing"]
    cmp = out["vs_paper"].read_text()
    assert "| DeltaNet 370M | deltanet | L1 | K | 900.0 | 4.25e+05 |" in cmp
    assert "| Gated DeltaNet 1.3B | gated_deltanet | Grad | K,Q | -- | 17.4 |" in cmp
    assert "\\textbf{110.0}" in out["tex"].read_text()


def test_table2_maps_the_paper_corpora_onto_the_offline_domains(tmp_path):
    results = tmp_path / "results"
    for calib, (drrqr, grad) in {"ptb": (40.0, 45.0), "wiki": (41.0, 60.0), "books": (42.0, None)}.items():
        vary = None if calib == "ptb" else {"calib": calib}
        put(results, "calibration_sensitivity", "deltanet", "drrqr", 0.75, drrqr, vary)
        if grad is not None:
            put(results, "calibration_sensitivity", "deltanet", "grad", 0.75, grad, vary)
    out = ablation_tables.render("table2", "tiny", results_root=results, out_root=tmp_path / "out", quiet=True)
    body = rows(out["md"])
    assert body[0] == ["ptb", "**40.0**", "45.0"] and body[2] == ["books", "**42.0**", "--"]
    assert body[3] == ["spread (max/min)", "1.050", "1.333"]
    cmp = out["vs_paper"].read_text()
    assert "| PG19 | wiki | 41.0 | 41.5 | 60.0 | 53.8 |" in cmp.replace("pg19", "PG19")
    assert out["missing"][0] == "deltanet-baseline-r0-eval" and "deltanet-grad-r75-cal_books-eval-pre" in out["missing"]
    assert "deltanet-drrqr-r75-cal_books-seed_111-eval-pre" in out["missing"]  # the replicates not run yet
    assert "±" not in out["md"].read_text()  # one draw per cell: no interval


def test_table2_shows_the_mean_and_interval_over_the_calibration_draws(tmp_path):
    results = tmp_path / "results"
    for seed, (drrqr, grad) in {42: (40.0, 45.0), 111: (42.0, 47.0), 1234: (44.0, 49.0)}.items():
        vary = None if seed == 42 else {"seed": seed}
        put(results, "calibration_sensitivity", "deltanet", "drrqr", 0.75, drrqr, vary)
        put(results, "calibration_sensitivity", "deltanet", "grad", 0.75, grad, vary)
    put(results, "calibration_sensitivity", "deltanet", "drrqr", 0.75, 41.0, {"calib": "wiki"})
    out = ablation_tables.render("table2", "tiny", results_root=results, out_root=tmp_path / "out", quiet=True)
    body = rows(out["md"])
    # mean 42, half-width t(0.975, 2) * 2 / sqrt(3) = 4.97; a corpus with one draw shows it alone
    assert body[0] == ["ptb", "**42.0 ± 5.0**", "47.0 ± 5.0"] and body[1] == ["wiki", "**41.0**", "--"]
    text = out["md"].read_text()
    assert "over 1-3 calibration draws per cell (seeds 42, 111, 1234; a cell without ± has one draw)" in text
    assert "A row that names its seed is that one draw. The spread row is max/min of the means." in text
    assert "\\textbf{42.0{\\scriptsize$\\pm$5.0}}" in out["tex"].read_text()
