"""MLP replacement on tiny models built here: indices, reload-free equivalence of the folded module inside the
model, bad layer counts and non-gated MLPs."""

import pytest
import torch

import state_reduction  # noqa: F401  (registers the families)
from state_reduction.models import build_model
from state_reduction.ralimp.model import LinearizedMLP, decoder_layers, replace_last_mlps

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

GDN = {"hidden_size": 32, "num_hidden_layers": 3, "num_heads": 2, "head_dim": 16, "vocab_size": 61,
       "fuse_cross_entropy": False, "fuse_swiglu": False, "hidden_ratio": 2}


def _gdn():
    return build_model("gated_deltanet", GDN, seed=0).eval()


def test_replace_last_k():
    model = _gdn()
    ids = torch.randint(0, 61, (2, 16), generator=torch.Generator().manual_seed(0))
    idx = replace_last_mlps(model, 2, ids, budget=32, rank=16, sphere=True, clamp=10.0)
    layers = decoder_layers(model)
    assert idx == [1, 2]
    assert not isinstance(layers[0].mlp, LinearizedMLP)
    assert all(isinstance(layers[i].mlp, LinearizedMLP) for i in idx)
    with torch.no_grad():
        out = model(input_ids=ids).logits
        x = torch.randn(5, 32)
        g = layers[2].mlp.gated
        torch.testing.assert_close(g.fold()(x), g(x), rtol=1e-4, atol=1e-5)
    assert torch.isfinite(out).all()


def test_too_many_layers():
    model = _gdn()
    ids = torch.zeros(1, 8, dtype=torch.long)
    with pytest.raises(ValueError, match=r"replace_layers=4 but .* has 3 decoder layers \(accepted: 1..3 or 'all'\)"):
        replace_last_mlps(model, 4, ids)
    with pytest.raises(ValueError, match="replace_layers=0"):
        replace_last_mlps(model, 0, ids)


def test_non_gated_mlp():
    model = _gdn()
    layers = decoder_layers(model)
    layers[2].mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    with pytest.raises(ValueError, match="layer 2 mlp .* is not a gated MLP"):
        replace_last_mlps(model, 1, torch.zeros(1, 8, dtype=torch.long))


def test_variant_reloads_with_auto_class(tmp_path):
    from transformers import AutoModelForCausalLM

    from state_reduction.ralimp.linearize import to_variant

    model = _gdn()
    ids = torch.randint(0, 61, (2, 16), generator=torch.Generator().manual_seed(1))
    spec = {"method": "ralimp", "budget": 32, "rank": 16, "sphere": True, "clamp": 10.0}
    idx = replace_last_mlps(model, 1, ids, **spec)
    variant = to_variant(model, idx, spec).eval()
    variant.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(again).__name__ == "RaLiMPGatedDeltaNetForCausalLM" and again.config.ralimp_layers == [2]
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        torch.testing.assert_close(variant(input_ids=ids).logits, ref)
        torch.testing.assert_close(again(input_ids=ids).logits, ref)


def test_variant_pairs_with_dense_teacher(tmp_path):
    from state_reduction.ralimp.linearize import to_variant
    from state_reduction.models.families import get_adapter
    from state_reduction.rft.targets import extra_trainable, family_targets
    from state_reduction.rft.trainer import check_pair

    dense = _gdn()
    model = _gdn()
    ids = torch.randint(0, 61, (1, 8), generator=torch.Generator().manual_seed(2))
    spec = {"budget": 32, "rank": 8}
    variant = to_variant(model, replace_last_mlps(model, 1, ids, **spec), spec)
    assert variant.config.model_type == "gated_deltanet_ralimp"
    check_pair(variant, dense, str(tmp_path), str(tmp_path))  # one family: no error (no tokenizer files there)
    assert len(list(get_adapter(variant).mixers(variant))) == 3
    assert family_targets("gated_deltanet_ralimp").lora == family_targets("gated_deltanet").lora
    names = extra_trainable(variant, ["mlp.gated"])
    assert names and all(".mlp.gated." in n for n in names)
