"""Key-channel adapters and surgery: equalities that must hold on tiny float64 models of every family, and a
save/reload round trip of every committed tiny checkpoint.

Slicing vs masking. Mamba-2 has no normalisation: slicing B/C channels equals zeroing their in_proj rows and
conv weights/bias in the dense model. (Gated) DeltaNet and Qwen3.5 L2-normalise q and k in the kernel and scale
q by K^-0.5: zeroed channels leave the norm of the kept ones unchanged and leave zero rows in the state, so the
sliced model equals the masked dense model *with the kernel scale set to K'^-0.5* (here: q and k normalised
before the kernel and q multiplied by sqrt(K/K')); without that the outputs differ.
"""

from __future__ import annotations

import functools
import inspect
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import state_reduction  # noqa: F401  (registers the families)
from state_reduction.models import build_model
from state_reduction.models.families import FAMILIES as REGISTRY
from state_reduction.models.families import MODEL_TYPES, KernelRoute
from state_reduction.models.shared_conv import SharedShortConvolution
from state_reduction.models.families import get_adapter
from state_reduction.pruning.adapters.base import FusedQKAdapter
from state_reduction.pruning.adapters.gated_deltanet import expand_v_for
from state_reduction.pruning.surgery import reduce_model, save_reduced
from state_reduction.pruning.types import KeyChannelSelection

CHECKPOINTS = Path(__file__).resolve().parents[2] / "experiments" / "tiny_models" / "checkpoints"
VOCAB = 97
FAMILIES = list(REGISTRY)  # every stock family, with its tiny test configuration (ModelFamily.test_config)
# families whose kernel L2-normalises q/k, reached through a kernel route (the others compute their scan inline)
DELTA_FAMILIES = [name for name, f in REGISTRY.items() if isinstance(f.state_capture, KernelRoute)]
# Qwen3.5's torch kernels and transformers' Mamba-2 scan compute in float32 even for float64 inputs
ATOL = {name: 1e-10 if f.exact_float64 else 1e-5 for name, f in REGISTRY.items()}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def tiny(family: str, seed: int = 0, **overrides):
    config = {**REGISTRY[family].test_config, "vocab_size": VOCAB, **overrides}
    return build_model(family, config, seed=seed, dtype=torch.float64).eval()


def tokens(seed: int = 0, length: int = 20) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def logits(model, ids) -> torch.Tensor:
    return model(ids, use_cache=False).logits


def random_keep(heads: int, channels: int, kept: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(channels, generator=g)[:kept].sort().values for _ in range(heads)])


def select_all(model, make) -> dict[int, KeyChannelSelection]:
    adapter = get_adapter(model)
    return {ref.layer: make(ref.layer) for ref in adapter.mixers(model)}


def selection_matrix(keep: torch.Tensor, channels: int) -> torch.Tensor:
    """[H, K'] indices -> [H, K', K] rows of the identity (P_I of paper section 3.3)."""
    return torch.nn.functional.one_hot(keep, channels).double()


def wrap_kernels(monkeypatch, family: str, transform) -> None:
    """Replace the family's delta-rule kernels by `transform(q, k, kwargs) -> (q, k)` followed by the kernel."""
    route = REGISTRY[family].state_capture
    module = __import__(route.module, fromlist=["_"])
    for name in route.kernels:
        original = getattr(module, name)

        @functools.wraps(original)
        def wrapped(*args, original=original, **kwargs):
            if "q" in kwargs:
                kwargs["q"], kwargs["k"] = transform(kwargs["q"], kwargs["k"], kwargs)
            else:
                args = (*transform(args[0], args[1], kwargs), *args[2:])
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapped)


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + 1e-6)  # fla's and transformers' in-kernel norm


