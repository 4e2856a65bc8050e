"""The analysis numbers against hand computations on tiny synthetic states, decay included, and against the
layers' own recurrent state."""

from __future__ import annotations

import math

import pytest
import torch

import state_reduction  # noqa: F401  (registers the families)
from state_reduction.analysis.conv import filter_similarity
from state_reduction.analysis.rank import (
    condition_number,
    effective_rank,
    effective_rank_from_singular_values,
    rank_utilization,
    utilization_divisor,
)
from state_reduction.analysis.selection import (
    channel_overlap,
    median,
    pearson,
    subspace_conditioning,
)
from state_reduction.analysis.states import (
    KernelInputs,
    capture_kernel_inputs,
    states_at,
)
from state_reduction.models import build_model
from state_reduction.models.families import get_adapter

D = torch.float64


def test_effective_rank_and_utilisation_by_hand():
    s = torch.diag(torch.tensor([3.0, 1.0, 0.0], dtype=D))
    assert float(effective_rank(s)) == pytest.approx(10 / 9)
    assert float(rank_utilization(s)) == pytest.approx(10 / 27)
    assert float(effective_rank(torch.eye(4, dtype=D))) == pytest.approx(4.0)
    assert utilization_divisor(64, 128, "dk") == 64 and utilization_divisor(64, 32, "min") == 32
    assert utilization_divisor(64, 32, "dv") == 32
    with pytest.raises(ValueError, match="divisor"):
        utilization_divisor(4, 4, "trace")


def test_zero_state_is_degenerate_not_nan():
    er, degenerate = effective_rank_from_singular_values(torch.zeros(2, 3, dtype=D))
    assert degenerate.all() and torch.isfinite(er).all()
    assert condition_number(torch.tensor([2.0, 0.0], dtype=D)) is None
    assert condition_number(torch.tensor([2.0, 0.5], dtype=D)) == pytest.approx(4.0)


def _inputs(keys, values, beta, g=None) -> KernelInputs:
    """keys [T, K], values [T, V] of one head and sequence -> KernelInputs with B = H = 1."""
    t = len(keys)
    k = torch.tensor(keys, dtype=D).reshape(1, t, 1, -1)
    v = torch.tensor(values, dtype=D).reshape(1, t, 1, -1)
    b = torch.full((1, t, 1), beta, dtype=D)
    gg = None if g is None else torch.full((1, t, 1), g, dtype=D)
    return KernelInputs(k.clone(), k, v, b, gg)


def test_delta_rule_states_by_hand():
    """beta = 1, orthonormal keys: S_t = sum_s v_s k_s^T exactly; the second write to e1 replaces the first."""
    inp = _inputs([[1, 0], [0, 1], [1, 0]], [[3, 0], [0, 1], [0, 2]], beta=1.0)
    st = states_at(inp, stride=1)[0, :, 0]  # [T, K, V] (state h = S^T)
    torch.testing.assert_close(st[0], torch.tensor([[3, 0], [0, 0]], dtype=D))
    torch.testing.assert_close(st[1], torch.tensor([[3, 0], [0, 1]], dtype=D))
    torch.testing.assert_close(st[2], torch.tensor([[0, 2], [0, 1]], dtype=D))
    assert float(effective_rank(st[1])) == pytest.approx(10 / 9)
    assert float(effective_rank(st[2])) == pytest.approx(1.0)  # rows (0, 2) and (0, 1): rank one
    # the stride only picks which states are returned; the last token is always included
    torch.testing.assert_close(states_at(inp, stride=2)[0, :, 0], st[[1, 2]])


def test_gdn_decay_changes_utilisation():
    """Gate 0 (log-decay 0) keeps every write; a strong decay forgets all but the last: er 2 -> ~1."""
    keys, values = [[1, 0], [0, 1]], [[1, 0], [0, 1]]
    no_decay = states_at(_inputs(keys, values, beta=1.0, g=0.0), stride=2)[0, -1, 0]
    strong = states_at(_inputs(keys, values, beta=1.0, g=-8.0), stride=2)[0, -1, 0]
    torch.testing.assert_close(no_decay, torch.eye(2, dtype=D))
    torch.testing.assert_close(strong, torch.diag(torch.tensor([math.exp(-8.0), 1.0], dtype=D)))
    assert float(effective_rank(no_decay)) == pytest.approx(2.0)
    assert float(effective_rank(strong)) == pytest.approx(1 + math.exp(-16.0))
    # the authors' recurrence without the decay sees the gate-0 state
    torch.testing.assert_close(states_at(_inputs(keys, values, 1.0, g=-8.0), 2, ignore_decay=True)[0, -1, 0], no_decay)


def test_mamba2_decay_only_states_by_hand():
    """h_t = exp(dt A) h_{t-1} + dt x_t B_t^T; here key = B, value = x, beta = dt, g = dt * A."""
    dt, a = 0.5, -2.0
    inp = _inputs([[1, 0], [0, 1], [1, 1]], [[1], [2], [3]], beta=dt, g=dt * a)
    inp.decay_only = True
    h = torch.zeros(2, 1, dtype=D)
    expected = []
    for key, val in zip(([1, 0], [0, 1], [1, 1]), (1, 2, 3)):
        h = math.exp(dt * a) * h + dt * val * torch.tensor(key, dtype=D)[:, None]
        expected.append(h)
    torch.testing.assert_close(states_at(inp, stride=2)[0, :, 0], torch.stack(expected)[[1, 2]])


