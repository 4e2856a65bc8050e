"""The rank-analysis renderers (paper_tables/rank_tables.py) on small synthetic `analyze` results: holes for missing
runs, degenerate heads as dashes (never NaN), and the numbers they derive (spectral gap, overlap, best marks)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from paper_tables import rank_tables
from paper_tables.rank_tables import render, tail_share
from state_reduction.analysis.experiment import analysis_name
from state_reduction.analysis.rank import spectral_gap
from state_reduction.results import build_result, results_dir, write_result
from state_reduction.stats import mean_ci

ROOT = Path(__file__).resolve().parents[2]
MODEL = "deltanet"  # the tiny profile's stand-in for DeltaNet 370M in experiments/rank_analysis


def _head(u, spectrum, positions=2):
    if u is None:
        return {"er": None, "u": None, "u_std": None, "spectrum": None, "spectrum_raw": None, "n_states": 0,
                "n_degenerate": 3, "degenerate": True, "u_by_position": [None] * positions}
    return {"er": u * len(spectrum), "u": u, "u_std": 0.01, "spectrum": spectrum, "spectrum_raw": spectrum,
            "n_states": 3, "n_degenerate": 0, "degenerate": False, "u_by_position": [u / 2, u]}


def _states(d_k, us, spectrum):
    """us[layer][head] -> per-layer state statistics (None = degenerate head)."""
    return {str(layer): {"d_k": d_k, "d_v": 8, "divisor": d_k, "positions": [4, 8], "u_mean": None,
                         "degenerate_heads": [h for h, u in enumerate(row) if u is None],
                         "heads": [_head(u, spectrum) for u in row]} for layer, row in enumerate(us)}


def _conditioning(smin, smax, degenerate=0):
    return {"per_layer": {}, "median": {"sigma_min": smin, "sigma_max": smax, "kappa": smax / smin},
            "degenerate_heads": degenerate}


def _summary(values):
    vals = [v for v in values if v is not None]
    mean = sum(vals) / len(vals)
    return {"mean": mean, "std": 0.0, "min": min(vals), "max": max(vals), "n": len(vals)}


DENSE_U = [[0.05, None], [0.02, 0.08]]  # layer 0 head 1 is degenerate (all-zero activations)
DENSE_SPECTRUM = [1.0, 0.5, 0.25, 0.125, 0.0625, 0.03, 0.01, 0.001]


def _dense_extra():
    filters = [[[0.1, 0.2], [0.1, 0.21]], [[-0.3, 0.1], [0.2, 0.0]]]  # [H][K][W]
    conv = {"q": {"within_head": [0.99, 0.2], "across_heads": 0.1, "dead_filters": 0, "filters": filters},
            "k": {"within_head": [0.5, None], "across_heads": 0.0, "dead_filters": 2, "filters": filters}}
    return {"model_type": "delta_net", "key_heads": 2, "key_dim": 8, "layers": [0, 1],
            "dense": {"states": _states(8, DENSE_U, DENSE_SPECTRUM), "conditioning": _conditioning(0.1, 50.0, 1)},
            "utilization_summary": {"dense": _summary([u for row in DENSE_U for u in row])},
            "conv_similarity": {"0": conv, "1": conv}}


def _selection_extra(u_scale, smin, smax, gap_at=None, kept=2):
    spectrum = [1.0, 0.9] if gap_at is None else [1.0, 0.1]
    us = [[None if u is None else min(1.0, u * u_scale) for u in row] for row in DENSE_U]
    sel = {"path": "x/selection.json", "method": None, "kept": kept, "model_dir": "x",
           "conditioning": _conditioning(smin, smax), "states": _states(kept, us, spectrum),
           "pearson_u": 0.9, "utilization_summary": _summary([u for row in us for u in row])}
    return {**_dense_extra(), "selection": sel}


def _write(root, name, extra):
    record = build_result("analyze", profile="tiny", experiment="rank_analysis", config={"name": name}, metrics={},
                          wall_time_s=0.0, extra=extra)
    write_result(results_dir("tiny", "rank_analysis", root) / f"{name}.json", record)


@pytest.fixture()
def results(tmp_path):
    """Dense, DRRQR (pre and post RFT) and Grad analyses; every other run is missing."""
    root = tmp_path / "results"
    _write(root, analysis_name(MODEL), _dense_extra())
    _write(root, analysis_name(MODEL, "drrqr", 0.75), _selection_extra(3.0, 0.9, 50.0))
    _write(root, analysis_name(MODEL, "drrqr", 0.75, rft=True), _selection_extra(3.5, 0.8, 40.0, gap_at=1))
    _write(root, analysis_name(MODEL, "grad", 0.75), _selection_extra(2.0, 0.5, 49.0))
    # the dense+RFT control: full width (8 channels), u 1.2x the dense model's, no gap
    _write(root, analysis_name(MODEL, "dense", 0.0, rft=True), _selection_extra(1.2, 0.1, 50.0, kept=8))
    overlap = {**_selection_extra(3.0, 0.9, 50.0),
               "overlap": {"per_layer": {"0": [2, 1], "1": [2, 2]}, "median": 2.0, "kept": [2, 2]}}
    _write(root, analysis_name(MODEL, "drrqr", 0.75, compare="grad"), overlap)
    return root


def _experiment(tmp_path, seeds) -> str:
    """The experiment's config with the tiny replicate seeds `seeds` on every target."""
    spec = yaml.safe_load((ROOT / "experiments" / "rank_analysis" / "config.yaml").read_text())
    for table in spec["tables"].values():
        table["seeds"] = {"tiny": seeds, "paper": [0]}
    path = tmp_path / f"rank-{len(seeds)}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def _render(target, results, tmp_path, seeds=(0,)):
    """Rendered from `results` with replicate seeds `seeds` (default one: the single-seed output)."""
    return render(target, "tiny", _experiment(tmp_path, list(seeds)), results_root=results, out_root=tmp_path / "out",
                  figures_root=tmp_path / "fig", quiet=True)


