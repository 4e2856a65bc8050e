"""Layer-adaptive budgets end to end (issue 17 part 3): per-layer key dimensions on every family (the `_kdim` config
variant reloads with AutoModelForCausalLM and equals the masked dense model with each layer's K'^-0.5 kernel scale),
exact state bytes, DRRQR's per-channel importance, and `prune --budget` keeping the uniform budget's total."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from state_reduction.errors import InputError
from state_reduction.models.families import FAMILIES as REGISTRY
from state_reduction.models.families import family_for, get_adapter
from state_reduction.pruning import prune as prune_module
from state_reduction.pruning.budgets import Budget, last_head_factor, layer_budget
from state_reduction.pruning.prune import PruneConfig, prune
from state_reduction.pruning.selectors import SELECTORS, SelectorInput, get_selector
from state_reduction.pruning.shed import Candidate, masked
from state_reduction.pruning.srrqr import _qrcp, qrcp_pivot_norms
from state_reduction.pruning.surgery import reduce_model
from state_reduction.pruning.types import KeyChannelSelection
from tests.pruning.test_adapters import (
    ATOL,
    CHECKPOINTS,
    DELTA_FAMILIES,
    FAMILIES,
    decoded_logits,
    l2norm,
    logits,
    random_keep,
    tiny,
    tokens,
    wrap_kernels,
    zero_conv_channels,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def per_layer_keep(model, seed: int = 0) -> dict[int, torch.Tensor]:
    """A different K' in every reducible layer (odd on purpose), random channels."""
    heads, channels = get_adapter(model).key_heads(model.config)
    layers = [ref.layer for ref in get_adapter(model).mixers(model)]
    return {layer: random_keep(heads, channels, channels - 3 - 4 * i, seed=seed + layer) for i, layer in enumerate(layers)}


@pytest.mark.parametrize("family", FAMILIES)
def test_per_layer_key_dims_reload_and_equal_the_masked_dense_model(family, monkeypatch, tmp_path):
    sliced, masked, ids = tiny(family), tiny(family), tokens()
    adapter = get_adapter(sliced)
    heads, channels = adapter.key_heads(sliced.config)
    keeps = per_layer_keep(sliced)
    before = adapter.state_bytes_per_sequence(sliced.config)
    reduce_model(sliced, {layer: KeyChannelSelection(keep=k) for layer, k in keeps.items()})
    assert sliced.config.model_type == REGISTRY[family].model_type + "_kdim"
    assert sliced.config.layer_key_dims == {str(layer): k.shape[1] for layer, k in keeps.items()}
    sliced.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float64).eval()
    assert type(reloaded) is type(sliced) and family_for(reloaded).variant == "kdim"
    out = logits(reloaded, ids)
    assert torch.equal(out, logits(sliced, ids))

    # state bytes: every layer's state is linear in its K', so after = before * mean_l K'_l / K, exactly
    after = family_for(reloaded).state_bytes(reloaded.config)
    assert after * len(keeps) * channels == before * sum(k.shape[1] for k in keeps.values())

    for ref in adapter.mixers(masked):
        w_q, w_k = adapter.qk_weights(ref.module)
        keep_mask = torch.zeros(heads, channels, dtype=torch.bool).scatter_(1, keeps[ref.layer], True)
        with torch.no_grad():
            w_q[~keep_mask] = 0
            w_k[~keep_mask] = 0
    _mask_convs(masked, keeps)
    if family in DELTA_FAMILIES:
        def kernel_scale_per_layer(q, k, kwargs):  # K'_l^-0.5: the layer's kept channels are its nonzero ones
            kept = (q != 0).flatten(0, 1).any(0).sum(-1).clamp(min=1).double()  # [H]
            kwargs["use_qk_l2norm_in_kernel"] = False
            return l2norm(q) * (channels / kept).sqrt()[:, None].to(q.dtype), l2norm(k)

        wrap_kernels(monkeypatch, family, kernel_scale_per_layer)
    torch.testing.assert_close(out, logits(masked, ids), atol=ATOL[family], rtol=0)


