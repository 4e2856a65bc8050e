"""A throwaway model family in one file, the way README "Extending: a model family" describes it: a DeltaNet whose
config has its own model_type, with a config class, a causal-LM class, an adapter and the `ModelFamily` that ties
them to the rest of the project (tests/models/test_families.py registers it and prunes it through the registry)."""

from __future__ import annotations

import warnings

from state_reduction.models.families import ModelFamily
from state_reduction.models.families.deltanet import DELTA_RULE, FLA_LORA
from state_reduction.pruning.adapters.deltanet import DeltaNetAdapter

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Triton is not supported on current platform")
    from fla.models import DeltaNetConfig, DeltaNetForCausalLM


class ToyDeltaNetConfig(DeltaNetConfig):
    model_type = "toy_delta_net"

    def __init__(self, **kwargs) -> None:  # without its own __init__ the subclass loses DeltaNetConfig's fields
        super().__init__(**kwargs)


class ToyDeltaNetForCausalLM(DeltaNetForCausalLM):
    config_class = ToyDeltaNetConfig


class ToyDeltaNetAdapter(DeltaNetAdapter):
    model_type = "toy_delta_net"
    family = "ToyDeltaNet"


FAMILY = ModelFamily(
    name="toy_deltanet",
    model_type=ToyDeltaNetConfig.model_type,
    description="a DeltaNet under its own model_type (test of the family registry)",
    config_class=ToyDeltaNetConfig,
    model_class=ToyDeltaNetForCausalLM,
    adapter=ToyDeltaNetAdapter(),
    lora=FLA_LORA,
    state_capture=DELTA_RULE,
    test_config={"hidden_size": 32, "num_hidden_layers": 2, "num_heads": 2, "expand_k": 1.0, "expand_v": 1.0,
                 "vocab_size": 8192, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 0,
                 "fuse_cross_entropy": False, "tie_word_embeddings": True},
    presets={"toy-tiny": {"hidden_size": 32, "num_hidden_layers": 1, "num_heads": 2, "vocab_size": 64,
                          "fuse_cross_entropy": False}},
)
