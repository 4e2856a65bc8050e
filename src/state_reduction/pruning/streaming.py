"""Layer-streamed calibration (issue 8): the statistics of `calibration.calibrate` with one decoder block on the
compute device at a time, for models whose weights and activations do not fit there together.

The model stays on its home device (normally CPU); embeddings, final norm and lm_head move to the compute
device, the decoder blocks move there one at a time. A first pass with every block replaced by a stand-in
records each block's call (the masks, position embeddings and flags the model's own forward builds for it)
and each batch's embeddings, so no family's forward is re-implemented here.

- Forward statistics (S-Wanda, DRRQR, PCA): block by block, every batch runs through the block and its outputs,
  kept on the home device, become the next block's inputs. Device: one block's weights and one batch's
  activations inside it. Home: the hidden states of all calibration windows, [N, T, d] (the blocks' output dtype).
- Grad: batch by batch, a forward through the blocks keeps every block's input on the home device (checkpoint
  boundaries); the model's own head (final norm, lm_head, loss) on the last hidden state gives dL/dh; going back,
  each block is recomputed from its boundary with autograd on and back-propagated with the incoming gradient
  (gradient checkpointing, one block at a time). Device: one block, its autograd activations, and the head's
  logits [B, T, vocab]; home: L + 1 boundaries of one batch and the q/k gradient sums (`QKGradients`).

Every block computes on the same inputs, in the same batch order, as in the full forward, so the statistics
are accumulated in the same order and the selections are the same (tests/pruning/test_streaming.py).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn
from torch.utils._pytree import tree_map

from state_reduction.errors import InputError, UnsupportedError
from state_reduction.pruning.calibration import (GRADIENT_NEEDS, QKGradients, check_finite, count_tokens,
                                                 gradient_statistics, resolve_needs, statistic_hooks)
from state_reduction.pruning.types import KeyChannelAdapter, LayerCalibration


def decoder_blocks(model: nn.Module) -> nn.ModuleList:
    """The decoder blocks, `model.base_model.layers` in every supported family."""
    layers = getattr(model.base_model, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not len(layers):
        raise InputError(f"layer streaming: {type(model).__name__}.{model.base_model_prefix} has no `layers` "
                         "ModuleList of decoder blocks")
    for i, block in enumerate(layers):
        if getattr(block, "use_attnres", False):
            raise UnsupportedError(f"layer streaming: block {i} of {type(model).__name__} uses attention residuals "
                                      "(attnres_block_size), whose state crosses blocks; calibrate without streaming")
    return layers


def _hidden(out) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


def _to(tree, device: torch.device, memo: dict | None = None):
    """Every tensor of a nested (args, kwargs) on `device`; `memo` makes a tensor shared by several calls one copy."""
    memo = {} if memo is None else memo

    def move(t):
        if not isinstance(t, torch.Tensor):
            return t
        if id(t) not in memo:
            memo[id(t)] = (t, t.to(device))  # the source stays referenced, so its id is not reused
        return memo[id(t)][1]

    return tree_map(move, tree)


class _StandIn(nn.Module):
    """Takes the place of decoder block `index`: hands its call to `on_call`, which returns the hidden states the
    block passes on, and returns them in the block's output format."""

    def __init__(self, index: int, on_call, adapter: KeyChannelAdapter):
        super().__init__()
        self.index, self.on_call, self.adapter = index, on_call, adapter

    def forward(self, hidden_states, *args, **kwargs):
        return self.adapter.block_output(self.on_call(self.index, hidden_states, args, kwargs), kwargs)


@contextmanager
def _blocks_replaced(model: nn.Module, blocks: nn.ModuleList, modules: list[nn.Module]):
    base = model.base_model
    base.layers = nn.ModuleList(modules)
    try:
        yield
    finally:
        base.layers = blocks


@contextmanager
def _on(module: nn.Module, device: torch.device, home: torch.device):
    module.to(device)
    try:
        yield module
    finally:
        module.to(home)


def mixer_blocks(blocks: nn.ModuleList, mixers) -> dict[int, object]:
    """Block index -> the MixerRef inside it."""
    where = {id(m): i for i, block in enumerate(blocks) for m in block.modules()}
    out = {}
    for ref in mixers:
        if id(ref.module) not in where:
            raise InputError(f"layer streaming: mixer {ref.name} (layer {ref.layer}) is not inside a decoder block")
        out[where[id(ref.module)]] = ref
    return out


