"""State-memory accounting: exact bytes against a hand computation per family, and the largest batch."""

import pytest
import torch

from state_reduction.models import build_config
from state_reduction.pruning.selectors import keep_count
from state_reduction.speed import (
    largest_batch,
    parse_bytes,
    reduced_config,
    state_bytes,
    state_memory_rows,
)


def gdn_1p3b():
    return build_config("gated_deltanet", hidden_size=2048, num_heads=16, head_dim=128, expand_v=1.0, num_hidden_layers=24)


def test_gated_deltanet_bytes_by_hand():
    c = gdn_1p3b()
    assert state_bytes(c) == 24 * 16 * 128 * 128 * 2
    assert state_bytes(c, ratio=0.5) == 24 * 16 * 64 * 128 * 2
    assert state_bytes(c, ratio=0.75, dtype=torch.float32) == 24 * 16 * 32 * 128 * 4
    assert state_bytes(c, keep=77) == 24 * 16 * 77 * 128 * 2  # d_v stays 128 (expand_v is rewritten)


def test_gated_deltanet_grouped_value_heads_by_hand():
    c = build_config("gated_deltanet", hidden_size=256, num_heads=2, num_v_heads=4, head_dim=32, expand_v=2.0,
                     num_hidden_layers=3)
    assert state_bytes(c) == 3 * 4 * 32 * 64 * 2
    assert state_bytes(c, ratio=0.5) == 3 * 4 * 16 * 64 * 2


def test_deltanet_bytes_by_hand():
    c = build_config("deltanet", hidden_size=2048, num_heads=16, expand_k=1.0, expand_v=1.0, num_hidden_layers=24)
    assert state_bytes(c) == 24 * 16 * 128 * 128 * 2
    assert state_bytes(c, ratio=0.75) == 24 * 16 * 32 * 128 * 2


def test_deltanet_hybrid_counts_only_linear_layers():
    c = build_config("deltanet", hidden_size=256, num_heads=4, num_hidden_layers=6,
                     attn={"layers": [1, 4], "num_heads": 4})
    assert state_bytes(c) == 4 * 4 * 64 * 64 * 2


def test_mamba2_bytes_by_hand():
    c = build_config("mamba2", hidden_size=256, num_heads=8, head_dim=64, state_size=128, n_groups=1,
                     expand=2, num_hidden_layers=5)
    assert state_bytes(c) == 5 * 8 * 64 * 128 * 2
    assert state_bytes(c, ratio=0.5) == 5 * 8 * 64 * 64 * 2


def test_qwen3_5_counts_linear_layers_only():
    c = build_config("qwen3_5", hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=64, intermediate_size=512, vocab_size=1000,
                     layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
                     linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=48)
    assert state_bytes(c) == 2 * 4 * 32 * 48 * 2
    assert state_bytes(c, ratio=0.75) == 2 * 4 * 8 * 48 * 2


def test_reduced_config_is_a_copy_and_rejects_bad_keep():
    c = gdn_1p3b()
    r = reduced_config(c, 64)
    assert (c.head_dim, r.head_dim) == (128, 64)
    with pytest.raises(ValueError, match="keep must be"):
        reduced_config(c, 129)


def test_power_of_two_and_multiple_budgets():
    assert keep_count(128, 0.4) == 76
    assert keep_count(128, 0.4, power_of_two=True) == 64
    assert keep_count(128, 0.4, multiple=16) == 64
    assert keep_count(128, 0.25, multiple=16) == 96
    assert keep_count(96, 0.0, power_of_two=True) == 64
    assert state_bytes(gdn_1p3b(), ratio=0.4, power_of_two=True) == state_bytes(gdn_1p3b(), ratio=0.5)


def test_largest_batch():
    assert largest_batch(80 * 2**30, 12_582_912) == 80 * 2**30 // 12_582_912 == 6826
    assert largest_batch(100, 10, fixed_bytes=35) == 6
    assert largest_batch(30, 10, fixed_bytes=35) == 0
    with pytest.raises(ValueError):
        largest_batch(100, 0)


def test_state_memory_rows_baseline_vs_reduced():
    rows = state_memory_rows(gdn_1p3b(), ratios=(0.0, 0.5, 0.75), budget_bytes=parse_bytes("80GiB"))
    assert [r["kept"] for r in rows] == [128, 64, 32]
    assert [r["largest_batch"] for r in rows] == [6826, 13653, 27306]
    assert all(r["largest_batch_baseline"] == 6826 for r in rows)
    assert [r["relative_to_baseline"] for r in rows] == [1.0, 0.5, 0.25]


@pytest.mark.parametrize("text,value", [("80GiB", 80 * 2**30), ("80 GB", 80 * 10**9), ("1.5MiB", 3 * 2**19), ("4096", 4096)])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["80 furlongs", "GiB", "-1GiB", "0"])
def test_parse_bytes_rejects(text):
    with pytest.raises(ValueError, match="memory size"):
        parse_bytes(text)


def test_prune_power_of_two_keeps_a_power_of_two(tmp_path):
    from state_reduction.cli import build_parser
    from state_reduction.provenance import REPO_ROOT
    from state_reduction.pruning.prune import PruneConfig, prune

    args = build_parser().parse_args(["prune", "m", "--method", "l1", "--ratio", "0.4", "--out", "x", "--power-of-two"])
    assert args.power_of_two is True
    torch.set_num_threads(1)
    model = str(REPO_ROOT / "experiments" / "tiny_models" / "checkpoints" / "gated_deltanet")
    record = prune(PruneConfig(model=model, method="l1", ratio=0.4, out=str(tmp_path / "p"), power_of_two=True))
    assert (record["key_dim_before"], record["key_dim_after"]) == (64, 32)  # floor(0.6 * 64) = 38 -> 32
    assert record["state_bytes_per_sequence"]["after"] * 2 == record["state_bytes_per_sequence"]["before"]