def _mask_convs(model, keeps):
    adapter = get_adapter(model)
    heads, channels = adapter.key_heads(model.config)
    with torch.no_grad():
        for ref in adapter.mixers(model):
            keep_mask = torch.zeros(heads, channels, dtype=torch.bool).scatter_(1, keeps[ref.layer], True)
            zero_conv_channels(model, ref.module, keep_mask)


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_decode_with_per_layer_key_dims_equals_the_full_forward(family, tmp_path):
    """The reloaded `_kdim` model decodes token by token from its cache (each layer's state at its own K') to the
    logits of one full forward."""
    model, ids = tiny(family), tokens(length=12)
    reduce_model(model, {layer: KeyChannelSelection(keep=k) for layer, k in per_layer_keep(model).items()})
    model.save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float64).eval()
    assert len(set(model.config.layer_key_dims.values())) > 1
    torch.testing.assert_close(decoded_logits(model, ids), logits(model, ids), atol=ATOL[family], rtol=0)


def test_rft_of_a_per_layer_checkpoint_merges_into_the_same_variant(tmp_path):
    """LoRA RFT takes a `_kdim` student with its family's dense teacher; the merged checkpoint reloads as the same
    variant with the same per-layer K', equals the LoRA model, and the adapters moved."""
    from state_reduction.rft import run_rft
    from state_reduction.rft.trainer import STATE_FILE, build_student, load_causal_lm, load_trainable_state
    from tests.rft.conftest import make_small_config

    dense = str(CHECKPOINTS / "gated_deltanet")
    student = tmp_path / "pruned"
    prune(PruneConfig(model=dense, method="l1", ratio=0.5, budget="global-aire", out=str(student), n_calib=2,
                      seq_len=64, batch_size=2))
    dims = AutoModelForCausalLM.from_pretrained(str(student)).config.layer_key_dims
    assert len(set(dims.values())) > 1  # the global budget gave the layers different K'
    cfg = make_small_config(str(student), dense, tmp_path / "rft", steps=3, rank=4, alpha=24.0, lr=1e-2)
    run_rft(cfg)
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "rft" / "model")).eval()
    assert merged.config.model_type.endswith("_kdim") and merged.config.layer_key_dims == dims
    peft_model = build_student(load_causal_lm(str(student), "student"), cfg)
    load_trainable_state(peft_model, torch.load(tmp_path / "rft" / STATE_FILE, weights_only=False)["trainable"])
    assert any(p.abs().max() > 0 for n, p in peft_model.named_parameters() if "lora_B" in n)
    ids = tokens(length=24)
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, peft_model.eval()(input_ids=ids).logits,
                                   atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_uniform_selection_keeps_the_stock_classes(family):
    model = tiny(family)
    heads, channels = get_adapter(model).key_heads(model.config)
    keep = random_keep(heads, channels, 5)
    reduce_model(model, {ref.layer: KeyChannelSelection(keep=keep) for ref in get_adapter(model).mixers(model)})
    assert model.config.model_type == REGISTRY[family].model_type and not hasattr(model.config, "layer_key_dims")


def test_drrqr_importance_is_the_qrcp_pivot_norm_of_each_channel():
    g = torch.Generator().manual_seed(0)
    M = torch.randn(50, 8, generator=g, dtype=torch.float64) * torch.tensor([3, 1, 2, 0.5, 4, 1, 1, 0.1]).double()
    scores = qrcp_pivot_norms((M.T @ M).numpy(), jitter=0.0)
    order = np.argsort(-scores, kind="stable")
    # direct: greedy Gram-Schmidt on the columns of M, each step taking the largest residual column
    residual, expected = M.clone(), np.zeros(8)
    for _ in range(8):
        norms = residual.norm(dim=0)
        j = int(norms.argmax())
        expected[j] = float(norms[j])
        u = residual[:, j] / norms[j]
        residual = residual - torch.outer(u, u @ residual)
        residual[:, j] = 0
    np.testing.assert_allclose(scores, expected, rtol=1e-8)
    assert np.all(np.diff(scores[order]) <= 1e-12)
    assert list(order) == list(_qrcp(np.linalg.cholesky((M.T @ M).numpy()).T, np.arange(8))[1])
    x = SelectorInput(_stats_with_gram(M), M.T[None].expand(1, 8, 50).clone(), M.T[None].expand(1, 8, 50).clone(), 3,
                      mode="k")
    torch.testing.assert_close(get_selector("drrqr").channel_scores(x)[0], torch.from_numpy(qrcp_pivot_norms((M.T @ M).numpy())))


def _stats_with_gram(M):
    from state_reduction.pruning.types import LayerCalibration

    return LayerCalibration(n_tokens=M.shape[0], gram_k=(M.T @ M)[None], gram_q=(M.T @ M)[None])


