"""fla DeltaNet: separate q_proj/k_proj and q_conv1d/k_conv1d (ShortConvolution, SiLU inside the conv).

`FlaKeyChannelAdapter` holds what fla's DeltaNet and GatedDeltaNet share; the subclasses hold their facts
(mixer class, config fields) in `FlaLayout`.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from state_reduction.errors import InputError
from state_reduction.models.shared_conv import SharedShortConvolution
from state_reduction.pruning.adapters.base import (
    check_selection,
    cut_rows,
    find_mixers,
    replace_conv_channels,
    replace_linear_rows,
)
from state_reduction.pruning.adapters.structure import StructureLayout
from state_reduction.pruning.dynamics import HeadDynamics
from state_reduction.pruning.types import InputHook, KeyChannelAdapter, KeyChannelSelection, MixerRef, QKHook


@dataclass(frozen=True)
class FlaLayout:
    mixer_class: str  # "module:Class"
    q_proj: str = "q_proj"
    k_proj: str = "k_proj"
    q_conv: str = "q_conv1d"
    k_conv: str = "k_conv1d"


def _import(path: str) -> type:
    module, _, attr = path.partition(":")
    return getattr(__import__(module, fromlist=[attr]), attr)


class FlaKeyChannelAdapter(KeyChannelAdapter):
    layout: FlaLayout
    family: str

    def mixers(self, model: nn.Module) -> Iterator[MixerRef]:
        return find_mixers(model, _import(self.layout.mixer_class), self.family)

    def qk_weights(self, mixer: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        h, k = mixer.num_heads, mixer.head_k_dim
        wq = getattr(mixer, self.layout.q_proj).weight
        wk = getattr(mixer, self.layout.k_proj).weight
        return wq.view(h, k, -1), wk.view(h, k, -1)

    @abstractmethod
    def post_conv_activation(self, mixer: nn.Module):
        """What the layer applies to q/k between the conv output (or the projection without conv) and the kernel."""

    def add_hooks(self, mixer: nn.Module, on_qk: QKHook | None = None, on_input: InputHook | None = None) -> list:
        lay = self.layout
        handles = []
        if on_input is not None:
            handles.append(getattr(mixer, lay.q_proj).register_forward_pre_hook(lambda m, args: on_input(args[0])))
        if on_qk is None:
            return handles
        h, k = mixer.num_heads, mixer.head_k_dim
        act = self.post_conv_activation(mixer)
        pending = {}

        def as_heads(y: torch.Tensor) -> torch.Tensor:  # [B, T, H*K] -> [B, T, H, K]
            y = act(y) if act is not None else y
            return y.reshape(*y.shape[:-1], h, k)

        def on_q(module, args, out):
            pending["q"] = as_heads(out[0] if isinstance(out, tuple) else out)

        def on_k(module, args, out):
            on_qk(pending.pop("q"), as_heads(out[0] if isinstance(out, tuple) else out))

        conv = mixer.use_short_conv
        handles.append(getattr(mixer, lay.q_conv if conv else lay.q_proj).register_forward_hook(on_q))
        handles.append(getattr(mixer, lay.k_conv if conv else lay.k_proj).register_forward_hook(on_k))
        handles.extend(self.force_separate_convs(mixer))
        return handles

    def force_separate_convs(self, mixer: nn.Module) -> list:
        return []

    def block_output(self, hidden: torch.Tensor, kwargs: dict):
        """fla blocks return (hidden, attentions, past_key_values, attnres_states)."""
        return hidden, None, kwargs.get("past_key_values"), kwargs.get("attnres_states")

    def apply_selection(self, mixer: nn.Module, selection: KeyChannelSelection) -> None:
        lay = self.layout
        h, k = mixer.num_heads, mixer.head_k_dim
        check_selection(selection, h, k, f"{self.family} layer {mixer.layer_idx}")
        with torch.no_grad():
            for name in (lay.q_proj, lay.k_proj):
                proj = getattr(mixer, name)
                replace_linear_rows(proj, cut_rows(proj.weight, selection, h))
            if mixer.use_short_conv:
                for name in (lay.q_conv, lay.k_conv):
                    self.cut_conv(getattr(mixer, name), selection, h)
        mixer.head_k_dim = selection.kept
        mixer.key_dim = h * selection.kept

    @torch.no_grad()
    def zero_key_channels(self, mixer: nn.Module, keep_mask: torch.Tensor) -> None:
        """Zero the q/k projection rows and per-channel conv filters (and bias) of the channels `keep_mask` [H, K]
        drops, so they reach the kernel as zeros (`prune --budget-granularity head`); a conv whose filters are
        shared by channels (SharedShortConvolution) gets zero inputs already."""
        drop = (~keep_mask).flatten()  # [H*K]
        for w in self.qk_weights(mixer):
            w.view(drop.numel(), -1)[drop] = 0
        if mixer.use_short_conv:
            for name in (self.layout.q_conv, self.layout.k_conv):
                conv = getattr(mixer, name)
                if conv.weight.shape[0] == drop.numel():
                    conv.weight[drop] = 0
                    if conv.bias is not None:
                        conv.bias[drop] = 0

    def cut_conv(self, conv: nn.Module, selection: KeyChannelSelection, heads: int) -> None:
        """Depthwise q/k conv: keep the selected channels' filters, or mix them with T**2 (Prop. B.1)."""
        bias = cut_rows(conv.bias, selection, heads) if conv.bias is not None else None
        replace_conv_channels(conv, cut_rows(conv.weight, selection, heads, squared=True), bias)