def conv_channels(model, mixer, keep_mask: torch.Tensor) -> tuple[torch.Tensor, list[torch.nn.Module]]:
    """Conv channel indices of the removed q/k (C/B) channels, and the conv modules they index (a conv whose
    filters are shared with kept channels is not listed: zero projection rows already give zero conv outputs)."""
    removed = (~keep_mask).flatten().nonzero().flatten()  # in [H*K]
    adapter = get_adapter(model)
    if isinstance(adapter, FusedQKAdapter):
        sizes = adapter.conv_segments(mixer)
        offsets = [sum(sizes[:i]) for i in (adapter.q_conv_segment, adapter.k_conv_segment)]
        return torch.cat([o + removed for o in offsets]), [getattr(mixer, adapter.conv)]
    convs = [getattr(mixer, name) for name in (adapter.layout.q_conv, adapter.layout.k_conv)]
    return removed, [c for c in convs if not isinstance(c, SharedShortConvolution)]


@torch.no_grad()
def mask_dense(model, keep: torch.Tensor) -> None:
    """Zero the removed channels' q/k projection rows and conv weights (and bias) in the dense model."""
    adapter = get_adapter(model)
    heads, channels = adapter.key_heads(model.config)
    keep_mask = torch.zeros(heads, channels, dtype=torch.bool).scatter_(1, keep, True)
    for ref in adapter.mixers(model):
        for w in adapter.qk_weights(ref.module):  # views of the projection weights
            w[~keep_mask] = 0
        zero_conv_channels(model, ref.module, keep_mask)


@torch.no_grad()
def zero_conv_channels(model, mixer, keep_mask: torch.Tensor) -> None:
    """Zero the q/k conv filters (and bias) of the channels `keep_mask` [H, K] removes in one mixer."""
    index, convs = conv_channels(model, mixer, keep_mask)
    for conv in convs:
        conv.weight[index] = 0
        if conv.bias is not None:
            conv.bias[index] = 0


# 1. ratio 0 ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_keeping_every_channel_reproduces_dense_logits_exactly(family):
    model, ids = tiny(family), tokens()
    dense = logits(model, ids)
    heads, channels = get_adapter(model).key_heads(model.config)
    keep = torch.arange(channels).repeat(heads, 1)
    reduce_model(model, select_all(model, lambda layer: KeyChannelSelection(keep=keep)))
    assert torch.equal(logits(model, ids), dense)


# 2. slicing vs masking -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_slicing_equals_masking_with_the_new_kernel_scale(family, monkeypatch):
    sliced, masked, ids = tiny(family), tiny(family), tokens()
    heads, channels = get_adapter(sliced).key_heads(sliced.config)
    kept = 5  # odd on purpose
    keep = random_keep(heads, channels, kept)
    reduce_model(sliced, select_all(sliced, lambda layer: KeyChannelSelection(keep=keep)))
    mask_dense(masked, keep)
    out = logits(sliced, ids)
    if family in DELTA_FAMILIES:
        assert not torch.allclose(out, logits(masked, ids), atol=1e-3), "K^-0.5 vs K'^-0.5 should matter"
        factor = math.sqrt(channels / kept)

        def kernel_scale_for_kept(q, k, kwargs):
            kwargs["use_qk_l2norm_in_kernel"] = False
            return l2norm(q) * factor, l2norm(k)

        wrap_kernels(monkeypatch, family, kernel_scale_for_kept)
    torch.testing.assert_close(out, logits(masked, ids), atol=ATOL[family], rtol=0)


# 3. rotations ----------------------------------------------------------------------------------------------------

