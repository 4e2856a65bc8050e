"""The torch references against fla's Triton kernels on a CUDA device, forward and backward.

Both sides run on the same CUDA tensors: the references are plain torch, the kernels are taken from their
defining modules (`.original` when the CPU backend has rebound the name). Errors are relative RMS errors,
as in fla's own tests; fp32 kernels may use TF32 dots, hence the loose fp32 bound.
"""

import pytest
import torch

from state_reduction.backend import patch
from state_reduction.backend.delta_rule import chunk_delta_rule_torch, recurrent_delta_rule_torch
from state_reduction.backend.gated_delta_rule import chunk_gated_delta_rule_torch, recurrent_gated_delta_rule_torch
from state_reduction.backend.modules import causal_conv1d_torch, rms_norm_gated_torch, rms_norm_torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device for fla's Triton kernels"),
]

TOLERANCE = {torch.float32: 5e-3, torch.bfloat16: 2e-2}
# SR_KERNEL_SHAPES=paper (scripts/gpu_check.sh): the paper's 1.3B shapes, one 2048-token sequence; DeltaNet 16 heads
# x 128 (fla-hub/delta_net-1.3B-100B), Gated DeltaNet 8 heads x 256 (experiments/rehearsal/configs). Default: small.
PAPER_SHAPES = __import__("os").environ.get("SR_KERNEL_SHAPES") == "paper"
DELTA_SHAPE = dict(B=1, T=2048, H=16, K=128, V=128) if PAPER_SHAPES else dict(B=2, T=300, H=4, K=64, V=64)
GATED_SHAPE = dict(B=1, T=2048, H=8, HV=8, K=256, V=256) if PAPER_SHAPES else dict(B=2, T=300, H=2, HV=4, K=64, V=128)


def kernel(function):
    return getattr(function, 'original', function)


def assert_relative_close(name, actual, expected, tolerance):
    actual, expected = actual.float(), expected.float()
    error = (actual - expected).square().mean().sqrt() / expected.square().mean().sqrt().clamp_min(1e-12)
    assert error <= tolerance, f"{name}: relative RMS error {error:.2e} > {tolerance:.0e}"


def run_with_grads(fn, inputs, do, dht, **kwargs):
    leaves = {n: t.detach().clone().requires_grad_(t.is_floating_point()) for n, t in inputs.items()}
    o, ht = fn(**leaves, **kwargs)
    ((o.float() * do).sum() + (ht.float() * dht).sum()).backward()
    return o, ht, {n: t.grad for n, t in leaves.items() if t.grad is not None}


def delta_inputs(dtype, B=None, T=None, H=None, K=None, V=None, N=None):
    B, T, H, K, V = (DELTA_SHAPE[n] if x is None else x for n, x in zip("BTHKV", (B, T, H, K, V)))
    gen = torch.Generator(device='cuda').manual_seed(0)
    N = B if N is None else N
    return dict(
        q=torch.randn(B, T, H, K, device='cuda', generator=gen).to(dtype),
        k=torch.randn(B, T, H, K, device='cuda', generator=gen).to(dtype),
        v=torch.randn(B, T, H, V, device='cuda', generator=gen).to(dtype),
        beta=torch.rand(B, T, H, device='cuda', generator=gen).to(dtype),
        initial_state=torch.randn(N, H, K, V, device='cuda', generator=gen),
    )


def gated_inputs(dtype, B=None, T=None, H=None, HV=None, K=None, V=None, N=None):
    B, T, H, HV, K, V = (GATED_SHAPE[n] if x is None else x
                         for n, x in zip(("B", "T", "H", "HV", "K", "V"), (B, T, H, HV, K, V)))
    gen = torch.Generator(device='cuda').manual_seed(0)
    N = B if N is None else N
    return dict(
        q=torch.randn(B, T, H, K, device='cuda', generator=gen).to(dtype),
        k=torch.randn(B, T, H, K, device='cuda', generator=gen).to(dtype),
        v=torch.randn(B, T, HV, V, device='cuda', generator=gen).to(dtype),
        g=torch.randn(B, T, HV, device='cuda', generator=gen).to(dtype),
        beta=torch.randn(B, T, HV, device='cuda', generator=gen).to(dtype),
        A_log=torch.rand(HV, device='cuda', generator=gen).mul(15).add(1).log(),
        dt_bias=torch.randn(HV, device='cuda', generator=gen) * 0.5,
        initial_state=torch.randn(N, HV, V, K, device='cuda', generator=gen),
    )


