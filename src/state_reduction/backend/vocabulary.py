"""fp32 compute of a 16-bit checkpoint without an fp32 copy of its vocabulary matrices (issue 22).

A CPU fallback computes in fp32 (bf16 matmuls are ~8x slower on CPUs without native bf16), but the input
embedding and the output head need not be held in fp32 for that: Qwen3.5 9B's (248,320 x 4096, untied) are 7.6 GiB
in fp32 and 3.8 GiB in bf16. `fp32_except_vocabulary` upcasts every other weight and gives the two matrices
classes that compute in fp32 from their 16-bit storage: the embedding gathers 16-bit rows and upcasts them (the
same values as gathering from an upcast copy), the head upcasts `HEAD_ROWS` rows per matmul, in the forward and
again in the backward (`_Fp32Head`: autograd would otherwise keep every upcast block, an fp32 copy of the head).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

HEAD_ROWS = 16384  # head rows upcast per matmul: 16384 x 4096 in fp32 is 256 MiB


class _Fp32Head(torch.autograd.Function):
    """x [..., d] fp32, weight [V, d] 16-bit (frozen) -> x W^T [..., V] fp32, W upcast block by block."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(weight)
        out = x.new_empty(*x.shape[:-1], weight.shape[0])
        for i in range(0, weight.shape[0], HEAD_ROWS):
            out[..., i:i + HEAD_ROWS] = x @ weight[i:i + HEAD_ROWS].float().T
        return out

    @staticmethod
    def backward(ctx, grad):
        (weight,) = ctx.saved_tensors
        grad_x = grad.new_zeros(*grad.shape[:-1], weight.shape[1])
        for i in range(0, weight.shape[0], HEAD_ROWS):
            grad_x += grad[..., i:i + HEAD_ROWS] @ weight[i:i + HEAD_ROWS].float()
        return grad_x, None


class Fp32ComputeEmbedding(nn.Embedding):
    """An embedding stored in 16 bits that returns fp32 rows."""

    def forward(self, input):
        return super().forward(input).float()


class Fp32ComputeHead(nn.Linear):
    """An output head stored in 16 bits that computes its logits in fp32. A head that trains (weight requiring
    grad, grad mode on) upcasts its whole weight per call, so that autograd sees an ordinary linear."""

    def forward(self, x):
        x = x.float()
        bias = None if self.bias is None else self.bias.float()
        if self.weight.requires_grad and torch.is_grad_enabled():
            return F.linear(x, self.weight.float(), bias)
        out = _Fp32Head.apply(x, self.weight)
        return out if bias is None else out + bias


def vocabulary_modules(model: nn.Module) -> list[nn.Module]:
    """The input embedding and the output head (one module when they are one)."""
    found = [model.get_input_embeddings(), model.get_output_embeddings()]
    return [m for i, m in enumerate(found) if m is not None and all(m is not n for n in found[:i])]


def fp32_except_vocabulary(model: nn.Module) -> nn.Module:
    """In place: every floating parameter and buffer to fp32 except the vocabulary matrices, which keep their dtype
    and compute in fp32 (an embedding or nn.Linear head; others are upcast too)."""
    keep = {id(m) for m in vocabulary_modules(model)}
    for module in model.modules():
        if id(module) in keep and type(module) in (nn.Embedding, nn.Linear):
            module.__class__ = Fp32ComputeEmbedding if isinstance(module, nn.Embedding) else Fp32ComputeHead
            # a tensor in the checkpoint's dtype stays in its memory map, which neither memory-plan nor HeapPeak
            # counts: the process holds its own copy, as it does of every upcast weight
            module.weight.data = module.weight.data.clone()
            if getattr(module, "bias", None) is not None:
                module.bias.data = module.bias.data.float()
            continue
        for name, p in module.named_parameters(recurse=False):
            if p.is_floating_point():
                p.data = p.data.float()
        for name, b in module.named_buffers(recurse=False):
            if b is not None and b.is_floating_point():
                module._buffers[name] = b.float()
    return model
