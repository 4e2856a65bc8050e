"""tiny_mqar: scoring is aligned with the labels (an oracle scores 100%, an off-by-one oracle ~0%), the suite is
deterministic and hashed, and it runs on each family through `evaluate`."""

import json

import pytest
import torch

from state_reduction.data.mqar import MQARVocab, mqar_sequences
from state_reduction.evaluation import mqar as mq
from state_reduction.models import build_model

VOCAB = MQARVocab(n_keys=64, n_values=30, n_noise=20, first=100)
V = 256


class _Oracle(torch.nn.Module):
    """Predicts, at a key seen before, the token after its first occurrence (shifted by `offset` pairs)."""

    def __init__(self, offset=0):
        super().__init__()
        self.offset = offset
        self.head = torch.nn.Linear(V, V, bias=False)
        self.head.weight.data = torch.eye(V)
        self.config = type("C", (), {"vocab_size": V})()

    def get_output_embeddings(self):
        return self.head

    def base_model(self, input_ids):
        out = torch.zeros(*input_ids.shape, V)
        for b, row in enumerate(input_ids.tolist()):
            first = {}
            for t, tok in enumerate(row):
                if tok in first:
                    p = first[tok] + 1 + 2 * self.offset
                    out[b, t, row[p] if p < len(row) else 0] = 1
                else:
                    first[tok] = t
        return (out,)


def test_an_oracle_recalls_everything_and_an_off_by_one_oracle_nothing():
    ids, labels = mqar_sequences(32, 64, 8, seed=3, vocab=VOCAB)
    assert mq.mqar_accuracy(_Oracle(), ids, labels, batch_size=5) == (256, 256)
    correct, total = mq.mqar_accuracy(_Oracle(offset=1), ids, labels, batch_size=5)
    assert total == 256 and correct / total < 0.15  # only chance coincidences of equal values


def test_suite_is_deterministic_hashed_and_large_enough(tmp_path):
    a = mq.build_mqar_suite(VOCAB, data_dir=tmp_path / "a")
    b = mq.build_mqar_suite(VOCAB, data_dir=tmp_path / "b")
    assert set(a["cells"]) == set(mq.CELLS)
    for name, cell in a["cells"].items():
        assert cell["sha256"] == b["cells"][name]["sha256"]
        assert cell["n_queries"] >= mq.MIN_QUERIES
        assert 0.5 / cell["n_queries"] ** 0.5 <= 0.01  # one standard error <= 1 point at any accuracy
    assert mq.build_mqar_suite(VOCAB, data_dir=tmp_path / "a") == a  # reused
    path = next(iter(a["cells"].values()))["data_file"]
    with open(path, "ab") as f:
        f.write(b"x")
    rebuilt = mq.build_mqar_suite(VOCAB, data_dir=tmp_path / "a")
    assert json.dumps(rebuilt, sort_keys=True) == json.dumps(a, sort_keys=True)
    # a copied data directory reads its own files (the manifest names them relative to its folder)
    import shutil

    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    shutil.rmtree(tmp_path / "a")
    copied = mq.build_mqar_suite(VOCAB, data_dir=tmp_path / "copy")
    assert all(str(tmp_path / "copy") in c["data_file"] for c in copied["cells"].values())
    assert {n: c["sha256"] for n, c in copied["cells"].items()} == {n: c["sha256"] for n, c in a["cells"].items()}


@pytest.mark.parametrize("family,config", [
    ("deltanet", dict(hidden_size=32, num_hidden_layers=1, num_heads=2, expand_k=0.5, use_short_conv=True)),
    ("mamba2", dict(hidden_size=32, num_hidden_layers=1, state_size=8, n_groups=2, expand=2, head_dim=16,
                    num_heads=4, conv_kernel=4, chunk_size=16)),
])
def test_suite_runs_on_real_models_through_evaluate(tmp_path, one_thread, family, config):
    from state_reduction.evaluation import evaluate

    model = build_model(family, dict(config, vocab_size=1400), seed=0).eval()
    tok = type("T", (), {"name_or_path": None, "__len__": lambda self: 1400})()
    out = evaluate(model, tok, suite="tiny_mqar", batch_size=8, max_length=128, limit=4, data_dir=tmp_path)
    assert set(out["tasks"]) == set(mq.CELLS)
    for name in mq.CELLS:
        acc = out["metrics"][f"{name}_acc"]
        assert 0.0 <= acc <= 1.0
        assert out["n_examples"][name] == 4 * mq.CELLS[name][0]
    # the model's own full forward agrees with the head-at-the-queries scoring
    manifest = mq.build_mqar_suite(data_dir=tmp_path)
    data = torch.load(manifest["cells"]["mqar_32_p8"]["data_file"])
    ids, labels = data["input_ids"][:4], data["labels"][:4]
    with torch.no_grad():
        pred = model(input_ids=ids).logits[:, :-1].argmax(-1)
    scored = labels[:, 1:] != -100
    direct = (pred[scored] == labels[:, 1:][scored]).double().mean().item()
    assert out["metrics"]["mqar_32_p8_acc"] == pytest.approx(direct)


def test_max_length_shorter_than_a_cell_is_refused(tmp_path):
    with pytest.raises(ValueError, match="exceed max_length 32"):
        mq.run_mqar_suite(_Oracle(), VOCAB, max_length=32, data_dir=tmp_path)
