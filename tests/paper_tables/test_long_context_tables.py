"""Renderers of Tables 4 and 11 (experiments/long_context): numbers only from result files, the tiny profile's
columns at 256/512 tokens beside the paper's 2K/4K, holes listed, figures written."""

from pathlib import Path

import pytest

from state_reduction.results import build_result, write_result

from paper_tables import long_context_tables


def put(root, model, method, ratio, seed=None, **metrics):
    stage = "baseline" if method == "baseline" else "eval-post"
    config = {"experiment": "long_context", "stage": stage, "model": model, "method": method, "ratio": ratio,
              "rft": method != "baseline", "suite": "tiny_longctx", **({"vary": {"seed": seed}} if seed else {})}
    name = f"{model}-{method}-r{round(ratio * 100)}{f'-seed_{seed}' if seed else ''}-{stage}"
    write_result(Path(root) / "tiny" / "long_context" / f"{name}.json",
                 build_result("evaluate", profile="tiny", experiment="long_context", config=config,
                              metrics=metrics, wall_time_s=1.0))


def recall(short, long):
    return {"ruler_256_acc": short, "ruler_512_acc": long, "niah_256_acc": short + 0.1, "niah_512_acc": long + 0.1}


@pytest.fixture
def results(tmp_path):
    root = tmp_path / "results"
    put(root, "gated_deltanet", "baseline", 0.0, **recall(0.6, 0.5))
    put(root, "gated_deltanet", "drrqr", 0.2, **recall(0.55, 0.45))
    put(root, "gated_deltanet", "grad", 0.2, **recall(0.58, 0.4))
    put(root, "gated_deltanet", "drrqr", 0.5, **recall(0.3, 0.2))
    put(root, "qwen3_5", "baseline", 0.0, **recall(0.9, 0.8))
    return root


def render(table, results, tmp_path):
    return long_context_tables.render(table, "tiny", results_root=results, out_root=tmp_path / "out",
                                      figures_root=tmp_path / "figures", quiet=True)


def md_rows(path):
    """The table's rows (the caption under it, after a blank line, is not a row)."""
    lines = path.read_text().split("\n\n")[0].splitlines()[2:]
    return [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines]


def own(missing):
    """The holes of the table's own cells (the recall companion's, none of which these fixtures write, aside)."""
    return [m for m in missing if "_mqar-" not in m]


def test_table11_rows_marks_and_holes(results, tmp_path):
    out = render("table11", results, tmp_path)
    rows = {r[1]: r[2:] for r in md_rows(out["md"])}
    assert list(rows) == ["Baseline", "Dense+RFT", "DRRQR 20%", "Grad 20%", "DRRQR 30%", "Grad 30%", "DRRQR 50%",
                          "Grad 50%"]
    assert rows["Baseline"] == ["60.0", "50.0", "70.0", "60.0", "--", "--"]  # no MQAR results: holes
    assert rows["Dense+RFT"] == ["--"] * 6 and "gated_deltanet-dense-r0-seed_2-eval-post" in out["missing"]
    # best among the methods at the same ratio; two methods: no second mark
    assert rows["DRRQR 20%"][:2] == ["55.0", "**45.0**"] and rows["Grad 20%"][:2] == ["**58.0**", "40.0"]
    assert rows["Grad 50%"] == ["--"] * 6 and rows["DRRQR 30%"] == ["--"] * 6
    assert "gated_deltanet-grad-r50-eval-post" in out["missing"] and "gated_deltanet-drrqr-r20-eval-post" not in out["missing"]
    assert "gated_deltanet_mqar-grad-r50-n_64-seed_2-len_32-eval-post" in out["missing"]  # the companion's holes too
    header = out["md"].read_text().splitlines()[0]
    assert "RULER 256" in header and "NIAH 512" in header and "SQuAD" not in header  # no tiny SQuAD/SWDE analog


def test_comparison_pairs_tiny_lengths_with_the_papers(results, tmp_path):
    text = render("table11", results, tmp_path)["vs_paper"].read_text()
    assert "| RULER 256 ours | RULER 2K paper | RULER 512 ours | RULER 4K paper |" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("| Gated DeltaNet 1.3B | gated_deltanet | DRRQR | 50% |"))
    assert "| 30.0 | 37.9 | 20.0 | 27.5 | 40.0 | 81.9 | 30.0 | 61.9 |" in line


