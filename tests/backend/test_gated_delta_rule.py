import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from state_reduction.backend import delta_rule
from state_reduction.backend.delta_rule import STATE_BUFFERS, StateBuffers
from state_reduction.backend.gated_delta_rule import chunk_gated_delta_rule_torch, recurrent_gated_delta_rule_torch

ATOL = 1e-10


def make_inputs(B=2, T=37, H=2, HV=4, K=8, V=6, N=None, seed=0):
    """Raw layer-style inputs: gate logits `a`, beta logits, A_log and dt_bias as fla's GatedDeltaNet passes them."""
    gen = torch.Generator().manual_seed(seed)
    N = B if N is None else N
    d = torch.float64
    return dict(
        q=torch.randn(B, T, H, K, generator=gen, dtype=d),
        k=torch.randn(B, T, H, K, generator=gen, dtype=d),
        v=torch.randn(B, T, HV, V, generator=gen, dtype=d),
        a=torch.randn(B, T, HV, generator=gen, dtype=d),
        b=torch.randn(B, T, HV, generator=gen, dtype=d),
        A_log=torch.rand(HV, generator=gen, dtype=d).mul(4).add(0.1).log(),
        dt_bias=torch.randn(HV, generator=gen, dtype=d) * 0.5,
        h0=torch.randn(N, HV, K, V, generator=gen, dtype=d),
    )


def loop_gated_delta_rule(q, k, v, g, beta, h0, scale):
    """S_t = exp(g_t) S_{t-1} (I - b k k^T) + b v k^T, o_t = scale S_t q_t, S [V, K]; q/k already normalised and
    repeated to the value heads; h0 given as [K, V]."""
    T, K = q.shape[1], q.shape[-1]
    S = h0.transpose(-1, -2).clone()
    eye = torch.eye(K, dtype=q.dtype)
    out = []
    for t in range(T):
        k_t, q_t, v_t, b_t = k[:, t], q[:, t], v[:, t], beta[:, t, :, None, None]
        S = g[:, t, :, None, None].exp() * S
        S = S @ (eye - b_t * k_t[..., :, None] * k_t[..., None, :]) + b_t * v_t[..., :, None] * k_t[..., None, :]
        out.append(scale * (S @ q_t[..., None])[..., 0])
    return torch.stack(out, dim=1), S.transpose(-1, -2)


def layer_call(fn, x, **overrides):
    """The call fla's GatedDeltaNet layer makes (raw gate and beta, l2norm, V-first state)."""
    kwargs = dict(
        g=x['a'], beta=x['b'], initial_state=x['h0'].transpose(-1, -2), output_final_state=True,
        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=x['A_log'], dt_bias=x['dt_bias'],
        use_beta_sigmoid_in_kernel=True, state_v_first=True,
    )
    kwargs.update(overrides)
    return fn(x['q'], x['k'], x['v'], **kwargs)


