import pytest
import torch

from state_reduction.backend.delta_rule import chunk_delta_rule_torch, recurrent_delta_rule_torch

ATOL = 1e-10


def make_inputs(B=2, T=37, H=2, K=8, V=6, N=None, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    N = B if N is None else N
    q = torch.randn(B, T, H, K, generator=gen, dtype=dtype)
    # unit-norm keys keep the recurrence contractive without the in-kernel L2 norm
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen, dtype=dtype), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen, dtype=dtype)
    beta = torch.rand(B, T, H, generator=gen, dtype=dtype)
    h0 = torch.randn(N, H, K, V, generator=gen, dtype=dtype)
    return q, k, v, beta, h0


def loop_delta_rule(q, k, v, beta, h0, scale, l2norm):
    """S_t = S_{t-1} (I - b k k^T) + b v k^T, o_t = scale S_t q_t, with S [V, K]; h0 is given as [K, V]."""
    if l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    B, T, H, K = q.shape
    S = h0.transpose(-1, -2).clone()  # [B, H, V, K]
    eye = torch.eye(K, dtype=q.dtype)
    out = []
    for t in range(T):
        k_t, q_t, v_t, b_t = k[:, t], q[:, t], v[:, t], beta[:, t, :, None, None]
        S = S @ (eye - b_t * k_t[..., :, None] * k_t[..., None, :]) + b_t * v_t[..., :, None] * k_t[..., None, :]
        out.append(scale * (S @ q_t[..., None])[..., 0])
    return torch.stack(out, dim=1), S.transpose(-1, -2)


@pytest.mark.parametrize('l2norm', [False, True])
def test_recurrent_equals_independent_loop(l2norm):
    q, k, v, beta, h0 = make_inputs()
    o, ht = recurrent_delta_rule_torch(
        q, k, v, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=l2norm,
    )
    o_ref, ht_ref = loop_delta_rule(q, k, v, beta, h0, q.shape[-1] ** -0.5, l2norm)
    torch.testing.assert_close(o, o_ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(ht, ht_ref, atol=ATOL, rtol=0)


def _loss_and_grads(fn, inputs, weights, **kwargs):
    inputs = [x.detach().clone().requires_grad_() for x in inputs]
    q, k, v, beta, h0 = inputs
    o, ht = fn(q, k, v, beta, initial_state=h0, output_final_state=True, **kwargs)
    ((o * weights[0]).sum() + (ht * weights[1]).sum()).backward()
    return o, ht, [x.grad for x in inputs]


@pytest.mark.parametrize('l2norm', [False, True])
@pytest.mark.parametrize('T', [16, 37, 100])
def test_chunk_equals_recurrent_forward_and_grads(l2norm, T):
    inputs = make_inputs(T=T)
    gen = torch.Generator().manual_seed(1)
    weights = (torch.randn(2, T, 2, 6, generator=gen, dtype=torch.float64),
               torch.randn(2, 2, 8, 6, generator=gen, dtype=torch.float64))
    o_c, ht_c, grads_c = _loss_and_grads(
        chunk_delta_rule_torch, inputs, weights, use_qk_l2norm_in_kernel=l2norm, chunk_size=16,
    )
    o_r, ht_r, grads_r = _loss_and_grads(recurrent_delta_rule_torch, inputs, weights, use_qk_l2norm_in_kernel=l2norm)
    torch.testing.assert_close(o_c, o_r, atol=ATOL, rtol=0)
    torch.testing.assert_close(ht_c, ht_r, atol=ATOL, rtol=0)
    for name, g_c, g_r in zip(('q', 'k', 'v', 'beta', 'initial_state'), grads_c, grads_r):
        torch.testing.assert_close(g_c, g_r, atol=ATOL, rtol=0, msg=f"grad of {name}")


def test_final_state_only_when_requested_and_default_scale():
    q, k, v, beta, _ = make_inputs()
    o, ht = chunk_delta_rule_torch(q, k, v, beta)
    assert ht is None
    o_scaled, _ = chunk_delta_rule_torch(q, k, v, beta, scale=q.shape[-1] ** -0.5)
    torch.testing.assert_close(o, o_scaled, atol=0, rtol=0)
    o_other, _ = chunk_delta_rule_torch(q, k, v, beta, scale=1.0)
    assert not torch.allclose(o, o_other)


@pytest.mark.parametrize('fn', [chunk_delta_rule_torch, recurrent_delta_rule_torch])
def test_varlen_equals_separate_sequences(fn):
    lens = [5, 25, 17, 64]
    cu_seqlens = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    q, k, v, beta, h0 = make_inputs(B=1, T=sum(lens), N=len(lens))
    kwargs = dict(use_qk_l2norm_in_kernel=True, output_final_state=True)
    if fn is chunk_delta_rule_torch:
        kwargs['chunk_size'] = 16
    o, ht = fn(q, k, v, beta, initial_state=h0, cu_seqlens=cu_seqlens, **kwargs)
    for n, (bos, eos) in enumerate(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())):
        part = (x[:, bos:eos] for x in (q, k, v, beta))
        o_n, ht_n = fn(*part, initial_state=h0[n:n + 1], **kwargs)
        torch.testing.assert_close(o[:, bos:eos], o_n, atol=ATOL, rtol=0)
        torch.testing.assert_close(ht[n:n + 1], ht_n, atol=ATOL, rtol=0)


def test_dtypes_follow_the_kernels():
    q, k, v, beta, h0 = (x.to(torch.bfloat16) for x in make_inputs())
    o, ht = chunk_delta_rule_torch(q, k, v, beta, initial_state=h0, output_final_state=True)
    assert o.dtype == torch.bfloat16 and ht.dtype == torch.float32
    q, k, v, beta, h0 = make_inputs()
    o, ht = recurrent_delta_rule_torch(q, k, v, beta, initial_state=h0, output_final_state=True)
    assert o.dtype == torch.float64 and ht.dtype == torch.float64


def test_unsupported_arguments_are_named():
    q, k, v, beta, _ = make_inputs()
    with pytest.raises(NotImplementedError, match='head_first'):
        chunk_delta_rule_torch(q, k, v, beta, head_first=True)
    with pytest.raises(NotImplementedError, match='head-wise beta'):
        recurrent_delta_rule_torch(q, k, v, beta[..., None].expand(*v.shape))
    with pytest.raises(ValueError, match='batch size must be 1'):
        chunk_delta_rule_torch(q, k, v, beta, cu_seqlens=torch.tensor([0, 10, 37]))