# the options fla's GatedDeltaNet layer passes
LAYER_OPTIONS = dict(
    output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
    use_beta_sigmoid_in_kernel=True, state_v_first=True,
)


def output_grads(o_shape, ht_shape):
    gen = torch.Generator(device='cuda').manual_seed(1)
    return (torch.randn(o_shape, device='cuda', generator=gen) * 0.1,
            torch.randn(ht_shape, device='cuda', generator=gen) * 0.1)


def compare_gated_chunk(fn_kernel, x, do, dht, dtype, **kwargs):
    """Forward always; the backward unless fla refuses it on this GPU/Triton (its guard for issue #640:
    Triton >= 3.4 and < 3.7.1 on Hopper), which is then the reason the rest is skipped."""
    with torch.no_grad():
        o_k, ht_k = fn_kernel(**x, **kwargs)
        o_r, ht_r = chunk_gated_delta_rule_torch(**x, **kwargs)
    assert_relative_close('o (forward only)', o_k, o_r, TOLERANCE[dtype])
    assert_relative_close('final_state (forward only)', ht_k, ht_r, TOLERANCE[dtype])
    try:
        results_kernel = run_with_grads(fn_kernel, x, do, dht, **kwargs)
    except RuntimeError as e:
        if '#640' in str(e):
            pytest.skip(f"forward matched; fla refuses the gated chunk backward here: {e}")
        raise
    compare(results_kernel, run_with_grads(chunk_gated_delta_rule_torch, x, do, dht, **kwargs), dtype)


def compare(results_kernel, results_reference, dtype):
    (o_k, ht_k, grads_k), (o_r, ht_r, grads_r) = results_kernel, results_reference
    tolerance = TOLERANCE[dtype]
    assert o_k.dtype == o_r.dtype
    assert_relative_close('o', o_k, o_r, tolerance)
    assert_relative_close('final_state', ht_k, ht_r, tolerance)
    assert grads_k.keys() == grads_r.keys()
    for name in grads_r:
        assert_relative_close(f"d{name}", grads_k[name], grads_r[name], tolerance)


def test_chunk_delta_rule_matches_kernel():
    from fla.ops.delta_rule.chunk import chunk_delta_rule

    dtype = torch.bfloat16  # the kernel refuses float32
    x = delta_inputs(dtype)
    do, dht = output_grads(x['v'].shape, x['initial_state'].shape)
    kwargs = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    compare(
        run_with_grads(kernel(chunk_delta_rule), x, do, dht, **kwargs),
        run_with_grads(chunk_delta_rule_torch, x, do, dht, **kwargs),
        dtype,
    )


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_fused_recurrent_delta_rule_matches_kernel(dtype):
    from fla.ops.delta_rule.fused_recurrent import fused_recurrent_delta_rule

    x = delta_inputs(dtype, T=100)
    do, dht = output_grads(x['v'].shape, x['initial_state'].shape)
    kwargs = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    compare(
        run_with_grads(kernel(fused_recurrent_delta_rule), x, do, dht, **kwargs),
        run_with_grads(recurrent_delta_rule_torch, x, do, dht, **kwargs),
        dtype,
    )


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_chunk_gated_delta_rule_matches_kernel(dtype):
    from fla.ops.gated_delta_rule.chunk import chunk_gated_delta_rule

    x = gated_inputs(dtype)
    do, dht = output_grads(x['v'].shape, x['initial_state'].shape)
    compare_gated_chunk(kernel(chunk_gated_delta_rule), x, do, dht, dtype, **LAYER_OPTIONS)


