"""DeltaNet with shared q/k conv filters (appendix B.5, C.6.1): Auto-class round trip, the filters really are
tied, Lemma B.2 on the whole model (rotations of a head's q/k channels leave it unchanged without SiLU, and do
not for depthwise filters), and pruning with pca / pca-adv / grad."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import state_reduction  # noqa: F401  (registers the families)
from state_reduction.models import build_model
from state_reduction.models.shared_conv import (
    SharedConvDeltaNetConfig,
    SharedShortConvolution,
)
from state_reduction.models.families import get_adapter
from state_reduction.pruning.prune import PruneConfig, prune
from state_reduction.pruning.surgery import reduce_model
from state_reduction.pruning.types import KeyChannelSelection

TOKENIZER = Path(__file__).resolve().parents[2] / "experiments" / "tiny_models" / "tokenizer"
VOCAB = 97
HEADS, CHANNELS = 4, 16
CONFIG = {"hidden_size": 64, "num_hidden_layers": 2, "num_heads": HEADS, "expand_k": 1.0, "expand_v": 1.0,
          "conv_size": 4, "vocab_size": VOCAB, "fuse_cross_entropy": False}
N_FILTERS = {"head": HEADS, "all": 1}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def tiny(sharing: str, seed: int = 0, dtype=torch.float64, **overrides):
    return build_model("deltanet_shared_conv", {**CONFIG, "conv_sharing": sharing, **overrides}, seed=seed,
                       dtype=dtype).eval()


def ids(seed: int = 0, length: int = 24) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def logits(model, x) -> torch.Tensor:
    return model(x, use_cache=False).logits


def random_orthogonal(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.linalg.qr(torch.randn(HEADS, CHANNELS, CHANNELS, generator=g, dtype=torch.float64))[0]


@torch.no_grad()
def rotate_qk_rows(model, t: torch.Tensor) -> None:
    """W_Q -> T W_Q, W_K -> T W_K per head, convs untouched."""
    adapter = get_adapter(model)
    for ref in adapter.mixers(model):
        for w in adapter.qk_weights(ref.module):  # [H, K, d_in] views
            w.copy_(torch.einsum("hrk,hki->hri", t, w.clone()))


@pytest.mark.parametrize("sharing", ["head", "all"])
def test_auto_classes_save_and_reload_exactly(sharing, tmp_path):
    model, x = tiny(sharing, dtype=torch.float32), ids()
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "delta_net_shared_conv" and config["conv_sharing"] == sharing
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(reloaded).__name__ == "SharedConvDeltaNetForCausalLM"
    assert reloaded.model.layers[0].attn.k_conv1d.filters.shape == (N_FILTERS[sharing], 1, 4)
    assert torch.equal(logits(reloaded, x), logits(model, x))


@pytest.mark.parametrize("sharing", ["head", "all"])
def test_filters_are_tied_in_parameters_and_gradients(sharing):
    """One parameter per filter; its gradient is the sum of the per-channel gradients of the same model written
    with depthwise filters (the stock DeltaNet with the expanded weights copied in)."""
    shared = tiny(sharing).train()
    names = [n for n, _ in shared.named_parameters() if "q_conv1d" in n or "k_conv1d" in n]
    assert names and all(n.endswith(".filters") for n in names)
    depthwise = build_model("deltanet", CONFIG, dtype=torch.float64).train()
    state = {k: v for k, v in shared.state_dict().items() if not k.endswith(".filters")}
    for name, module in shared.named_modules():
        if isinstance(module, SharedShortConvolution):
            w = module.weight  # [H*K, 1, W]
            assert w.shape == (HEADS * CHANNELS, 1, 4)
            groups = w.view(N_FILTERS[sharing], -1, 4)  # [n_filters, channels per filter, W]
            assert torch.equal(groups, groups[:, :1].expand_as(groups))
            state[f"{name}.weight"] = w.detach().clone()
    depthwise.load_state_dict(state)
    x = ids()
    for model in (shared, depthwise):
        model(input_ids=x, labels=x).loss.backward()
    assert torch.allclose(logits(shared, x), logits(depthwise, x), atol=1e-12, rtol=0)
    conv = shared.model.layers[1].attn.k_conv1d
    per_channel = depthwise.model.layers[1].attn.k_conv1d.weight.grad  # [H*K, 1, W]
    expected = per_channel.view(N_FILTERS[sharing], -1, 4).sum(1, keepdim=True)
    torch.testing.assert_close(conv.filters.grad, expected, atol=1e-12, rtol=0)
    assert conv.filters.grad.abs().sum() > 0


@pytest.mark.parametrize("sharing", ["head", "all"])
def test_rotating_qk_channels_inside_a_head_leaves_shared_conv_model_unchanged(sharing):
    """Lemma B.2 + Prop. 3.1 on the whole model (q/k activation identity, as the lemma needs): T W_Q, T W_K."""
    model, x = tiny(sharing, qk_activation="identity"), ids()
    dense = logits(model, x)
    rotate_qk_rows(model, random_orthogonal(seed=1))
    torch.testing.assert_close(logits(model, x), dense, atol=1e-10, rtol=0)


def test_the_same_rotation_changes_the_model_with_depthwise_filters():
    model, x = tiny("none", qk_activation="identity"), ids()
    assert isinstance(model.model.layers[0].attn.q_conv1d.weight, torch.nn.Parameter)  # fla's depthwise conv
    dense = logits(model, x)
    rotate_qk_rows(model, random_orthogonal(seed=1))
    assert (logits(model, x) - dense).abs().max() > 1e-4


def test_silu_breaks_the_invariance_even_with_shared_filters():
    """Appendix B.5: the equivariance does not extend through the SiLU that fla applies inside the q/k conv."""
    model, x = tiny("head"), ids()
    dense = logits(model, x)
    rotate_qk_rows(model, random_orthogonal(seed=1))
    assert (logits(model, x) - dense).abs().max() > 1e-4


@pytest.mark.parametrize("sharing", ["head", "all"])
def test_adapter_rotation_and_slicing_keep_the_shared_filters(sharing):
    model, x = tiny(sharing, qk_activation="identity"), ids()
    dense = logits(model, x)
    filters = {n: p.detach().clone() for n, p in model.named_parameters() if n.endswith(".filters")}
    t = random_orthogonal(seed=2)
    reduce_model(model, {ref.layer: KeyChannelSelection(rotation=t) for ref in get_adapter(model).mixers(model)})
    torch.testing.assert_close(logits(model, x), dense, atol=1e-10, rtol=0)
    keep = torch.arange(0, CHANNELS, 2).repeat(HEADS, 1)
    reduce_model(model, {ref.layer: KeyChannelSelection(keep=keep) for ref in get_adapter(model).mixers(model)})
    assert model.config.expand_k == 0.5
    for name, p in model.named_parameters():
        if name.endswith(".filters"):
            assert torch.equal(p, filters[name])
    conv = model.model.layers[0].attn.q_conv1d
    assert conv.weight.shape == (HEADS * CHANNELS // 2, 1, 4) and conv.hidden_size == HEADS * CHANNELS // 2
    assert torch.isfinite(logits(model, x)).all()


@pytest.mark.parametrize("sharing", ["head", "all"])
def test_cached_decode_of_a_pruned_shared_conv_model_equals_full_forward(sharing):
    model, x = tiny(sharing), ids(length=12)
    keep = torch.arange(1, CHANNELS, 3).repeat(HEADS, 1)
    reduce_model(model, {ref.layer: KeyChannelSelection(keep=keep) for ref in get_adapter(model).mixers(model)})
    full = logits(model, x)
    with torch.no_grad():
        out = model(x[:, :8], use_cache=True)
        steps = [out.logits]
        for t in range(8, x.shape[1]):
            out = model(x[:, t:t + 1], use_cache=True, past_key_values=out.cache)
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-10, rtol=0)


def test_config_rejects_unknown_sharing_and_conv_bias():
    with pytest.raises(ValueError, match="conv_sharing='heads'.*none, head, all"):
        SharedConvDeltaNetConfig(conv_sharing="heads")
    with pytest.raises(ValueError, match="conv_bias=True"):
        SharedShortConvolution(64, 4, n_filters=4, bias=True)
    with pytest.raises(ValueError, match="n_filters=3 must divide hidden_size=64"):
        SharedShortConvolution(64, 4, n_filters=3)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A shared-conv (per head) DeltaNet with the tiny tokenizer, saved like a tiny-profile checkpoint."""
    tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER))
    model = build_model("deltanet_shared_conv", {**CONFIG, "vocab_size": len(tokenizer), "conv_sharing": "head",
                                                 "num_heads": 2, "expand_k": 1.0}, seed=0)
    path = tmp_path_factory.mktemp("shared_head")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize("method", ["pca", "pca-adv", "grad"])
