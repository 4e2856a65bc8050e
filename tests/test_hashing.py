"""The one config hash gives the digests the four hashes it replaced gave (results' config_key, RFTConfig.hash,
PretrainConfig.hash, the S5 TrainConfig.hash, MQARVocab.sha256): finished results and resumable runs are still
found. The pinned values were computed with the code before the merge (commit b558dfa)."""

from pathlib import Path

import pytest

from state_reduction.data.mqar import MQARVocab
from state_reduction.hashing import config_key
from state_reduction.provenance import REPO_ROOT
from state_reduction.rft.config import RFTConfig
from state_reduction.ssm.train import TrainConfig
from state_reduction.training.pretrain import PretrainConfig

CONFIGS = REPO_ROOT / "experiments" / "tiny_models" / "configs"


@pytest.mark.parametrize(("config", "digest"), [
    ({"model": "x", "ratio": 0.5, "seeds": [1, 2], "nested": {"b": 1, "a": None}}, "6e07233b050d8606"),
    ({"path": Path("/a/b"), "dtype": "bfloat16", "limit": 0.25}, "d1d5b9ef854f2099"),
    ({}, "44136fa355b3678a"),
])
def test_config_key_pinned(config, digest):
    assert config_key(config) == digest


def test_key_order_does_not_matter_and_values_do():
    assert config_key({"a": 1, "b": 2}) == config_key({"b": 2, "a": 1})
    assert config_key({"a": 1}) != config_key({"a": 2})
    assert config_key({"a": 1}, digits=None).startswith(config_key({"a": 1})) and len(config_key({}, None)) == 64


def test_config_hashes_of_resumable_runs_pinned():
    assert RFTConfig.tiny_preset("s", "t", "o").hash() == "a1f7982911055080"
    assert PretrainConfig.from_yaml(CONFIGS / "deltanet.yaml").hash() == "de4f7c5c1b74cb42"
    assert PretrainConfig.from_yaml(CONFIGS / "mamba2_mqar.yaml").hash() == "756ae4365d2a55b6"
    assert TrainConfig().hash() == "89abfabf009e60b9"
    assert MQARVocab().sha256() == "ffbc0ad0999bd6ac29f7543b92339461d94a5974c7758f9e26a3f107ef5bbf5c"
