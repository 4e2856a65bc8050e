import pytest

from state_reduction.provenance import REPO_ROOT
from state_reduction.rft import RFTConfig, RFTError
from state_reduction.rft.targets import resolve_lora_targets
from state_reduction.rft.trainer import build_student, load_causal_lm

CHECKPOINTS = REPO_ROOT / "experiments" / "tiny_models" / "checkpoints"

EXPECTED_CHILDREN = {"deltanet": {"q_proj", "k_proj", "v_proj"}, "gated_deltanet": {"q_proj", "k_proj", "v_proj"},
                     "mamba2": {"in_proj"}, "qwen3_5": {"in_proj_qkv"}}


def _model(family):
    return load_causal_lm(str(CHECKPOINTS / family), "student")


@pytest.mark.parametrize("family", sorted(EXPECTED_CHILDREN))
def test_lora_on_the_mixers_qkv_projections_and_conv_norm_bias_train(family):
    model = _model(family)
    names = resolve_lora_targets(model, None)
    assert {n.rsplit(".", 1)[-1] for n in names} == EXPECTED_CHILDREN[family]
    cfg = RFTConfig(student="s", teacher=None, out="o", rank=4, alpha=8)
    peft_model = build_student(model, cfg)
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    lora = [n for n in trainable if "lora_" in n]
    assert len(lora) == 2 * len(names)
    others = [n for n in trainable if "lora_" not in n]
    assert others and all(any(s in n for s in ("conv1d", "norm", "bias")) for n in others)
    assert not any(".mlp." in n or "embed" in n or "lm_head" in n for n in trainable)


def test_qwen3_5_attention_layers_and_non_mixer_parts_stay_frozen():
    model = _model("qwen3_5")
    peft_model = build_student(model, RFTConfig(student="s", teacher=None, out="o", rank=4, alpha=8))
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all(".linear_attn." in n for n in trainable)
    assert not any("self_attn" in n for n, _ in peft_model.named_modules() if "lora_" in n)


def test_target_matching_no_module_is_named():
    with pytest.raises(RFTError, match="LoRA target 'qq_proj' matches no module"):
        resolve_lora_targets(_model("deltanet"), ["qq_proj"])


def test_short_convolution_target_is_refused_by_name():
    with pytest.raises(RFTError, match=r"model\.layers\.0\.attn\.q_conv1d .*ShortConvolution"):
        resolve_lora_targets(_model("deltanet"), ["q_conv1d"])


def test_mamba2_out_proj_target_is_refused_by_name():
    with pytest.raises(RFTError, match=r"backbone\.layers\.0\.mixer\.out_proj .*peft refuses out_proj"):
        resolve_lora_targets(_model("mamba2"), ["out_proj"])


def test_non_linear_target_is_refused():
    with pytest.raises(RFTError, match="not a torch.nn.Linear"):
        resolve_lora_targets(_model("deltanet"), [r"model\.layers\.0\.attn_norm"])


def test_flame_export_carries_the_recipe_and_refuses_transformers_families(tmp_path):
    from state_reduction.rft.flame import export_for_flame

    cfg = RFTConfig(student=str(CHECKPOINTS / "deltanet"), teacher=None, out="o")
    text = export_for_flame(cfg, tmp_path / "flame").read_text()
    assert "convert_hf_to_dcp" in text and "checkpoint/step-0" in text
    for flag in ("--optimizer.lr 0.0001", "--optimizer.eps 1e-15", "--lr_scheduler.lr_min 0.1",
                 "--training.batch_size 16", "--training.seq_len 2048", "--training.steps 2000",
                 "--training.max_norm 1.0", f"--model.config {CHECKPOINTS / 'deltanet' / 'config.json'}"):
        assert flag in text
    with pytest.raises(RFTError, match="mamba2"):
        export_for_flame(RFTConfig(student=str(CHECKPOINTS / "mamba2"), teacher=None, out="o"), tmp_path / "m")


def test_flame_export_checks_the_recorded_gdn_value_dim(tmp_path):
    """Pruned GDN rewrites expand_v (1.0 -> 2.0 at 50%) to keep head_v_dim; config.json records value_head_dim
    and the flame export refuses a config whose expand_v no longer gives it."""
    import json

    from state_reduction.pruning.prune import PruneConfig, prune
    from state_reduction.rft.flame import export_for_flame

    out = tmp_path / "gdn-50"
    prune(PruneConfig(model=str(CHECKPOINTS / "gated_deltanet"), method="l1", ratio=0.5, out=str(out)))
    dense = json.loads((CHECKPOINTS / "gated_deltanet" / "config.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert config["value_head_dim"] == int(dense["head_dim"] * dense["expand_v"])
    assert int(config["head_dim"] * config["expand_v"]) == config["value_head_dim"]
    export_for_flame(RFTConfig(student=str(out), teacher=None, out="o"), tmp_path / "flame")
    config["expand_v"] = dense["expand_v"]  # a reader that kept the dense expand_v
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="value_head_dim 128 != int\\(head_dim 32 x expand_v"):
        export_for_flame(RFTConfig(student=str(out), teacher=None, out="o"), tmp_path / "flame2")
