import pytest
import torch

from state_reduction.backend import install_cpu_backend


@pytest.fixture(scope="module")
def one_thread():
    """The CPU backend and one torch thread for a module: tiny models run fastest on one thread; several
    threads on a shared CPU make such modules ~10x slower."""
    install_cpu_backend()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


TINY_TOKENIZER = ("tokenizer.json", "tokenizer_config.json")


def make_tiny_checkpoint(folder, seed: int = 0, trained_at: int = 64):
    """A two-layer DeltaNet (hidden 32, 2 heads of 16 key channels) with the committed tiny tokenizer and a
    training record (seq_len `trained_at`): about 1 MB, loads and prunes in well under a second."""
    import json
    import shutil
    from pathlib import Path

    from state_reduction.models import build_model
    from state_reduction.provenance import TINY_CHECKPOINTS

    folder = Path(folder)
    model = build_model("deltanet", {"hidden_size": 32, "num_hidden_layers": 2, "num_heads": 2, "vocab_size": 8192,
                                     "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 0,
                                     "fuse_cross_entropy": False, "tie_word_embeddings": True}, seed=seed)
    model.save_pretrained(folder)
    for name in TINY_TOKENIZER:
        shutil.copy(TINY_CHECKPOINTS / "deltanet" / name, folder / name)
    (folder / "training_record.json").write_text(json.dumps({"config": {"seq_len": trained_at}}))
    return folder


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """Path of a session-wide tiny DeltaNet checkpoint folder (make_tiny_checkpoint); copy it before damaging it."""
    torch.set_num_threads(1)
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "deltanet")
