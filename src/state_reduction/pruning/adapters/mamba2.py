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

    autograd_saved_per_output = 1.0  # the scan's saved tensors are counted in scan_bytes_per_token

    def scan_bytes_per_token(self, config, seq_len: int) -> tuple[int, int]:
        """transformers' torch chunk scan (`mamba2_chunk_scan`, the fallback without mamba_ssm, on CPU and CUDA),
        fp32 whatever the weights, each sequence padded to a multiple of the chunk L. Per padded token, in units of
        u = heads x L (the position-by-position tensors [b, c, l, s, h]: exp(segsum), C B^T, their product and
        einsum's copy of it), n = heads x N (B and C repeated over the heads), p = heads x head_dim (x and the
        outputs) and z = heads x head_dim x N / L (the chunk states): alive at the forward peak 4u + 2n + 5p + 3z,
        saved for the backward 3u + 5n + 7p + 2z (tensors counted in the scan; HeapPeak of one mixer at 512
        tokens on 8 shapes, Codestral's included, within 5% of both, issue 22)."""
        H, P, N, L = config.num_heads, config.head_dim, config.state_size, config.chunk_size
        u, n, p, z = H * L, H * N, H * P, H * P * N / L
        padded = -(-seq_len // L) * L / seq_len
        return round(4 * padded * (4 * u + 2 * n + 5 * p + 3 * z)), round(4 * padded * (3 * u + 5 * n + 7 * p + 2 * z))

    def state_bytes_per_sequence(self, config, dtype: torch.dtype = torch.bfloat16) -> int:
        """Sum over Mamba-2 layers of heads * head_dim * state_size * bytes: the SSM state (conv cache excluded)."""
        per_layer = config.num_heads * config.head_dim * config.state_size
        return config.num_hidden_layers * per_layer * torch.empty((), dtype=dtype).element_size()
