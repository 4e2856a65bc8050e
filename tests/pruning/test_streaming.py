"""Layer-streamed calibration equals the all-at-once path on the committed tiny checkpoints of all four families:
the same statistics (bit for bit on CPU: every block sees the same inputs in the same batch order) and so the same
selection for every selector and coupled mode; the model comes back unchanged."""

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

import state_reduction  # noqa: F401
from state_reduction.models.families import get_adapter
from state_reduction.pruning.calibration import STATISTICS, calibrate
from state_reduction.pruning.selectors import MODES, SELECTORS, select
from state_reduction.pruning.streaming import calibrate_streaming, decoder_blocks

CHECKPOINTS = Path(__file__).resolve().parents[2] / "experiments" / "tiny_models" / "checkpoints"
FAMILIES = ["deltanet", "gated_deltanet", "mamba2", "qwen3_5"]
FIELDS = ("gram_q", "gram_k", "sum_q", "sum_k", "sum_qq", "sum_kk", "input_sq", "saliency_q", "saliency_k",
          "window_norm_qk", "window_norm_q", "window_norm_k", "gramian_ctrl", "gramian_obs", "taylor_q", "taylor_k",
          "fisher_qq", "fisher_kk", "fisher_qk")
GRADIENT_FIELDS = ("saliency", "taylor", "fisher")


pytestmark = pytest.mark.usefixtures("one_thread")


def _load(family):
    return AutoModelForCausalLM.from_pretrained(str(CHECKPOINTS / family))


def _windows(model, n=5, length=32):
    return torch.randint(0, model.config.vocab_size, (n, length), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("family", FAMILIES)
def test_streamed_statistics_and_selections_equal_all_at_once(family):
    model = _load(family)
    adapter = get_adapter(model)
    windows = _windows(model)  # 5 windows in batches of 2: a short last batch
    before = {k: v.clone() for k, v in model.state_dict().items()}
    served = [name for name, s in SELECTORS.items() if s.missing(adapter) is None]  # ghost needs a decay
    needs = set(STATISTICS) if "ghost" in served else set(STATISTICS) - {"state_gramians"}
    forward = needs - {"gradients", "taylor"}
    full = calibrate(model, adapter, windows, batch_size=2, needs=needs)
    streamed = calibrate_streaming(model, adapter, windows, batch_size=2, needs=needs)
    # without gradients fla's GatedDeltaNet runs another kernel: compare like with like
    full_forward = calibrate(model, adapter, windows, batch_size=2, needs=forward)
    streamed_forward = calibrate_streaming(model, adapter, windows, batch_size=2, needs=forward)
    assert sorted(full) == sorted(streamed) == sorted(streamed_forward)
    for layer, s in full.items():
        assert streamed[layer].n_tokens == streamed_forward[layer].n_tokens == windows.numel()
        for name in FIELDS:
            if name.startswith("gramian") and "state_gramians" not in needs:
                assert getattr(s, name) is None and getattr(streamed[layer], name) is None
                continue
            assert torch.equal(getattr(streamed[layer], name), getattr(s, name)), (layer, name)
            if not name.startswith(GRADIENT_FIELDS):
                assert torch.equal(getattr(streamed_forward[layer], name), getattr(full_forward[layer], name)), name
        for name in ("decay_sq", "gain_sq"):  # head dynamics (energy): None where the family has none
            for a, b in ((full, streamed), (full_forward, streamed_forward)):
                a, b = getattr(a[layer], name), getattr(b[layer], name)
                assert (a is None and b is None) or torch.equal(a, b), (layer, name)
        assert streamed[layer].horizon == s.horizon == windows.shape[1]
        assert streamed_forward[layer].saliency_q is None

    _, K = adapter.key_heads(model.config)
    for ref in adapter.mixers(model):
        w_q, w_k = (w.detach() for w in adapter.qk_weights(ref.module))
        for method in sorted(served):
            for mode in MODES:
                a, b = (select(method, stats[ref.layer], w_q, w_k, K // 2, mode, torch.Generator().manual_seed(0),
                               ref.layer) for stats in (full, streamed))
                assert (a.keep is None) == (b.keep is None)
                if a.keep is not None:
                    assert torch.equal(a.keep, b.keep), (method, mode, ref.layer)
                else:
                    assert torch.equal(a.rotation, b.rotation), (method, mode, ref.layer)

    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.requires_grad and p.grad is None for p in model.parameters())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert isinstance(model.base_model.layers[0], type(decoder_blocks(model)[0]))


def test_streaming_equals_all_at_once_on_a_float64_model_with_a_different_batch_split():
    """Statistics add up over batches: streaming with batch 3 equals the full path with batch 2 to rounding (the
    batch-level Fisher of taylor depends on the split by definition)."""
    model = _load("qwen3_5").double()
    adapter = get_adapter(model)
    windows = _windows(model, n=6, length=24)
    full = calibrate(model, adapter, windows, batch_size=2, needs=set(STATISTICS))
    streamed = calibrate_streaming(model, adapter, windows, batch_size=3, needs=set(STATISTICS))
    for layer, s in full.items():
        for name in (f for f in FIELDS if not f.startswith("fisher")):
            torch.testing.assert_close(getattr(streamed[layer], name), getattr(s, name), rtol=1e-7, atol=1e-12)


def test_a_model_without_decoder_blocks_is_refused():
    class NoLayers(nn.Module):
        base_model_prefix = "model"

        def __init__(self):
            super().__init__()
            self.model = nn.Linear(2, 2)

        @property
        def base_model(self):
            return self.model

    with pytest.raises(ValueError, match="NoLayers.model has no `layers` ModuleList"):
        decoder_blocks(NoLayers())


@pytest.mark.parametrize("method", ["grad", "drrqr"])
def test_prune_stream_layers_writes_the_same_checkpoint(tmp_path, method):
    from state_reduction.cli import main

    common = ["--method", method, "--ratio", "0.5", "--n-calib", "3", "--seq-len", "32", "--batch-size", "2"]
    path = str(CHECKPOINTS / "mamba2")
    assert main(["prune", path, *common, "--out", str(tmp_path / "full")]) == 0
    assert main(["prune", path, *common, "--stream-layers", "--device", "cpu", "--out", str(tmp_path / "streamed")]) == 0
    full, streamed = (json.loads((tmp_path / d / "selection.json").read_text()) for d in ("full", "streamed"))
    assert streamed["config"]["stream_layers"] and not full["config"]["stream_layers"]
    assert streamed["selection"] == full["selection"]
    a, b = (AutoModelForCausalLM.from_pretrained(str(tmp_path / d)) for d in ("full", "streamed"))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_a_cuda_device_without_cuda_is_a_clear_error(tmp_path, capsys, monkeypatch):
    from state_reduction.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    rc = main(["prune", str(CHECKPOINTS / "mamba2"), "--method", "l1", "--ratio", "0.5", "--stream-layers",
               "--device", "cuda", "--out", str(tmp_path / "o")])
    assert rc == 2 and "--device cuda: torch.cuda.is_available() is False" in capsys.readouterr().err
