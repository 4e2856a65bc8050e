"""`state-reduction render`, the tables' layouts as data (`tables.<table>.render`) and their bad inputs: a table no
config declares, a metric id not in the registry, an unknown render key or layout each give one line naming the
file, the key and the closest valid names."""

import re
from pathlib import Path

import pytest
import yaml
from table_fixtures import write_fixtures

import paper_tables
from paper_tables import lm_tables, spec
from paper_tables.metrics import METRICS, TableSpecError
from state_reduction import cli
from state_reduction.errors import Error
from state_reduction.pipeline import load_experiment, profile_tables


def test_every_declared_table_has_a_renderer_and_valid_render_data():
    layouts = paper_tables.layouts()
    for table, experiment in spec.declared_tables().items():
        s = load_experiment(experiment)
        if "render" in s["tables"][table]:
            for profile in (p for p in s["profiles"] if table in profile_tables(s, p)):
                r = spec.render_spec(s, table, profile, layouts, experiment)
                assert r["columns"] and all(m.id in METRICS for m in r["columns"])
        else:  # its experiment's renderer, or a companion table that other tables' columns read
            assert s["experiment"] in paper_tables.RENDERERS or spec.readers(s, table), table


def test_the_lm_long_context_and_shared_conv_variant_tables_are_data():
    declared = spec.declared_tables()
    data = [t for t, e in declared.items() if "render" in load_experiment(e)["tables"][t]]
    paper = sorted((t for t in data if re.fullmatch(r"table\d+", t)), key=lambda t: int(t[5:]))
    assert paper == [f"table{n}" for n in (1, 3, 4, 8, 9, 10, 11, 12, 13, 14, 20, 21, 22, 23, 24)]
    # variants of a paper table, compared with its published numbers
    assert {t for t in data if t.startswith("table") and t not in paper} == {"table20_full"}
    assert spec.render_spec(load_experiment("deltanet_gdn"), "table20_full", "tiny", lm_tables.LAYOUTS)["paper"] == \
        "table20"
    assert {t for t in data if declared[t] == "selector_benchmark"} == {
        "selector_benchmark", "selector_benchmark_ghost", "selector_recall", "selector_bar", "bar_deltanet",
        "bar_gated_deltanet", "bar_mamba2", "bar_qwen3_5", "bar_recall", "selector_recall_ghost",
        "selector_benchmark_books", "selector_benchmark_ghost_books", "selector_recall_seeds",
        "selector_recall_seeds_ghost", "selector_bar_rft", "selector_bar_rft_books", "selector_rank_rft",
        "selector_rank_rft_books"}


def test_render_command_writes_the_table(tmp_path, capsys):
    write_fixtures(tmp_path / "results", tables=["table3"], profiles=["tiny"])
    assert cli.main(["render", "table3", "--results-root", str(tmp_path / "results"),
                     "--out-root", str(tmp_path / "out")]) == 0
    tex = (tmp_path / "out" / "tiny" / "table3.tex").read_text()
    assert "Wiki $\\downarrow$ & ZS $\\uparrow$" in tex and "\\textbf{" in tex
    assert (tmp_path / "out" / "figures" / "tiny" / "table3.png").is_file()