CONFIGS = {
    "deltanet": {"hidden_size": 64, "num_hidden_layers": 2, "num_heads": 4, "expand_k": 1.0, "expand_v": 1.0,
                 "conv_size": 4, "vocab_size": 97, "fuse_cross_entropy": False},
    "gated_deltanet": {"hidden_size": 64, "num_hidden_layers": 2, "num_heads": 4, "head_dim": 16, "expand_v": 2,
                       "conv_size": 4, "vocab_size": 97, "fuse_cross_entropy": False},
    "mamba2": {"hidden_size": 64, "num_hidden_layers": 2, "state_size": 16, "n_groups": 2, "expand": 2, "head_dim": 16,
               "num_heads": 8, "conv_kernel": 4, "chunk_size": 8, "vocab_size": 97},
    "qwen3_5": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
                "layer_types": ["linear_attention", "full_attention", "linear_attention"], "num_attention_heads": 2,
                "num_key_value_heads": 1, "head_dim": 16, "linear_num_key_heads": 2, "linear_key_head_dim": 16,
                "linear_num_value_heads": 4, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
                "vocab_size": 97},
}
# transformers' Mamba-2 scan and Qwen3.5's torch kernels compute in float32 even for float64 models
VALUE_FIRST = {"gated_deltanet", "mamba2"}  # cached as [B, HV, V, K]; the others [B, HV, K, V]
ATOL = {"deltanet": 1e-10, "gated_deltanet": 1e-10, "mamba2": 1e-7, "qwen3_5": 1e-8}


@pytest.mark.parametrize("family", list(CONFIGS))
def test_reconstructed_states_equal_the_layers_final_state(family):
    """The captured inputs rebuilt by the reference recurrence give the recurrent state the real layers return
    (GDN/Qwen3.5 gate and beta, Mamba-2 dt/A decay included)."""
    model = build_model(family, CONFIGS[family], seed=0, dtype=D).eval()
    ids = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(0))
    captured = capture_kernel_inputs(model, get_adapter(model), ids)
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
    cache = out.past_key_values if getattr(out, "past_key_values", None) is not None else out.cache_params
    for layer, inputs in captured.items():
        if family != "deltanet":
            assert inputs.g is not None and (inputs.g < 0).all()
        final = states_at(inputs, stride=16)[:, -1]  # [B, HV, K, V]
        fla_cache = family in ("deltanet", "gated_deltanet")
        reference = (cache[layer]["recurrent_state"] if fla_cache else cache.get_recurrent_state(layer)).double()
        if family in VALUE_FIRST:
            reference = reference.transpose(-1, -2)
        torch.testing.assert_close(final, reference, atol=ATOL[family], rtol=0)


def test_subspace_conditioning_matches_the_svd_of_the_kept_columns():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 30, 6, generator=g, dtype=D), torch.randn(2, 30, 6, generator=g, dtype=D)
    gram = q.transpose(1, 2) @ q + k.transpose(1, 2) @ k
    keep = torch.tensor([[0, 2, 5], [1, 3, 4]])
    got = subspace_conditioning(gram, 60, keep)
    for h in range(2):
        sv = torch.linalg.svdvals(torch.cat([q[h], k[h]])[:, keep[h]]) / math.sqrt(60)
        assert got[h]["sigma_max"] == pytest.approx(float(sv[0]))
        assert got[h]["sigma_min"] == pytest.approx(float(sv[-1]))
        assert got[h]["kappa"] == pytest.approx(float(sv[0] / sv[-1]))
    dead = subspace_conditioning(torch.zeros(1, 3, 3, dtype=D), 10)
    assert dead[0]["degenerate"] and dead[0]["kappa"] is None


def test_overlap_pearson_median_by_hand():
    a = {0: torch.tensor([[0, 1, 2], [3, 4, 5]]), 1: torch.tensor([[0, 1, 2], [0, 1, 2]])}
    b = {0: torch.tensor([[0, 1, 5], [0, 1, 2]]), 1: torch.tensor([[0, 1, 2], [2, 3, 4]])}
    assert channel_overlap(a, b) == {0: [2, 0], 1: [3, 1]}
    assert median([2.0, 0.0, 3.0, 1.0]) == 1.5 and median([None]) is None
    x, y = [1.0, 2.0, 3.0, None], [2.0, 4.1, 5.9, 1.0]
    expected = float(torch.corrcoef(torch.tensor([x[:3], y[:3]]))[0, 1])
    assert pearson(x, y) == pytest.approx(expected)
    assert pearson([1.0, 1.0], [2.0, 3.0]) is None  # zero variance: no correlation, not NaN
    with pytest.raises(ValueError, match="different layers"):
        channel_overlap(a, {0: a[0]})


def test_conv_filter_similarity_by_hand():
    filters = torch.tensor([[[1.0, 0.0], [2.0, 0.0]], [[0.0, 1.0], [0.0, 0.0]]], dtype=D)  # [H=2, K=2, W=2]
    sim = filter_similarity(filters)
    assert sim["within_head"][0] == pytest.approx(1.0)
    assert sim["within_head"][1] is None  # its only partner filter is zero
    assert sim["across_heads"] == pytest.approx(0.0)
    assert sim["dead_filters"] == 1
