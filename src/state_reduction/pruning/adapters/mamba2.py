"""transformers Mamba-2: B (key) and C (query) are G groups of N = state_size channels.

in_proj rows [z (I) | x (I) | B (G*N) | C (G*N) | dt (heads)], conv1d (with bias) over [x | B | C]; the SiLU is
applied inside the functional conv. Nothing else depends on N (the gated norm acts on I = expand * hidden).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer

from state_reduction.pruning.adapters.base import FusedQKAdapter, find_mixers
from state_reduction.pruning.adapters.structure import StructureLayout
from state_reduction.pruning.dynamics import HeadDynamics
from state_reduction.pruning.types import MixerRef


class Mamba2Adapter(FusedQKAdapter):
    """Key heads are the B/C groups; state [heads, head_dim, N] per layer."""

    model_type = "mamba2"
    family = "Mamba-2"
    required_fields = ("n_groups", "state_size", "num_heads", "head_dim", "num_hidden_layers")
    in_proj, conv = "in_proj", "conv1d"
    q_segment, k_segment = 3, 2  # C, B in [z | x | B | C | dt]
    q_conv_segment, k_conv_segment = 2, 1  # in [x | B | C]
    mask_after_conv = True
    dynamics = HeadDynamics(gate="in_proj", beta=None, value_heads="num_heads", gate_tail=True, gain_is_dt=True)

    def qk_l2_normalised(self, mixer: nn.Module) -> bool:
        return False

    structure = StructureLayout(layers="backbone.layers", mixers={"mixer": "tensor"}, mlp=None)

    def mixers(self, model: nn.Module) -> Iterator[MixerRef]:
        return find_mixers(model, Mamba2Mixer, "Mamba-2")

    def key_heads(self, config) -> tuple[int, int]:
        return config.n_groups, config.state_size

    def mixer_heads(self, mixer: nn.Module) -> tuple[int, int]:
        return mixer.n_groups, mixer.ssm_state_size

    def proj_segments(self, mixer: nn.Module) -> list[int]:
        gn = mixer.n_groups * mixer.ssm_state_size
        return [mixer.intermediate_size, mixer.intermediate_size, gn, gn, mixer.num_heads]

    def conv_segments(self, mixer: nn.Module) -> list[int]:
        gn = mixer.n_groups * mixer.ssm_state_size
        return [mixer.intermediate_size, gn, gn]

    def set_key_dim(self, mixer: nn.Module, new_k: int) -> None:
        mixer.ssm_state_size = new_k
        mixer.conv_dim = mixer.intermediate_size + 2 * mixer.n_groups * new_k

    def update_config(self, config, new_k: int) -> None:
        config.state_size = new_k

    def state_bytes_per_sequence(self, config, dtype: torch.dtype = torch.bfloat16) -> int:
        """Sum over Mamba-2 layers of heads * head_dim * state_size * bytes: the SSM state (conv cache excluded)."""
        per_layer = config.num_heads * config.head_dim * config.state_size
        return config.num_hidden_layers * per_layer * torch.empty((), dtype=dtype).element_size()