def test_table4_shows_both_models_at_the_long_length(results, tmp_path):
    out = render("table4", results, tmp_path)
    rows = md_rows(out["md"])
    assert [r[1] for r in rows] == ["Baseline", "Dense+RFT", "DRRQR", "Baseline", "Dense+RFT", "DRRQR"]
    assert rows[0][0].startswith("tiny gated_deltanet") and rows[3][0].startswith("tiny qwen3_5")
    assert rows[0][2:] == ["50.0", "60.0", "--", "--"] and rows[2][2:4] == ["20.0", "30.0"] and rows[5][2:] == ["--"] * 4
    assert "qwen3_5-drrqr-r50-eval-post" in own(out["missing"]) and "qwen3_5-dense-r0-eval-post" in own(out["missing"])
    text = out["vs_paper"].read_text()
    assert "| Qwen3.5 9B | qwen3_5 | Baseline | 0% | 80.0 | 93.9 | 90.0 | 100.0 |" in text
    png, pdf = out["figures"]
    assert png.stat().st_size > 5000 and pdf.read_bytes()[:4] == b"%PDF"


def test_seeds_and_control_give_mean_and_interval(results, tmp_path):
    """Three seeds of a cell and of the dense+RFT control: the table shows their mean ± the 95% t half-width, says
    over how many seeds, and a cell with one seed shows no ±."""
    for seed, (short, long) in zip((None, 1, 2), ((0.59, 0.49), (0.61, 0.51), (0.60, 0.50))):
        put(results, "gated_deltanet", "dense", 0.0, seed, **recall(short, long))
    for seed, (short, long) in zip((1, 2), ((0.25, 0.15), (0.35, 0.25))):
        put(results, "gated_deltanet", "drrqr", 0.5, seed, **recall(short, long))
    out = render("table11", results, tmp_path)
    rows = {r[1]: r[2:] for r in md_rows(out["md"])}
    # mean 0.6 / 0.3, t(0.975, 2) * sd / sqrt(3) = 4.303 * 0.01 / 1.732 = 2.5 and 4.303 * 0.05 / 1.732 = 12.4 points
    assert rows["Dense+RFT"][:2] == ["60.0 ± 2.5", "50.0 ± 2.5"]
    assert rows["DRRQR 50%"][:2] == ["**30.0 ± 12.4**", "**20.0 ± 12.4**"]  # Grad 50% is a hole
    assert rows["DRRQR 20%"][:2] == ["55.0", "**45.0**"]  # one seed: no interval
    assert "gated_deltanet-dense-r0-seed_1-eval-post" not in out["missing"]


def test_recall_table4_seeds_has_every_pretraining_seed_of_every_family(tmp_path):
    """The tiny-only table of Table 4's recall cell on 4 families x 3 pretraining seeds: Table 4's rows per model,
    its MQAR columns, a bar per configuration and model, and no paper row to compare with (said, not left empty)."""
    from table_fixtures import write_fixtures

    root = tmp_path / "results"
    assert write_fixtures(root, tables=["recall_table4_seeds"], profiles=["tiny"]) > 100
    out = render("recall_table4_seeds", root, tmp_path)
    rows = md_rows(out["md"])
    assert len(rows) == 12 * 3 and [r[1] for r in rows[:3]] == ["Baseline", "Dense+RFT", "DRRQR"]
    models = [r[0] for r in rows if r[0]]
    assert len(models) == 12 and models[0].startswith("tiny deltanet_mqar") and models[-1].startswith("tiny qwen3_5_recall_s2")
    assert "MQAR 32/8" in out["md"].read_text().splitlines()[0]
    assert any("±" in c for r in rows for c in r[2:])  # 3 calibration/RFT seeds per reduced cell
    assert "nothing to compare" in out["vs_paper"].read_text()
    png, pdf = out["figures"]
    assert png.stat().st_size > 5000 and pdf.read_bytes()[:4] == b"%PDF"
