"""transformers Qwen3.5 text hybrid (Gated DeltaNet + softmax attention): model_type `qwen3_5_text`; only the
Gated DeltaNet layers (`linear_attn`) are reduced, analysed and adapted by RFT."""

from __future__ import annotations

from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

from state_reduction.backend.delta_rule import l2norm
from state_reduction.models.families.base import Architecture, KernelInputs, KernelRoute, LoraTargets, ModelFamily
from state_reduction.models.families.decay_init import init_decay_half_life
from state_reduction.pruning.adapters.qwen3_5 import Qwen3_5Adapter

_ARGS = ("query", "key", "value", "g", "beta")


def qwen_capture(kw: dict) -> KernelInputs:
    """The layer's own g and beta (value heads share key heads)."""
    q, k, v = kw["query"].double(), kw["key"].double(), kw["value"].double()
    if kw.get("use_qk_l2norm_in_kernel"):
        q, k = l2norm(q), l2norm(k)
    return KernelInputs(q, k, v, kw["beta"].double(), kw["g"].double())


FAMILY = ModelFamily(
    name="qwen3_5",
    model_type=Qwen3_5TextConfig.model_type,
    description="transformers Qwen3.5 text hybrid (Gated DeltaNet + softmax attention)",
    config_class=Qwen3_5TextConfig,
    model_class=Qwen3_5ForCausalLM,
    adapter=Qwen3_5Adapter(),
    # in_proj_qkv rows [q | k | v]; attention layers (self_attn) and everything outside linear_attn stay frozen.
    lora=LoraTargets(lora=("in_proj_qkv",), extra_scope="mixers", unwrappable={
        "conv1d": "the Qwen3.5 gated-delta conv1d is applied functionally (its forward is never called)"}),
    state_capture=KernelRoute("transformers.models.qwen3_5.modeling_qwen3_5",
                              {"torch_chunk_gated_delta_rule": _ARGS, "torch_recurrent_gated_delta_rule": _ARGS},
                              qwen_capture),
    test_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
                 "layer_types": ["linear_attention", "full_attention", "linear_attention"], "num_attention_heads": 2,
                 "num_key_value_heads": 1, "head_dim": 16, "linear_num_key_heads": 2, "linear_key_head_dim": 16,
                 "linear_num_value_heads": 4, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
                 "vocab_size": 97},
    exact_float64=False,  # its torch kernels compute in float32 even for float64 inputs
    architectures=(Architecture(
        "qwen3_5-9b", "Qwen/Qwen3.5-9B, text model (qwen3_5_text)",
        {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 32,
         "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 8, "num_attention_heads": 16,
         "num_key_value_heads": 4, "head_dim": 256, "linear_num_key_heads": 16, "linear_key_head_dim": 128,
         "linear_num_value_heads": 32, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
         "vocab_size": 248320, "tie_word_embeddings": False},
        "text_config of the public Qwen/Qwen3.5-9B config.json as quoted in third-party code (a config probe "
        "test and a shape contract found by code search; not checked against the hub, which is not reachable here)"),),
    tiny_checkpoints=("qwen3_5",),
    recall_checkpoints=("qwen3_5_mqar", "qwen3_5_mqar_s1", "qwen3_5_mqar_s3",
                        "qwen3_5_recall", "qwen3_5_recall_s1", "qwen3_5_recall_s2"),
    decay_init=init_decay_half_life,
    wrapper_model_types=("qwen3_5",),  # Qwen3_5ForConditionalGeneration: the text model is in text_config
)
