"""paper_tables/joint_compression: method groups, the Pareto front, and a render from result files written here
(means and intervals over seeds, kept fractions, the missing-cell note, the figure files)."""

from __future__ import annotations

import pytest

from paper_tables import joint_compression as jc
from paper_tables import render
from state_reduction.results import build_result, write_result
from state_reduction.stats import mean_ci


@pytest.mark.parametrize("method,group", [("drrqr", "state"), ("ralimp-k2", "mlp"), ("eugen-kall", "baseline"),
                                          ("drrqr+ralimp-kall", "both"), ("dense", "control")])
def test_groups(method, group):
    assert jc.group(method) == group


def test_pareto_keeps_the_non_dominated_points():
    pts = [(1.0, 10.0), (0.5, 12.0), (0.6, 11.0), (0.7, 13.0), (0.4, 20.0), (0.9, 9.0)]
    assert jc.pareto(pts) == [(0.4, 20.0), (0.5, 12.0), (0.6, 11.0), (0.9, 9.0)]


def _write(root, name, kind, config, metrics):
    write_result(root / "tiny" / "joint_compression" / f"{name}.json",
                 build_result(kind, profile="tiny", experiment="joint_compression", config=config, metrics=metrics,
                              wall_time_s=1.0))


def test_render_from_results(tmp_path):
    root = tmp_path / "results"
    base = {"model": "gated_deltanet", "experiment": "joint_compression"}
    _write(root, "gdn-base", "evaluate", {**base, "method": "baseline", "ratio": 0.0, "rft": False},
           {"wiki_word_perplexity": 100.0})
    ppl = {0: 120.0, 1: 130.0, 2: 125.0}
    control = {0: 110.0, 1: 120.0, 2: 115.0}  # the dense+RFT control, one per seed
    for seed, value in ppl.items():
        vary = {"vary": {"seed": seed}} if seed else {}
        cfg = {**base, "method": "drrqr+ralimp-k1", "ratio": 0.5, **vary}
        _write(root, f"p{seed}", "prune", cfg,
               {"parameters_before": 1000.0, "parameters_after": 800.0, "state_bytes_before": 64.0,
                "state_bytes_after": 32.0, "flops_per_token_before": 10.0, "flops_per_token_after": 9.0,
                "decode_ms_per_token": 2.0, "decode_ms_per_token_dense": 2.5, "decode_speedup": 1.2 + 0.1 * seed,
                "mlp_rel_error_fit": 0.3})
        _write(root, f"e{seed}", "evaluate", {**cfg, "rft": True}, {"wiki_word_perplexity": value})
        _write(root, f"c{seed}", "evaluate", {**base, "method": "dense", "ratio": 0.0, "rft": True, **vary},
               {"wiki_word_perplexity": control[seed]})
    paths = render("joint_compression", "tiny", results_root=root, out_root=tmp_path / "out",
                   figures_root=tmp_path / "fig")
    md = (tmp_path / "out" / "tiny" / "joint_compression.md").read_text()
    row = next(line for line in md.splitlines() if "| gated_deltanet | drrqr+ralimp-k1 | 0.5 |" in line)
    assert "| 80.0% | 50.0% | 90.0% | 2.00 (2.50) |" in row
    assert mean_ci(list(ppl.values())).format(4) in row and mean_ci([1.2, 1.3, 1.4]).format(4) in row
    # recovery read against the control of the same seed: 120/110, 130/120, 125/115, minus 1, in %
    assert row.endswith(f"| {mean_ci([100 * (ppl[s] / control[s] - 1) for s in ppl]).format(4)} |")
    assert f"| gated_deltanet | dense+RFT | 0 | 100% | 100% | 100% | -- | -- | -- | " \
           f"{mean_ci(list(control.values())).format(4)} | -- |" in md
    assert "| gated_deltanet | dense | 0 |" in md and "100 (n=1)" in md
    assert "gated_deltanet-drrqr+ralimp-k2-r50" in md.split("Cells without a post-RFT result:")[1]
    assert {p.suffix for p in paths} == {".md", ".png", ".pdf"} and all(p.exists() for p in paths)


def test_recall_section_from_results(tmp_path):
    """The recall tables' cells (tiny_mqar suite) render in their own section, accuracy in % per pair count before
    RFT with the interval over seeds; the perplexity table does not list the recall models."""
    root = tmp_path / "results"
    base = {"model": "gated_deltanet_mqar", "experiment": "joint_compression", "suite": "tiny_mqar"}
    columns = jc.RECALL_COLUMNS["tiny_mqar"]
    _write(root, "dense", "evaluate", {**base, "method": "baseline", "ratio": 0.0, "rft": False},
           {c: 0.99 for c in columns})
    acc = {0: 0.50, 1: 0.60, 2: 0.55}
    for seed, value in acc.items():
        cfg = {**base, "method": "ralimp-k1", "ratio": 0.0, "vary": {"seq_len": 32, "n_calib": 64,
                                                                        **({"seed": seed} if seed else {})}}
        _write(root, f"p{seed}", "prune", cfg, {"parameters_before": 1000.0, "parameters_after": 900.0,
                                                "state_bytes_before": 64.0, "state_bytes_after": 64.0})
        _write(root, f"e{seed}", "evaluate", {**cfg, "rft": False}, {c: value for c in columns})
    paths = render("joint_compression", "tiny", results_root=root, out_root=tmp_path / "out",
                   figures_root=tmp_path / "fig")
    md = (tmp_path / "out" / "tiny" / "joint_compression.md").read_text()
    table, recall = md.split("## Recall (the MQAR testbed)")
    assert "gated_deltanet_mqar" not in table
    row = next(line for line in recall.splitlines() if "| gated_deltanet_mqar | ralimp-k1 | 0 |" in line)
    assert "| 90.0% | 100.0% |" in row and row.count(mean_ci([50.0, 60.0, 55.0]).format(4)) == len(columns)
    assert "| gated_deltanet_mqar | dense | 0 | 100% | 100% | 99 (n=1) |" in recall
    assert "deltanet_mqar-drrqr-r50" in recall.split("Recall cells without a result:")[1]
    assert any(p.name.startswith("joint_compression_recall") for p in paths)
