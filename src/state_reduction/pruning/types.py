"""The contracts between adapters, calibration and selectors.

Vocabulary: a *key head* is the unit that owns one set of key channels of the recurrent state: a head
of (Gated) DeltaNet, a B/C group of Mamba-2 (B = key, C = query), a linear key head of Qwen3.5 (its
value heads share key heads). Channels are indexed 0..K-1 within a key head; K is the per-head key
dimension (Mamba-2: `state_size`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

QKHook = Callable[[torch.Tensor, torch.Tensor], None]  # (q, k), each [B, T, H, K], post-conv/activation
InputHook = Callable[[torch.Tensor], None]  # x [B, T, d_in]: the input of the q/k projections


@dataclass(frozen=True)
class MixerRef:
    """One sequence mixer whose key channels can be reduced."""

    layer: int  # index of the decoder layer
    name: str  # qualified module name in the model
    module: nn.Module


@dataclass
class LayerCalibration:
    """Calibration statistics of one mixer, accumulated over tokens (memory independent of their number).

    Shapes use H key heads and K channels per head; d_in is the width of the q/k projections' input."""

    n_tokens: int = 0
    gram_q: torch.Tensor | None = None  # [H, K, K] float64: sum_t q_t q_t^T of post-conv queries
    gram_k: torch.Tensor | None = None  # [H, K, K] float64: same for keys
    sum_k: torch.Tensor | None = None  # [H, K] float64: sum of L2-normalised keys (PCA centring)
    sum_kk: torch.Tensor | None = None  # [H, K, K] float64: sum of outer products of L2-normalised keys
    sum_q: torch.Tensor | None = None  # [H, K] float64: same for queries (PCA pooled with q)
    sum_qq: torch.Tensor | None = None  # [H, K, K] float64
    input_sq: torch.Tensor | None = None  # [d_in] float64: sum_t x_{t,i}^2 (S-Wanda uses its sqrt)
    saliency_q: torch.Tensor | None = None  # [H, K] float64: sum_i |W_Q[j, i] * dL/dW_Q[j, i]|
    saliency_k: torch.Tensor | None = None  # [H, K] float64
    decay_sq: torch.Tensor | None = None  # [H] float64: sum_t a_t^2 of the heads' decay (None: no decay, a = 1)
    gain_sq: torch.Tensor | None = None  # [H] float64: sum_t g_t^2 of the input gain (dt or beta; None: g = 1)
    horizon: int | None = None  # calibration window length (tokens): the energy selector's horizon
    qk_l2_normalised: bool | None = None  # the kernel L2-normalises q and k (energy reads sum_qq/sum_kk then)
    # thinK: sums over calibration windows w of ||Q_w[:, j]||_2 ||K_w[:, j]||_2, ||Q_w[:, j]||_2, ||K_w[:, j]||_2
    # of the q/k the kernel sees (L2-normalised where it normalises them); [H, K] float64 each
    window_norm_qk: torch.Tensor | None = None
    window_norm_q: torch.Tensor | None = None
    window_norm_k: torch.Tensor | None = None
    # ghost: sums over tokens of the diagonal time-varying controllability / observability Gramians of every
    # value head's state channels, [H_v, K] float64 (calibration.accumulate_gramians)
    gramian_ctrl: torch.Tensor | None = None
    gramian_obs: torch.Tensor | None = None
    # qkscore-decay: sum_t (q_t q_t^T) o P_t with P_t = a_t^2 P_{t-1} + k_t k_t^T (a the value head's decay, 1
    # without one), value heads summed into their key head; [H, K, K] float64 (calibration.accumulate_decay_gram)
    decay_score_gram: torch.Tensor | None = None
    # taylor: u_b[j] = sum_i W[j, i] dL_b/dW[j, i] per gradient batch b; taylor_* = sum_b u_b (first order),
    # fisher_* = sum_b c_b u_b u_b' with c_b = N / B_b (the batch-level empirical Fisher); [H, K] float64 each
    taylor_q: torch.Tensor | None = None
    taylor_k: torch.Tensor | None = None
    fisher_qq: torch.Tensor | None = None
    fisher_kk: torch.Tensor | None = None
    fisher_qk: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class KeyChannelSelection:
    """What to keep in one mixer: per-head channel indices, or a per-head semi-orthogonal map (PCA)."""

    keep: torch.Tensor | None = None  # [H, K'] int64, sorted ascending per head
    rotation: torch.Tensor | None = None  # [H, K', K]: new channel r = sum_d T[r, d] old channel d

    @property
    def kept(self) -> int:
        return (self.keep if self.keep is not None else self.rotation).shape[1]


class KeyChannelAdapter(ABC):
    """Where one model family keeps its key/query channels and how to cut them.

    One subclass per family; each family's module (state_reduction.models.families) holds an instance."""

    model_type: str
    family: str
    required_fields: tuple[str, ...]  # config fields the adapter reads (checked by `get_adapter`)
    structure = None  # adapters.structure.StructureLayout: blocks, mixers and MLPs (structure removal)

    @abstractmethod
    def mixers(self, model: nn.Module) -> Iterator[MixerRef]:
        """The mixers whose state is reduced, in layer order (Qwen3.5: only the Gated DeltaNet layers)."""

    @abstractmethod
    def key_heads(self, config) -> tuple[int, int]:
        """(H, K): key heads per mixer and channels per key head."""

    @abstractmethod
    def qk_weights(self, mixer: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_Q, W_K) as [H, K, d_in] views of the projection rows that produce q and k (Mamba-2: C, B)."""

    @abstractmethod
    def add_hooks(self, mixer: nn.Module, on_qk: QKHook | None = None, on_input: InputHook | None = None) -> list:
        """Register forward hooks delivering post-conv(+activation) q, k [B, T, H, K] and the q/k projection
        input [B, T, d_in]; returns handles to remove."""

    @abstractmethod
    def apply_selection(self, mixer: nn.Module, selection: KeyChannelSelection) -> None:
        """Physically shrink the mixer's q/k projection rows and conv channels in place."""

    @abstractmethod
    def update_config(self, config, new_k: int) -> None:
        """Rewrite `config` in place so that stock loaders build the reduced model."""

    @abstractmethod
    def state_bytes_per_sequence(self, config, dtype: torch.dtype = torch.bfloat16) -> int:
        """Recurrent-state bytes of one sequence across all reducible mixers (conv caches excluded)."""

    dynamics = None  # HeadDynamics (state_reduction.pruning.dynamics): where the decay and input gain come from

    def qk_l2_normalised(self, mixer: nn.Module) -> bool:
        """Whether the mixer's kernel L2-normalises q and k before they enter the state."""
        return True

    # Grad's autograd-saved tensors per Linear/conv output (memory_plan.AUTOGRAD_SAVED_PER_OUTPUT); a family whose
    # scan_bytes_per_token counts its scan's saved tensors on its own keeps only the outputs (1.0)
    autograd_saved_per_output = None

    def scan_bytes_per_token(self, config, seq_len: int) -> tuple[int, int]:
        """(forward peak, autograd-saved) bytes per token of the mixer's sequence scan beyond its Linear and conv
        outputs, for memory-plan. 0: the delta-rule CPU references keep no per-token tensor wider than the block's
        projections (their saved tensors are in AUTOGRAD_SAVED_PER_OUTPUT)."""
        return 0, 0

    def block_output(self, hidden: torch.Tensor, kwargs: dict):
        """What one decoder block returns to its model's layer loop when its new hidden states are `hidden` and it
        was called with `kwargs`; layer-streamed calibration stands in for the blocks with it."""
        return hidden
