"""Pure-torch delta rule, matching fla 0.6.0's `chunk_delta_rule` and `fused_recurrent_delta_rule`.

Recurrence per head, state h [K, V] (the transpose of S in S_t = S_{t-1}(I - b k k^T) + b v k^T):
    h_t = exp(g_t) h_{t-1} + k_t u_t^T,   u_t = b_t (v_t - exp(g_t) h_{t-1}^T k_t),   o_t = scale h_t^T q_t
with g = 0 for the plain delta rule. `run_delta_rule` is shared with the gated variant.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from state_reduction.backend.fused_cpu import fused_recurrent_scan, selected_kernel

L2NORM_EPS = 1e-6


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The kernels accumulate in float32; float64 inputs stay float64 so references can be checked tightly."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def l2norm(x: torch.Tensor) -> torch.Tensor:
    # fla: x / sqrt(sum(x^2) + eps), not F.normalize's x / max(|x|, eps)
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + L2NORM_EPS)


def reject_kwargs(function: str, kwargs: dict) -> None:
    if kwargs:
        raise NotImplementedError(
            f"{function}: the CPU reference does not support argument(s) {sorted(kwargs)}; "
            f"only what fla's DeltaNet/GatedDeltaNet layers pass is implemented."
        )


def _pack_to_batch(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    # [1, sum(T_n), ...] -> [N, max(T_n), ...], zeros after each sequence's end
    out = x.new_zeros(*valid.shape, *x.shape[2:])
    out[valid] = x[0]
    return out


def _chunk_scan(q, k, v, beta, g, h0, scale: float, chunk_size: int):
    """q, k: [B, H, T, K]; v: [B, H, T, V]; beta, g (log-decay or None): [B, H, T]; h0: [B, H, K, V].

    T is a multiple of chunk_size. Within a chunk (UT transform), with G the cumulative log-decay:
        (I + L) U = b V - diag(b exp(G)) K h0,   L_ij = b_i exp(G_i - G_j) k_i.k_j  (i > j)
        O = scale (exp(G) Q h0 + (Q K^T * D) U),  D_ij = exp(G_i - G_j)  (i >= j)
        h_end = exp(G_C) h0 + (exp(G_C - G) K)^T U
    Everything except the h0-dependent terms is computed for all chunks at once.
    """
    B, H, T, K = q.shape
    C = chunk_size
    N = T // C
    q, k, v = (x.reshape(B, H, N, C, x.shape[-1]) for x in (q, k, v))
    beta = beta.reshape(B, H, N, C, 1)
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    strict = causal.tril(-1)

    kk = k @ k.transpose(-1, -2)  # [B, H, N, C, C]
    qk = q @ k.transpose(-1, -2)
    if g is None:
        q_read, k_read, k_write, chunk_decay = q, k, k, None
    else:
        G = g.reshape(B, H, N, C).cumsum(-1)
        # masked before exp: the upper triangle would overflow and poison gradients
        decay = (G[..., :, None] - G[..., None, :]).masked_fill(~causal, float('-inf')).exp()
        kk, qk = kk * decay, qk * decay
        q_read = q * G.exp()[..., None]
        k_read = k * G.exp()[..., None]
        k_write = k * (G[..., -1:] - G).exp()[..., None]
        chunk_decay = G[..., -1].exp()[..., None, None]  # [B, H, N, 1, 1]

    system = (beta * kk).masked_fill(~strict, 0)
    u0 = torch.linalg.solve_triangular(system, beta * v, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, beta * k_read, upper=False, unitriangular=True)
    attn = qk.masked_fill(~causal, 0) * scale
    q_read = q_read * scale

    h = h0
    outputs = []
    for n in range(N):
        u = u0[:, :, n] - w[:, :, n] @ h
        outputs.append(q_read[:, :, n] @ h + attn[:, :, n] @ u)
        h = h if chunk_decay is None else h * chunk_decay[:, :, n]
        h = h + k_write[:, :, n].transpose(-1, -2) @ u
    return torch.stack(outputs, dim=2).reshape(B, H, T, -1), h


def _recurrent_scan(q, k, v, beta, g, h0, scale: float):
    """Token by token; same shapes as `_chunk_scan`, any T."""
    h = h0
    outputs = []
    for t in range(q.shape[2]):
        if g is not None:
            h = h * g[:, :, t, None, None].exp()
        k_t = k[:, :, t]
        u = beta[:, :, t, None] * (v[:, :, t] - torch.einsum('bhk,bhkv->bhv', k_t, h))
        h = h + k_t[..., :, None] * u[..., None, :]
        outputs.append(torch.einsum('bhk,bhkv->bhv', q[:, :, t] * scale, h))
    return torch.stack(outputs, dim=2), h


class StateBuffers:
    """Final-state buffers for the in-place recurrence, kept for reuse once the caller has let go of them.

    fla's CUDA kernels take a fresh final state from torch's caching allocator at no cost; on CPU a fresh state above
    glibc's mmap threshold (at most 32 MiB) is a fresh mapping, and faulting it in cost ~90 ms of a 125 ms decode step
    at batch 64, d_k 128 (issue 20). A buffer is handed out again only when no tensor or view of it is left (its
    storage's use count is the pool's own reference), so reuse never aliases a live state. At most `max_bytes` are
    kept; smaller states than `min_bytes` come from glibc's heap anyway."""

    def __init__(self, max_bytes: int = 512 << 20, min_bytes: int = 4 << 20):
        self.max_bytes, self.min_bytes = max_bytes, min_bytes
        self._storages: list[torch.UntypedStorage] = []

    def empty(self, shape: torch.Size, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < self.min_bytes or device.type != 'cpu':
            return torch.empty(shape, dtype=dtype, device=device)
        for storage in self._storages:
            if storage.nbytes() == nbytes and torch._C._storage_Use_Count(storage._cdata) == 1:
                return torch.empty(0, dtype=dtype, device=device).set_(storage, 0, shape)
        out = torch.empty(shape, dtype=dtype, device=device)
        if self.held_bytes() + nbytes <= self.max_bytes:
            self._storages.append(out.untyped_storage())
        return out

    def held_bytes(self) -> int:
        return sum(s.nbytes() for s in self._storages)

    def clear(self) -> None:
        self._storages.clear()


STATE_BUFFERS = StateBuffers()
# bytes of state per block of the in-place recurrence: a block is decayed, read and updated while it sits in the core's
# cache (2 MiB of L2 per core on the machine it was measured on); 1 MiB ran best of 256 KiB - 2 MiB at d_k 128/64/32
# (issue 20 part 3, experiments/speed/README.md)
STATE_BLOCK_BYTES = 1 << 20


def _recurrent_scan_inplace(q, k, v, beta, g, h0, scale: float, v_first: bool, block_bytes: int | None = None):
    """`_recurrent_scan` for inference (no autograd), in the state's own layout (h0 [B, H, K, V], or [B, H, V, K]
    if v_first) and without state-sized temporaries (issue 20). The B*H head states are processed in blocks of about
    `block_bytes` (default `STATE_BLOCK_BYTES`); per block and token, while the block stays in cache:
        h <- e^g h (g = 0 for the plain delta rule; the first token copies h0 into the buffer on the way),
        [u; r] = [b v; 0] + [-b k, scale q]^T h   (one baddbmm: u = b (v - h^T k), r = scale h^T q),
        h <- h + k u^T (in place),
        o = r + (scale q.k) u.
    The caller's h0 is never written; the final state comes from `STATE_BUFFERS`. State traffic per token from
    memory: one read and one write, as a copy; the other passes hit the cache."""
    B, H, T, K = q.shape
    V = v.shape[-1]
    BH = B * H
    h = STATE_BUFFERS.empty(h0.shape, h0.dtype, h0.device)  # [B, H, K, V] or [B, H, V, K], contiguous
    dst = h.view(BH, *h.shape[2:])
    src = h0.reshape(BH, *h0.shape[2:])
    if T == 0:
        return q.new_empty(B, H, 0, V), h.copy_(h0)

    q_t, k_t, v_t = (x.permute(2, 0, 1, 3) for x in (q, k, v))  # [T, B, H, *]: a block of heads is a slice of a token
    beta_t = beta.permute(2, 0, 1)[..., None]  # [T, B, H, 1]
    lhs = q.new_empty(T, B, H, 2, K)  # [-b k, scale q]
    torch.mul(k_t, -beta_t, out=lhs[..., 0, :])
    torch.mul(q_t, scale, out=lhs[..., 1, :])
    read = q.new_empty(T, B, H, 2, V)  # [b v; 0], accumulated in place into [u; r]
    torch.mul(v_t, beta_t, out=read[..., 0, :])
    read[..., 1, :].zero_()
    qk = (lhs[..., 1, :] * k_t).sum(-1, keepdim=True).view(T, BH, 1)  # scale q.k
    lhs, read = lhs.view(T, BH, 2, K), read.view(T, BH, 2, V)
    u = read[:, :, 0]
    k_t = k_t.reshape(T, BH, K)
    rank1 = (u[..., None], k_t[:, :, None, :]) if v_first else (k_t[..., None], u[:, :, None, :])
    decay = None if g is None else g.permute(2, 0, 1).exp().reshape(T, BH, 1, 1)

    block_bytes = STATE_BLOCK_BYTES if block_bytes is None else block_bytes
    n = max(1, min(BH, block_bytes // (math.prod(dst.shape[1:]) * dst.element_size())))  # heads per block
    as_kv = (lambda x: x.mT) if v_first else (lambda x: x)  # the state as [K, V] for the read
    src_b, dst_b, dst_kv = src.split(n), dst.split(n), as_kv(dst).split(n)
    per_token = [tuple(x[t].split(n) for x in (lhs, read, *rank1)) + (() if decay is None else (decay[t].split(n),))
                 for t in range(T)]
    for j in range(len(dst_b)):
        for t, (lhs_b, read_b, left_b, right_b, *decay_b) in enumerate(per_token):
            # the first token brings the block from h0 into the buffer (the one pass from memory, a copy or a
            # decayed copy); reading h0 directly in the baddbmm instead ran 1.1-1.2x slower at d_k 128
            if t == 0 and decay_b:
                torch.mul(src_b[j], decay_b[0][j], out=dst_b[j])
            elif t == 0:
                dst_b[j].copy_(src_b[j])
            elif decay_b:
                dst_b[j].mul_(decay_b[0][j])
            read_b[j].baddbmm_(lhs_b[j], dst_kv[j])
            dst_b[j].baddbmm_(left_b[j], right_b[j])  # rank 1; ran 1.4x faster than addcmul_ at d_k 64 in cache
    out = torch.addcmul(read[:, :, 1], qk, u)  # [T, BH, V]
    return out.view(T, B, H, V).permute(1, 2, 0, 3), h


def run_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None,
    *,
    function: str,
    scale: float | None,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    use_qk_l2norm_in_kernel: bool,
    cu_seqlens: torch.Tensor | None,
    state_v_first: bool = False,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Shared driver. q, k: [B, T, H, K]; v: [B, T, HV, V]; beta, g (already in log space): [B, T, HV] in
    compute dtype; initial_state: [N, HV, K, V] ([N, HV, V, K] if state_v_first). chunk_size None: recurrent.
    Returns o [B, T, HV, V] and the final state, both in compute dtype."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if k.shape[2] != H:
        raise ValueError(f"{function}: q and k need the same number of heads, got {H} and {k.shape[2]}.")
    if HV % H != 0:
        raise ValueError(f"{function}: num_v_heads={HV} must be a multiple of num_heads={H}.")
    if beta.dim() != 3:
        raise NotImplementedError(
            f"{function}: only head-wise beta of shape [B, T, HV] is supported, got {tuple(beta.shape)}."
        )
    if cu_seqlens is not None and B != 1:
        raise ValueError(f"{function}: with cu_seqlens the batch size must be 1 (packed sequences), got {B}.")
    n_seq = B if cu_seqlens is None else len(cu_seqlens) - 1
    if initial_state is not None and initial_state.shape[0] != n_seq:
        raise ValueError(f"{function}: initial_state has {initial_state.shape[0]} states for {n_seq} sequences.")

    inference = not (torch.is_grad_enabled() and any(x is not None and x.requires_grad
                                                     for x in (q, k, v, beta, g, initial_state)))
    fused = chunk_size is None and inference and q.device.type == "cpu" and selected_kernel() == "fused"
    dtype = compute_dtype(q.dtype)
    q, k, v = (x.to(dtype) for x in (q, k, v))
    if use_qk_l2norm_in_kernel and not fused:  # the fused step normalises q and k rows itself (it commutes with GVA)
        q, k = l2norm(q), l2norm(k)
    if HV != H:
        # GVA: value head i reads key/query head i // (HV // H)
        q, k = (x.repeat_interleave(HV // H, dim=2) for x in (q, k))
    scale = K ** -0.5 if scale is None else scale

    if cu_seqlens is not None:
        lens = cu_seqlens.diff().to(q.device)
        valid = torch.arange(int(lens.max()), device=q.device)[None, :] < lens[:, None]  # [N, T_max]
        q, k, v, beta = (_pack_to_batch(x, valid) for x in (q, k, v, beta))
        g = None if g is None else _pack_to_batch(g, valid)
    # zero padding (beta = 0, g = 0) leaves the state untouched, so final states stay exact
    length = q.shape[1]
    pad = 0 if chunk_size is None else -length % chunk_size

    def pad_time(x):  # F.pad copies even when it pads nothing (5 copies per decode step)
        return F.pad(x, (0, 0) * (x.dim() - 2) + (0, pad)) if pad else x

    q, k, v = (pad_time(x).transpose(1, 2) for x in (q, k, v))  # [B, HV, T, K]
    beta = pad_time(beta).transpose(1, 2)  # [B, HV, T]
    g = None if g is None else pad_time(g).transpose(1, 2)

    if initial_state is None:
        h0 = q.new_zeros(q.shape[0], HV, V, K) if state_v_first else q.new_zeros(q.shape[0], HV, K, V)
    else:
        h0 = initial_state.to(dtype)

    if chunk_size is None and inference:
        if fused:
            ht = STATE_BUFFERS.empty(h0.shape, h0.dtype, h0.device)
            o, ht = fused_recurrent_scan(q, k, v, beta, g, h0, scale, state_v_first, ht,
                                         l2norm_eps=L2NORM_EPS if use_qk_l2norm_in_kernel else None)
        else:
            o, ht = _recurrent_scan_inplace(q, k, v, beta, g, h0, scale, v_first=state_v_first)
        state_v_first = False  # ht is already in the caller's layout
    else:
        h0 = h0.transpose(-1, -2) if state_v_first else h0
        if chunk_size is None:
            o, ht = _recurrent_scan(q, k, v, beta, g, h0, scale)
        else:
            o, ht = _chunk_scan(q, k, v, beta, g, h0, scale, chunk_size)

    o = o.transpose(1, 2)[:, :length]  # [B, T, HV, V]
    if cu_seqlens is not None:
        o = o[valid].unsqueeze(0)
    final_state = None
    if output_final_state:
        final_state = ht.transpose(-1, -2).contiguous() if state_v_first else ht
    return o, final_state


def chunk_delta_rule_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_cpu: torch.Tensor | None = None,
    chunk_size: int = 64,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked (WY/UT) delta rule. q, k: [B, T, H, K]; v: [B, T, H, V]; beta: [B, T, H];
    initial_state: [N, H, K, V]. Returns o [B, T, H, V] in q's dtype and the final state (compute dtype) or None."""
    reject_kwargs('chunk_delta_rule', kwargs)
    o, ht = run_delta_rule(
        q, k, v, beta.to(compute_dtype(q.dtype)), None,
        function='chunk_delta_rule',
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens=cu_seqlens,
        chunk_size=chunk_size,
    )
    return o.to(q.dtype), ht


def recurrent_delta_rule_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-by-token delta rule with `chunk_delta_rule_torch`'s shapes; beta None means beta = 1."""
    beta = torch.ones_like(q[..., 0]) if beta is None else beta
    o, ht = run_delta_rule(
        q, k, v, beta.to(compute_dtype(q.dtype)), None,
        function='fused_recurrent_delta_rule',
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens=cu_seqlens,
    )
    return o.to(q.dtype), ht
