"""The four model families and how to build them from a plain dict.

`import fla` registers fla's own Mamba-2 under the `mamba2` model type, whose torch prefill tiles
B/C groups across heads and disagrees with its decode when n_groups > 1 (REFERENCE.md section 5).
The project uses transformers' Mamba2ForCausalLM, so registration puts it back.
"""

from __future__ import annotations

import difflib
import warnings
from dataclasses import dataclass

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from state_reduction.errors import UnknownNameError


@dataclass(frozen=True)
class ModelFamily:
    name: str
    model_type: str
    config_class: str
    model_class: str
    description: str

    def classes(self) -> tuple[type[PretrainedConfig], type[PreTrainedModel]]:
        register_auto_classes()
        module, _, attr = self.config_class.rpartition(".")
        config_cls = getattr(__import__(module, fromlist=[attr]), attr)
        module, _, attr = self.model_class.rpartition(".")
        model_cls = getattr(__import__(module, fromlist=[attr]), attr)
        return config_cls, model_cls


FAMILIES: dict[str, ModelFamily] = {
    f.name: f
    for f in (
        ModelFamily("deltanet", "delta_net", "fla.models.DeltaNetConfig", "fla.models.DeltaNetForCausalLM",
                    "fla DeltaNet (Schlag et al. 2021; Yang et al. 2024)"),
        ModelFamily("deltanet_shared_conv", "delta_net_shared_conv",
                    "state_reduction.models.shared_conv.SharedConvDeltaNetConfig",
                    "state_reduction.models.shared_conv.SharedConvDeltaNetForCausalLM",
                    "fla DeltaNet with q/k conv filters shared per head or across heads (appendix B.5, C.6.1)"),
        ModelFamily("gated_deltanet", "gated_deltanet", "fla.models.GatedDeltaNetConfig",
                    "fla.models.GatedDeltaNetForCausalLM", "fla Gated DeltaNet (Yang et al. 2025)"),
        ModelFamily("mamba2", "mamba2", "transformers.Mamba2Config", "transformers.Mamba2ForCausalLM",
                    "transformers Mamba-2 (B = key, C = query)"),
        ModelFamily("qwen3_5", "qwen3_5_text", "transformers.Qwen3_5TextConfig", "transformers.Qwen3_5ForCausalLM",
                    "transformers Qwen3.5 text hybrid (Gated DeltaNet + softmax attention)"),
    )
}

_registered = False


def register_auto_classes() -> None:
    """Make `AutoModelForCausalLM.from_pretrained` load every family, Mamba-2 as transformers' class."""
    global _registered
    if _registered:
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Triton is not supported on current platform")
        import fla.models  # noqa: F401  (registers delta_net, gated_deltanet, and fla's mamba2)
    from transformers import Mamba2Config, Mamba2ForCausalLM, Mamba2Model
    from transformers import AutoModel

    AutoConfig.register("mamba2", Mamba2Config, exist_ok=True)
    AutoModel.register(Mamba2Config, Mamba2Model, exist_ok=True)
    AutoModelForCausalLM.register(Mamba2Config, Mamba2ForCausalLM, exist_ok=True)
    from state_reduction.models.shared_conv import register_shared_conv_auto_classes

    register_shared_conv_auto_classes()
    from state_reduction.models.ralimp_variant import register_ralimp_auto_classes

    register_ralimp_auto_classes()
    from state_reduction.models.shed import register_shed_auto_classes

    register_shed_auto_classes()
    _registered = True


def get_family(name: str) -> ModelFamily:
    if name in FAMILIES:
        return FAMILIES[name]
    close = difflib.get_close_matches(name, list(FAMILIES), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise UnknownNameError(f"unknown model family {name!r}{hint} (known: {', '.join(FAMILIES)})")


def build_config(family: str, **kwargs) -> PretrainedConfig:
    config_cls, _ = get_family(family).classes()
    return config_cls(**kwargs)


def build_model(family: str, config_kwargs: dict, seed: int = 0, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """A freshly initialised causal LM of `family` from config kwargs, seeded."""
    config = build_config(family, **config_kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model
