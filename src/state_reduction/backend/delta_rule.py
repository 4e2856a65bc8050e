"""Pure-torch delta rule, matching fla 0.6.0's `chunk_delta_rule` and `fused_recurrent_delta_rule`.

Recurrence per head, state h [K, V] (the transpose of S in S_t = S_{t-1}(I - b k k^T) + b v k^T):
    h_t = exp(g_t) h_{t-1} + k_t u_t^T,   u_t = b_t (v_t - exp(g_t) h_{t-1}^T k_t),   o_t = scale h_t^T q_t
with g = 0 for the plain delta rule. `run_delta_rule` is shared with the gated variant.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

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
# below it e^-g would leave float32's range (2^-126..2^127) once multiplied by the rank-1 vector
MIN_FOLDED_DECAY = 2.0 ** -60


def _recurrent_scan_inplace(q, k, v, beta, g, h0, scale: float, v_first: bool):
    """`_recurrent_scan` for inference (no autograd), in the state's own layout (h0 [B, H, K, V], or [B, H, V, K]
    if v_first) and without state-sized temporaries (issue 20). Per token the state is read once (k^T h and q^T h
    in one batched product), then decayed and updated by a rank-1 product in place; the caller's h0 is never written
    (the first token writes a buffer from `STATE_BUFFERS`):
        r = [k, scale q]^T h_{t-1},   u = b (v - e^g r_k),   h_t = e^g h_{t-1} + k u^T,   o = e^g r_q + (scale q.k) u
    State traffic per token: 3 passes (delta rule: read, then read+write) or 5 (gated: one more read+write)."""
    B, H, T, K = q.shape
    V = v.shape[-1]
    h = STATE_BUFFERS.empty(h0.shape, h0.dtype, h0.device)  # [B, H, K, V] or [B, H, V, K], contiguous
    flat = h.view(B * H, *h.shape[2:])
    src = h0.reshape(B * H, *h0.shape[2:])
    # [k, scale q] as rows: the read below multiplies by their transpose, the layout MKL's batched gemv-like gemm
    # reads at copy speed (the column layout [K, 2] ran 2-3x slower)
    kq = torch.stack((k, q * scale), dim=3).reshape(B * H, T, 2, K)
    out = q.new_empty(B, H, T, V)
    for t in range(T):
        rows_kq = kq[:, t]  # [BH, 2, K]
        read = (src @ rows_kq.transpose(-1, -2)).transpose(-1, -2) if v_first else rows_kq @ src  # [BH, 2, V]
        read = read.view(B, H, 2, V)
        k_t = k[:, :, t]
        decay = None if g is None else g[:, :, t].exp()[..., None]  # [B, H, 1]
        if decay is not None:
            read = read * decay[..., None]
        u = beta[:, :, t, None] * (v[:, :, t] - read[:, :, 0])  # [B, H, V]
        fold = decay is not None and bool(decay.min() >= MIN_FOLDED_DECAY)
        # folded: h_t = e^g (h_{t-1} + k (e^-g u)^T), one addcmul and one in-place scaling, which ran 1.5-2x faster
        # than a broadcast mul into the buffer followed by the rank-1 update at d_k 32 and never slower at d_k 128;
        # it costs 2 extra roundings per element
        w = u / decay if fold else u
        rows, cols = (w, k_t) if v_first else (k_t, w)
        rows, cols = rows.reshape(B * H, -1, 1), cols.reshape(B * H, 1, -1)
        if decay is not None and not fold:
            torch.mul(src, decay.reshape(B * H, 1, 1), out=flat)
            flat.addcmul_(rows, cols)
        elif t == 0:
            torch.addcmul(src, rows, cols, out=flat)
        else:
            flat.addcmul_(rows, cols)
        if fold:
            flat.mul_(decay.reshape(B * H, 1, 1))
        out[:, :, t] = read[:, :, 1] + (q[:, :, t] * scale * k_t).sum(-1, keepdim=True) * u
        src = flat
    return out, h


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

    dtype = compute_dtype(q.dtype)
    q, k, v = (x.to(dtype) for x in (q, k, v))
    if use_qk_l2norm_in_kernel:
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
    q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)).transpose(1, 2) for x in (q, k, v))  # [B, HV, T, K]
    beta = F.pad(beta, (0, 0, 0, pad)).transpose(1, 2)  # [B, HV, T]
    g = None if g is None else F.pad(g, (0, 0, 0, pad)).transpose(1, 2)

    if initial_state is None:
        h0 = q.new_zeros(q.shape[0], HV, V, K) if state_v_first else q.new_zeros(q.shape[0], HV, K, V)
    else:
        h0 = initial_state.to(dtype)
    tensors = (q, k, v, beta, h0) + (() if g is None else (g,))
    inference = not (torch.is_grad_enabled() and any(x.requires_grad for x in tensors))

    if chunk_size is None and inference:
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
