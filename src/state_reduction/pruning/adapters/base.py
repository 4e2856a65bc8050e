"""Operations every adapter shares: validating a selection and cutting per-head channel blocks.

A *block* is a run of H * K consecutive rows (projection weights) or channels (conv weights, conv bias)
laid out head-major, [H, K, ...]. Keeping indices slices each head's K rows; a rotation T [H, K', K]
maps rows as W' = T W (q/k projections, conv bias) and depthwise filters as w'_r = sum_d T[r, d]^2 w_d
(paper appendix B.4, Prop. B.1: the closest diagonal filter in Frobenius norm).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN

from state_reduction.errors import InputError, UnsupportedError
from state_reduction.pruning.types import KeyChannelAdapter, KeyChannelSelection, MixerRef


def find_mixers(model: nn.Module, mixer_class: type, family: str) -> Iterator[MixerRef]:
    refs = [MixerRef(layer=m.layer_idx, name=name, module=m) for name, m in model.named_modules() if isinstance(m, mixer_class)]
    if not refs:
        raise InputError(
            f"{family} adapter: {type(model).__module__}.{type(model).__name__} has no "
            f"{mixer_class.__module__}.{mixer_class.__qualname__} module."
        )
    yield from sorted(refs, key=lambda r: r.layer)


def check_selection(selection: KeyChannelSelection, heads: int, channels: int, where: str) -> None:
    """Reject a selection that does not fit H key heads of K channels; `where` names the layer/module."""
    if (selection.keep is None) == (selection.rotation is None):
        raise InputError(f"{where}: a KeyChannelSelection needs exactly one of `keep` or `rotation`.")
    if selection.keep is not None:
        keep = selection.keep
        if keep.dim() != 2 or keep.shape[0] != heads or not 1 <= keep.shape[1] <= channels:
            raise InputError(
                f"{where}: keep has shape {tuple(keep.shape)}, expected [H={heads}, K'] with 1 <= K' <= K={channels}."
            )
        if keep.dtype.is_floating_point or keep.dtype == torch.bool:
            raise InputError(f"{where}: keep must hold integer channel indices, got dtype {keep.dtype}.")
        if int(keep.min()) < 0 or int(keep.max()) >= channels:
            raise InputError(
                f"{where}: keep indices must lie in [0, {channels}), got min {int(keep.min())}, max {int(keep.max())}."
            )
        if keep.shape[1] > 1 and not bool((keep.diff(dim=1) > 0).all()):
            bad = int((keep.diff(dim=1) <= 0).any(dim=1).nonzero()[0])
            raise InputError(f"{where}: keep indices of head {bad} are not strictly ascending: {keep[bad].tolist()}.")
    else:
        rot = selection.rotation
        if rot.dim() != 3 or rot.shape[0] != heads or rot.shape[2] != channels or not 1 <= rot.shape[1] <= channels:
            raise InputError(
                f"{where}: rotation has shape {tuple(rot.shape)}, expected [H={heads}, K', K={channels}] with K' <= K."
            )


def cut_rows(x: torch.Tensor, selection: KeyChannelSelection, heads: int, squared: bool = False) -> torch.Tensor:
    """x [H*K, ...] -> [H*K', ...]. With a rotation, rows combine with T (or T**2 for depthwise filters)."""
    block = x.reshape(heads, -1, *x.shape[1:])  # [H, K, ...]
    if selection.keep is not None:
        index = selection.keep.to(x.device).long().reshape(heads, -1, *([1] * (x.dim() - 1))).expand(-1, -1, *x.shape[1:])
        out = block.gather(1, index)
    else:
        t = selection.rotation.to(device=x.device, dtype=torch.float64)
        if squared:
            t = t.square()
        out = torch.einsum("hrk,hk...->hr...", t, block.double()).to(x.dtype)
    return out.reshape(-1, *x.shape[1:]).contiguous()


def cut_segments(x: torch.Tensor, sizes: Sequence[int], cuts: dict[int, tuple[KeyChannelSelection, int]],
                 squared: bool = False) -> torch.Tensor:
    """x is the concatenation of segments of `sizes` along dim 0; segment i in `cuts` is cut by (selection, H)."""
    parts = list(torch.split(x, list(sizes), dim=0))
    for i, (selection, heads) in cuts.items():
        parts[i] = cut_rows(parts[i], selection, heads, squared=squared)
    return torch.cat(parts, dim=0)


def replace_linear_rows(linear: nn.Linear, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    linear.weight = nn.Parameter(weight, requires_grad=linear.weight.requires_grad)
    if bias is not None:
        linear.bias = nn.Parameter(bias, requires_grad=linear.bias.requires_grad)
    linear.out_features = weight.shape[0]


def replace_conv_channels(conv: nn.Conv1d, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    """A depthwise conv with new channels: weight [C', 1, W], optional bias [C']."""
    channels = weight.shape[0]
    conv.weight = nn.Parameter(weight, requires_grad=conv.weight.requires_grad)
    if bias is not None:
        conv.bias = nn.Parameter(bias, requires_grad=conv.bias.requires_grad)
    conv.in_channels = conv.out_channels = conv.groups = channels
    if hasattr(conv, "hidden_size"):  # fla ShortConvolution
        conv.hidden_size = channels


class Undo:
    """A hook handle that runs `fn` once on `remove()` (undoes a temporary change to a module)."""

    def __init__(self, fn):
        self.fn = fn

    def remove(self) -> None:
        if self.fn is not None:
            self.fn()
            self.fn = None


class FusedQKAdapter(KeyChannelAdapter):
    """Base of the adapters of transformers' Mamba-2 and Qwen3.5 mixers: q and k (C and B) are segments of one
    input projection and of one depthwise conv, which the forward applies functionally (no conv module call, so
    no conv hook fires); hooks recompute the conv + activation on the q/k channels from the projection output.
    Subclasses give `mixer_heads`, `proj_segments`, `conv_segments`, `set_key_dim` (abstract: a subclass that
    misses one cannot be instantiated) and the names below."""

    in_proj: str
    conv: str
    q_segment: int  # index of the query segment in proj_segments (and in conv_segments: q_conv_segment)
    k_segment: int
    q_conv_segment: int
    k_conv_segment: int
    mask_after_conv: bool  # Mamba-2 zeroes padded positions of the conv output, Qwen3.5 only its input

    @abstractmethod
    def mixer_heads(self, mixer: nn.Module) -> tuple[int, int]:
        """(H, K) of this mixer's q/k: key heads and channels per head."""

    @abstractmethod
    def proj_segments(self, mixer: nn.Module) -> list[int]:
        """Row counts of the segments of the input projection, in order (q and k among them)."""

    @abstractmethod
    def conv_segments(self, mixer: nn.Module) -> list[int]:
        """Channel counts of the segments of the depthwise conv, in order."""

    @abstractmethod
    def set_key_dim(self, mixer: nn.Module, new_k: int) -> None:
        """Record K' = new_k on the mixer (the attributes its forward reads)."""

    def _offset(self, sizes: list[int], index: int) -> slice:
        start = sum(sizes[:index])
        return slice(start, start + sizes[index])

    def qk_weights(self, mixer: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        h, k = self.mixer_heads(mixer)
        w = getattr(mixer, self.in_proj).weight
        sizes = self.proj_segments(mixer)
        return (w[self._offset(sizes, self.q_segment)].view(h, k, -1), w[self._offset(sizes, self.k_segment)].view(h, k, -1))

    def add_hooks(self, mixer: nn.Module, on_qk=None, on_input=None) -> list:
        proj = getattr(mixer, self.in_proj)
        handles = []
        if on_input is not None:
            handles.append(proj.register_forward_pre_hook(lambda m, args: on_input(args[0])))
        if on_qk is None:
            return handles

        context = {}

        def before_mixer(module, args, kwargs):
            cache = kwargs.get("cache", kwargs.get("cache_params", args[1] if len(args) > 1 else None))
            if cache is not None and cache.get_conv_state(module.layer_idx, state_idx=0) is not None:
                raise UnsupportedError(
                    f"{type(module).__name__} layer {module.layer_idx}: q/k hooks recompute the short conv from the "
                    f"tokens of one forward and cannot continue a cache; calibrate with full forwards."
                )
            context["mask"] = kwargs.get("attention_mask", args[2] if len(args) > 2 else None)

        def after_proj(module, args, out):  # out [B, T, P]
            h, k = self.mixer_heads(mixer)
            conv = getattr(mixer, self.conv)
            sizes, conv_sizes = self.proj_segments(mixer), self.conv_segments(mixer)
            result = []
            for seg, conv_seg in ((self.q_segment, self.q_conv_segment), (self.k_segment, self.k_conv_segment)):
                x = out[..., self._offset(sizes, seg)].transpose(1, 2)  # [B, H*K, T]
                ch = self._offset(conv_sizes, conv_seg)
                bias = conv.bias[ch] if conv.bias is not None else None
                width = conv.weight.shape[-1]
                y = F.conv1d(x.to(conv.weight.dtype), conv.weight[ch], bias, padding=width - 1, groups=x.shape[1])
                y = ACT2FN[mixer.activation](y[..., : x.shape[-1]]).transpose(1, 2).to(out.dtype)
                mask = context.get("mask")
                if self.mask_after_conv and mask is not None:
                    y = (y * mask[:, :, None]).to(out.dtype)
                result.append(y.reshape(*y.shape[:2], h, k))
            on_qk(*result)

        handles.append(mixer.register_forward_pre_hook(before_mixer, with_kwargs=True))
        handles.append(proj.register_forward_hook(after_proj))
        return handles

    @torch.no_grad()
    def zero_key_channels(self, mixer: nn.Module, keep_mask: torch.Tensor) -> None:
        """Zero the q/k (C/B) projection rows and conv filters (and biases) of the channels `keep_mask` [H, K] drops
        (`prune --budget-granularity head`): the conv then outputs act(0) = 0 there (silu), as in the masked model."""
        drop = (~keep_mask).flatten()  # [H*K]
        proj, conv = getattr(mixer, self.in_proj), getattr(mixer, self.conv)
        sizes, conv_sizes = self.proj_segments(mixer), self.conv_segments(mixer)
        for seg in (self.q_segment, self.k_segment):
            rows = torch.arange(self._offset(sizes, seg).start, self._offset(sizes, seg).stop)[drop]
            proj.weight[rows] = 0
            if proj.bias is not None:
                proj.bias[rows] = 0
        for seg in (self.q_conv_segment, self.k_conv_segment):
            rows = torch.arange(self._offset(conv_sizes, seg).start, self._offset(conv_sizes, seg).stop)[drop]
            conv.weight[rows] = 0
            if conv.bias is not None:
                conv.bias[rows] = 0

    def apply_selection(self, mixer: nn.Module, selection: KeyChannelSelection) -> None:
        h, k = self.mixer_heads(mixer)
        check_selection(selection, h, k, f"{type(mixer).__name__} layer {mixer.layer_idx}")
        proj, conv = getattr(mixer, self.in_proj), getattr(mixer, self.conv)
        sizes, conv_sizes = self.proj_segments(mixer), self.conv_segments(mixer)
        cuts = {self.q_segment: (selection, h), self.k_segment: (selection, h)}
        conv_cuts = {self.q_conv_segment: (selection, h), self.k_conv_segment: (selection, h)}
        with torch.no_grad():
            bias = cut_segments(proj.bias, sizes, cuts) if proj.bias is not None else None
            replace_linear_rows(proj, cut_segments(proj.weight, sizes, cuts), bias)
            conv_bias = cut_segments(conv.bias, conv_sizes, conv_cuts) if conv.bias is not None else None
            replace_conv_channels(conv, cut_segments(conv.weight, conv_sizes, conv_cuts, squared=True), conv_bias)
        self.set_key_dim(mixer, selection.kept)
