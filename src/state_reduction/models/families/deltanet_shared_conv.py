"""DeltaNet with q/k short-conv filters shared per head or across heads (paper appendix B.5, C.6.1; the model is
`state_reduction.models.shared_conv`): fla's DeltaNet layer, so its kernel route and LoRA targets are DeltaNet's."""

from __future__ import annotations

from state_reduction.models.families.base import ModelFamily
from state_reduction.models.families.deltanet import DELTA_RULE, FLA_LORA, TEST_CONFIG
from state_reduction.models.shared_conv import SharedConvDeltaNetConfig, SharedConvDeltaNetForCausalLM
from state_reduction.pruning.adapters.deltanet import SharedConvDeltaNetAdapter

FAMILY = ModelFamily(
    name="deltanet_shared_conv",
    model_type=SharedConvDeltaNetConfig.model_type,
    description="fla DeltaNet with q/k conv filters shared per head or across heads (appendix B.5, C.6.1)",
    config_class=SharedConvDeltaNetConfig,
    model_class=SharedConvDeltaNetForCausalLM,
    adapter=SharedConvDeltaNetAdapter(),
    lora=FLA_LORA,
    state_capture=DELTA_RULE,
    test_config={**TEST_CONFIG, "conv_sharing": "head"},
    tiny_checkpoints=("deltanet_shared_head", "deltanet_shared_all"),
    shed=False,
    ralimp=False,
)
