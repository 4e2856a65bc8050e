"""transformers Qwen3.5 text (qwen3_5_text): only the Gated DeltaNet layers (`linear_attn`) are reduced.

in_proj_qkv rows [q (Hk*K) | k (Hk*K) | v (Hv*V)], conv1d (no bias) over the same channels, SiLU inside the
functional conv; the value heads share key heads (Hv = a multiple of Hk). Softmax-attention layers stay.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

from state_reduction.pruning.adapters.base import FusedQKAdapter, find_mixers
from state_reduction.pruning.adapters.structure import StructureLayout
from state_reduction.pruning.dynamics import HeadDynamics
from state_reduction.pruning.types import MixerRef


class Qwen3_5Adapter(FusedQKAdapter):
    """Key heads are the linear key heads; state [Hv, K, V] per linear-attention layer."""

    model_type = "qwen3_5_text"
    family = "Qwen3.5"
    required_fields = ("linear_num_key_heads", "linear_key_head_dim", "linear_num_value_heads",
                       "linear_value_head_dim", "layer_types")
    in_proj, conv = "in_proj_qkv", "conv1d"
    q_segment, k_segment = 0, 1
    q_conv_segment, k_conv_segment = 0, 1
    mask_after_conv = False
    dynamics = HeadDynamics(gate="in_proj_a", beta="in_proj_b", value_heads="num_v_heads")
    structure = StructureLayout(layers="model.layers", mixers={"linear_attn": "tensor", "self_attn": "pair"}, mlp="mlp",
                                layer_types="layer_types", recurrent_type="linear_attention")

    def mixers(self, model: nn.Module) -> Iterator[MixerRef]:
        return find_mixers(model, Qwen3_5GatedDeltaNet, "Qwen3.5")

    def key_heads(self, config) -> tuple[int, int]:
        return config.linear_num_key_heads, config.linear_key_head_dim

    def mixer_heads(self, mixer: nn.Module) -> tuple[int, int]:
        return mixer.num_k_heads, mixer.head_k_dim

    def proj_segments(self, mixer: nn.Module) -> list[int]:
        return [mixer.key_dim, mixer.key_dim, mixer.value_dim]

    conv_segments = proj_segments

    def set_key_dim(self, mixer: nn.Module, new_k: int) -> None:
        mixer.head_k_dim = new_k
        mixer.key_dim = mixer.num_k_heads * new_k
        mixer.conv_dim = 2 * mixer.key_dim + mixer.value_dim

    def update_config(self, config, new_k: int) -> None:
        config.linear_key_head_dim = new_k

    def state_bytes_per_sequence(self, config, dtype: torch.dtype = torch.bfloat16) -> int:
        """Sum over linear-attention layers of Hv * K * V * bytes: the gated-delta-rule state (the softmax layers'
        KV cache grows with the sequence and is not counted)."""
        n_linear = sum(t == "linear_attention" for t in config.layer_types)
        per_layer = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim
        return n_linear * per_layer * torch.empty((), dtype=dtype).element_size()
