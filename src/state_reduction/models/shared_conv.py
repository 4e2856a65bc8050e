"""DeltaNet with shared q/k short-convolution filters (paper appendix B.5, C.6.1, Tables 14-15).

A depthwise short conv gives every key channel its own filter, so rotating the channels of a head (PCA
pruning) does not commute with it. Sharing one filter across the channels of a head makes the conv a scalar
per lag, which commutes with any rotation of that head (Lemma B.2); sharing it across heads too is the
paper's "✓✓" variant. `conv_sharing` in the config:

- "none": fla's depthwise filters (the "××" layout, under this model type),
- "head": one filter per head for q and one for k ("×✓"; Table 15's "Shared" column),
- "all": one filter for all q channels and one for all k channels ("✓✓").

q and k keep separate filters (each commutes with the same rotation). The value conv stays depthwise: the
rotation never touches v, so tying it would only change the architecture, not what Lemma B.2 needs.
Parameter layout: `q_conv1d.filters` / `k_conv1d.filters` [n_filters, 1, W]; the module's `weight` is the
expanded [H*K, 1, W] view that fla's conv kernels (and the CPU backend) consume, so gradients reach the
shared filter through the expansion.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from state_reduction.errors import InputError

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Triton is not supported on current platform")
    from fla.layers.delta_net import DeltaNet
    from fla.models import DeltaNetConfig, DeltaNetForCausalLM
    from fla.modules import ShortConvolution

CONV_SHARING = ("none", "head", "all")


class SharedShortConvolution(ShortConvolution):
    """fla ShortConvolution over `hidden_size` channels whose filters are shared by runs of consecutive channels:
    `filters` [n_filters, 1, W], channel c uses filter c // (hidden_size / n_filters)."""

    def __init__(self, hidden_size: int, kernel_size: int, n_filters: int, activation: str | None = "silu",
                 **kwargs) -> None:
        if kwargs.get("bias"):
            raise InputError("SharedShortConvolution: conv_bias=True would give each channel its own bias and break "
                             "the rotation equivariance of the shared filter; use conv_bias=False.")
        if n_filters < 1 or hidden_size % n_filters:
            raise InputError(f"SharedShortConvolution: n_filters={n_filters} must divide hidden_size={hidden_size}.")
        super().__init__(hidden_size=hidden_size, kernel_size=kernel_size, bias=False, activation=activation, **kwargs)
        del self._parameters["weight"]
        self.n_filters = n_filters
        self.filters = nn.Parameter(torch.empty(n_filters, 1, kernel_size))
        self.reset_parameters()

    @property
    def weight(self) -> torch.Tensor:  # [hidden_size, 1, W]
        return self.filters.repeat_interleave(self.hidden_size // self.n_filters, dim=0)

    def reset_parameters(self) -> None:
        if "filters" in self._parameters:  # nn.Conv1d.__init__ calls this before `filters` exists
            nn.init.kaiming_uniform_(self.filters, a=5 ** 0.5)

    def set_channels(self, channels: int) -> None:
        """Keep the filters, change the number of channels they are expanded to (pruning key channels)."""
        if channels % self.n_filters:
            raise InputError(f"SharedShortConvolution: {channels} channels do not split over {self.n_filters} filters.")
        self.hidden_size = self.in_channels = self.out_channels = self.groups = channels

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, n_filters={self.n_filters}"


class SharedConvDeltaNetConfig(DeltaNetConfig):
    model_type = "delta_net_shared_conv"

    def __init__(self, conv_sharing: str = "head", **kwargs) -> None:
        if conv_sharing not in CONV_SHARING:
            raise InputError(f"SharedConvDeltaNetConfig: conv_sharing={conv_sharing!r}; accepted: {', '.join(CONV_SHARING)}.")
        self.conv_sharing = conv_sharing
        super().__init__(**kwargs)


def _n_filters(conv_sharing: str, num_heads: int) -> int | None:
    return {"none": None, "head": num_heads, "all": 1}[conv_sharing]


class SharedConvDeltaNetForCausalLM(DeltaNetForCausalLM):
    """fla's DeltaNetForCausalLM with the q/k convs of every DeltaNet layer replaced by shared ones."""

    config_class = SharedConvDeltaNetConfig

    def __init__(self, config: SharedConvDeltaNetConfig) -> None:
        super().__init__(config)
        n_filters = _n_filters(config.conv_sharing, config.num_heads)
        if n_filters is None:
            return
        if not config.use_short_conv:
            raise InputError(f"SharedConvDeltaNetConfig: conv_sharing={config.conv_sharing!r} needs use_short_conv=True.")
        for layer in self.model.layers:
            mixer = layer.attn
            if not isinstance(mixer, DeltaNet):  # fla hybrid attention layers have no short conv
                continue
            for name in ("q_conv1d", "k_conv1d"):
                old = getattr(mixer, name)
                conv = SharedShortConvolution(old.hidden_size, old.kernel_size[0], n_filters, activation=old.activation,
                                              device=old.weight.device, dtype=old.weight.dtype)
                self._init_weights(conv)
                setattr(mixer, name, conv)

    def _init_weights(self, module: nn.Module, *args, **kwargs) -> None:
        if isinstance(module, SharedShortConvolution):  # fla's rule for conv weights: normal(0, initializer_range)
            with torch.no_grad():
                module.filters.normal_(0.0, self.config.initializer_range)
            return
        super()._init_weights(module, *args, **kwargs)

