import inspect
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from state_reduction.backend import install_cpu_backend, is_installed, patch


@pytest.fixture(scope='module', autouse=True)
def cpu_backend():
    install_cpu_backend()


def conv_reference(x, conv, activation):
    # x: [B, T, D]; nn.Conv1d with padding W - 1, keep the first T outputs (causal)
    y = F.conv1d(x.transpose(1, 2), conv.weight, conv.bias, padding=conv.kernel_size[0] - 1, groups=x.shape[-1])
    y = y[..., :x.shape[1]].transpose(1, 2)
    return F.silu(y) if activation else y


@pytest.mark.parametrize('activation', ['silu', None])
@pytest.mark.parametrize('bias', [False, True])
def test_short_convolution_full_equals_conv1d_and_steps(activation, bias):
    from fla.modules import ShortConvolution

    torch.manual_seed(0)
    conv = ShortConvolution(hidden_size=12, kernel_size=4, bias=bias, activation=activation).double()
    x = torch.randn(3, 10, 12, dtype=torch.float64)
    y, _ = conv(x)
    torch.testing.assert_close(y, conv_reference(x, conv, activation), atol=1e-12, rtol=0)

    with torch.no_grad():
        prefix, cache = conv(x[:, :3], output_final_state=True)
        steps = [prefix]
        for t in range(3, 10):
            y_t, cache = conv(x[:, t:t + 1], cache=cache, output_final_state=True)
            steps.append(y_t)
    torch.testing.assert_close(torch.cat(steps, 1), y, atol=1e-12, rtol=0)
    torch.testing.assert_close(cache, x[:, -4:].transpose(1, 2), atol=0, rtol=0)


def test_short_convolution_cache_continuation_and_short_prefix():
    from fla.modules import ShortConvolution

    torch.manual_seed(0)
    conv = ShortConvolution(hidden_size=8, kernel_size=4, bias=True).double()
    x = torch.randn(2, 9, 8, dtype=torch.float64)
    y, _ = conv(x)
    _, cache = conv(x[:, :2], output_final_state=True)  # shorter than the kernel
    y_rest, cache = conv(x[:, 2:], cache=cache, output_final_state=True)  # multi-token call from a cache
    torch.testing.assert_close(y_rest, y[:, 2:], atol=1e-12, rtol=0)
    torch.testing.assert_close(cache, x[:, -4:].transpose(1, 2), atol=0, rtol=0)


def test_short_convolution_varlen_equals_separate():
    from fla.modules import ShortConvolution

    torch.manual_seed(0)
    conv = ShortConvolution(hidden_size=8, kernel_size=3).double()
    lens = [2, 7, 5]
    cu_seqlens = torch.tensor([0, 2, 9, 14])
    x = torch.randn(1, sum(lens), 8, dtype=torch.float64)
    y, state = conv(x, cu_seqlens=cu_seqlens, output_final_state=True)
    for n, (bos, eos) in enumerate(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())):
        y_n, state_n = conv(x[:, bos:eos], output_final_state=True)
        torch.testing.assert_close(y[:, bos:eos], y_n, atol=1e-12, rtol=0)
        torch.testing.assert_close(state[n:n + 1], state_n, atol=0, rtol=0)


def test_rms_norms_match_formula():
    from fla.modules import FusedRMSNormGated, RMSNorm

    torch.manual_seed(0)
    x, residual, g = (torch.randn(2, 5, 16) for _ in range(3))
    norm = RMSNorm(16, eps=1e-5)
    norm.weight.data.uniform_(0.5, 1.5)
    h = x + residual
    expected = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    torch.testing.assert_close(norm(h), expected)
    y, stream = norm(x, residual, True)
    torch.testing.assert_close(y, expected)
    torch.testing.assert_close(stream, h)
    assert norm(x.bfloat16()).dtype == torch.bfloat16

    for activation, act in (('swish', F.silu), ('sigmoid', torch.sigmoid)):
        gated = FusedRMSNormGated(16, eps=1e-5, activation=activation)
        gated.weight.data.uniform_(0.5, 1.5)
        expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * gated.weight * act(g)
        torch.testing.assert_close(gated(x, g), expected)


