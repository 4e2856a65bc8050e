import pytest
import torch

from state_reduction.pruning.budgets import check_scored_selector, layer_budget, layer_normalise


def _scores(seed=0, layers=4, H=2, K=16):
    g = torch.Generator().manual_seed(seed)
    # layers of very different scale: normalisation makes them comparable
    return {l: torch.rand(H, K, generator=g, dtype=torch.float64) * 10.0 ** l for l in range(layers)}


def test_layer_normalise_hand_computed_top_is_one():
    got = layer_normalise(torch.tensor([[3.0, 1.0], [6.0, 2.0]]))
    torch.testing.assert_close(got, torch.tensor([[3 / 9, 1 / 12], [1.0, 2 / 11]], dtype=torch.float64))


@pytest.mark.parametrize("budget", ["uniform", "global-aire", "global-last"])
@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.75])
@pytest.mark.parametrize("multiple", [1, 4])
def test_total_kept_equals_the_uniform_budget_within_rounding(budget, ratio, multiple):
    b = layer_budget(_scores(), 16, ratio, budget, multiple=multiple)
    assert b.requested_total == 4 * 2 * int(16 * (1 - ratio))
    assert abs(b.total_error) < 2 * multiple
    assert all(k % multiple == 0 and 1 <= k <= 16 for k in b.key_dims.values())


def test_global_budget_is_scale_free_per_layer_and_uniform_is_not_affected():
    s = _scores()
    scaled = {l: v * 1e6 if l == 0 else v for l, v in s.items()}
    assert layer_budget(s, 16, 0.5, "global-aire").key_dims == layer_budget(scaled, 16, 0.5, "global-aire").key_dims


def test_global_budget_moves_channels_to_the_layer_with_flat_scores():
    H, K = 1, 8
    flat = torch.ones(H, K)                                           # every channel matters equally
    peaked = torch.tensor([[100.0, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3]])   # one channel carries the layer
    b = layer_budget({0: flat, 1: peaked}, K, 0.5, "global-aire", floor=1)
    assert b.key_dims[0] > b.key_dims[1] and b.kept_total == 8


def test_bad_input_is_one_line_naming_the_option():
    with pytest.raises(ValueError, match="--budget-floor 9: .* the largest floor is 8"):
        layer_budget(_scores(), 16, 0.5, "global-aire", floor=9)
    spike = torch.full((4, 8), 1e-9)
    spike[0, 0] = 1.0  # one channel carries the layer: its other normalised scores are ~0
    with pytest.raises(ValueError, match=r"--budget global-last with --budget-floor 0 leaves layer\(s\) 1 with K'=0 "
                                         r"\(every key channel removed\); pass --allow-layer-removal"):
        layer_budget({0: torch.ones(4, 8), 1: spike}, 8, 0.5, "global-last", floor=0)
    with pytest.raises(ValueError, match="--budget 'global' unknown; accepted: uniform, global-aire, global-last"):
        layer_budget(_scores(), 16, 0.5, "global")
    with pytest.raises(ValueError, match="--budget global-aire needs per-channel scores; --method pca has none"):
        check_scored_selector("pca", "global-aire")
    check_scored_selector("pca", "uniform")
    check_scored_selector("drrqr", "global-last")
