import pytest
import torch

from state_reduction.provenance import REPO_ROOT

CHECKPOINTS = REPO_ROOT / "experiments" / "tiny_models" / "checkpoints"


@pytest.fixture(autouse=True)
def _one_thread_no_wandb(monkeypatch):
    torch.set_num_threads(1)
    monkeypatch.setenv("WANDB_MODE", "disabled")


@pytest.fixture(scope="session")
def dense_deltanet() -> str:
    return str(CHECKPOINTS / "deltanet")


@pytest.fixture(scope="session")
def pruned_deltanet(tmp_path_factory, dense_deltanet) -> str:
    from state_reduction.pruning.prune import PruneConfig, prune

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("pruned") / "deltanet-l1-50"
    prune(PruneConfig(model=dense_deltanet, method="l1", ratio=0.5, out=str(out)))
    return str(out)


def make_small_config(student, teacher, out, **overrides):
    """A few optimizer steps on 4 x 32 tokens: seconds on one CPU thread."""
    from state_reduction.rft import RFTConfig

    settings = {"steps": 4, "batch_size": 4, "seq_len": 32, "warmup_steps": 1, "save_every": 2, "lr": 1e-3,
                "corpora": ["ptb"], "progress": False, "threads": 1, "resume": False}
    settings.update(overrides)
    return RFTConfig.tiny_preset(student, teacher, str(out), **settings)


@pytest.fixture(scope="session")
def small_config():
    return make_small_config


@pytest.fixture(scope="session")
def checkpoints():
    return CHECKPOINTS
