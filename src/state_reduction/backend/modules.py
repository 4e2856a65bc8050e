"""Pure-torch versions of the fla 0.6.0 module kernels that DeltaNet/GatedDeltaNet models call: causal short
convolution (full sequence, varlen and single-token update), RMSNorm (with fused residual), gated RMSNorm,
swiglu (+ fused down projection), the Triton activations and the fused cross-entropy losses.

Each function keeps the signature of the fla function or module `forward` it stands in for, computes in float32
(float64 stays float64) and returns the input dtype, like the kernels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from state_reduction.backend.delta_rule import compute_dtype


def _activate(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation is None:
        return y
    if activation in ('silu', 'swish'):
        return F.silu(y)
    raise NotImplementedError(f"causal_conv1d: activation {activation!r} is not supported; use 'silu'/'swish' or None.")


def _conv_dense(x, weight, bias, initial_state, activation):
    # x: [B, T, D]; weight: [D, W]; initial_state: [B, D, W] (the last W inputs, oldest first) -> y [B, T, D], window
    B, T, D = x.shape
    W = weight.shape[1]
    history = x.new_zeros(B, D, W) if initial_state is None else initial_state.to(x.dtype)
    window = torch.cat([history, x.transpose(1, 2)], dim=-1)  # [B, D, W + T]
    y = F.conv1d(window[..., 1:], weight[:, None, :], bias, groups=D)  # [B, D, T]
    return _activate(y, activation).transpose(1, 2), window[..., -W:]


def causal_conv1d_torch(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool | None = False,
    activation: str | None = None,
    backend: str | None = 'triton',
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_cpu: torch.Tensor | None = None,
    chunk_indices: torch.Tensor | None = None,
    cp_context=None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fla `causal_conv1d`: depthwise causal conv. x: [B, T, D] (B = 1 with cu_seqlens); weight: [D, W];
    initial_state: [N, D, W]. Returns y [B, T, D] and, if requested, the final state [N, D, W] (last W inputs)."""
    if cp_context is not None:
        raise NotImplementedError("causal_conv1d: the CPU reference does not support cp_context.")
    if weight is None:
        raise NotImplementedError("causal_conv1d: the CPU reference needs `weight`.")
    if kwargs.get('seq_idx') is not None:
        raise NotImplementedError("causal_conv1d: the CPU reference does not support `seq_idx`; pass cu_seqlens.")
    shape = x.shape
    if x.shape[-1] != weight.shape[0]:
        x = x.flatten(2)
    dtype = compute_dtype(x.dtype)
    xc, weight = x.to(dtype), weight.to(dtype)
    bias = None if bias is None else bias.to(dtype)

    if cu_seqlens is None:
        y, final_state = _conv_dense(xc, weight, bias, initial_state, activation)
    else:
        if x.shape[0] != 1:
            raise ValueError(f"causal_conv1d: with cu_seqlens the batch size must be 1, got {x.shape[0]}.")
        bounds = cu_seqlens.tolist()
        ys, states = [], []
        for n, (bos, eos) in enumerate(zip(bounds[:-1], bounds[1:])):
            h0 = None if initial_state is None else initial_state[n:n + 1]
            y_n, state_n = _conv_dense(xc[:, bos:eos], weight, bias, h0, activation)
            ys.append(y_n)
            states.append(state_n)
        y, final_state = torch.cat(ys, dim=1), torch.cat(states, dim=0)

    if residual is not None:
        y = y + residual.to(dtype)
    final_state = final_state.to(x.dtype) if output_final_state else None
    return y.to(x.dtype).view(shape), final_state


