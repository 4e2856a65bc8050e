"""backend/fused_cpu.py: the fused one-pass C decode step against the plain loop, the torch step and the chunked
form; its selection (STATE_REDUCTION_CPU_RECURRENCE, use_kernel) and its errors."""

import pytest
import torch
import torch.nn.functional as F

from state_reduction.backend import fused_cpu
from state_reduction.backend.fused_cpu import FusedKernelError, selected_kernel, use_kernel
from state_reduction.backend.gated_delta_rule import chunk_gated_delta_rule_torch, recurrent_gated_delta_rule_torch
from tests.backend.test_gated_delta_rule import ATOL, loop_gated_delta_rule, make_inputs


def _inputs(K, V, T, gated, dtype=torch.float64, B=3, H=5):
    x = make_inputs(B=B, T=T, H=H, HV=H, K=K, V=V)
    g = -x['A_log'].exp() * F.softplus(x['a'] + x['dt_bias']) if gated else torch.zeros_like(x['a'])
    q, k = (F.normalize(x[n], dim=-1, eps=0) for n in ('q', 'k'))
    return {n: t.to(dtype) for n, t in dict(q=q, k=k, v=x['v'], g=g, beta=x['b'].sigmoid(), h0=x['h0']).items()}


@pytest.mark.parametrize('K', [16, 32, 24])  # 16, 32: the copies with K a constant; 24: the general one
@pytest.mark.parametrize('T', [1, 6])
@pytest.mark.parametrize('gated', [True, False])
@pytest.mark.parametrize('v_first', [True, False])
def test_fused_step_equals_the_loop_and_the_chunked_form_and_leaves_h0_alone(K, T, gated, v_first):
    x = _inputs(K, 7, T, gated)
    h0 = x['h0'].transpose(-1, -2).contiguous() if v_first else x['h0']
    keep = h0.clone()
    kwargs = dict(initial_state=h0, output_final_state=True, state_v_first=v_first)
    with use_kernel('fused'):
        o, ht = recurrent_gated_delta_rule_torch(x['q'], x['k'], x['v'], g=x['g'] if gated else None, beta=x['beta'],
                                                 **kwargs)
    assert torch.equal(h0, keep)
    o_loop, ht_loop = loop_gated_delta_rule(x['q'], x['k'], x['v'], x['g'], x['beta'], x['h0'], scale=K ** -0.5)
    o_chunk, ht_chunk = chunk_gated_delta_rule_torch(x['q'], x['k'], x['v'], x['g'], x['beta'], chunk_size=4, **kwargs)
    for o_ref, ht_ref in ((o_loop, ht_loop.transpose(-1, -2) if v_first else ht_loop), (o_chunk, ht_chunk)):
        torch.testing.assert_close(o, o_ref, atol=ATOL, rtol=0)
        torch.testing.assert_close(ht, ht_ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize('HV', [5, 10])  # 10: GVA, two value heads read each key head
@pytest.mark.parametrize('K', [32, 24])
@pytest.mark.parametrize('v_first', [True, False])
def test_fused_step_takes_the_kernels_l2_norm_itself_and_equals_the_torch_step(HV, K, v_first):
    x = make_inputs(B=3, T=4, H=5, HV=HV, K=K, V=9)
    x['q'][0, 0, 0] = 0  # a zero row: sqrt(0 + eps), as delta_rule.l2norm
    h0 = x['h0'].transpose(-1, -2).contiguous() if v_first else x['h0']
    kwargs = dict(g=x['a'], beta=x['b'], use_gate_in_kernel=True, A_log=x['A_log'], dt_bias=x['dt_bias'],
                  use_beta_sigmoid_in_kernel=True, use_qk_l2norm_in_kernel=True, initial_state=h0,
                  output_final_state=True, state_v_first=v_first)
    runs = {}
    for kernel in ('torch', 'fused'):
        with use_kernel(kernel):
            runs[kernel] = recurrent_gated_delta_rule_torch(x['q'], x['k'], x['v'], **kwargs)
    for fast, ref in zip(runs['fused'], runs['torch'], strict=True):
        torch.testing.assert_close(fast, ref, atol=ATOL, rtol=0)


# V 16 and 13: float32 V-first rows go eight at a time (AVX2), then one by one for the rest; K 24 is a general one
@pytest.mark.parametrize('K,V', [(32, 16), (16, 13), (64, 8), (24, 21)])
@pytest.mark.parametrize('v_first', [True, False])
def test_fused_float32_step_is_as_close_to_float64_as_the_torch_step(v_first, K, V):
    x64 = _inputs(K, V, 3, True)
    x32 = {n: t.float() for n, t in x64.items()}

    def run(x, kernel):
        h0 = x['h0'].transpose(-1, -2).contiguous() if v_first else x['h0']
        with use_kernel(kernel):
            return recurrent_gated_delta_rule_torch(x['q'], x['k'], x['v'], g=x['g'], beta=x['beta'], initial_state=h0,
                                                    output_final_state=True, state_v_first=v_first)

    o64, h64 = run(x64, 'torch')
    (o_t, h_t), (o_f, h_f) = run(x32, 'torch'), run(x32, 'fused')
    assert o_f.dtype == h_f.dtype == torch.float32
    for fast, torch_step, ref in ((o_f, o_t, o64), (h_f, h_t, h64)):
        err, err_torch = ((x.double() - ref).abs().max().item() for x in (fast, torch_step))
        assert err <= max(4 * err_torch, 1e-6), (err, err_torch)


def test_the_kernel_is_chosen_by_the_environment_and_use_kernel(monkeypatch):
    monkeypatch.delenv(fused_cpu.ENV, raising=False)
    assert selected_kernel() == 'torch'
    monkeypatch.setenv(fused_cpu.ENV, 'fused')
    assert selected_kernel() == 'fused'
    with use_kernel('torch'):
        assert selected_kernel() == 'torch'
    monkeypatch.setenv(fused_cpu.ENV, 'triton')
    with pytest.raises(FusedKernelError, match="STATE_REDUCTION_CPU_RECURRENCE must be one of torch, fused, got 'triton'"):
        selected_kernel()
    with pytest.raises(FusedKernelError, match="got 'fast'"), use_kernel('fast'):
        pass


def test_a_missing_compiler_is_an_error_naming_it(monkeypatch, tmp_path):
    monkeypatch.setattr(fused_cpu, '_LIB', None)
    monkeypatch.delenv('CC', raising=False)
    monkeypatch.setattr(fused_cpu.shutil, 'which', lambda name: None)
    x = _inputs(16, 7, 1, True)
    with pytest.raises(FusedKernelError, match='needs a C compiler'), use_kernel('fused'):
        recurrent_gated_delta_rule_torch(x['q'], x['k'], x['v'], g=x['g'], beta=x['beta'], initial_state=x['h0'],
                                         output_final_state=True)


def test_a_failed_build_is_an_error_with_the_compiler_output(monkeypatch, tmp_path):
    monkeypatch.setattr(fused_cpu, '_LIB', None)
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
    monkeypatch.setenv('CC', 'false')  # exits 1
    with pytest.raises(FusedKernelError, match='building the fused decode step with false failed'):
        fused_cpu._library()
    assert not list(tmp_path.rglob('*.so'))