def test_every_selector_but_rotations_random_draws_and_set_searches_has_channel_scores():
    # qkscore and qkscore-decay choose a kept set by greedy elimination on a joint error, not by ranking scores
    assert {n for n, s in SELECTORS.items() if s.scores is None} == {"rand", "pca", "pca-adv", "qkscore", "qkscore-decay"}


def test_last_head_factor_is_squared_hinf_over_energy():
    rho = torch.tensor([0.25, 0.81, 1.0], dtype=torch.float64)
    f = last_head_factor(rho, 4000)
    a = rho.sqrt()
    torch.testing.assert_close(f[:2], ((1 + a) / (1 - a))[:2])
    assert f[2] == 4000.0


@pytest.mark.parametrize("family,method,budget", [("gated_deltanet", "l1", "global-aire"),
                                                  ("mamba2", "energy", "global-last"),
                                                  ("qwen3_5", "drrqr", "global-aire")])
def test_prune_with_a_global_budget_keeps_the_uniform_total_and_reloads(tmp_path, family, method, budget):
    out = tmp_path / "out"
    record = prune(PruneConfig(model=str(CHECKPOINTS / family), method=method, ratio=0.75, budget=budget,
                               multiple=2, out=str(out), n_calib=2, seq_len=64, batch_size=2))
    b = record["budget"]
    H = record["key_heads"]
    dims = {int(k): v for k, v in b["layer_key_dims"].items()}
    assert b["requested_channels"] == H * len(dims) * 16
    assert abs(b["kept_channels"] - b["requested_channels"]) < 2 * H  # +- one multiple per head, reported
    assert b["kept_channels"] == H * sum(dims.values()) and all(k % 2 == 0 and k >= 1 for k in dims.values())
    selection = json.loads((out / "selection.json").read_text())
    assert {int(k): len(v["keep"][0]) for k, v in selection["selection"].items()} == dims
    model = AutoModelForCausalLM.from_pretrained(str(out))
    before, after = record["state_bytes_per_sequence"]["before"], record["state_bytes_per_sequence"]["after"]
    assert after == family_for(model).state_bytes(model.config)
    assert after * len(dims) * 64 == before * sum(dims.values())
    if len(set(dims.values())) > 1:
        assert model.config.model_type.endswith("_kdim")


def test_uniform_prune_records_no_budget_fields(tmp_path):
    record = prune(PruneConfig(model=str(CHECKPOINTS / "deltanet"), method="l1", ratio=0.5, out=str(tmp_path / "o")))
    assert "budget" not in record and "budget" not in record["config"] and "budget_floor" not in record["config"]


