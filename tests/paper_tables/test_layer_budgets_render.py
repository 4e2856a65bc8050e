"""The layer-adaptive budgets renderer (issue 17 part 4) on synthetic results: each layer's K', the channel totals,
and the paired difference to the uniform budget of the same seeds."""

from __future__ import annotations

from paper_tables import render
from state_reduction.results import build_result, write_result
from state_reduction.stats import diff_ci

EXP = "layer_adaptive_budgets"


def _write(root, name, kind, config, metrics, extra=None):
    write_result(root / "tiny" / EXP / f"{name}.json",
                 build_result(kind, profile="tiny", experiment=EXP, config=config, metrics=metrics, model=None,
                              data={}, seeds={}, wall_time_s=0.0, extra=extra or {}))


def test_rows_show_per_layer_key_dims_totals_and_the_paired_difference(tmp_path):
    ppl = {None: [100.0, 104.0, 101.0], "global-aire": [95.0, 99.0, 97.0]}
    for budget, values in ppl.items():
        for seed, v in enumerate(values):
            vary = {"seed": seed, **({"budget": budget} if budget else {})}
            base = {"model": "deltanet", "method": "energy", "ratio": 0.5, "vary": vary}
            metrics = {"key_dim_before": 64, "key_dim_after": 32.0, "state_bytes_before": 800, "state_bytes_after": 400}
            extra = {}
            if budget:
                metrics.update(kept_channels=256, requested_channels=256)
                extra = {"budget": {"layer_key_dims": {"0": 50, "1": 42, "2": 28, "3": 8}}}
            _write(tmp_path, f"{budget}-{seed}-p", "prune", base, metrics, extra)
            _write(tmp_path, f"{budget}-{seed}-e", "evaluate", {**base, "rft": False}, {"ptb_word_perplexity": v})
    (md, png, pdf) = render("layer_budgets_energy", "tiny", results_root=tmp_path, out_root=tmp_path / "out",
                            figures_root=tmp_path / "fig")
    text = md.read_text()
    paired = diff_ci(ppl["global-aire"], ppl[None], paired=True).format(4)
    assert "| deltanet | energy | 0.5 | global-aire | 256/256 | 50.0% | 50, 42, 28, 8 |" in text
    assert paired in text and "| deltanet | energy | 0.5 | uniform | = | 50.0% | 32.0 in every layer |" in text
    assert png.stat().st_size > 0 and pdf.suffix == ".pdf"


def test_the_dense_rft_control_is_one_row_per_model_with_its_post_rft_interval(tmp_path):
    """layer_budgets_rft has the dense+RFT control: one row per model (no budget, no K'), its post-RFT mean and
    interval over the seeds; no K' panel for it in the figure."""
    values = [90.0, 90.5, 89.5]
    for seed, v in enumerate(values):
        config = {"model": "deltanet", "method": "dense", "ratio": 0.0, "vary": {"seed": seed}, "rft": True}
        _write(tmp_path, f"dense-{seed}-post", "evaluate", config, {"ptb_word_perplexity": v})
    (md, *figures) = render("layer_budgets_rft", "tiny", results_root=tmp_path, out_root=tmp_path / "out",
                            figures_root=tmp_path / "fig")
    from state_reduction.stats import mean_ci

    rows = [line for line in md.read_text().splitlines() if "dense+RFT |" in line]
    assert len(rows) == 4  # the four families, three without results
    assert rows[0] == f"| deltanet | dense+RFT | 0 | -- | all | 100% | -- |  |  | {mean_ci(values).format(4)} |  |"
    assert all(r.endswith("| -- |  |") for r in rows[1:])
    assert "the control post-RFT cells are read against" in md.read_text()
