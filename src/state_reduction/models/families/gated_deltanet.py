"""fla Gated DeltaNet (Yang et al. 2025): model_type `gated_deltanet`; the in-kernel gate g = -exp(A_log) *
softplus(a + dt_bias) and beta = sigmoid(b), as the layer asks the kernel."""

from __future__ import annotations

import warnings

from state_reduction.backend.delta_rule import l2norm
from state_reduction.backend.gated_delta_rule import _prepare_gate_and_beta
from state_reduction.models.families.base import KernelInputs, KernelRoute, ModelFamily
from state_reduction.models.families.decay_init import init_decay_half_life
from state_reduction.models.families.deltanet import FLA_LORA
from state_reduction.pruning.adapters.gated_deltanet import GatedDeltaNetAdapter, check_value_dim

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Triton is not supported on current platform")
    from fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM

_ARGS = ("q", "k", "v", "g", "beta")


def gated_capture(kw: dict) -> KernelInputs:
    q, k, v = kw["q"].double(), kw["k"].double(), kw["v"].double()
    if kw.get("use_qk_l2norm_in_kernel"):
        q, k = l2norm(q), l2norm(k)
    beta = kw.get("beta")
    beta = v.new_ones(v.shape[:-1]) if beta is None else beta  # [B, T, HV]
    g, beta = _prepare_gate_and_beta(
        "analysis", kw.get("g"), beta, v.dtype, kw.get("use_gate_in_kernel", False), kw.get("A_log"),
        kw.get("dt_bias"), kw.get("use_beta_sigmoid_in_kernel", False), kw.get("allow_neg_eigval", False))
    return KernelInputs(q, k, v, beta, None if g is None else g.double())


FAMILY = ModelFamily(
    name="gated_deltanet",
    model_type=GatedDeltaNetConfig.model_type,
    description="fla Gated DeltaNet (Yang et al. 2025)",
    config_class=GatedDeltaNetConfig,
    model_class=GatedDeltaNetForCausalLM,
    adapter=GatedDeltaNetAdapter(),
    lora=FLA_LORA,
    state_capture=KernelRoute("fla.layers.gated_deltanet", {"chunk_gated_delta_rule": _ARGS,
                                                            "fused_recurrent_gated_delta_rule": _ARGS}, gated_capture),
    test_config={"hidden_size": 64, "num_hidden_layers": 2, "num_heads": 4, "head_dim": 16, "expand_v": 2,
                 "conv_size": 4, "vocab_size": 97, "fuse_cross_entropy": False},
    flame=True,
    check_config=check_value_dim,  # flame builds the model from config.json: expand_v must give value_head_dim
    # 1.3B shapes (paper G.1, Table 19): `head_dim` is d_k and d_v = head_dim * expand_v
    presets={"gdn-1.3b": {"hidden_size": 2048, "num_heads": 16, "head_dim": 128, "expand_v": 1.0,
                          "num_hidden_layers": 24, "vocab_size": 32000, "hidden_ratio": 4}},
    tiny_checkpoints=("gated_deltanet",),
    recall_checkpoints=("gated_deltanet_mqar", "gated_deltanet_mqar_s5", "gated_deltanet_mqar_s16",
                        "gated_deltanet_recall", "gated_deltanet_recall_s5", "gated_deltanet_recall_s16",
                        "gated_deltanet_lr1e3", "gated_deltanet_lr1e3_s1", "gated_deltanet_lr1e3_s2"),
    decay_init=init_decay_half_life,
)
