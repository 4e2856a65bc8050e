"""Streaming calibration: statistics equal a direct computation, add up over batches (so memory does not
grow with tokens), gradients give |W * dL/dW| per q/k row, and NaN stops with the layer and head."""

import pytest
import torch

import state_reduction  # noqa: F401
from state_reduction.backend import install_cpu_backend
from state_reduction.models import build_model
from state_reduction.models.families import get_adapter
from state_reduction.pruning.calibration import calibrate

VOCAB = 61
DELTANET = {"hidden_size": 32, "num_hidden_layers": 2, "num_heads": 2, "expand_k": 1.0, "expand_v": 1.0,
            "conv_size": 4, "vocab_size": VOCAB, "fuse_cross_entropy": False}
MAMBA2 = {"hidden_size": 32, "num_hidden_layers": 2, "state_size": 8, "n_groups": 2, "expand": 2, "head_dim": 8,
          "num_heads": 8, "conv_kernel": 4, "chunk_size": 8, "vocab_size": VOCAB}


@pytest.fixture(scope="module", autouse=True)
def cpu_backend():
    install_cpu_backend()


def _windows(n=6, length=24, seed=0):
    return torch.randint(0, VOCAB, (n, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family,cfg", [("deltanet", DELTANET), ("mamba2", MAMBA2)])
def test_statistics_equal_direct_computation_and_add_up(family, cfg):
    model = build_model(family, cfg, seed=0, dtype=torch.float64)
    adapter = get_adapter(model)
    windows = _windows()
    seen = {}
    handles = []
    for ref in adapter.mixers(model):
        handles += adapter.add_hooks(ref.module, on_qk=lambda q, k, layer=ref.layer: seen.setdefault(layer, []).append((q, k)))
    with torch.no_grad():
        model(input_ids=windows)
    for h in handles:
        h.remove()

    stats = calibrate(model, adapter, windows, batch_size=4)
    halves = [calibrate(model, adapter, windows[:3], batch_size=2), calibrate(model, adapter, windows[3:], batch_size=3)]
    H, K = adapter.key_heads(model.config)
    for layer, s in stats.items():
        q, k = seen[layer][0]
        assert s.n_tokens == windows.numel()
        assert s.gram_k.shape == (H, K, K) and s.gram_k.dtype == torch.float64
        torch.testing.assert_close(s.gram_k, torch.einsum("bthk,bthl->hkl", k, k), rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(s.gram_q, torch.einsum("bthk,bthl->hkl", q, q), rtol=1e-9, atol=1e-9)
        kn = torch.nn.functional.normalize(k, dim=-1)
        torch.testing.assert_close(s.sum_kk, torch.einsum("bthk,bthl->hkl", kn, kn), rtol=1e-9, atol=1e-9)
        for name in ("gram_q", "gram_k", "sum_k", "sum_qq", "input_sq"):
            torch.testing.assert_close(getattr(s, name), getattr(halves[0][layer], name) + getattr(halves[1][layer], name),
                                       rtol=1e-9, atol=1e-9)


def test_grad_saliency_is_weight_times_summed_gradient():
    model = build_model("deltanet", DELTANET, seed=1, dtype=torch.float64)
    adapter = get_adapter(model)
    windows = _windows(4)
    stats = calibrate(model, adapter, windows, batch_size=2, gradients=True)
    assert all(p.grad is None for p in model.parameters())
    assert all(p.requires_grad for p in model.parameters())

    reference = build_model("deltanet", DELTANET, seed=1, dtype=torch.float64)
    reference.eval()
    reference(input_ids=windows, labels=windows).loss.backward()
    H, K = adapter.key_heads(model.config)
    for ref in adapter.mixers(reference):
        layer = ref.module
        sal_q = (layer.q_proj.weight * layer.q_proj.weight.grad).abs().sum(-1).view(H, K)
        sal_k = (layer.k_proj.weight * layer.k_proj.weight.grad).abs().sum(-1).view(H, K)
        torch.testing.assert_close(stats[ref.layer].saliency_q, sal_q, rtol=1e-6, atol=1e-12)
        torch.testing.assert_close(stats[ref.layer].saliency_k, sal_k, rtol=1e-6, atol=1e-12)


def test_nan_statistic_names_layer_and_head():
    model = build_model("deltanet", DELTANET, seed=0)
    adapter = get_adapter(model)
    ref = list(adapter.mixers(model))[1]
    with torch.no_grad():
        ref.module.k_proj.weight[DELTANET["hidden_size"] // 2 + 3] = float("nan")  # a channel of head 1
    with pytest.raises(FloatingPointError, match=r"layer 1, head 1"):
        calibrate(model, adapter, _windows(2), batch_size=2)