class DeltaNetAdapter(FlaKeyChannelAdapter):
    """fla DeltaNet. key_dim = hidden_size * expand_k, head_k_dim = key_dim / num_heads; state [H, K, V]."""

    model_type = "delta_net"
    family = "DeltaNet"
    required_fields = ("hidden_size", "num_heads", "expand_k", "expand_v", "num_hidden_layers")
    layout = FlaLayout(mixer_class="fla.layers.delta_net:DeltaNet")
    dynamics = HeadDynamics(gate=None, beta="b_proj", value_heads="num_heads", beta_flag="use_beta")

    def qk_l2_normalised(self, mixer: nn.Module) -> bool:
        return mixer.qk_norm == "l2"

    structure = StructureLayout(layers="model.layers", mixers={"attn": "fla"}, mlp="mlp", attn_layers="attn.layers")

    def key_heads(self, config) -> tuple[int, int]:
        key_dim = round(config.hidden_size * config.expand_k)
        return config.num_heads, key_dim // config.num_heads

    def post_conv_activation(self, mixer: nn.Module):
        # lazy: this module loads while the package registers its families, before fla's CPU warning is filtered
        from fla.modules.activations import elu_p1

        if mixer.use_short_conv and mixer.qk_activation == "silu":
            return None  # inside ShortConvolution
        return {"silu": F.silu, "identity": None, "relu": torch.relu, "elu": elu_p1}[mixer.qk_activation]

    def apply_selection(self, mixer: nn.Module, selection: KeyChannelSelection) -> None:
        super().apply_selection(mixer, selection)
        mixer.expand_k = mixer.key_dim / mixer.hidden_size

    def update_config(self, config, new_k: int) -> None:
        key_dim = config.num_heads * new_k
        expand_k = key_dim / config.hidden_size
        if round(config.hidden_size * expand_k) != key_dim or not math.isclose(config.hidden_size * expand_k, key_dim):
            raise InputError(f"DeltaNet: no float expand_k gives key_dim {key_dim} with hidden_size {config.hidden_size}.")
        config.expand_k = expand_k

    def state_bytes_per_sequence(self, config, dtype: torch.dtype = torch.bfloat16) -> int:
        """Sum over DeltaNet layers (not fla hybrid attention layers) of H * K * V * bytes: the delta-rule state."""
        h, k = self.key_heads(config)
        v = round(config.hidden_size * config.expand_v) // config.num_heads
        return _n_linear_layers(config) * h * k * v * torch.empty((), dtype=dtype).element_size()


class SharedConvDeltaNetAdapter(DeltaNetAdapter):
    """DeltaNet whose q/k convs share filters per head or across heads (`state_reduction.models.shared_conv`).

    Slicing channels removes nothing from a shared filter, and a rotation commutes with it (Lemma B.2): the
    T**2-weighted average of identical filters is that filter, since each row of T has unit norm. Only the
    number of channels the filter is expanded to changes. conv_sharing="none" keeps fla's depthwise rule."""

    model_type = "delta_net_shared_conv"
    family = "DeltaNet (shared conv)"

    def cut_conv(self, conv: nn.Module, selection: KeyChannelSelection, heads: int) -> None:
        if isinstance(conv, SharedShortConvolution):
            conv.set_channels(heads * selection.kept)
        else:
            super().cut_conv(conv, selection, heads)


def _n_linear_layers(config) -> int:
    attn_layers = set((config.attn or {}).get("layers", [])) if getattr(config, "attn", None) else set()
    return config.num_hidden_layers - len(attn_layers)