def _texts(written):
    return {k: written[k].read_text() for k in ("tex", "md", "vs_paper")}


def test_table5_holes_degenerate_heads_and_the_papers_rows(results, tmp_path):
    w = _render("table5", results, tmp_path)
    texts = _texts(w)
    assert not any("nan" in t.lower() for t in texts.values())
    md = texts["md"]
    assert "| Baseline (d_k=8) | 0.050 |" in md and "| 1.00 | 3/4 |" in md  # rho of the baseline with itself
    assert "| DRRQR (d_k=2) | 0.150 |" in md and "| DRRQR (d_k=2) post-RFT | 0.175 |" in md
    assert "| Dense+RFT (d_k=8) | 0.060 |" in md and "Dense+RFT: the dense model fine-tuned" in md
    assert "| L1 (d_k=?) | -- | -- | -- | -- | -- | -- |" in md
    assert "L0 H1 | -- | -- |" in md and "degenerate heads (all-zero states; no rank): L0H1" in md
    assert set(w["missing"]) == {analysis_name(MODEL, "l1", 0.75), analysis_name(MODEL, "l1", 0.75, rft=True)}
    assert "0.150 / 0.170" in texts["vs_paper"] and "-- / 0.124" in texts["vs_paper"]
    assert "One seed (seed 0: calibration draw, analysis windows and RFT run) per cell: no CI." in md and " ± " not in md


def test_replicate_seeds_give_mean_and_ci_and_the_first_seed_alone_keeps_its_numbers(results, tmp_path):
    """Seeds 1 and 2 of DRRQR pre-RFT and of the dense model: each number is the mean over seeds ± the half-width of
    the 95% t-interval; Grad, with one seed, shows its value alone; seed 2's missing post-RFT run is a hole listed."""
    seed1, seed2 = (("seed", 1),), (("seed", 2),)
    for vary, (scale, smin) in ((seed1, (2.0, 0.7)), (seed2, (4.0, 1.1))):
        _write(results, analysis_name(MODEL, vary=vary), _dense_extra())
        _write(results, analysis_name(MODEL, "drrqr", 0.75, vary=vary), _selection_extra(scale, smin, 50.0))
    _write(results, analysis_name(MODEL, "drrqr", 0.75, rft=True, vary=seed1), _selection_extra(3.5, 0.8, 40.0))
    w = _render("table6", results, tmp_path, seeds=(0, 1, 2))
    md = w["md"].read_text()
    half = mean_ci([0.9, 0.7, 1.1]).half_width  # sigma_min of DRRQR over the three seeds
    assert f"| DRRQR | **0.9000 ± {half:.4f}** | 50.0000 ± 0.0000 |" in md and "| 0/0/0 |" in md
    assert "| Grad | 0.5000 | 49.0000 | 98.0 | 0 |" in md  # one seed: no ±
    assert "95% t-interval over 1-3 seeds per cell (seeds 0, 1, 2;" in md
    assert analysis_name(MODEL, "grad", 0.75, vary=seed2) in w["missing"]
    md5 = _render("table5", results, tmp_path, seeds=(0, 1, 2))["md"].read_text()
    u = mean_ci([0.15, 0.10, 0.20])  # DRRQR's mean u: the dense mean 0.05 x 3, 2, 4
    assert f"| DRRQR (d_k=2) | {u.mean:.3f} ± {u.half_width:.3f} |" in md5
    assert f"| DRRQR (d_k=2) post-RFT | {mean_ci([0.175, 0.175]).mean:.3f} ± 0.000 |" in md5
    assert analysis_name(MODEL, "drrqr", 0.75, rft=True, vary=seed2) in _render("table5", results, tmp_path,
                                                                               seeds=(0, 1, 2))["missing"]
    for target in ("figure2", "figure3", "figure5"):
        texts = _texts(_render(target, results, tmp_path, seeds=(0, 1, 2)))
        assert " ± " in texts["md"] and not any("nan" in t.lower() for t in texts.values())