@pytest.mark.parametrize('allow_neg_eigval', [False, True])
def test_recurrent_layer_call_equals_independent_loop(allow_neg_eigval):
    x = make_inputs()
    o, ht = layer_call(recurrent_gated_delta_rule_torch, x, allow_neg_eigval=allow_neg_eigval)
    rep = x['v'].shape[2] // x['q'].shape[2]
    q, k = (
        (x[n] / torch.sqrt((x[n] * x[n]).sum(-1, keepdim=True) + 1e-6)).repeat_interleave(rep, dim=2)
        for n in ('q', 'k')
    )
    g = -x['A_log'].exp() * F.softplus(x['a'] + x['dt_bias'])
    beta = x['b'].sigmoid() * (2 if allow_neg_eigval else 1)
    o_ref, ht_ref = loop_gated_delta_rule(q, k, x['v'], g, beta, x['h0'], q.shape[-1] ** -0.5)
    torch.testing.assert_close(o, o_ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(ht, ht_ref.transpose(-1, -2), atol=ATOL, rtol=0)


def test_in_kernel_gate_and_beta_equal_precomputed():
    x = make_inputs()
    g = -x['A_log'].exp() * F.softplus(x['a'] + x['dt_bias'])
    o, ht = layer_call(chunk_gated_delta_rule_torch, x, chunk_size=16)
    o2, ht2 = layer_call(
        chunk_gated_delta_rule_torch, x, g=g, beta=x['b'].sigmoid(), use_gate_in_kernel=False,
        use_beta_sigmoid_in_kernel=False, A_log=None, dt_bias=None, state_v_first=False,
        initial_state=x['h0'], chunk_size=16,
    )
    torch.testing.assert_close(o, o2, atol=ATOL, rtol=0)
    torch.testing.assert_close(ht, ht2.transpose(-1, -2), atol=ATOL, rtol=0)


@pytest.mark.parametrize('T', [16, 37, 100])
@pytest.mark.parametrize('HV', [2, 4])
def test_chunk_equals_recurrent_forward_and_grads(T, HV):
    x = make_inputs(T=T, HV=HV)
    gen = torch.Generator().manual_seed(1)
    do = torch.randn(2, T, HV, 6, generator=gen, dtype=torch.float64)
    dht = torch.randn(2, HV, 6, 8, generator=gen, dtype=torch.float64)
    results = []
    for fn, extra in ((chunk_gated_delta_rule_torch, dict(chunk_size=16)), (recurrent_gated_delta_rule_torch, {})):
        leaves = {n: t.detach().clone().requires_grad_() for n, t in x.items()}
        o, ht = layer_call(fn, leaves, **extra)
        ((o * do).sum() + (ht * dht).sum()).backward()
        results.append((o, ht, {n: t.grad for n, t in leaves.items()}))
    (o_c, ht_c, grads_c), (o_r, ht_r, grads_r) = results
    torch.testing.assert_close(o_c, o_r, atol=ATOL, rtol=0)
    torch.testing.assert_close(ht_c, ht_r, atol=ATOL, rtol=0)
    for name in x:
        torch.testing.assert_close(grads_c[name], grads_r[name], atol=ATOL, rtol=0, msg=f"grad of {name}")


@pytest.mark.parametrize('l2norm', [False, True])
def test_chunk_equals_recurrent_precomputed_gate(l2norm):
    x = make_inputs(T=45)
    g = F.logsigmoid(x['a'])
    kwargs = dict(g=g, beta=x['b'].sigmoid(), use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                  state_v_first=False, initial_state=x['h0'], use_qk_l2norm_in_kernel=l2norm)
    if not l2norm:
        x['k'] = F.normalize(x['k'], dim=-1)
    o_c, ht_c = layer_call(chunk_gated_delta_rule_torch, x, chunk_size=32, **kwargs)
    o_r, ht_r = layer_call(recurrent_gated_delta_rule_torch, x, **kwargs)
    torch.testing.assert_close(o_c, o_r, atol=ATOL, rtol=0)
    torch.testing.assert_close(ht_c, ht_r, atol=ATOL, rtol=0)


@pytest.mark.parametrize('fn', [chunk_gated_delta_rule_torch, recurrent_gated_delta_rule_torch])
def test_varlen_equals_separate_sequences(fn):
    lens = [3, 40, 21]
    cu_seqlens = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    x = make_inputs(B=1, T=sum(lens), N=len(lens))
    extra = dict(chunk_size=16) if fn is chunk_gated_delta_rule_torch else {}
    o, ht = layer_call(fn, x, cu_seqlens=cu_seqlens, **extra)
    for n, (bos, eos) in enumerate(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())):
        part = {name: (t[:, bos:eos] if t.dim() >= 3 and name != 'h0' else t) for name, t in x.items()}
        part['h0'] = x['h0'][n:n + 1]
        o_n, ht_n = layer_call(fn, part, **extra)
        torch.testing.assert_close(o[:, bos:eos], o_n, atol=ATOL, rtol=0)
        torch.testing.assert_close(ht[n:n + 1], ht_n, atol=ATOL, rtol=0)


def test_dtypes_follow_the_kernels():
    x = {n: t.bfloat16() if n in ('q', 'k', 'v', 'a', 'b', 'h0') else t.float() for n, t in make_inputs().items()}
    o, ht = layer_call(chunk_gated_delta_rule_torch, x)
    assert o.dtype == torch.bfloat16 and ht.dtype == torch.float32
    assert torch.isfinite(o.float()).all()


def test_unsupported_arguments_are_named():
    x = make_inputs()
    with pytest.raises(NotImplementedError, match='gk'):
        layer_call(recurrent_gated_delta_rule_torch, x, gk=torch.zeros_like(x['q']))
    with pytest.raises(NotImplementedError, match='cp_context'):
        layer_call(chunk_gated_delta_rule_torch, x, cp_context=object())
    with pytest.raises(NotImplementedError, match='transpose_state_layout'):
        layer_call(chunk_gated_delta_rule_torch, x, transpose_state_layout=True)
    with pytest.raises(ValueError, match='allow_neg_eigval'):
        layer_call(chunk_gated_delta_rule_torch, x, allow_neg_eigval=True, use_beta_sigmoid_in_kernel=False)
    with pytest.raises(ValueError, match='num_v_heads=3'):
        layer_call(chunk_gated_delta_rule_torch, {**x, 'v': x['v'][:, :, :3]})


