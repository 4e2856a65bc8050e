"""Pure-torch gated delta rule, matching fla 0.6.0's `chunk_gated_delta_rule` and
`fused_recurrent_gated_delta_rule` with the options fla's GatedDeltaNet layer passes: in-kernel q/k L2 norm,
in-kernel gate (g = -exp(A_log) * softplus(g + dt_bias)), in-kernel sigmoid beta (x2 with allow_neg_eigval),
grouped value heads (GVA), V-first state layout and varlen `cu_seqlens`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from state_reduction.backend.delta_rule import compute_dtype, reject_kwargs, run_delta_rule


def _prepare_gate_and_beta(
    function: str,
    g: torch.Tensor | None,
    beta: torch.Tensor,
    dtype: torch.dtype,
    use_gate_in_kernel: bool,
    A_log: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    use_beta_sigmoid_in_kernel: bool,
    allow_neg_eigval: bool,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    # g, beta: [B, T, HV]; A_log, dt_bias: [HV]
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError(f"{function}: allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True.")
    if use_gate_in_kernel:
        if A_log is None or g is None:
            raise ValueError(f"{function}: use_gate_in_kernel=True needs both the raw gate `g` and `A_log`.")
        g = g.to(dtype)
        if dt_bias is not None:
            g = g + dt_bias.to(dtype)
        g = -A_log.to(dtype).exp() * F.softplus(g)
    elif g is not None:
        g = g.to(dtype)
    beta = beta.to(dtype)
    if use_beta_sigmoid_in_kernel:
        beta = beta.sigmoid() * (2.0 if allow_neg_eigval else 1.0)
    return g, beta


def chunk_gated_delta_rule_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_cpu: torch.Tensor | None = None,
    chunk_indices: torch.Tensor | None = None,
    cp_context=None,
    use_gate_in_kernel: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    chunk_size: int = 64,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked gated delta rule. q, k: [B, T, H, K]; v: [B, T, HV, V]; g, beta: [B, T, HV] (g in log space unless
    use_gate_in_kernel); initial_state: [N, HV, K, V] or [N, HV, V, K] with state_v_first.
    Returns o [B, T, HV, V] in q's dtype and the final state (compute dtype, same layout) or None."""
    reject_kwargs('chunk_gated_delta_rule', kwargs)
    if cp_context is not None:
        raise NotImplementedError("chunk_gated_delta_rule: the CPU reference does not support cp_context.")
    dtype = compute_dtype(q.dtype)
    g, beta = _prepare_gate_and_beta(
        'chunk_gated_delta_rule', g, beta, dtype, use_gate_in_kernel, A_log, dt_bias,
        use_beta_sigmoid_in_kernel, allow_neg_eigval,
    )
    o, ht = run_delta_rule(
        q, k, v, beta, g,
        function='chunk_gated_delta_rule',
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens=cu_seqlens,
        state_v_first=state_v_first,
        chunk_size=chunk_size,
    )
    return o.to(q.dtype), ht


def recurrent_gated_delta_rule_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None = None,
    gk: torch.Tensor | None = None,
    gv: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-by-token gated delta rule with `chunk_gated_delta_rule_torch`'s shapes; g None means no decay,
    beta None means beta = 1."""
    reject_kwargs('fused_recurrent_gated_delta_rule', kwargs)
    for name, value in (('gk', gk), ('gv', gv)):
        if value is not None:
            raise NotImplementedError(
                f"fused_recurrent_gated_delta_rule: the CPU reference does not support `{name}` (per-channel decay)."
            )
    dtype = compute_dtype(q.dtype)
    beta = torch.ones_like(v[..., 0]) if beta is None else beta
    g, beta = _prepare_gate_and_beta(
        'fused_recurrent_gated_delta_rule', g, beta, dtype, use_gate_in_kernel, A_log, dt_bias,
        use_beta_sigmoid_in_kernel, allow_neg_eigval,
    )
    o, ht = run_delta_rule(
        q, k, v, beta, g,
        function='fused_recurrent_gated_delta_rule',
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens=cu_seqlens,
        state_v_first=state_v_first,
    )
    return o.to(q.dtype), ht
