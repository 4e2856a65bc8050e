import math

import pytest
import torch

from state_reduction.ssm.s5 import DiagonalSSM
from state_reduction.ssm.scores import (aire_energy, global_keep, hinf_score, layer_normalise, select_modes,
                                         uniform_keep)


def _layer(seed: int = 0, h: int = 5, p: int = 6) -> DiagonalSSM:
    torch.manual_seed(seed)
    layer = DiagonalSSM(h, p, dt_min=0.01, dt_max=0.5).double()
    with torch.no_grad():
        layer.log_neg_real.uniform_(math.log(0.2), math.log(2.0))
    return layer


@torch.no_grad()
def test_aire_energy_equals_truncated_impulse_response_energy_of_each_mode():
    """E_i against the energy of the layer's own recurrence driven by a unit impulse on every input channel,
    with only mode i kept, summed over 4000 steps (|lambda|^8000 < 1e-8 here)."""
    layer = _layer()
    lam_bar, b_bar, c = layer.discrete()
    horizon = 4000
    assert float(lam_bar.abs().max()) ** (2 * horizon) < 1e-8
    h = c.shape[0]
    impulses = torch.zeros(h, horizon, h, dtype=torch.float64)
    impulses[torch.arange(h), 0, torch.arange(h)] = 1.0                       # batch j: e_j at t = 0
    energies = []
    for i in range(lam_bar.numel()):
        keep = torch.zeros_like(layer.keep)
        keep[i] = True
        layer.keep.copy_(keep)
        _, _, c_i = layer.discrete()
        y = torch.einsum("btp,hp->bth", layer.states(impulses), c_i)           # complex C x_t, [H_in, T, H_out]
        energies.append(float(y.abs().pow(2).sum()))
    layer.keep.fill_(True)
    torch.testing.assert_close(aire_energy(lam_bar, b_bar, c), torch.tensor(energies, dtype=torch.float64),
                               rtol=1e-6, atol=0)


@torch.no_grad()
def test_hinf_score_is_the_peak_gain_of_each_mode():
    """LAST's score: the squared peak over frequency of ||C_i|| ||B_i|| / |e^{jw} - lambda_i|."""
    lam_bar, b_bar, c = _layer(1).discrete()
    w = torch.linspace(-math.pi, math.pi, 200001, dtype=torch.float64)
    gain = c.abs().pow(2).sum(0)[:, None] * b_bar.abs().pow(2).sum(1)[:, None] \
        / (torch.exp(1j * w)[None] - lam_bar[:, None]).abs().pow(2)
    torch.testing.assert_close(hinf_score(lam_bar, b_bar, c), gain.max(1).values, rtol=1e-3, atol=0)


def test_layer_normalise_hand_computed():
    # ascending 1, 2, 3, 6; tails 12, 11, 9, 6
    got = layer_normalise(torch.tensor([3.0, 1.0, 6.0, 2.0], dtype=torch.float64))
    torch.testing.assert_close(got, torch.tensor([3 / 9, 1 / 12, 1.0, 2 / 11], dtype=torch.float64))


def test_global_keep_hand_computed_and_top_mode_of_each_layer_survives():
    a = layer_normalise(torch.tensor([3.0, 1.0, 6.0, 2.0]))   # 1/3, 1/12, 1, 2/11
    b = layer_normalise(torch.tensor([10.0, 10.0]))           # 1/2, 1
    keep = global_keep([a, b], 0.5)                            # keep floor(6 * 0.5) = 3: two 1s and 1/2
    assert keep[0].tolist() == [False, False, True, False] and keep[1].tolist() == [True, True]
    keep = global_keep([a, b], 0.6)                            # floor(2.4) = 2: each layer's top mode
    assert [k.sum().item() for k in keep] == [1, 1]


def test_uniform_keep_counts_and_budget_totals():
    scores = [torch.rand(32) for _ in range(4)]
    for ratio in [i / 20 for i in range(20)]:
        assert [int(k.sum()) for k in uniform_keep(scores, ratio)] == [math.floor(32 * (1 - ratio) + 1e-9)] * 4
        assert sum(int(k.sum()) for k in global_keep(scores, ratio)) == math.floor(128 * (1 - ratio) + 1e-9)


@torch.no_grad()
def test_select_modes_unknown_method_and_bad_ratio():
    systems = [_layer(2).discrete()]
    with pytest.raises(ValueError, match="did you mean 'aire'"):
        select_modes("air", systems, 0.5)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        select_modes("aire", systems, 1.0)
    assert [k.all() for k in select_modes("last", systems, 0.0)] == [True]


def test_max_ratio_within_stops_at_the_first_grid_point_over_tolerance():
    from state_reduction.ssm.experiment import max_ratio_within
    ratios = [0.0, 0.05, 0.1, 0.15, 0.2]
    assert max_ratio_within(ratios, [0.0, 0.004, 0.01, 0.02, 0.0], 0.01) == 0.1   # 0.2 is back within, not counted
    assert max_ratio_within(ratios, [0.0, 0.05, 0.0, 0.0, 0.0], 0.01) == 0.0
    assert max_ratio_within(list(reversed(ratios)), [0.0] * 5, 0.01) == 0.2
