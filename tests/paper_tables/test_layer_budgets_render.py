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