def causal_conv1d_update_torch(
    x: torch.Tensor,
    cache: torch.Tensor,
    residual: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fla `causal_conv1d_update`: one token per sequence. x: [N, D], [1, N, D] or [N, 1, D]; cache: [N, D, W],
    shifted in place by one token like the kernel. Returns (y shaped like x, cache)."""
    if weight is None:
        raise NotImplementedError("causal_conv1d_update: the CPU reference needs `weight`.")
    shape = x.shape
    D = weight.shape[0]
    dtype = compute_dtype(x.dtype)
    x_t = x.reshape(-1, D)  # [N, D]
    window = torch.cat([cache[..., 1:].to(dtype), x_t.to(dtype)[..., None]], dim=-1)  # [N, D, W]
    y = (window * weight.to(dtype)).sum(-1)
    if bias is not None:
        y = y + bias.to(dtype)
    y = _activate(y, activation)
    if residual is not None:
        y = y + residual.reshape(-1, D).to(dtype)
    with torch.no_grad():
        cache.copy_(window)
    return y.to(x.dtype).view(shape), cache


def _rms_norm(x, weight, bias, residual, eps):
    # in compute dtype: (normalised output, residual stream x + residual)
    dtype = compute_dtype(x.dtype)
    h = x.to(dtype)
    if residual is not None:
        h = h + residual.to(dtype)
    y = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(dtype)
    if bias is not None:
        y = y + bias.to(dtype)
    return y, h


def _residual_out(h, x, residual, residual_in_fp32):
    if residual is not None:
        return h.to(residual.dtype)
    return h.to(torch.promote_types(x.dtype, torch.float32) if residual_in_fp32 else x.dtype)


def rms_norm_torch(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None = None,
    eps: float = 1e-5,
    prenorm: bool = False,
    residual_in_fp32: bool = False,
):
    """fla `rms_norm` (used by fla RMSNorm.forward): y = x / rms(x) * weight + bias, with x += residual first;
    prenorm also returns the summed residual stream."""
    y, h = _rms_norm(x, weight, bias, residual, eps)
    y = y.to(x.dtype)
    return (y, _residual_out(h, x, residual, residual_in_fp32)) if prenorm else y


def rms_norm_gated_torch(
    x: torch.Tensor,
    g: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    activation: str = 'swish',
    residual: torch.Tensor | None = None,
    prenorm: bool = False,
    residual_in_fp32: bool = False,
    eps: float = 1e-6,
):
    """fla `rms_norm_gated` (FusedRMSNormGated.forward): rms_norm(x) * act(g), act swish/silu or sigmoid."""
    if activation not in ('swish', 'silu', 'sigmoid'):
        raise NotImplementedError(f"rms_norm_gated: activation {activation!r} is not 'swish', 'silu' or 'sigmoid'.")
    y, h = _rms_norm(x, weight, bias, residual, eps)
    gate = g.to(y.dtype)
    y = (y * (gate.sigmoid() if activation == 'sigmoid' else F.silu(gate))).to(x.dtype)
    return (y, _residual_out(h, x, residual, residual_in_fp32)) if prenorm else y


def swiglu_torch(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """fla `swiglu`: silu(x) * y."""
    dtype = compute_dtype(x.dtype)
    return (F.silu(x.to(dtype)) * y.to(dtype)).to(x.dtype)


def swiglu_linear_torch(
    x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
) -> torch.Tensor:
    """fla `swiglu_linear`: the GatedMLP down projection fused with swiglu (fuse_swiglu=True)."""
    return F.linear(swiglu_torch(x, y), weight, bias)


def _elementwise(fn):
    def apply(x: torch.Tensor) -> torch.Tensor:
        return fn(x.to(compute_dtype(x.dtype))).to(x.dtype)
    return apply


swish_torch = _elementwise(F.silu)
sigmoid_torch = _elementwise(torch.sigmoid)
elu_p1_torch = _elementwise(lambda x: F.elu(x) + 1.0)


def logsigmoid_torch(x: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    return (F.logsigmoid(x.to(compute_dtype(x.dtype))) / temperature).to(x.dtype)


def _reject_loss_options(name: str, options: dict) -> None:
    used = [key for key, value in options.items() if value]
    if used:
        raise NotImplementedError(f"{name}: the CPU path is plain torch cross-entropy and does not support {used}.")


def fused_cross_entropy_forward_torch(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """FusedCrossEntropyLoss.forward on CPU: F.cross_entropy on [N, V] logits, float32 (float64 stays float64)."""
    _reject_loss_options('FusedCrossEntropyLoss', {
        'lse_square_scale': self.lse_square_scale,
        'logit_softcapping': self.logit_softcapping,
        'process_group': self.process_group,
        'return_z_loss': self.return_z_loss,
    })
    logits = input.to(compute_dtype(input.dtype))
    if self.logit_scale != 1.0:
        logits = logits * self.logit_scale
    return F.cross_entropy(
        logits, target, ignore_index=self.ignore_index, reduction=self.reduction, label_smoothing=self.label_smoothing,
    )


def fused_linear_cross_entropy_forward_torch(
    self, x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """FusedLinearCrossEntropyLoss.forward on CPU: logits = x W^T + b, then F.cross_entropy."""
    _reject_loss_options('FusedLinearCrossEntropyLoss', {
        'logit_softcapping': self.logit_softcapping,
        'use_l2warp': self.use_l2warp,
        'process_group': self.process_group,
    })
    if weight.dtype != x.dtype:  # a bf16 head kept in storage for fp32 compute (backend.vocabulary)
        weight, bias = weight.to(x.dtype), None if bias is None else bias.to(x.dtype)
    logits = F.linear(x.reshape(-1, x.shape[-1]), weight, bias)
    logits = logits.to(compute_dtype(logits.dtype))
    if self.logit_scale != 1.0:
        logits = logits * self.logit_scale
    return F.cross_entropy(
        logits, target.reshape(-1), ignore_index=self.ignore_index, reduction=self.reduction,
        label_smoothing=self.label_smoothing,
    )
