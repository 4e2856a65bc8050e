"""fla GatedDeltaNet: like DeltaNet, but `head_dim` is the per-head key dim and head_v_dim = int(head_dim * expand_v)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from state_reduction.errors import InputError
from state_reduction.pruning.adapters.base import Undo
from state_reduction.pruning.adapters.deltanet import FlaKeyChannelAdapter, FlaLayout, _n_linear_layers
from state_reduction.pruning.adapters.structure import StructureLayout
from state_reduction.pruning.dynamics import HeadDynamics
from state_reduction.pruning.types import KeyChannelSelection


def expand_v_for(head_v_dim: int, head_k_dim: int, num_v_heads: int) -> float:
    """The float expand_v with int(head_k_dim * expand_v) == head_v_dim that fla's GatedDeltaNet accepts.

    head_v_dim / head_k_dim can land just below the integer after multiplying back (int() truncates), so
    it is nudged up by ULPs."""
    expand_v = head_v_dim / head_k_dim
    for _ in range(8):
        if int(head_k_dim * expand_v) == head_v_dim and int(num_v_heads * head_k_dim * expand_v) == num_v_heads * head_v_dim:
            break
        expand_v = math.nextafter(expand_v, math.inf)
    else:
        raise InputError(f"GatedDeltaNet: no expand_v keeps head_v_dim {head_v_dim} with head_dim {head_k_dim}.")
    if not (math.isclose(head_k_dim * expand_v, head_v_dim, rel_tol=1e-5)
            and math.isclose(num_v_heads * head_k_dim * expand_v, num_v_heads * head_v_dim, rel_tol=1e-5)):
        raise InputError(f"GatedDeltaNet: expand_v {expand_v} fails fla's integer checks for head_dim {head_k_dim}.")
    return expand_v


class GatedDeltaNetAdapter(FlaKeyChannelAdapter):
    """fla GatedDeltaNet; state [H_v, K, V] per layer."""

    model_type = "gated_deltanet"
    family = "GatedDeltaNet"
    required_fields = ("num_heads", "head_dim", "expand_v", "num_hidden_layers")
    layout = FlaLayout(mixer_class="fla.layers.gated_deltanet:GatedDeltaNet")
    dynamics = HeadDynamics(gate="a_proj", beta="b_proj", value_heads="num_v_heads")
    structure = StructureLayout(layers="model.layers", mixers={"attn": "fla"}, mlp="mlp", attn_layers="attn.layers")

    def key_heads(self, config) -> tuple[int, int]:
        return config.num_heads, config.head_dim

    def post_conv_activation(self, mixer: nn.Module):
        return None if mixer.use_short_conv else F.silu

    def force_separate_convs(self, mixer: nn.Module) -> list:
        """Without a cache the layer convolves q|k|v in one fused call that bypasses q_conv1d/k_conv1d (and their
        hooks); the separate path computes the same per-channel convolution."""
        if not mixer.use_short_conv:
            return []
        mixer._use_fused_qkv_conv = lambda *args, **kwargs: False
        mixer._separate_conv_hooks = getattr(mixer, "_separate_conv_hooks", 0) + 1

        def undo():
            mixer._separate_conv_hooks -= 1
            if mixer._separate_conv_hooks == 0:
                del mixer._use_fused_qkv_conv, mixer._separate_conv_hooks

        return [Undo(undo)]

    def apply_selection(self, mixer: nn.Module, selection: KeyChannelSelection) -> None:
        head_v_dim = mixer.head_v_dim
        super().apply_selection(mixer, selection)
        mixer.head_dim = selection.kept
        mixer.expand_v = expand_v_for(head_v_dim, selection.kept, mixer.num_v_heads)

    def update_config(self, config, new_k: int) -> None:
        head_v_dim = int(config.head_dim * config.expand_v)
        num_v_heads = config.num_v_heads or config.num_heads
        config.expand_v = expand_v_for(head_v_dim, new_k, num_v_heads)
        config.head_dim = new_k
        # expand_v is now head_v_dim / new_k (2.0, 4.0, 1.4382...): readers that take it as the model's value
        # expansion get it wrong, so the value head dimension is recorded as a number (check_value_dim)
        config.value_head_dim = head_v_dim

    def state_bytes_per_sequence(self, config, dtype: torch.dtype = torch.bfloat16) -> int:
        """Sum over GatedDeltaNet layers (not fla hybrid attention layers) of H_v * K * V * bytes: the
        gated-delta-rule state."""
        h_v = config.num_v_heads or config.num_heads
        v = int(config.head_dim * config.expand_v)
        return _n_linear_layers(config) * h_v * config.head_dim * v * torch.empty((), dtype=dtype).element_size()


def check_value_dim(config, where: str) -> int:
    """The value head dimension of a GatedDeltaNet config: int(head_dim * expand_v), which must equal the recorded
    `value_head_dim` of a pruned checkpoint. Returns it; a mismatch is an error naming both."""
    head_v_dim = int(config["head_dim"] * config["expand_v"])
    recorded = config.get("value_head_dim")
    if recorded is not None and recorded != head_v_dim:
        raise ValueError(f"{where}: GatedDeltaNet value_head_dim {recorded} != int(head_dim {config['head_dim']} x "
                         f"expand_v {config['expand_v']}) = {head_v_dim}; set expand_v = value_head_dim / head_dim")
    return head_v_dim