@pytest.mark.parametrize('T', [1, 5])
@pytest.mark.parametrize('gated', [True, False])
@pytest.mark.parametrize('v_first', [True, False])
def test_inplace_inference_scan_equals_the_autograd_scan_and_leaves_h0_alone(T, gated, v_first):
    """Inference takes the in-place recurrence (issue 20); with inputs that need gradients the functional one runs."""
    x = make_inputs(T=T)
    h0 = x['h0'].transpose(-1, -2).contiguous() if v_first else x['h0']
    kwargs = dict(initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True, state_v_first=v_first,
                  use_beta_sigmoid_in_kernel=True)
    g = x['a'] if gated else torch.zeros_like(x['a'])
    keep = h0.clone()
    o_fast, ht_fast = recurrent_gated_delta_rule_torch(x['q'], x['k'], x['v'], g=g, beta=x['b'], **kwargs)
    assert torch.equal(h0, keep)  # the caller's state is never written
    q = x['q'].clone().requires_grad_(True)
    o_ref, ht_ref = recurrent_gated_delta_rule_torch(q, x['k'], x['v'], g=g, beta=x['b'], **kwargs)
    assert ht_fast.shape == ht_ref.shape == h0.shape
    torch.testing.assert_close(o_fast, o_ref.detach(), atol=1e-12, rtol=0)
    torch.testing.assert_close(ht_fast, ht_ref.detach(), atol=1e-12, rtol=0)


@pytest.mark.parametrize('v_first', [True, False])
def test_inplace_scan_equals_the_loop_with_a_vanishing_decay(v_first):
    """A step with a gate of -80 (e^g ~ 2^-115, which an update folding e^-g into the rank-1 vector could not take)
    equals the plain S_t = e^g S_{t-1} (I - b k k^T) + b v k^T loop."""
    x = make_inputs(T=6, HV=2, H=2)
    g = -x['A_log'].exp() * F.softplus(x['a'] + x['dt_bias'])
    g[:, 3, 0] = -80.0
    beta = x['b'].sigmoid()
    q, k = (F.normalize(x[n], dim=-1, eps=0) for n in ('q', 'k'))
    h0 = x['h0'].transpose(-1, -2).contiguous() if v_first else x['h0']
    o, ht = recurrent_gated_delta_rule_torch(q, k, x['v'], g=g, beta=beta, initial_state=h0, output_final_state=True,
                                             state_v_first=v_first)
    o_loop, ht_loop = loop_gated_delta_rule(q, k, x['v'], g, beta, x['h0'], scale=q.shape[-1] ** -0.5)
    torch.testing.assert_close(o, o_loop, atol=ATOL, rtol=0)
    torch.testing.assert_close(ht.transpose(-1, -2) if v_first else ht, ht_loop, atol=ATOL, rtol=0)


def test_state_buffers_are_reused_only_once_nothing_holds_them():
    pool = StateBuffers(max_bytes=2 * 64 * 8, min_bytes=0)
    shape, cpu = torch.Size((2, 4, 8)), torch.device('cpu')
    a = pool.empty(shape, torch.float64, cpu)
    first = a.untyped_storage().data_ptr()
    view = a[1]
    del a
    b = pool.empty(shape, torch.float64, cpu)  # a view of the first is alive: a second buffer
    assert b.untyped_storage().data_ptr() != first
    del view
    c = pool.empty(shape, torch.float64, cpu)
    assert c.untyped_storage().data_ptr() == first and c.shape == shape and c.is_contiguous()
    d = pool.empty(shape, torch.float64, cpu)  # both held and max_bytes reached: a fresh buffer, not kept
    assert pool.held_bytes() == 2 * 64 * 8 and len({x.untyped_storage().data_ptr() for x in (b, c, d)}) == 3


def test_decode_states_do_not_alias_across_steps():
    """Two consecutive decode calls with pooled buffers: the second's final state is a different buffer from the
    state it read, and the first call's state, still held, is unchanged."""
    x = make_inputs(T=1, HV=2, H=2)
    kwargs = dict(output_final_state=True, use_qk_l2norm_in_kernel=True, state_v_first=True)
    STATE_BUFFERS.clear()
    pool_min = STATE_BUFFERS.min_bytes
    STATE_BUFFERS.min_bytes = 0
    try:
        _, s1 = recurrent_gated_delta_rule_torch(x['q'], x['k'], x['v'], g=-x['a'].abs(), beta=x['b'].sigmoid(),
                                                 initial_state=x['h0'].transpose(-1, -2).contiguous(), **kwargs)
        keep = s1.clone()
        _, s2 = recurrent_gated_delta_rule_torch(x['q'], x['k'], x['v'], g=-x['a'].abs(), beta=x['b'].sigmoid(),
                                                 initial_state=s1, **kwargs)
        assert s2.data_ptr() != s1.data_ptr() and torch.equal(s1, keep)
        del s1, keep
        _, s3 = recurrent_gated_delta_rule_torch(x['q'], x['k'], x['v'], g=-x['a'].abs(), beta=x['b'].sigmoid(),
                                                 initial_state=s2, **kwargs)
        assert s3.data_ptr() != s2.data_ptr()
    finally:
        STATE_BUFFERS.min_bytes = pool_min
        STATE_BUFFERS.clear()