def test_chunk_gated_delta_rule_varlen_matches_kernel():
    from fla.ops.gated_delta_rule.chunk import chunk_gated_delta_rule

    dtype = torch.bfloat16
    cu_seqlens = torch.tensor([0, 15, 100, 300], device='cuda', dtype=torch.int32)
    x = gated_inputs(dtype, B=1, N=3)
    do, dht = output_grads(x['v'].shape, x['initial_state'].shape)
    kwargs = dict(LAYER_OPTIONS, cu_seqlens=cu_seqlens)
    compare_gated_chunk(kernel(chunk_gated_delta_rule), x, do, dht, dtype, **kwargs)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_fused_recurrent_gated_delta_rule_matches_kernel(dtype):
    from fla.ops.gated_delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule

    x = gated_inputs(dtype, T=64)  # the kernel has no backward
    with torch.no_grad():
        o_k, ht_k = kernel(fused_recurrent_gated_delta_rule)(**x, **LAYER_OPTIONS)
        o_r, ht_r = recurrent_gated_delta_rule_torch(**x, **LAYER_OPTIONS)
    assert_relative_close('o', o_k, o_r, TOLERANCE[dtype])
    assert_relative_close('final_state', ht_k, ht_r, TOLERANCE[dtype])


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_causal_conv_and_norms_match_kernels(dtype):
    from fla.modules.causal_conv1d.ops import causal_conv1d
    from fla.modules.norm.fused_norm_gate import rms_norm_gated
    from fla.modules.norm.layernorm import rms_norm

    gen = torch.Generator(device='cuda').manual_seed(0)
    x = torch.randn(2, 50, 96, device='cuda', generator=gen).to(dtype)
    weight, bias = torch.randn(96, 4, device='cuda', generator=gen), torch.randn(96, device='cuda', generator=gen)
    h0 = torch.randn(2, 96, 4, device='cuda', generator=gen).to(dtype)
    kwargs = dict(weight=weight, bias=bias, initial_state=h0, output_final_state=True, activation='silu')
    y_k, state_k = kernel(causal_conv1d)(x, **kwargs)
    y_r, state_r = causal_conv1d_torch(x, **kwargs)
    assert_relative_close('causal_conv1d', y_k, y_r, TOLERANCE[dtype])
    torch.testing.assert_close(state_k, state_r, atol=0, rtol=0)

    g, residual, w = torch.randn_like(x), torch.randn_like(x), torch.rand(96, device='cuda', generator=gen) + 0.5
    for name, fn_k, fn_r, args in (
        ('rms_norm', kernel(rms_norm), rms_norm_torch, (x, w, None)),
        ('rms_norm_gated', kernel(rms_norm_gated), rms_norm_gated_torch, (x, g, w, None)),
    ):
        y_k, stream_k = fn_k(*args, residual=residual, prenorm=True, eps=1e-5)
        y_r, stream_r = fn_r(*args, residual=residual, prenorm=True, eps=1e-5)
        assert_relative_close(name, y_k, y_r, TOLERANCE[dtype])
        assert_relative_close(f"{name} residual", stream_k, stream_r, TOLERANCE[dtype])


def test_installed_dispatcher_runs_the_kernel_on_cuda():
    import fla.layers.gated_deltanet as layer
    from state_reduction.backend import install_cpu_backend

    install_cpu_backend()
    assert patch.is_dispatcher(layer.chunk_gated_delta_rule)
    x = gated_inputs(torch.bfloat16)
    with torch.no_grad():
        o_dispatched, _ = layer.chunk_gated_delta_rule(**x, **LAYER_OPTIONS)
        o_kernel, _ = layer.chunk_gated_delta_rule.original(**x, **LAYER_OPTIONS)
    torch.testing.assert_close(o_dispatched, o_kernel, atol=0, rtol=0)