def test_a_table_no_config_declares_is_one_line_with_the_closest_names(capsys):
    assert cli.main(["render", "table200"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "experiments/*/config.yaml" in err and "'table200'" in err
    assert "did you mean" in err and "table20" in err


def _config(tmp_path, render) -> Path:
    s = load_experiment("deltanet_gdn")
    s["tables"] = {"table20": {**s["tables"]["table20"], "render": render}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(s))
    return path


@pytest.mark.parametrize("render, key, closest", [
    ({"layout": "pre_post", "columns": ["wiki_word_perplexity", "lambada_pl", "zero_shot_avg"]},
     "tables.table20.render.columns[1]", "lambada_ppl"),
    ({"layout": "pre_post", "columns": {"tiny": [{"metric": "zero_shot_ave", "label": "Avg"}], "paper": []}},
     "tables.table20.render.columns.tiny[0]", "zero_shot_avg"),
    ({"layout": "pre_posts", "columns": ["wiki_word_perplexity"]}, "tables.table20.render.layout", "pre_post"),
    ({"layout": "pre_post", "colums": ["wiki_word_perplexity"]}, "tables.table20.render", "columns"),
])
def test_bad_render_data_names_the_file_the_key_and_the_closest_names(tmp_path, capsys, render, key, closest):
    path = _config(tmp_path, render)
    with pytest.raises(TableSpecError) as e:
        lm_tables.render("table20", "tiny", experiment=str(path), results_root=tmp_path, out_root=tmp_path,
                         figures_root=tmp_path, quiet=True)
    line = e.value.one_line()
    assert isinstance(e.value, Error) and str(path) in line and key in line and closest in line
    assert cli.main(["render", "table20", "--experiment", str(path), "--results-root", str(tmp_path),
                     "--out-root", str(tmp_path / "out")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_pre_post_ranks_at_the_tables_ratio(tmp_path):
    """Table 20's layout marks best/second among the methods at the table's own ratio (here 30%), the ratio it
    shows (main fixed the former hard-coded 0.5 in 29055c7; this guards it)."""
    s = load_experiment("deltanet_gdn")
    s["tables"] = {"table20": {**s["tables"]["table20"], "ratios": [0.3], "control": False,
                               "models": ["DeltaNet 370M"]}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(s))
    from state_reduction.results import build_result, write_result

    def put(method, ratio, wiki):
        stage = "baseline" if method == "baseline" else "eval-pre"
        config = {"experiment": "deltanet_gdn", "stage": stage, "model": "deltanet", "method": method,
                  "ratio": ratio, "rft": False, **s["profiles"]["tiny"]["evaluate"]}
        write_result(tmp_path / "results" / "tiny" / "deltanet_gdn" / f"{method}-{ratio}.json",
                     build_result("evaluate", profile="tiny", experiment="deltanet_gdn", config=config,
                                  metrics={"wiki_word_perplexity": wiki}, wall_time_s=1.0))

    for method, wiki in {"l1": 50.0, "rand": 90.0, "drrqr": 40.0, "grad": 60.0, "wanda": 70.0}.items():
        put(method, 0.3, wiki)
        put(method, 0.5, 200.0 - wiki)  # the opposite order at 50%, which the table does not show
    out = lm_tables.render("table20", "tiny", experiment=str(path), results_root=tmp_path / "results",
                           out_root=tmp_path / "out", figures_root=tmp_path / "fig", quiet=True)
    rows = {r.split(" & ")[1]: r.split(" & ")[2] for r in out["tex"].read_text().splitlines() if " & " in r}
    assert rows["DRRQR"] == "\\textbf{40.0}" and rows["L1"] == "\\underline{50.0}" and rows["Rand"] == "90.0"


def test_one_make_rule_renders_every_table_and_figure():
    """`make -n TARGET` of every declared table and figure (and the speed outputs) is the generic rule:
    `state-reduction render TARGET --run`, after the speed tables' bench results."""
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.fail("make is not installed")
    root = Path(paper_tables.__file__).resolve().parents[1]
    targets = [t for t in spec.declared_tables() if t.startswith(("table", "figure"))] + \
        ["table17", "table18", "table19", "figure4"]
    for target in targets:
        out = subprocess.run(["make", "-n", "-o", ".venv/.installed", "-o", "setup", target, "PROFILE=tiny"],
                             cwd=root, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, (target, out.stderr)
        assert f"state-reduction render {target} --profile tiny --run" in out.stdout, (target, out.stdout)


def test_calibration_sources_layout_keeps_each_sources_draws_apart(tmp_path):
    """experiments/distribution_shift's table shift: one row group per calibration source, each the mean ± 95% CI of
    that source's draws only (the replicates of a cell span every source); the MQAR columns read the companion
    table shift_mqar (the same cells scored by tiny_mqar)."""
    from state_reduction.pipeline import plan_table
    from state_reduction.results import build_result, write_result

    root = tmp_path / "results"
    level = {"ptb": 100.0, "books": 200.0, "mqar": 400.0}
    for table in ("shift", "shift_mqar"):
        plan = plan_table(None, table, "tiny", stages=("baseline", "eval-pre"))
        for jobs in plan["stages"].values():
            for name, config in jobs:
                vary = config.get("vary", {})
                v = 16.0 if config["method"] == "baseline" else \
                    level[vary.get("calib", "ptb")] + vary.get("seed", 0) + (1000.0 if config["method"] == "grad" else 0)
                metrics = ({"wiki_word_perplexity": v, "ptb_word_perplexity": 2 * v} if config["suite"] == "tiny_ppl"
                           else {"mqar_32_p6_acc": v / 5000, "mqar_32_p8_acc": v / 10000})
                write_result(root / "tiny" / plan["experiment"] / f"{name}.json",
                             build_result("evaluate", profile="tiny", experiment=plan["experiment"], config=config,
                                          metrics=metrics, wall_time_s=0.0))
    written = paper_tables.render("shift", "tiny", results_root=root, out_root=tmp_path / "out",
                                  figures_root=tmp_path / "fig", quiet=True)
    assert written["missing"] == []
    rows = {tuple(c.strip() for c in line.split("|")[2:5]): [c.strip() for c in line.split("|")[5:-1]]
            for line in written["md"].read_text().splitlines() if line.startswith("|") and "---" not in line}
    # draws 0, 1, 2 of a source: mean + 1, half-width t(0.975, 2) / sqrt(3) = 2.5
    assert rows[("50%", "books", "DRRQR")] == ["**201.0 ± 2.5**", "**402.0 ± 5.0**", "4.0 ± 0.0", "2.0 ± 0.0"]
    assert rows[("50%", "mqar", "Grad")] == ["1401.0 ± 2.5", "2802.0 ± 5.0", "**28.0 ± 0.0**", "**14.0 ± 0.0**"]
    assert rows[("0%", "--", "Baseline")] == ["16.0", "32.0", "0.3", "0.2"]
    assert [k[1] for k in rows if k[2] == "DRRQR"] == ["ptb", "books", "mqar"] * 2  # two models
    md = written["md"].read_text()
    assert "over 3 replicates per cell" in md and "over 3 replicates per reduced cell" in md  # per source, not 9
    assert written["figures"] and all(p.is_file() for p in written["figures"])
