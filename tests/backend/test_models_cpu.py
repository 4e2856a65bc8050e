"""Whole tiny models on CPU after install_cpu_backend(): loss, cached decoding, padding and backward.

fla's DeltaNet layer runs fused_recurrent for q_len <= 64 and chunk above; GatedDeltaNet runs chunk whenever grad
is enabled. T = 40 and 100 cover both paths (100 also covers T not a multiple of the chunk size).
"""

from dataclasses import dataclass
from typing import Callable

import pytest
import torch
import torch.nn.functional as F

from state_reduction.backend.fused_cpu import KERNELS, use_kernel
from state_reduction.backend import install_cpu_backend

VOCAB = 256
LENGTHS = (40, 100)


@pytest.fixture(scope='module', autouse=True)
def cpu_backend():
    install_cpu_backend()


def build_delta_net(**overrides):
    from fla.models import DeltaNetConfig, DeltaNetForCausalLM

    config = dict(hidden_size=64, num_hidden_layers=2, num_heads=2, vocab_size=VOCAB, use_gate=True)
    return DeltaNetForCausalLM(DeltaNetConfig(**{**config, **overrides}))


def build_gated_deltanet(**overrides):
    from fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM

    config = dict(hidden_size=64, num_hidden_layers=2, num_heads=2, head_dim=32, num_v_heads=4, vocab_size=VOCAB)
    return GatedDeltaNetForCausalLM(GatedDeltaNetConfig(**{**config, **overrides}))


def build_qwen3_5():
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    return Qwen3_5ForCausalLM(Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4,
        layer_types=['linear_attention', 'full_attention', 'linear_attention'],
    ))


def build_mamba2():
    # transformers' class directly: `import fla` re-registers the mamba2 Auto classes to fla's Mamba2
    from transformers import Mamba2Config
    from transformers.models.mamba2.modeling_mamba2 import Mamba2ForCausalLM

    return Mamba2ForCausalLM(Mamba2Config(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, state_size=16, n_groups=2, num_heads=4, head_dim=32,
        expand=2, chunk_size=16,
    ))


@dataclass(frozen=True)
class Family:
    build: Callable
    cache_name: str  # the cache argument of forward and field of its output
    atol: float  # float64 model; transformers' torch fallbacks compute in float32


FAMILIES = {
    'delta_net': Family(build_delta_net, 'past_key_values', 1e-10),
    'gated_deltanet': Family(build_gated_deltanet, 'past_key_values', 1e-10),
    'qwen3_5': Family(build_qwen3_5, 'cache', 1e-6),
    'mamba2': Family(build_mamba2, 'cache', 1e-6),
}
FLA_FAMILIES = ('delta_net', 'gated_deltanet')


def tokens(B, T, seed=0):
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def model_in_float64(name, seed=0):
    torch.manual_seed(seed)
    return FAMILIES[name].build().double().eval()


def shifted_cross_entropy(logits, labels):
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))


@pytest.mark.parametrize('name', FAMILIES)
def test_loss_equals_torch_cross_entropy(name):
    model = model_in_float64(name)
    x = tokens(2, 40)
    out = model(x, labels=x)
    if name in FLA_FAMILIES:  # the routed fused cross-entropy keeps float64
        torch.testing.assert_close(out.loss, shifted_cross_entropy(out.logits, x), atol=1e-12, rtol=0)
    else:  # transformers' loss runs on logits.float()
        torch.testing.assert_close(out.loss, shifted_cross_entropy(out.logits.float(), x), atol=1e-6, rtol=0)


@pytest.mark.parametrize('build', [build_delta_net, build_gated_deltanet])
def test_fused_linear_cross_entropy_equals_torch_cross_entropy(build):
    torch.manual_seed(0)
    model = build(fuse_cross_entropy=False, fuse_linear_cross_entropy=True).double()
    x = tokens(2, 40)
    loss = model(x, labels=x).loss
    logits = model(x).logits
    torch.testing.assert_close(loss, shifted_cross_entropy(logits, x), atol=1e-12, rtol=0)


@pytest.mark.parametrize('kernel', KERNELS)  # the decode steps: the torch reference, the fused C step
@pytest.mark.parametrize('T', LENGTHS)
@pytest.mark.parametrize('name', FAMILIES)
def test_cached_decoding_equals_full_forward(name, T, kernel):
    family = FAMILIES[name]
    model = model_in_float64(name)
    x = tokens(2, T)
    prefill = T - 6
    with torch.no_grad(), use_kernel(kernel):
        full = model(x).logits
        out = model(x[:, :prefill], use_cache=True)
        logits = [out.logits]
        for t in range(prefill, T):
            out = model(x[:, t:t + 1], use_cache=True, **{family.cache_name: getattr(out, family.cache_name)})
            logits.append(out.logits)
    torch.testing.assert_close(torch.cat(logits, dim=1), full, atol=family.atol, rtol=0)


@pytest.mark.parametrize('T', LENGTHS)
@pytest.mark.parametrize('name', FAMILIES)
def test_left_padded_batch_equals_unpadded_sequences(name, T):
    family = FAMILIES[name]
    model = model_in_float64(name)
    x = tokens(3, T)
    pads = [7, 0, 30]
    mask = torch.ones(3, T, dtype=torch.long)
    for i, pad in enumerate(pads):
        mask[i, :pad] = 0
    with torch.no_grad():
        padded = model(x, attention_mask=mask).logits
        for i, pad in enumerate(pads):
            alone = model(x[i:i + 1, pad:]).logits
            torch.testing.assert_close(padded[i:i + 1, pad:], alone, atol=family.atol, rtol=0, msg=f"sequence {i}")


@pytest.mark.parametrize('T', LENGTHS)
@pytest.mark.parametrize('name', FAMILIES)
def test_backward_gives_finite_gradients(name, T):
    torch.manual_seed(0)
    model = FAMILIES[name].build().train()
    x = tokens(2, T)
    model(x, labels=x).loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    missing = [n for n, g in grads.items() if g is None and 'embed' not in n]
    assert not missing, f"no gradient for {missing}"
    assert all(torch.isfinite(g).all() for g in grads.values() if g is not None)
    mixer_grads = [g for n, g in grads.items() if g is not None and ('attn' in n or 'mixer' in n)]
    assert mixer_grads and all(g.abs().sum() > 0 for g in mixer_grads)