def random_orthogonal(heads: int, channels: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.linalg.qr(torch.randn(heads, channels, channels, generator=g, dtype=torch.float64))[0]


@pytest.mark.parametrize("family", DELTA_FAMILIES)
def test_orthogonal_rotation_of_post_conv_q_and_k_leaves_output_unchanged(family, monkeypatch):
    """Prop. 3.1: (k_t, q_t) -> (T k_t, T q_t) at the kernel input, per key head."""
    model, ids = tiny(family), tokens()
    dense = logits(model, ids)
    heads, channels = get_adapter(model).key_heads(model.config)
    t = random_orthogonal(heads, channels)

    def rotate(q, k, kwargs):
        return (torch.einsum("hrk,bthk->bthr", t.to(q.dtype), q), torch.einsum("hrk,bthk->bthr", t.to(k.dtype), k))

    wrap_kernels(monkeypatch, family, rotate)
    rotated = logits(model, ids)
    torch.testing.assert_close(rotated, dense, atol=ATOL[family], rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_rotation_by_selection_matrix_equals_slicing(family):
    sliced, rotated, ids = tiny(family), tiny(family), tokens()
    heads, channels = get_adapter(sliced).key_heads(sliced.config)
    keep = random_keep(heads, channels, channels // 2, seed=1)
    reduce_model(sliced, select_all(sliced, lambda layer: KeyChannelSelection(keep=keep)))
    reduce_model(rotated, select_all(rotated, lambda layer: KeyChannelSelection(rotation=selection_matrix(keep, channels))))
    torch.testing.assert_close(logits(rotated, ids), logits(sliced, ids), atol=1e-12, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_rotation_by_permutation_reproduces_dense(family):
    """A permutation moves each channel together with its conv filter (and bias): Prop. 3.1 without approximation."""
    model, ids = tiny(family), tokens()
    dense = logits(model, ids)
    heads, channels = get_adapter(model).key_heads(model.config)
    g = torch.Generator().manual_seed(2)
    perm = torch.stack([torch.randperm(channels, generator=g) for _ in range(heads)])
    reduce_model(model, select_all(model, lambda layer: KeyChannelSelection(rotation=selection_matrix(perm, channels))))
    torch.testing.assert_close(logits(model, ids), dense, atol=ATOL[family], rtol=0)


def test_dense_rotation_is_exact_with_shared_conv_filters_and_no_activation():
    """Lemma B.2 + Prop. 3.1: with one conv filter per head and no SiLU the adapted filters sum_d T[r,d]^2 w equal w,
    and a general orthogonal T on W_Q, W_K leaves DeltaNet unchanged."""
    model, ids = tiny("deltanet", qk_activation="identity"), tokens()
    adapter = get_adapter(model)
    heads, channels = adapter.key_heads(model.config)
    with torch.no_grad():
        for ref in adapter.mixers(model):
            for conv in (ref.module.q_conv1d, ref.module.k_conv1d):
                w = conv.weight.view(heads, channels, -1)
                w.copy_(w[:, :1].expand_as(w))
    dense = logits(model, ids)
    t = random_orthogonal(heads, channels, seed=3)
    reduce_model(model, select_all(model, lambda layer: KeyChannelSelection(rotation=t)))
    torch.testing.assert_close(logits(model, ids), dense, atol=1e-10, rtol=0)


def cache_kwarg(model) -> str:
    """fla models take the cache as `past_key_values`, transformers' Mamba-2 and Qwen3.5 as `cache`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def decoded_logits(model, ids, prefix: int = 8) -> torch.Tensor:
    """Logits of a forward over the first `prefix` tokens, then one token at a time from the model's cache."""
    with torch.no_grad():
        out = model(ids[:, :prefix], use_cache=True)
        steps = [out.logits]
        for t in range(prefix, ids.shape[1]):
            out = model(ids[:, t : t + 1], use_cache=True, **{cache_kwarg(model): out.cache})
            steps.append(out.logits)
    return torch.cat(steps, dim=1)


# 4. cached decode ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_cached_decode_of_pruned_model_equals_full_forward(family):
    model, ids = tiny(family), tokens(length=12)
    heads, channels = get_adapter(model).key_heads(model.config)
    keep = random_keep(heads, channels, channels // 2)
    reduce_model(model, select_all(model, lambda layer: KeyChannelSelection(keep=keep)))
    torch.testing.assert_close(decoded_logits(model, ids), logits(model, ids), atol=ATOL[family], rtol=0)


# hooks -----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_hooks_deliver_the_kernel_inputs_and_the_projection_input(family, monkeypatch):
    model, ids = tiny(family), tokens()
    adapter = get_adapter(model)
    heads, channels = adapter.key_heads(model.config)
    hooked, kernel, inputs = [], [], []
    handles = []
    for ref in adapter.mixers(model):
        handles += adapter.add_hooks(ref.module, on_qk=lambda q, k: hooked.append((q, k)), on_input=inputs.append)
    if family not in DELTA_FAMILIES:  # Mamba-2: the scan is inline; its chunk scan sees C, B
        import transformers.models.mamba2.modeling_mamba2 as mamba2

        original = mamba2.mamba2_chunk_scan

        def scan(x, dt, A, B, C, *args, **kwargs):
            kernel.append((C, B))
            return original(x, dt, A, B, C, *args, **kwargs)

        monkeypatch.setattr(mamba2, "mamba2_chunk_scan", scan)
    else:
        wrap_kernels(monkeypatch, family, lambda q, k, kwargs: kernel.append((q, k)) or (q, k))
    dense = logits(model, ids)
    n_mixers = len(list(adapter.mixers(model)))
    assert len(hooked) == len(kernel) == len(inputs) == n_mixers
    for (q, k), (kq, kk) in zip(hooked, kernel):
        assert q.shape == k.shape == (2, ids.shape[1], heads, channels)
        torch.testing.assert_close(q, kq.to(q.dtype), atol=1e-12, rtol=0)
        torch.testing.assert_close(k, kk.to(k.dtype), atol=1e-12, rtol=0)
    assert all(x.shape == (2, ids.shape[1], model.config.hidden_size) for x in inputs)
    for h in handles:
        h.remove()
    hooked.clear()
    torch.testing.assert_close(logits(model, ids), dense, atol=0, rtol=0)
    assert not hooked


# 6. state size ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_state_bytes_halve_at_50_percent(family):
    model = tiny(family)
    adapter = get_adapter(model)
    heads, channels = adapter.key_heads(model.config)
    before = adapter.state_bytes_per_sequence(model.config)
    reduce_model(model, select_all(model, lambda layer: KeyChannelSelection(keep=random_keep(heads, channels, channels // 2))))
    assert adapter.state_bytes_per_sequence(model.config) * 2 == before
    assert adapter.state_bytes_per_sequence(model.config, torch.float32) == before  # twice the bytes of bf16


def test_state_bytes_count_the_recurrent_state():
    model = tiny("qwen3_5")
    c = model.config
    assert get_adapter(model).state_bytes_per_sequence(c) == 2 * 4 * 16 * 8 * 2  # 2 linear layers, Hv*K*V, bf16


# 5. committed checkpoints: save/reload ---------------------------------------------------------------------------

@pytest.mark.parametrize("ratio", [0.5, 0.75])
@pytest.mark.parametrize("family", FAMILIES)
def test_reduced_checkpoint_saves_and_reloads_exactly(family, ratio, tmp_path):
    path = CHECKPOINTS / REGISTRY[family].tiny_checkpoints[0]
    model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    adapter = get_adapter(model)
    heads, channels = adapter.key_heads(model.config)
    assert channels == 64
    kept = math.floor(channels * (1 - ratio))
    selections = select_all(model, lambda layer: KeyChannelSelection(keep=random_keep(heads, channels, kept, seed=layer)))
    reduce_model(model, selections)
    ids = tokens(length=16)
    before = logits(model, ids)
    out = save_reduced(model, tokenizer, tmp_path / "reduced")
    reloaded = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert adapter.key_heads(reloaded.config) == (heads, kept)
    assert torch.equal(logits(reloaded, ids), before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reduced"]


# 7. errors -------------------------------------------------------------------------------------------------------

def test_unknown_model_type_lists_supported_ones():
    from types import SimpleNamespace

    with pytest.raises(KeyError, match="did you mean 'mamba2'.*supported: delta_net"):
        get_adapter(SimpleNamespace(model_type="mamba"))
    with pytest.raises(KeyError, match="Qwen3_5ForCausalLM.*qwen3_5_text"):
        get_adapter(SimpleNamespace(model_type="qwen3_5"))
    stock = {"delta_net", "delta_net_shared_conv", "gated_deltanet", "mamba2", "qwen3_5_text"}
    shed = {f"{t}_shed" for t in stock - {"delta_net_shared_conv"}}  # structures removed (models/shed.py)
    ralimp = {"delta_net_ralimp", "gated_deltanet_ralimp", "qwen3_5_text_ralimp"}  # linearized MLPs
    kdim = {f"{t}_kdim" for t in stock}  # a key dimension per layer (models/kdim_variant.py)
    assert set(MODEL_TYPES) == stock | shed | ralimp | kdim
    for model_type, family in MODEL_TYPES.items():
        assert get_adapter(SimpleNamespace(model_type=model_type, **{f: 1 for f in family.adapter.required_fields})) \
            is family.adapter


def test_save_refuses_an_existing_directory(tmp_path):
    model = tiny("deltanet")
    (tmp_path / "out").mkdir()
    with pytest.raises(FileExistsError, match=str(tmp_path / "out")):
        save_reduced(model, None, tmp_path / "out")
    save_reduced(model, None, tmp_path / "out", overwrite=True)
    assert (tmp_path / "out" / "config.json").exists()


@pytest.mark.parametrize("family", FAMILIES)
def test_bad_selections_are_rejected_naming_the_layer(family):
    model = tiny(family)
    adapter = get_adapter(model)
    heads, channels = adapter.key_heads(model.config)
    layer = next(iter(adapter.mixers(model))).layer
    bad = {
        "expected \\[H=": KeyChannelSelection(keep=random_keep(heads + 1, channels, 4)),
        "must lie in": KeyChannelSelection(keep=torch.arange(channels - 3, channels + 1).repeat(heads, 1)),
        "not strictly ascending": KeyChannelSelection(keep=torch.tensor([3, 1, 2, 0]).repeat(heads, 1)),
        "rotation has shape": KeyChannelSelection(rotation=torch.zeros(heads, 4, channels + 1)),
    }
    for message, selection in bad.items():
        with pytest.raises(ValueError, match=f"layer {layer}.*{message}"):
            reduce_model(model, select_all(model, lambda _, selection=selection: selection))
    with pytest.raises(ValueError, match="missing"):
        reduce_model(model, {})


@pytest.mark.parametrize("family", [n for n, f in REGISTRY.items() if isinstance(f.adapter, FusedQKAdapter)])
def test_recomputing_hooks_refuse_to_continue_a_cache(family):
    model, ids = tiny(family), tokens(length=6)
    adapter = get_adapter(model)
    with torch.no_grad():
        cache = model(ids[:, :5], use_cache=True).cache
        handles = [h for ref in adapter.mixers(model) for h in adapter.add_hooks(ref.module, on_qk=lambda q, k: None)]
        with pytest.raises(NotImplementedError, match="cannot continue a cache"):
            model(ids[:, 5:], use_cache=True, cache=cache)
    for h in handles:
        h.remove()


def test_gated_deltanet_expand_v_survives_int_truncation():
    for head_v in (128, 256, 96):
        for new_k in range(1, 129):
            expand_v = expand_v_for(head_v, new_k, num_v_heads=6)
            assert int(new_k * expand_v) == head_v and int(6 * new_k * expand_v) == 6 * head_v, (head_v, new_k)


def test_gated_deltanet_config_rebuilds_the_value_dim_with_grouped_value_heads():
    model, ids = tiny("gated_deltanet", num_v_heads=8, expand_v=1.5), tokens()  # head_v_dim 24, kept 7: 24/7
    adapter = get_adapter(model)
    heads, channels = adapter.key_heads(model.config)
    reduce_model(model, select_all(model, lambda layer: KeyChannelSelection(keep=random_keep(heads, channels, 7))))
    rebuilt = AutoModelForCausalLM.from_config(model.config, dtype=torch.float64).eval()
    rebuilt.load_state_dict(model.state_dict())
    for a, b in zip(adapter.mixers(model), adapter.mixers(rebuilt)):
        assert (a.module.head_v_dim, a.module.head_k_dim) == (b.module.head_v_dim, b.module.head_k_dim) == (24, 7)
    assert torch.equal(logits(rebuilt, ids), logits(model, ids))
    assert adapter.state_bytes_per_sequence(model.config) == 2 * 8 * 7 * 24 * 2


def _qwen3_5_vl_config():
    from transformers.models.qwen3_5 import Qwen3_5Config

    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
              "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 2}
    return Qwen3_5Config(text_config={**REGISTRY["qwen3_5"].test_config, "model_type": "qwen3_5_text"},
                         vision_config=vision)


def test_a_vision_language_wrapper_names_the_text_model_and_how_to_get_it():
    config = _qwen3_5_vl_config()
    assert config.model_type == "qwen3_5" and config.text_config.model_type == "qwen3_5_text"
    with pytest.raises(KeyError, match=r"'qwen3_5' is a wrapper .* 'qwen3_5_text' text model in config.text_config: "
                                       r"extract it with transformers.AutoModelForCausalLM.from_pretrained"):
        get_adapter(config)
    assert get_adapter(config.text_config) is REGISTRY["qwen3_5"].adapter


def test_a_config_lacking_the_adapters_fields_names_them_and_the_expected_model_type():
    from types import SimpleNamespace

    wrapper_like = SimpleNamespace(model_type="qwen3_5_text", text_config={"model_type": "qwen3_5_text"})
    with pytest.raises(ValueError, match=r"Qwen3.5 adapter: the config of model_type 'qwen3_5_text' lacks "
                                         r"linear_num_key_heads, .*expected a 'qwen3_5_text' config.*text_config"):
        get_adapter(wrapper_like)
    config = SimpleNamespace(model_type="mamba2", n_groups=8, num_heads=128, head_dim=64, num_hidden_layers=64)
    with pytest.raises(ValueError, match=r"Mamba-2 adapter: .* lacks state_size; expected a 'mamba2' config") as e:
        get_adapter(config)
    assert "wrapper" not in str(e.value)


def test_prune_refuses_a_vision_language_checkpoint_before_loading_it(tmp_path, capsys):
    from transformers.models.qwen3_5 import Qwen3_5ForConditionalGeneration

    from state_reduction.cli import main

    path = tmp_path / "vl"
    Qwen3_5ForConditionalGeneration(_qwen3_5_vl_config()).save_pretrained(path)
    assert main(["prune", str(path), "--method", "l1", "--ratio", "0.5", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "'qwen3_5' is a wrapper" in err and "save_pretrained(text_dir)" in err
    assert not (tmp_path / "o").exists()


FUSED_HOOKS = ("mixer_heads", "proj_segments", "conv_segments", "set_key_dim")


@pytest.mark.parametrize("missing", FUSED_HOOKS)
def test_a_fused_adapter_missing_a_hook_cannot_be_instantiated(missing):
    """A forgotten override fails at construction, naming the adapter and the hook (not a silent None later)."""
    from state_reduction.pruning.adapters.mamba2 import Mamba2Adapter

    methods = ("mixers", "key_heads", "update_config", "state_bytes_per_sequence") + FUSED_HOOKS
    namespace = {name: getattr(Mamba2Adapter, name) for name in methods if name != missing}
    forgetful = type("ForgetfulAdapter", (FusedQKAdapter,), namespace)
    with pytest.raises(TypeError, match=f"ForgetfulAdapter.*{missing}"):
        forgetful()
    type("CompleteAdapter", (FusedQKAdapter,), {name: getattr(Mamba2Adapter, name) for name in methods})()