@pytest.mark.parametrize('block_heads', [1, 4, 7, 100])
@pytest.mark.parametrize('T', [1, 6])
@pytest.mark.parametrize('gated', [True, False])
@pytest.mark.parametrize('v_first', [True, False])
def test_blocked_inplace_scan_equals_the_loop_and_the_chunked_form(block_heads, T, gated, v_first, monkeypatch):
    """The in-place recurrence runs over blocks of `block_heads` head states (issue 20): blocks of one head, blocks
    that do not divide B * HV = 15 (last blocks of 3 and of 1 heads), one block for all. It equals the plain loop and
    the chunked form at 1e-10 in float64 and leaves h0 alone."""
    x = make_inputs(B=5, T=T, H=3, HV=3, K=8, V=6)
    monkeypatch.setattr(delta_rule, 'STATE_BLOCK_BYTES', block_heads * 8 * 6 * 8)
    g = -x['A_log'].exp() * F.softplus(x['a'] + x['dt_bias']) if gated else torch.zeros_like(x['a'])
    beta = x['b'].sigmoid()
    q, k = (F.normalize(x[n], dim=-1, eps=0) for n in ('q', 'k'))
    h0 = x['h0'].transpose(-1, -2).contiguous() if v_first else x['h0']
    keep = h0.clone()
    kwargs = dict(initial_state=h0, output_final_state=True, state_v_first=v_first)
    o, ht = recurrent_gated_delta_rule_torch(q, k, x['v'], g=g if gated else None, beta=beta, **kwargs)
    assert torch.equal(h0, keep)
    o_loop, ht_loop = loop_gated_delta_rule(q, k, x['v'], g, beta, x['h0'], scale=8 ** -0.5)
    o_chunk, ht_chunk = chunk_gated_delta_rule_torch(q, k, x['v'], g, beta, chunk_size=4, **kwargs)
    for o_ref, ht_ref in ((o_loop, ht_loop.transpose(-1, -2) if v_first else ht_loop), (o_chunk, ht_chunk)):
        torch.testing.assert_close(o, o_ref, atol=ATOL, rtol=0)
        torch.testing.assert_close(ht, ht_ref, atol=ATOL, rtol=0)


class StorageSizes(TorchDispatchMode):
    """Bytes of every storage an op returns inside the block (views and inputs returned as they are included), by data
    pointer."""

    def __init__(self):
        super().__init__()
        self.sizes: dict[int, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.sizes[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return out


@pytest.mark.parametrize('gated', [True, False])
def test_decode_step_makes_no_state_sized_temporary(gated, monkeypatch):
    """With the buffer pool warm, a decode step (blocks of 3 of the 8 head states) returns no storage of a quarter of
    the state or more except h0's own (its views) and its final state, which is the pool's buffer again (issue 20)."""
    x = make_inputs(B=4, T=1, H=2, HV=2, K=32, V=32)
    h0 = x['h0'].transpose(-1, -2).contiguous()  # 64 KiB; the per-token operands are 4 KiB
    monkeypatch.setattr(delta_rule, 'STATE_BLOCK_BYTES', 3 * 32 * 32 * 8)
    monkeypatch.setattr(STATE_BUFFERS, 'min_bytes', 0)
    kwargs = dict(g=-x['a'].abs() if gated else None, beta=x['b'].sigmoid(), initial_state=h0, output_final_state=True,
                  use_qk_l2norm_in_kernel=True, state_v_first=True)
    STATE_BUFFERS.clear()
    try:
        _, first = recurrent_gated_delta_rule_torch(x['q'], x['k'], x['v'], **kwargs)
        pooled = first.untyped_storage().data_ptr()
        del first
        with StorageSizes() as seen:
            _, ht = recurrent_gated_delta_rule_torch(x['q'], x['k'], x['v'], **kwargs)
        assert ht.untyped_storage().data_ptr() == pooled
        assert {p for p, n in seen.sizes.items() if n >= h0.nbytes // 4} == {pooled, h0.untyped_storage().data_ptr()}
    finally:
        STATE_BUFFERS.clear()
