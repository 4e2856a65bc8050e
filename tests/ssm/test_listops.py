import dataclasses

import numpy as np
import pytest

from state_reduction.ssm.listops import (CLOSE, DIGIT0, OPEN, PAD, ListOpsSpec, evaluate_tokens, generate,
                                         generate_split, verify)

SPEC = ListOpsSpec(seed=3, n_train=200, n_val=20, n_test=50, min_len=8, max_len=48)


def test_labels_are_the_values_of_the_expressions():
    tokens, lengths, labels = generate_split(SPEC, "train")
    assert all(evaluate_tokens(list(t)) == y for t, y in zip(tokens, labels))
    assert ((SPEC.min_len <= lengths) & (lengths <= SPEC.max_len)).all()
    assert (tokens[np.arange(SPEC.max_len)[None] >= lengths[:, None]] == PAD).all()


def test_evaluate_hand_written():
    e = [OPEN["MAX"], DIGIT0 + 2, OPEN["SM"], DIGIT0 + 7, DIGIT0 + 8, CLOSE, DIGIT0 + 4, CLOSE]   # MAX 2 (7+8)%10 4
    assert evaluate_tokens(e) == 5
    assert evaluate_tokens([OPEN["MED"], DIGIT0 + 9, DIGIT0 + 1, DIGIT0 + 3, DIGIT0 + 6, CLOSE]) == 3   # lower median
    assert evaluate_tokens([OPEN["MIN"], DIGIT0 + 9, DIGIT0 + 1, CLOSE, PAD, PAD]) == 1


def test_generation_is_seeded_and_the_manifest_detects_a_change():
    data, manifest = generate(SPEC)
    again, manifest2 = generate(SPEC)
    assert manifest == manifest2
    verify(again, manifest)
    other, _ = generate(dataclasses.replace(SPEC, seed=4))
    with pytest.raises(ValueError, match="sha256"):
        verify(other, manifest)
    assert len({manifest["splits"][s]["sha256"] for s in ("train", "val", "test")}) == 3


def test_unknown_split():
    with pytest.raises(ValueError, match="train, val, test"):
        SPEC.size("dev")
