"""The family registry: one canonical name per family (model_type an alias), every fact other modules read comes
from it, and a family declared in one file (tests/models/toy_family.py) is pruned, reloaded, analysed and given
LoRA targets through the registry alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import state_reduction  # noqa: F401  (registers the families)
from state_reduction.errors import InputError, UnknownNameError
from state_reduction.models.families import (
    FAMILIES,
    MODEL_TYPES,
    architectures,
    build_model,
    family_for,
    get_family,
    register_family,
    speed_presets,
    unregister_family,
)
from state_reduction.models.families import get_adapter

import toy_family  # tests/models/toy_family.py (pytest puts this folder on sys.path)

CHECKPOINTS = Path(__file__).resolve().parents[2] / "experiments" / "tiny_models" / "checkpoints"

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_one_canonical_name_per_family_and_the_model_type_as_alias():
    assert list(FAMILIES) == ["deltanet", "deltanet_shared_conv", "gated_deltanet", "mamba2", "qwen3_5"]
    assert get_family("delta_net") is get_family("deltanet") is FAMILIES["deltanet"]
    assert get_family("qwen3_5_text") is FAMILIES["qwen3_5"]
    with pytest.raises(UnknownNameError, match="did you mean 'gated_deltanet'"):
        get_family("gated_delta_net")
    # the vision-language wrapper's model_type is not a family's: the adapter lookup explains it instead
    with pytest.raises(UnknownNameError, match="did you mean"):
        family_for("qwen3_5")


def test_variants_are_derived_from_their_stock_family():
    for model_type, family in MODEL_TYPES.items():
        if family.variant is None:
            assert FAMILIES[family.name] is family
            continue
        stock = FAMILIES[family.base]
        assert model_type == stock.model_type + "_" + family.variant
        assert family.config_class.model_type == model_type and issubclass(family.config_class, stock.config_class)
        assert family.state_capture is stock.state_capture
        assert family.lora.lora == stock.lora.lora
    assert family_for("mamba2_shed").adapter.structure is FAMILIES["mamba2"].adapter.structure
    assert "mamba2_ralimp" not in MODEL_TYPES  # no MLP to linearize
    assert family_for("gated_deltanet_ralimp").lora.extra_scope == "model"


def test_presets_and_architectures_come_from_the_family_modules():
    from state_reduction.pruning.memory_plan import ARCHITECTURES
    from state_reduction.speed.models import PRESETS

    assert PRESETS == speed_presets() and set(PRESETS) == {"dn-1.3b", "gdn-1.3b"}
    assert PRESETS["dn-1.3b"][0] == "deltanet" and PRESETS["gdn-1.3b"][0] == "gated_deltanet"
    assert {k: a.family for k, a in ARCHITECTURES.items()} == {"codestral-7b": "mamba2", "qwen3_5-9b": "qwen3_5"}
    assert architectures() == ARCHITECTURES


def test_a_family_is_registered_once_and_checked():
    with pytest.raises(InputError, match="name 'deltanet' and model_type 'delta_net'"):
        register_family(FAMILIES["deltanet"])
    import dataclasses

    wrong = dataclasses.replace(toy_family.FAMILY, adapter=FAMILIES["deltanet"].adapter)
    with pytest.raises(InputError, match="adapter DeltaNetAdapter is for model_type 'delta_net'"):
        register_family(wrong)
    assert "toy_deltanet" not in FAMILIES


@pytest.fixture
def toy():
    family = register_family(toy_family.FAMILY)
    yield family
    unregister_family(family.name)
    assert "toy_delta_net" not in MODEL_TYPES and "toy_delta_net_shed" not in MODEL_TYPES


def test_a_family_from_one_file_prunes_and_reloads_through_the_registry(toy, tmp_path):
    from state_reduction.pruning.prune import PruneConfig, prune
    from state_reduction.rft.targets import resolve_lora_targets

    assert get_family("toy_delta_net") is toy and family_for("toy_delta_net_ralimp").base == "toy_deltanet"
    model = build_model("toy_deltanet", toy.test_config, seed=0)
    assert type(model) is toy_family.ToyDeltaNetForCausalLM and get_adapter(model) is toy.adapter
    dense = tmp_path / "dense"
    model.save_pretrained(dense)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(CHECKPOINTS / "deltanet" / name, dense / name)

    record = prune(PruneConfig(model=str(dense), method="drrqr", ratio=0.5, out=str(tmp_path / "pruned"),
                               n_calib=2, seq_len=32, batch_size=2))
    assert record["model_type"] == "toy_delta_net" and record["key_dim_after"] == 8
    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "pruned")).eval()
    assert type(reloaded) is toy_family.ToyDeltaNetForCausalLM
    assert toy.adapter.key_heads(reloaded.config) == (2, 8)
    assert json.loads((tmp_path / "pruned" / "config.json").read_text())["model_type"] == "toy_delta_net"
    assert toy.state_bytes(reloaded.config) * 2 == toy.state_bytes(model.config)
    ids = torch.randint(0, 8192, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.isfinite(reloaded(input_ids=ids).logits).all()
    assert resolve_lora_targets(reloaded, None) == [f"model.layers.{i}.attn.{p}" for i in range(2)
                                                    for p in ("q_proj", "k_proj", "v_proj")]


def test_a_family_from_one_file_is_analysed_through_its_kernel_route(toy):
    from state_reduction.analysis.states import capture_kernel_inputs

    model = build_model("toy_deltanet", {**toy.test_config, "vocab_size": 64}, seed=0, dtype=torch.float64).eval()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    captured = capture_kernel_inputs(model, toy.adapter, ids)
    assert sorted(captured) == [0, 1]
    assert captured[0].k.shape == (2, 12, 2, 16) and captured[0].g is None
