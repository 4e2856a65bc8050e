"""Similarity of the learned q/k short-conv filters within and across heads (paper Figure 7)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from state_reduction.pruning.types import KeyChannelAdapter


def qk_conv_filters(adapter: KeyChannelAdapter, mixer: nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(q filters, k filters), each [H, K, W]; None when the mixer has no q/k short conv."""
    w_q, _ = adapter.qk_weights(mixer)
    heads, k = w_q.shape[:2]
    layout = getattr(adapter, "layout", None)
    if layout is not None:  # fla: separate q/k convs
        if not getattr(mixer, "use_short_conv", False):
            return None
        q, kk = getattr(mixer, layout.q_conv).weight, getattr(mixer, layout.k_conv).weight  # [H*K, 1, W]
        return q.detach().reshape(heads, k, -1), kk.detach().reshape(heads, k, -1)
    conv = getattr(mixer, adapter.conv)
    sizes = adapter.conv_segments(mixer)
    w = conv.weight.detach()[:, 0]  # [C, W]
    seg = lambda i: w[sum(sizes[:i]):sum(sizes[:i + 1])].reshape(heads, k, -1)
    return seg(adapter.q_conv_segment), seg(adapter.k_conv_segment)


def filter_similarity(filters: torch.Tensor) -> dict:
    """filters [H, K, W] -> cosine similarities: mean over distinct channel pairs within each head, and the
    mean over pairs from different heads. A zero filter has no direction and is left out."""
    heads, k, _ = filters.shape
    flat = filters.double().reshape(heads * k, -1)
    alive = flat.norm(dim=-1) > 0
    cos = F.normalize(flat, dim=-1) @ F.normalize(flat, dim=-1).T
    head_of = torch.arange(heads).repeat_interleave(k)
    pair = alive[:, None] & alive[None, :] & ~torch.eye(heads * k, dtype=torch.bool)
    same = head_of[:, None] == head_of[None, :]
    within = []
    for h in range(heads):
        m = pair & same & (head_of[:, None] == h)
        within.append(float(cos[m].mean()) if m.any() else None)
    across = pair & ~same
    return {"within_head": within, "across_heads": float(cos[across].mean()) if across.any() else None,
            "dead_filters": int((~alive).sum())}