def test_table6_marks_the_best_selection_and_scales_to_the_authors_rows(results, tmp_path):
    texts = _texts(_render("table6", results, tmp_path))
    md = texts["md"]
    assert "| DRRQR | **0.9000** | 50.0000 | **55.6** | 0 |" in md  # highest sigma_min, lowest kappa
    assert "| Grad | 0.5000 | 49.0000 | 98.0 | 0 |" in md
    assert "| Rand | -- | -- | -- | -- |" in md and "| Baseline (d_k=8) | 0.1000 | 50.0000 | 500.0 | 1 |" in md
    assert "| DRRQR | 90.00 | 0.96 | 5000.0 | 49.4 | 56 | 65 |" in texts["vs_paper"]
    assert "\\textbf{0.9000}" in texts["tex"]


def test_tableC2_overlap_and_random_expectation(results, tmp_path):
    w = _render("tableC2", results, tmp_path)
    md = _texts(w)["md"]
    assert "| DRRQR & Grad | 2.0 | 2 | 1.00 | 0.5 | 1 | 2 |" in md
    assert "| DRRQR & Rand | -- |" in md and analysis_name(MODEL, "drrqr", 0.75, compare="rand") in w["missing"]
    assert "| DRRQR & Grad | 2.0 of 2 | 1.00 | 26 of 32 | 0.81 | 0.5 | 8.0 |" in w["vs_paper"].read_text()


@pytest.mark.parametrize("target", ["figure2", "figure3", "figure5", "figure6", "figure7"])
def test_figures_render_with_holes_and_dead_heads(results, tmp_path, target):
    w = _render(target, results, tmp_path)
    assert all(p.is_file() and p.stat().st_size > 0 for p in w["figures"])
    assert not any("nan" in t.lower() for t in _texts(w).values())


def test_figure6_reports_the_gap_that_rft_opened(results, tmp_path):
    texts = _texts(_render("figure6", results, tmp_path))
    md = texts["md"]
    pre = next(line for line in md.splitlines() if line.startswith("| DRRQR pre-RFT"))
    post = next(line for line in md.splitlines() if line.startswith("| DRRQR post-RFT"))
    assert "| 1.11 | 1.11 |" in pre and "none" in pre  # 1.0 / 0.9
    assert "| 10.00 | 10.00 |" in post and "L0H0@1" in post and "L0H1" not in post  # the degenerate head has none
    assert "| L1 pre-RFT | -- |" in md
    dense = next(line for line in md.splitlines() if line.startswith("| Dense |"))
    control = next(line for line in md.splitlines() if line.startswith("| Dense+RFT |"))
    assert "| 2.00 | 2.00 |" in dense  # 1.0 / 0.5 among the first k = 2 of the dense spectrum
    assert "| 1.11 | 1.11 |" in control and "Dense+RFT (ours)" in texts["vs_paper"]


def test_figure7_compares_within_and_across_heads(results, tmp_path):
    md = _texts(_render("figure7", results, tmp_path))["md"]
    assert "| L0 q | 0.990, 0.200 | 0.100 | 0 | yes |" in md
    assert "| L0 k | 0.500, -- | 0.000 | 2 | no |" in md


def test_spectral_gap_and_tail_share_by_hand():
    assert spectral_gap([1.0, 0.5, 0.05, 0.04, 0.0]) == (pytest.approx(10.0), 2)
    assert spectral_gap(None) == (None, None) and spectral_gap([1.0, 0.0]) == (None, None)
    assert tail_share([2.0, 1.0, 1.0], 1) == pytest.approx(2 / 6)
    assert tail_share([0.0, 0.0], 1) is None


def test_an_unknown_target_is_named(tmp_path):
    with pytest.raises(ValueError, match="figure2.*got 'figure4'"):
        rank_tables.render("figure4", "tiny", results_root=tmp_path)