@pytest.mark.parametrize("kwargs,message", [
    ({"method": "pca", "budget": "global-aire"},
     r"--budget global-aire needs per-channel scores; --method pca has none"),
    ({"method": "rand", "budget": "global-last"}, r"--budget global-last needs per-channel scores; --method rand"),
    ({"method": "l1", "budget": "global-aire", "budget_granularity": "channel"},
     r"--budget-granularity 'channel' unknown; accepted: layer, head"),
    ({"method": "l1", "budget": "global-aire", "budget_floor": 40},
     r"--budget-floor 40: the floors alone need .* the largest floor is 32"),
    ({"method": "l1", "budget": "global-aire", "power_of_two": True}, r"--power-of-two with --budget global-aire"),
    ({"method": "l1", "budget": "global"}, r"--budget 'global' unknown; accepted: uniform, global-aire, global-last"),
])
def test_bad_budget_input_is_one_line(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        prune(PruneConfig(model=str(CHECKPOINTS / "deltanet"), ratio=0.5, out=str(tmp_path / "o"), **kwargs))


# --allow-layer-removal and --budget-granularity head ----------------------------------------------------------

def _spiked(scores: dict) -> dict:
    """Layer scores where the first layer has one dominant channel: its layer-normalised scores are ~0 but one."""
    first = min(scores)
    s = torch.full_like(scores[first], 1e-9)
    s.view(-1)[0] = 1.0
    return {**scores, first: s}


def test_a_layer_left_at_zero_is_refused_without_allow_layer_removal():
    scores = _spiked({0: torch.rand(4, 8, generator=torch.Generator().manual_seed(0)) + 1,
                      1: torch.rand(4, 8, generator=torch.Generator().manual_seed(1)) + 1})
    with pytest.raises(InputError, match=r"leaves layer\(s\) 0 with K'=0 .* pass --allow-layer-removal"):
        layer_budget(scores, 8, 0.5, "global-aire", floor=0)
    b = layer_budget(scores, 8, 0.5, "global-aire", floor=0, allow_layer_removal=True)
    assert b.key_dims[0] == 0 and b.removed_layers == [0] and b.kept_total == b.requested_total == 32
    assert layer_budget(scores, 8, 0.5, "global-aire").key_dims[0] == 1  # the default floor keeps one channel


@pytest.mark.parametrize("family", FAMILIES)
def test_a_removed_mixer_reloads_and_equals_the_model_with_that_mixer_zeroed(family, tmp_path):
    model, dense, ids = tiny(family), tiny(family), tokens()
    adapter = get_adapter(model)
    heads, channels = adapter.key_heads(model.config)
    layers = [ref.layer for ref in adapter.mixers(model)]
    before = adapter.state_bytes_per_sequence(model.config)
    keep = torch.arange(channels).repeat(heads, 1)
    reduce_model(model, {layer: KeyChannelSelection(keep=keep) for layer in layers[1:]}, removed_mixers=[layers[0]])
    assert model.config.model_type.endswith("_kdim") and model.config.removed_mixers == [layers[0]]
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float64).eval()
    assert [ref.layer for ref in get_adapter(reloaded).mixers(reloaded)] == layers[1:]
    with masked(dense, [Candidate("mixer", layers[0])]):
        expected = logits(dense, ids)
    torch.testing.assert_close(logits(reloaded, ids), expected, atol=ATOL[family], rtol=0)
    assert not torch.allclose(expected, logits(dense, ids))  # the removed mixer mattered
    after = family_for(reloaded).state_bytes(reloaded.config)
    assert after * len(layers) == before * (len(layers) - 1)
    torch.testing.assert_close(decoded_logits(reloaded, tokens(length=8)), logits(reloaded, tokens(length=8)),
                               atol=ATOL[family], rtol=0)


def _first_layer_emptied(scores, K, ratio, budget, **kw):
    """The uniform budget with the first layer's channels moved to the second (same total): a budget that empties
    a layer, for prune's handling of it (which budgets empty a layer: the layer_budget tests above)."""
    b = layer_budget(scores, K, ratio, "uniform")
    first, second, *_ = sorted(b.key_dims)
    assert kw["allow_layer_removal"] and 2 * b.key_dims[first] == K
    return Budget({**b.key_dims, first: 0, second: K}, b.requested_total, b.requested_total)


@pytest.mark.parametrize("family", ["gated_deltanet", "mamba2"])
def test_prune_allow_layer_removal_removes_the_mixer_a_global_budget_empties(family, tmp_path, monkeypatch):
    monkeypatch.setattr(prune_module, "layer_budget", _first_layer_emptied)
    out = tmp_path / "out"
    record = prune(PruneConfig(model=str(CHECKPOINTS / family), method="l1", ratio=0.5, budget="global-aire",
                               budget_floor=0, allow_layer_removal=True, out=str(out), n_calib=2, seq_len=64,
                               batch_size=2))
    b = record["budget"]
    assert b["removed_mixers"] == [0] and b["layer_key_dims"]["0"] == 0 and "0" not in record["selection"]
    assert record["config"]["allow_layer_removal"] is True
    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert model.config.removed_mixers == [0] and 0 not in [r.layer for r in get_adapter(model).mixers(model)]
    state = record["state_bytes_per_sequence"]
    assert state["after"] == family_for(model).state_bytes(model.config) == state["before"] // 2


def test_layer_removal_is_refused_where_the_family_has_no_structure_layout(tmp_path, monkeypatch):
    monkeypatch.setattr(prune_module, "layer_budget", _first_layer_emptied)
    adapter = family_for("gated_deltanet").adapter
    monkeypatch.setattr(type(adapter), "structure", None)
    with pytest.raises(InputError, match=r"--allow-layer-removal: GatedDeltaNet has no StructureLayout, so removing "
                                         r"the token mixer of layer\(s\) 0 is not defined"):
        prune(PruneConfig(model=str(CHECKPOINTS / "gated_deltanet"), method="l1", ratio=0.5, budget="global-aire",
                          budget_floor=0, allow_layer_removal=True, out=str(tmp_path / "o"), n_calib=2, seq_len=64,
                          batch_size=2))


