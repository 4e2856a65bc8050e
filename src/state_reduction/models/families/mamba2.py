"""transformers Mamba-2 (B = key, C = query): model_type `mamba2`.

`import fla` registers fla's own Mamba-2 under `mamba2`, whose torch prefill tiles B/C groups across heads and
disagrees with its decode when n_groups > 1 (REFERENCE.md section 5); `register` puts transformers' class back.
The scan runs inline (no kernel call to intercept): h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, rebuilt from the
in_proj output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, Mamba2Config, Mamba2ForCausalLM, Mamba2Model
from transformers.activations import ACT2FN

from state_reduction.models.families.base import Architecture, KernelInputs, LoraTargets, MixerHooks, ModelFamily
from state_reduction.models.families.decay_init import init_decay_half_life
from state_reduction.pruning.adapters.mamba2 import Mamba2Adapter


def scan_hooks(mixer, record) -> list:
    """Rebuild x, B, C, dt from the in_proj output (conv + SiLU as the layer)."""

    def after_proj(module, args, out):  # out [B, T, P]
        inter, g_, n, heads = mixer.intermediate_size, mixer.n_groups, mixer.ssm_state_size, mixer.num_heads
        xbc, dt = out[..., inter:2 * inter + 2 * g_ * n].double(), out[..., 2 * inter + 2 * g_ * n:].double()
        conv = mixer.conv1d
        width = conv.weight.shape[-1]
        y = F.conv1d(xbc.transpose(1, 2), conv.weight.double(), None if conv.bias is None else conv.bias.double(),
                     padding=width - 1, groups=xbc.shape[-1])[..., :xbc.shape[1]]
        y = ACT2FN[mixer.activation](y).transpose(1, 2)
        x, b, c = torch.split(y, [inter, g_ * n, g_ * n], dim=-1)
        bsz, t = x.shape[:2]
        dt = F.softplus(dt + mixer.dt_bias.double())
        lo, hi = mixer.time_step_limit
        dt = dt.clamp(lo, hi)
        a = -torch.exp(mixer.A_log.double())
        # heads read group h // (heads / groups)
        b = b.reshape(bsz, t, g_, n).repeat_interleave(heads // g_, dim=2)
        c = c.reshape(bsz, t, g_, n).repeat_interleave(heads // g_, dim=2)
        record(KernelInputs(c, b, x.reshape(bsz, t, heads, -1), dt, dt * a, decay_only=True))

    return [mixer.in_proj.register_forward_hook(after_proj)]


def register() -> None:
    AutoConfig.register("mamba2", Mamba2Config, exist_ok=True)
    AutoModel.register(Mamba2Config, Mamba2Model, exist_ok=True)
    AutoModelForCausalLM.register(Mamba2Config, Mamba2ForCausalLM, exist_ok=True)


FAMILY = ModelFamily(
    name="mamba2",
    model_type=Mamba2Config.model_type,
    description="transformers Mamba-2 (B = key, C = query)",
    config_class=Mamba2Config,
    model_class=Mamba2ForCausalLM,
    adapter=Mamba2Adapter(),
    # in_proj holds [z | x | B | C | dt]: x, B, C are Mamba-2's v, k, q (appendix C.3); it is the only projection.
    lora=LoraTargets(lora=("in_proj",), extra_scope="model", unwrappable={
        "out_proj": "peft refuses out_proj on Mamba models (model_type mamba2)",
        "conv1d": "peft refuses conv1d on Mamba models (model_type mamba2)"}),
    state_capture=MixerHooks(scan_hooks),
    test_config={"hidden_size": 64, "num_hidden_layers": 2, "state_size": 16, "n_groups": 2, "expand": 2,
                 "head_dim": 16, "num_heads": 8, "conv_kernel": 4, "chunk_size": 8, "vocab_size": 97},
    register=register,
    exact_float64=False,  # transformers' Mamba-2 scan computes in float32 even for float64 inputs
    # The paper gives no architecture numbers for its large models; this is the public configuration.
    architectures=(Architecture(
        "codestral-7b", "mistralai/Mamba-Codestral-7B-v0.1",
        {"hidden_size": 4096, "num_hidden_layers": 64, "state_size": 128, "n_groups": 8, "expand": 2,
         "head_dim": 64, "num_heads": 128, "conv_kernel": 4, "vocab_size": 32768, "chunk_size": 256,
         "tie_word_embeddings": False, "residual_in_fp32": True},
        "the public config.json of mistralai/Mamba-Codestral-7B-v0.1, which transformers 5.24's Mamba2Config "
        "defaults reproduce field for field (installed package; the hub is not reachable here)"),),
    tiny_checkpoints=("mamba2",),
    recall_checkpoints=("mamba2_mqar", "mamba2_mqar_s1", "mamba2_mqar_s2", "mamba2_recall", "mamba2_recall_s1",
                        "mamba2_recall_s2", "mamba2_recall_s3", "mamba2_recall_s4", "mamba2_recall_s5",
                        "mamba2_recall_s6", "mamba2_recall_s7"),
    decay_init=init_decay_half_life,
    ralimp=False,  # no MLP to linearize
)
