"""figure_mqar's two replicate levels: calibration seeds within a model, pretraining seeds within a family."""

import math
from collections import defaultdict

import pytest

from paper_tables import figure_mqar as fm


def _nested(entries):
    out = defaultdict(lambda: defaultdict(list))
    for key, cell, values in entries:
        out[key][cell].extend(values)
    return out


@pytest.mark.parametrize("name, family", [("DeltaNet", "DeltaNet"), ("DeltaNet (pretraining seed 9)", "DeltaNet"),
                                          ("Qwen3.5 hybrid lr 1e-3 (pretraining seed 2)", "Qwen3.5 hybrid lr 1e-3"),
                                          ("Mamba-2 (seed 2)", "Mamba-2 (seed 2)")])
def test_family_name_strips_only_the_pretraining_seed_suffix(name, family):
    assert fm.family_name(name) == family


def test_pool_families_averages_calibration_seeds_then_pools_models():
    acc = _nested([(("DeltaNet", "drrqr", 0.75), "c", [0.2, 0.4, 0.6]),
                   (("DeltaNet (pretraining seed 1)", "drrqr", 0.75), "c", [0.9]),
                   (("DeltaNet (pretraining seed 2)", "drrqr", 0.75), "c", [0.0, 0.1]),
                   (("Mamba-2", "drrqr", 0.75), "c", [0.5])])
    se = _nested([(k, c, [0.01] * len(v)) for k, cells in acc.items() for c, v in cells.items()])
    pooled, pooled_se = fm.pool_families(acc, se, {"DeltaNet", "DeltaNet (pretraining seed 1)", "Mamba-2"})
    # seed 2 has no dense result, so it is left out of its family
    assert pooled[("DeltaNet", "drrqr", 0.75)]["c"] == pytest.approx([0.4, 0.9])
    # a model's one result keeps its standard error; a mean over calibration seeds has none
    assert pooled_se[("DeltaNet", "drrqr", 0.75)]["c"] == [None, 0.01]
    assert pooled[("Mamba-2", "drrqr", 0.75)]["c"] == [0.5]


def test_summary_states_its_interval():
    mean, half, what = fm.summary([0.4, 0.9], [None, 0.01], "pretraining seeds")
    # t(0.975, df=1) = 12.706; the sample sd of (0.4, 0.9) is sqrt(0.125)
    assert mean == pytest.approx(0.65) and half == pytest.approx(12.7062047 * math.sqrt(0.125) / math.sqrt(2))
    assert what == "95% t-CI over 2 pretraining seeds"
    assert fm.summary([0.5], [0.02]) == (0.5, 0.02, "1 SE over queries (one result)")
    mean, half, what = fm.summary([0.4], [None], "pretraining seeds")
    assert math.isnan(half) and what == "one pretraining seed: no interval"
    assert fm._cell((0.4, half, what)) == "40.0 ± n/a"