def test_head_granularity_gives_each_head_its_own_k_and_keeps_the_total_exactly():
    g = torch.Generator().manual_seed(0)
    scores = {layer: torch.rand(4, 16, generator=g) ** (1 + 3 * layer) for layer in range(3)}
    b = layer_budget(scores, 16, 0.5, "global-aire", granularity="head")
    assert b.kept_total == b.requested_total == 3 * 4 * 8
    assert all(len(d) == 4 and min(d) >= 1 for d in b.head_key_dims.values())
    assert sum(sum(d) for d in b.head_key_dims.values()) == b.kept_total
    assert b.key_dims == {layer: max(d) for layer, d in b.head_key_dims.items()}
    assert b.allocated_total == sum(4 * k for k in b.key_dims.values()) >= b.kept_total
    assert any(len(set(d)) > 1 for d in b.head_key_dims.values())


@pytest.mark.parametrize("family", ["deltanet", "gated_deltanet", "mamba2", "qwen3_5"])
def test_head_granularity_checkpoint_equals_the_masked_dense_model(family, tmp_path, monkeypatch):
    out = tmp_path / "out"
    record = prune(PruneConfig(model=str(CHECKPOINTS / family), method="l1", ratio=0.5, budget="global-aire",
                               budget_granularity="head", out=str(out), n_calib=2, seq_len=64, batch_size=2))
    b = record["budget"]
    H, K = record["key_heads"], record["key_dim_before"]
    assert b["granularity"] == "head" and b["kept_channels"] == b["requested_channels"]
    assert b["kept_channels"] == sum(sum(d) for d in b["head_key_dims"].values())
    assert b["allocated_channels"] == H * sum(b["layer_key_dims"].values()) >= b["kept_channels"]
    state = record["state_bytes_per_sequence"]
    assert state["exact"] * H * len(b["layer_key_dims"]) * K == state["before"] * b["kept_channels"]
    assert state["after"] * H * len(b["layer_key_dims"]) * K == state["before"] * b["allocated_channels"]

    reloaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float64).eval()
    ids = torch.randint(0, reloaded.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0))
    got = logits(reloaded, ids)  # before the masked model's kernels are wrapped
    dense = AutoModelForCausalLM.from_pretrained(str(CHECKPOINTS / family), dtype=torch.float64).eval()
    adapter = get_adapter(dense)
    for ref in adapter.mixers(dense):
        keep_mask = torch.zeros(H, K, dtype=torch.bool)
        for h, channels in enumerate(record["selection"][str(ref.layer)]["head_keep"]):
            keep_mask[h, channels] = True
        assert keep_mask.sum(1).tolist() == b["head_key_dims"][str(ref.layer)]
        with torch.no_grad():
            for w in adapter.qk_weights(ref.module):
                w[~keep_mask] = 0
            zero_conv_channels(dense, ref.module, keep_mask)
    if family in DELTA_FAMILIES:
        def stored_layer_scale(q, k, kwargs):  # the checkpoint's K'^-0.5 at the layer's largest K'_h
            kept = (q != 0).flatten(0, 1).any(0).sum(-1).max().clamp(min=1).double()
            kwargs["use_qk_l2norm_in_kernel"] = False
            return l2norm(q) * (K / kept).sqrt().to(q.dtype), l2norm(k)

        wrap_kernels(monkeypatch, family, stored_layer_scale)
    torch.testing.assert_close(logits(dense, ids), got, atol=ATOL[family], rtol=0)


def test_rft_of_a_checkpoint_with_a_removed_mixer_merges_into_the_same_variant(tmp_path, monkeypatch):
    from state_reduction.rft import run_rft
    from tests.rft.conftest import make_small_config

    monkeypatch.setattr(prune_module, "layer_budget", _first_layer_emptied)
    dense, student = str(CHECKPOINTS / "gated_deltanet"), tmp_path / "pruned"
    prune(PruneConfig(model=dense, method="l1", ratio=0.5, budget="global-aire", budget_floor=0,
                      allow_layer_removal=True, out=str(student), n_calib=2, seq_len=64, batch_size=2))
    run_rft(make_small_config(str(student), dense, tmp_path / "rft", steps=3, rank=4, alpha=24.0, lr=1e-2))
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "rft" / "model")).eval()
    before = AutoModelForCausalLM.from_pretrained(str(student)).config
    assert merged.config.removed_mixers == [0] and merged.config.layer_key_dims == before.layer_key_dims
    assert 0 not in [r.layer for r in get_adapter(merged).mixers(merged)]