def calibrate_streaming(model, adapter: KeyChannelAdapter, windows: torch.Tensor, batch_size: int = 8,
                        gradients: bool = False, device: torch.device | str | None = None, needs=None,
                        ) -> dict[int, LayerCalibration]:
    """`calibrate(model, adapter, windows, batch_size, gradients, needs)` with the model on its home device and one
    decoder block at a time on `device` (default: the model's device, which streams activations only)."""
    needs = resolve_needs(needs, gradients)
    gradients = bool(needs & GRADIENT_NEEDS)
    mixers = list(adapter.mixers(model))
    if not mixers:
        raise InputError(f"calibration: no reducible mixers found in {type(model).__name__}")
    blocks = decoder_blocks(model)
    by_block = mixer_blocks(blocks, mixers)
    home = next(model.parameters()).device
    device = home if device is None else torch.device(device)
    stats = {m.layer: LayerCalibration() for m in mixers}
    collecting = [True]  # off while Grad recomputes blocks: every token counts once
    handles = []
    for m in mixers:
        handles += statistic_hooks(adapter, m, stats[m.layer], needs, windows.shape[1], active=lambda: collecting[0])
    if not needs:
        return stats
    batches = [windows[i:i + batch_size] for i in range(0, windows.shape[0], batch_size)]
    was_training = model.training
    model.eval()
    params = list(model.parameters())
    requires = [p.requires_grad for p in params]
    grads = None
    try:
        for p in params:
            p.requires_grad_(False)
            p.grad = None
        with _blocks_replaced(model, blocks, []):
            model.to(device)  # everything but the blocks
        inputs, calls = _record_calls(model, adapter, blocks, batches, device, home)
        if gradients:
            grads = QKGradients(adapter, mixers, home=home, taylor="taylor" in needs)
            _grad_pass(model, adapter, blocks, batches, inputs, calls, min(by_block), device, home,
                       windows.shape[0], collecting)
            gradient_statistics(stats, grads, mixers, needs, [b.shape[0] for b in batches])
        else:
            _forward_pass(blocks, inputs, calls, max(by_block), device, home)
    finally:
        for h in handles + (grads.handles if grads is not None else []):
            h.remove()
        with _blocks_replaced(model, blocks, []):
            model.to(home)
        for p, r in zip(params, requires):
            p.requires_grad_(r)
            p.grad = None
        model.train(was_training)
    count_tokens(stats, needs, windows)
    check_finite(stats)
    return stats


@torch.no_grad()
def _record_calls(model, adapter, blocks, batches, device, home):
    """(embeddings of every batch, calls[block][batch] = (args, kwargs) without the hidden states), on `home`."""
    inputs, calls = [], [[None] * len(batches) for _ in blocks]
    current = {}

    def on_call(index, hidden, args, kwargs):
        if index == 0:
            inputs.append(hidden.to(home))
        calls[index][current["batch"]] = _to((args, kwargs), home, current["memo"])
        return hidden

    with _blocks_replaced(model, blocks, [_StandIn(i, on_call, adapter) for i in range(len(blocks))]):
        for b, x in enumerate(batches):
            current.update(batch=b, memo={})
            model.base_model(input_ids=x.to(device), use_cache=False)
    return inputs, calls


@torch.no_grad()
def _forward_pass(blocks, hidden, calls, last, device, home) -> None:
    """Blocks 0..last, each over every batch; `hidden` (per batch) is replaced by each block's outputs."""
    for i in range(last + 1):
        with _on(blocks[i], device, home) as block:
            for b in range(len(hidden)):
                args, kwargs = _to(calls[i][b], device)
                hidden[b] = _hidden(block(hidden[b].to(device), *args, **kwargs)).to(home)


def _grad_pass(model, adapter, blocks, batches, inputs, calls, first, device, home, n_windows, collecting) -> None:
    """Per batch: forward keeping block inputs, loss through the model's own head, then block-wise backward from
    the last block down to `first` (the first block with a mixer), recomputing each block from its input."""
    for b, x in enumerate(batches):
        bounds = [inputs[b]]
        for i, block in enumerate(blocks):
            args, kwargs = _to(calls[i][b], device)
            with _on(block, device, home):  # autograd on as in the full path: fla's GatedDeltaNet picks its kernel by it
                bounds.append(_hidden(block(bounds[-1].to(device), *args, **kwargs)).detach().to(home))
        last = bounds[-1].to(device).requires_grad_(True)
        stand_ins = [_StandIn(i, lambda index, hidden, args, kwargs, last=last: last, adapter) for i in range(len(blocks))]
        with _blocks_replaced(model, blocks, stand_ins):
            ids = x.to(device)
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        (loss * x.shape[0] / n_windows).backward()
        grad = last.grad
        collecting[0] = False
        try:
            for i in reversed(range(first, len(blocks))):
                args, kwargs = _to(calls[i][b], device)
                with _on(blocks[i], device, home) as block:
                    xin = bounds[i].to(device).requires_grad_(i > first)
                    with torch.enable_grad():
                        out = _hidden(block(xin, *args, **kwargs))
                    if out.requires_grad:
                        torch.autograd.backward(out, grad)
                    grad = xin.grad if i > first else None
        finally:
            collecting[0] = True
