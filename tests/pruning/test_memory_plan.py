"""The memory plan: exact parameter counts (meta-device models vs loaded checkpoints and an independent count of
Mamba-Codestral-7B), defaults equal to the paper profiles, and the heap-peak measurement: it sees a known
allocation, and layer streaming lowers Grad's activation peak."""

from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

import state_reduction  # noqa: F401
from state_reduction.cli import build_parser, main
from state_reduction.models import build_model
from state_reduction.pruning.adapters import get_adapter
from state_reduction.pruning.calibration import calibrate
from state_reduction.pruning.memory import ARCHITECTURES, HeapPeak, build_config, plan
from state_reduction.pruning.streaming import calibrate_streaming

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINTS = ROOT / "experiments" / "tiny_models" / "checkpoints"


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("family", ["deltanet", "gated_deltanet", "mamba2", "qwen3_5"])
def test_plan_counts_the_checkpoints_parameters_exactly(family):
    path = CHECKPOINTS / family
    model = AutoModelForCausalLM.from_pretrained(str(path))
    p = plan(build_config(str(path)), n_calib=4, seq_len=16, batch_size=2, weight_bytes=4)
    assert p["parameters"] == sum(t.numel() for t in model.parameters())
    assert p["terms"]["weights"] == 4 * p["parameters"]
    assert p["terms"]["largest_block"] == 4 * max(sum(t.numel() for t in b.parameters()) for b in model.base_model.layers)
    assert p["reducible_layers"] == len(list(get_adapter(model).mixers(model)))
    assert p["terms"]["hidden_store"] == 4 * 16 * model.config.hidden_size * 4  # float32 hidden states


def test_codestral_plan_matches_an_independent_count():
    c = ARCHITECTURES["codestral-7b"].config
    d, inner, gn, heads = c["hidden_size"], c["expand"] * c["hidden_size"], c["n_groups"] * c["state_size"], c["num_heads"]
    conv = inner + 2 * gn
    per_layer = (d * (2 * inner + 2 * gn + heads) + conv * (c["conv_kernel"] + 1) + 3 * heads + inner
                 + inner * d + d)  # in_proj, conv + bias, dt_bias/A_log/D, gated norm, out_proj, block norm
    total = c["num_hidden_layers"] * per_layer + 2 * c["vocab_size"] * d + d
    p = plan(build_config("codestral-7b"))
    assert p["parameters"] == total == 7_285_403_648
    assert (p["key_heads"], p["key_dim"], p["reducible_layers"]) == (8, 128, 64)
    assert p["terms"]["hidden_store"] == 128 * 2048 * 4096 * 4  # residual_in_fp32
    assert p["device"]["streamed_grad"] < p["device"]["all_at_once_forward"] < p["device"]["all_at_once_grad"]
    q = plan(build_config("qwen3_5-9b"))
    assert (q["blocks"], q["reducible_layers"], q["key_heads"], q["key_dim"]) == (32, 24, 16, 128)


def test_cli_defaults_are_the_paper_profiles_calibration(capsys):
    args = build_parser().parse_args(["memory-plan", "codestral-7b"])
    for experiment in ("mamba2", "qwen3_5"):
        prune = yaml.safe_load((ROOT / "experiments" / experiment / "config.yaml").read_text())["profiles"]["paper"]["prune"]
        assert (args.n_calib, args.seq_len, args.batch_size) == (prune["n_calib"], prune["seq_len"], prune["batch_size"])
        assert prune["stream_layers"] is True
    assert main(["memory-plan", "qwen3_5-9b"]) == 0
    out = capsys.readouterr().out
    assert "8.95B parameters" in out and "streamed_grad" in out and "architecture source" in out
    assert main(["memory-plan", "qwen3_5-7b"]) == 2
    assert "neither a known architecture (codestral-7b, qwen3_5-9b)" in capsys.readouterr().err


def test_heap_peak_sees_a_known_allocation():
    with HeapPeak() as peak:
        x = torch.ones(4 * 2**20)  # 16 MiB
        del x
    assert 16 * 2**20 <= peak.peak < 20 * 2**20


def test_streaming_lowers_the_grad_activation_peak():
    config = {"hidden_size": 64, "num_hidden_layers": 6, "num_heads": 2, "expand_k": 1.0, "expand_v": 1.0,
              "conv_size": 4, "vocab_size": 32, "fuse_cross_entropy": False}
    model = build_model("deltanet", config, seed=0)
    adapter = get_adapter(model)
    windows = torch.randint(0, 32, (4, 128), generator=torch.Generator().manual_seed(0))
    peaks = {}
    for name, fn in (("full", calibrate), ("streamed", calibrate_streaming)):
        fn(model, adapter, windows[:2], batch_size=2, gradients=True)
        with HeapPeak() as peak:
            fn(model, adapter, windows, batch_size=2, gradients=True)
        peaks[name] = peak.peak
    assert peaks["streamed"] < 0.6 * peaks["full"], peaks  # one block's graph instead of six