@pytest.mark.parametrize('fuse_swiglu', [False, True])
def test_gated_mlp_matches_unfused(fuse_swiglu):
    from fla.modules import GatedMLP

    torch.manual_seed(0)
    mlp = GatedMLP(hidden_size=16, intermediate_size=24, fuse_swiglu=fuse_swiglu)
    x = torch.randn(2, 5, 16, requires_grad=True)
    y = mlp(x)
    expected = mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
    torch.testing.assert_close(y, expected)
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_fla_activations_are_torch_on_cpu():
    from fla.modules.activations import ACT2FN, elu_p1, logsigmoid, sigmoid, swish

    x = torch.randn(4, 8)
    torch.testing.assert_close(ACT2FN['silu'](x), F.silu(x))
    torch.testing.assert_close(ACT2FN['sigmoid'](x), torch.sigmoid(x))
    torch.testing.assert_close(swish(x), F.silu(x))
    torch.testing.assert_close(sigmoid(x), torch.sigmoid(x))
    torch.testing.assert_close(logsigmoid(x, 2.0), F.logsigmoid(x) / 2)
    torch.testing.assert_close(elu_p1(x), F.elu(x) + 1)


def test_fused_cross_entropy_losses_equal_torch():
    from fla.modules import FusedCrossEntropyLoss, FusedLinearCrossEntropyLoss

    torch.manual_seed(0)
    x, weight = torch.randn(2, 6, 16), torch.randn(32, 16)
    target = torch.randint(0, 32, (2, 6))
    target[0, -1] = -100
    logits = x @ weight.T
    expected = F.cross_entropy(logits.reshape(-1, 32), target.reshape(-1))
    loss = FusedCrossEntropyLoss(inplace_backward=True)(logits.reshape(-1, 32), target.reshape(-1))
    assert torch.equal(loss, expected)
    loss_sum = FusedCrossEntropyLoss(reduction='sum')(logits.reshape(-1, 32), target.reshape(-1))
    torch.testing.assert_close(loss_sum, F.cross_entropy(logits.reshape(-1, 32), target.reshape(-1), reduction='sum'))
    torch.testing.assert_close(FusedLinearCrossEntropyLoss()(x, target, weight), expected)
    with pytest.raises(NotImplementedError, match='lse_square_scale'):
        FusedCrossEntropyLoss(lse_square_scale=1e-4)(logits.reshape(-1, 32), target.reshape(-1))


def test_dispatch_rule_keeps_the_original_for_non_cpu_tensors():
    calls = []
    dispatcher = patch.make_dispatcher(lambda *a, **k: calls.append('original'), lambda *a, **k: calls.append('torch'))
    dispatcher('not a tensor', torch.empty(2, device='meta'))
    dispatcher(x=torch.empty(2))
    dispatcher(3)
    assert calls == ['original', 'torch', 'original']
    assert patch.uses_reference((torch.empty(1),), {}) is True
    assert patch.uses_reference((), {'q': torch.empty(1, device='meta')}) is False


def test_install_is_idempotent_and_keeps_originals():
    import fla.layers.delta_net
    import fla.layers.gated_deltanet
    import fla.ops.delta_rule.chunk
    import fla.ops.gated_delta_rule.fused_recurrent
    from transformers.models.qwen3_5 import modeling_qwen3_5

    before = patch.installed_dispatchers()
    install_cpu_backend()
    after = patch.installed_dispatchers()
    assert is_installed()
    assert before.keys() == after.keys() and all(before[key] is after[key] for key in before)
    for (owner, name), dispatcher in after.items():
        assert not patch.is_dispatcher(dispatcher.original), f"{owner}.{name} wraps a dispatcher"

    assert fla.layers.delta_net.chunk_delta_rule.original is fla.ops.delta_rule.chunk.chunk_delta_rule
    recurrent = fla.layers.gated_deltanet.fused_recurrent_gated_delta_rule
    assert recurrent.original is fla.ops.gated_delta_rule.fused_recurrent.fused_recurrent_gated_delta_rule
    qwen = modeling_qwen3_5.torch_chunk_gated_delta_rule
    assert patch.is_dispatcher(qwen)
    assert qwen.reference.__wrapped__ is inspect.unwrap(qwen.original)
    assert qwen.reference.__wrapped__.__module__ == modeling_qwen3_5.__name__


def test_importing_the_backend_has_no_side_effects():
    code = (
        "import state_reduction.backend as b, fla.layers.delta_net as m\n"
        "from state_reduction.backend.patch import is_dispatcher\n"
        "assert not b.is_installed() and not is_dispatcher(m.chunk_delta_rule)\n"
    )
    subprocess.run([sys.executable, '-c', code], check=True)
