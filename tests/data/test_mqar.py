"""MQAR sequences: every query's label is the value paired with its key, only query values are scored, seeded."""

import pytest
import torch

from state_reduction.data.mqar import IGNORE_INDEX, MQARVocab, mqar_mixed_pairs, mqar_sequences

VOCAB = MQARVocab(n_keys=40, n_values=30, n_noise=20, first=100)


@pytest.mark.parametrize("n_pairs,length", [(1, 4), (8, 32), (10, 64), (40, 200)])
def test_queries_ask_every_key_once_and_label_its_value(n_pairs, length):
    ids, labels = mqar_sequences(16, length, n_pairs, seed=5, vocab=VOCAB)
    assert ids.shape == labels.shape == (16, length)
    gap = length - 4 * n_pairs
    for row, lab in zip(ids, labels):
        keys, values = row[:2 * n_pairs:2], row[1:2 * n_pairs:2]
        assert len(set(keys.tolist())) == n_pairs
        assert set(keys.tolist()) <= set(VOCAB.keys.tolist())
        assert set(values.tolist()) <= set(VOCAB.values.tolist())
        assert set(row[2 * n_pairs:2 * n_pairs + gap].tolist()) <= set(VOCAB.noise.tolist())
        pairs = dict(zip(keys.tolist(), values.tolist()))
        q_keys, q_values = row[length - 2 * n_pairs::2], row[length - 2 * n_pairs + 1::2]
        assert sorted(q_keys.tolist()) == sorted(keys.tolist())
        assert [pairs[k] for k in q_keys.tolist()] == q_values.tolist()
        scored = (lab != IGNORE_INDEX).nonzero().flatten()
        assert scored.tolist() == list(range(length - 2 * n_pairs + 1, length, 2))
        assert torch.equal(lab[scored], row[scored])


def test_seeded_and_pure():
    a = mqar_sequences(4, 64, 8, seed=1, vocab=VOCAB)
    b = mqar_sequences(4, 64, 8, seed=1, vocab=VOCAB)
    c = mqar_sequences(4, 64, 8, seed=2, vocab=VOCAB)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_mixed_pair_counts_stay_in_range():
    ids, labels = mqar_mixed_pairs(64, 64, 2, 9, seed=0, vocab=VOCAB)
    counts = (labels != IGNORE_INDEX).sum(1)
    assert counts.min() >= 2 and counts.max() <= 9 and len(set(counts.tolist())) > 3
    assert torch.equal(mqar_mixed_pairs(64, 64, 2, 9, seed=0, vocab=VOCAB)[0], ids)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="n_pairs=41: accepted 1..40"):
        mqar_sequences(1, 400, 41, seed=0, vocab=VOCAB)
    with pytest.raises(ValueError, match="length=30 cannot hold n_pairs=8"):
        mqar_sequences(1, 30, 8, seed=0, vocab=VOCAB)
    with pytest.raises(ValueError, match="token ids up to 189"):
        VOCAB.check(150)
