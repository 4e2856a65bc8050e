"""fla DeltaNet (Schlag et al. 2021; Yang et al. 2024): model_type `delta_net`, no decay (g = None)."""

from __future__ import annotations

import warnings

from state_reduction.backend.delta_rule import l2norm
from state_reduction.models.families.base import KernelInputs, KernelRoute, LoraTargets, ModelFamily
from state_reduction.pruning.adapters.deltanet import DeltaNetAdapter

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Triton is not supported on current platform")
    from fla.models import DeltaNetConfig, DeltaNetForCausalLM

_FLA_CONV = "fla ShortConvolution (depthwise conv returning (y, cache)) is not a LoRA target"
FLA_LORA = LoraTargets(lora=("q_proj", "k_proj", "v_proj"), extra_scope="model",
                       unwrappable={c: _FLA_CONV for c in ("q_conv1d", "k_conv1d", "v_conv1d")})

_ARGS = ("q", "k", "v", "beta")


def delta_capture(kw: dict) -> KernelInputs:
    q, k = kw["q"].double(), kw["k"].double()
    if kw.get("use_qk_l2norm_in_kernel"):
        q, k = l2norm(q), l2norm(k)
    beta = kw.get("beta")
    beta = q.new_ones(q.shape[:-1]) if beta is None else beta.double()  # [B, T, H]
    return KernelInputs(q, k, kw["v"].double(), beta, None)


DELTA_RULE = KernelRoute("fla.layers.delta_net", {"chunk_delta_rule": _ARGS, "fused_recurrent_delta_rule": _ARGS},
                         delta_capture)

TEST_CONFIG = {"hidden_size": 64, "num_hidden_layers": 2, "num_heads": 4, "expand_k": 1.0, "expand_v": 1.0,
               "conv_size": 4, "vocab_size": 97, "fuse_cross_entropy": False}

FAMILY = ModelFamily(
    name="deltanet",
    model_type=DeltaNetConfig.model_type,
    description="fla DeltaNet (Schlag et al. 2021; Yang et al. 2024)",
    config_class=DeltaNetConfig,
    model_class=DeltaNetForCausalLM,
    adapter=DeltaNetAdapter(),
    lora=FLA_LORA,
    state_capture=DELTA_RULE,
    test_config=TEST_CONFIG,
    flame=True,
    # 1.3B shapes (paper G.1, Table 19): hidden 2048, 16 heads, d_k = d_v = 128 (d_k = hidden * expand_k / heads)
    presets={"dn-1.3b": {"hidden_size": 2048, "num_heads": 16, "expand_k": 1.0, "expand_v": 1.0,
                         "num_hidden_layers": 24, "vocab_size": 32000, "hidden_ratio": 4}},
    tiny_checkpoints=("deltanet",),
    recall_checkpoints=("deltanet_mqar", "deltanet_mqar_s1", "deltanet_mqar_s9"),
)
