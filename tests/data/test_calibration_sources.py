"""Calibration sources (data.calibration_sources): `mqar` draws MQAR sequences with the model's training settings,
seeded by the calibration seed; a model without an `mqar:` training section and an unknown name are one-line
errors."""

import json
from pathlib import Path

import pytest
import torch

from state_reduction.data import calibration_source_names, calibration_windows, check_calibration_source
from state_reduction.data.mqar import MQARVocab, manifest_entry, mqar_mixed_pairs
from state_reduction.errors import Error, InputError

CHECKPOINTS = Path(__file__).resolve().parents[2] / "experiments" / "tiny_models" / "checkpoints"
RECALL = CHECKPOINTS / "deltanet_mqar"


def _training_mqar(model_dir: Path) -> dict:
    return json.loads((model_dir / "training_record.json").read_text())["config"]["mqar"]


def _draw(seed: int, n: int = 24, seq_len: int = 32, model_dir: Path = RECALL):
    return calibration_windows("mqar", model_dir=model_dir, tokenizer=None, n=n, seq_len=seq_len, seed=seed,
                               vocab_size=4096)


def test_mqar_is_a_source_beside_the_corpora():
    names = calibration_source_names()
    assert "mqar" in names and {"ptb", "wiki", "books"} <= set(names)


def test_same_seed_same_sequences_and_record_other_seed_others():
    a, rec_a = _draw(0)
    b, rec_b = _draw(0)
    c, rec_c = _draw(1)
    assert torch.equal(a, b) and rec_a == rec_b
    assert not torch.equal(a, c) and rec_a["sequences_sha256"] != rec_c["sequences_sha256"]
    assert a.shape == (24, 32) and a.dtype == torch.int64


def test_record_identifies_the_draw_without_a_file_hash():
    ids, rec = _draw(3)
    section = _training_mqar(RECALL)
    assert rec["corpus"] == "mqar" and rec["seed"] == 3 and rec["n"] == 24 and rec["seq_len"] == 32
    assert rec["tokens"] == ids.numel()
    assert rec["sha256"] is None and "no corpus file" in rec["sha256_note"]
    gen = rec["generator"]
    assert (gen["min_pairs"], gen["max_pairs"]) == (section["min_pairs"], section["max_pairs"])
    assert gen["vocab"] == MQARVocab(**section["vocab"]).to_dict() and gen["training_seq_len"] == 32
    # the hash is that of the generator's sequences and labels at the recorded generator seed
    again, labels = mqar_mixed_pairs(24, 32, gen["min_pairs"], gen["max_pairs"], seed=gen["seed"],
                                     vocab=MQARVocab(**gen["vocab"]))
    assert torch.equal(again, ids) and rec["sequences_sha256"] == manifest_entry(again, labels)


def _mqar_pairs(row: list[int], vocab: MQARVocab) -> list[int]:
    """The pair counts N for which `row` reads k v ... k v (N distinct keys, values), noise, then every key again
    followed by its value."""
    keys, values, noise = (set(t.tolist()) for t in (vocab.keys, vocab.values, vocab.noise))
    found = []
    for n in range(1, len(row) // 4 + 1):
        pairs = dict(zip(row[0:2 * n:2], row[1:2 * n:2]))
        tail = row[len(row) - 2 * n:]
        if (len(pairs) == n and set(pairs) <= keys and set(pairs.values()) <= values
                and set(row[2 * n:len(row) - 2 * n]) <= noise
                and sorted(tail[::2]) == sorted(pairs) and [pairs.get(k) for k in tail[::2]] == tail[1::2]):
            found.append(n)
    return found


@pytest.mark.parametrize("model", ["deltanet_mqar", "mamba2_mqar_s2"])
def test_sequences_are_mqar_sequences_of_the_models_vocabulary(model):
    section = _training_mqar(CHECKPOINTS / model)
    vocab = MQARVocab(**section["vocab"])
    ids, _ = _draw(5, n=64, model_dir=CHECKPOINTS / model)
    counts = [_mqar_pairs(row, vocab) for row in ids.tolist()]
    assert all(len(c) == 1 for c in counts), "every row is an MQAR sequence of exactly one pair count"
    counts = {c[0] for c in counts}
    assert counts <= set(range(section["min_pairs"], section["max_pairs"] + 1)) and len(counts) > 1
    assert not _mqar_pairs(list(range(32)), vocab)  # a row of other ids is not


def test_model_without_mqar_training_section_is_one_line_naming_it():
    text_model = CHECKPOINTS / "deltanet"
    with pytest.raises(InputError) as e:
        check_calibration_source("mqar", text_model)
    message = Error.one_line(e.value)
    assert str(text_model) in message and "`mqar:` section" in message and "\n" not in str(e.value)
    with pytest.raises(InputError, match="no training_record.json"):
        check_calibration_source("mqar", CHECKPOINTS)


def test_sequence_too_short_for_the_trained_pairs_is_refused():
    with pytest.raises(InputError, match="cannot hold the 8 pairs"):
        _draw(0, seq_len=16)


def test_unknown_source_names_the_close_ones():
    with pytest.raises(Error, match="did you mean 'mqar'|Did you mean 'mqar'"):
        check_calibration_source("mqr", RECALL)