def test_pruning_a_shared_conv_checkpoint(checkpoint, tmp_path, method):
    dense = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    x = torch.randint(0, dense.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    fast = {"n_calib": 2, "seq_len": 64, "batch_size": 2}
    prune(PruneConfig(model=str(checkpoint), method=method, ratio=0.0, out=str(tmp_path / "r0"), **fast))
    assert torch.equal(logits(AutoModelForCausalLM.from_pretrained(tmp_path / "r0"), x), logits(dense, x))

    record = prune(PruneConfig(model=str(checkpoint), method=method, ratio=0.5, out=str(tmp_path / "r50"), **fast))
    assert record["key_dim_before"] == 32 and record["key_dim_after"] == 16
    pruned = AutoModelForCausalLM.from_pretrained(tmp_path / "r50").eval()
    assert pruned.config.model_type == "delta_net_shared_conv" and pruned.config.expand_k == 0.5
    for (name, p), q in zip(dense.named_parameters(), pruned.parameters()):
        if name.endswith(".filters"):
            assert torch.equal(p, q), f"{name}: pruning changed a shared filter"
    out = logits(pruned, x)
    assert torch.isfinite(out).all() and not torch.allclose(out, logits(dense, x))


def test_the_flame_370m_configs_build_the_three_variants_with_the_paper_shape():
    """experiments/pca_vs_shared_conv/flame: 24 layers, 8 heads x d_k 128; the three differ only in conv sharing."""
    from transformers import AutoConfig

    folder = TOKENIZER.parents[1] / "pca_vs_shared_conv" / "flame"
    configs = {name: json.loads((folder / f"{name}.json").read_text())
               for name in ("delta_net_370M", "delta_net_shared_head_370M", "delta_net_shared_all_370M")}
    strip = {"model_type", "conv_sharing"}
    assert len({json.dumps({k: v for k, v in c.items() if k not in strip}, sort_keys=True) for c in configs.values()}) == 1
    for name, raw in configs.items():
        config = AutoConfig.for_model(**raw)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        mixer = model.model.layers[0].attn
        assert (config.num_hidden_layers, mixer.num_heads, mixer.head_k_dim) == (24, 8, 128)
        expected = {"delta_net_370M": None, "delta_net_shared_head_370M": 8, "delta_net_shared_all_370M": 1}[name]
        assert getattr(mixer.k_conv1d, "n_filters", None) == expected
        assert 3.6e8 < sum(p.numel() for p in model.parameters()) < 4.0e8


@pytest.mark.parametrize("sharing", ["head", "all"])
def test_tiny_shared_conv_configs_are_the_tiny_deltanet_recipe_but_for_the_sharing(sharing):
    """Table 14 compares pretrained variants: only the conv sharing may differ from the committed ×× model."""
    from state_reduction.training.pretrain import PretrainConfig

    configs = TOKENIZER.parent / "configs"
    base = PretrainConfig.from_yaml(configs / "deltanet.yaml").to_dict()
    trained = json.loads((TOKENIZER.parent / "checkpoints" / "deltanet" / "training_record.json").read_text())["config"]
    assert {k: v for k, v in trained.items() if k != "threads"} == {k: v for k, v in base.items() if k != "threads"}
    shared = PretrainConfig.from_yaml(configs / f"deltanet_shared_{sharing}.yaml").to_dict()
    assert shared.pop("model").pop("conv_sharing") == sharing
    assert (shared.pop("name"), shared.pop("family")) == (f"deltanet_shared_{sharing}", "deltanet_shared_conv")
    model = base.pop("model")
    base.pop("name"), base.pop("family")
    assert shared == base
    assert PretrainConfig.from_yaml(configs / f"deltanet_shared_{sharing}.yaml").model == {**model, "conv_sharing": sharing}
