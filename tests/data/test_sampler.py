"""The sampler: shapes, determinism, disjoint streams, clear errors, tokenizer handling, caching."""

import datasets
import numpy as np
import pytest
import torch

from state_reduction.data import STREAMS, registry, sample_sequences
from state_reduction.data import sampler
from state_reduction.data.sampler import stream_document_ids, stream_tokens, tokenizer_fingerprint


@pytest.mark.parametrize("stream", STREAMS)
def test_shape_and_dtype(byte_tokenizer, stream):
    x = sample_sequences(byte_tokenizer, "ptb", n=8, seq_len=64, seed=0, stream=stream)
    assert x.shape == (8, 64) and x.dtype == torch.long
    assert int(x.min()) >= 0 and int(x.max()) <= byte_tokenizer.eos_token_id


def test_same_seed_same_tensor_other_seed_other_tensor(byte_tokenizer):
    a = sample_sequences(byte_tokenizer, "wiki", n=16, seq_len=128, seed=3, stream="calibration")
    b = sample_sequences(byte_tokenizer, "wiki", n=16, seq_len=128, seed=3, stream="calibration")
    c = sample_sequences(byte_tokenizer, "wiki", n=16, seq_len=128, seed=4, stream="calibration")
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_windows_are_distinct_within_a_sample(byte_tokenizer):
    x = sample_sequences(byte_tokenizer, "bible", n=256, seq_len=128, seed=0, stream="finetune")
    assert len({tuple(row) for row in x.tolist()}) == 256


@pytest.mark.parametrize("corpus", ["ptb", "wiki", "books", "bible"])
def test_streams_share_no_document(corpus):
    pools = {s: set(stream_document_ids(corpus, s)) for s in STREAMS}
    pools["evaluation-test"] = set(stream_document_ids(corpus, "evaluation", split="test"))
    names = list(pools)
    for i, a in enumerate(names):
        assert pools[a], a
        for b in names[i + 1:]:
            assert not pools[a] & pools[b], (a, b)
    train = stream_document_ids(corpus, "pretrain") + stream_document_ids(corpus, "calibration")
    train += stream_document_ids(corpus, "finetune")
    assert len(train) == len(set(train))


STREAM_KEYS = [("pretrain", None), ("calibration", None), ("finetune", None),
               ("evaluation", "validation"), ("evaluation", "test")]


@pytest.mark.parametrize("corpus", ["ptb", "bible"])
def test_streams_share_no_window(byte_tokenizer, corpus):
    seen = {}
    for stream, split in STREAM_KEYS:
        x = sample_sequences(byte_tokenizer, corpus, n=128, seq_len=64, seed=0, stream=stream, split=split)
        for row in map(tuple, x.tolist()):
            assert seen.setdefault(row, stream + str(split)) == stream + str(split)


def test_no_window_occurs_in_another_streams_text(byte_tokenizer):
    # Wikipedia articles do not repeat each other (PTB repeats boilerplate sentences across its
    # standard splits), so here no window of one stream occurs anywhere in another's text.
    def as_bytes(tokens):
        return bytes(np.where(tokens == 256, 10, tokens).astype(np.uint8))

    text = {key: as_bytes(stream_tokens(byte_tokenizer, "wiki", *key)) for key in STREAM_KEYS}
    for key in STREAM_KEYS:
        x = sample_sequences(byte_tokenizer, "wiki", n=32, seq_len=96, seed=1, stream=key[0], split=key[1])
        for row in x.numpy():
            window = as_bytes(row)
            assert not any(window in text[other] for other in STREAM_KEYS if other != key), key


def test_pool_sizes_follow_the_fractions(byte_tokenizer):
    sizes = {s: len(stream_tokens(byte_tokenizer, "bible", s)) for s in sampler.TRAIN_POOL_FRACTIONS}
    total = sum(sizes.values())
    for stream, fraction in sampler.TRAIN_POOL_FRACTIONS.items():
        assert abs(sizes[stream] / total - fraction) < 0.02, (stream, sizes)


def test_evaluation_reads_validation_or_test(byte_tokenizer):
    val = sample_sequences(byte_tokenizer, "bible", n=4, seq_len=32, seed=0, stream="evaluation")
    val2 = sample_sequences(byte_tokenizer, "bible", n=4, seq_len=32, seed=0, stream="evaluation", split="validation")
    test = sample_sequences(byte_tokenizer, "bible", n=4, seq_len=32, seed=0, stream="evaluation", split="test")
    assert torch.equal(val, val2) and not torch.equal(val, test)


def test_too_few_tokens_says_how_many_there_are(byte_tokenizer):
    available = len(stream_tokens(byte_tokenizer, "wiki", "evaluation", "test"))
    with pytest.raises(ValueError, match=f"has {available} tokens, {available // 1024} windows of seq_len=1024"):
        sample_sequences(byte_tokenizer, "wiki", n=10_000, seq_len=1024, seed=0, stream="evaluation", split="test")


@pytest.mark.parametrize(
    ("stream", "split", "message"),
    [("calibrate", None, "unknown stream 'calibrate'"),
     ("calibration", "validation", "pool of the train split"),
     ("evaluation", "train", "reads 'validation' or 'test'")],
)
def test_bad_stream_or_split(byte_tokenizer, stream, split, message):
    with pytest.raises(ValueError, match=message):
        sample_sequences(byte_tokenizer, "ptb", n=1, seq_len=8, seed=0, stream=stream, split=split)


class HFLikeTokenizer:
    """Adds BOS unless told not to, like an HF tokenizer."""

    eos_token_id = 257
    bos_token_id = 258

    def encode(self, text, add_special_tokens=True):
        ids = list(text.encode("utf-8"))
        return [self.bos_token_id, *ids] if add_special_tokens else ids


class EncodingTokenizer:
    """Returns an object with `.ids`, like a `tokenizers.Tokenizer`."""

    eos_token_id = 256

    class _Encoding:
        def __init__(self, ids):
            self.ids = ids

    def encode(self, text):
        return self._Encoding(list(text.encode("utf-8")))


def test_hf_and_encoding_tokenizers(byte_tokenizer):
    hf = sample_sequences(HFLikeTokenizer(), "ptb", n=64, seq_len=64, seed=0, stream="calibration")
    assert not (hf == HFLikeTokenizer.bos_token_id).any()
    enc = sample_sequences(EncodingTokenizer(), "ptb", n=4, seq_len=64, seed=0, stream="calibration")
    assert torch.equal(enc, sample_sequences(byte_tokenizer, "ptb", n=4, seq_len=64, seed=0, stream="calibration"))


def test_tokenizer_without_eos_is_refused():
    class NoEos:
        eos_token_id = None

        def encode(self, text):
            return [1]

    with pytest.raises(ValueError, match="NoEos has no eos_token_id"):
        sample_sequences(NoEos(), "ptb", n=1, seq_len=8, seed=0, stream="pretrain")


def test_tokenized_splits_are_cached(byte_tokenizer, monkeypatch, tmp_path, shared_data_dir):
    first = stream_tokens(byte_tokenizer, "bible", "finetune")
    monkeypatch.setattr(sampler, "_tokenize_documents", lambda *a: pytest.fail("re-tokenized"))
    assert np.array_equal(stream_tokens(byte_tokenizer, "bible", "finetune"), first)
    assert list((shared_data_dir / "tokens").glob("bible-train-*.npz"))


def test_fingerprint_tells_tokenizers_apart(byte_tokenizer):
    class Shifted:
        eos_token_id = 256

        def encode(self, text):
            return [(b + 1) % 256 for b in text.encode("utf-8")]

    assert tokenizer_fingerprint(byte_tokenizer) == tokenizer_fingerprint(type(byte_tokenizer)())
    assert tokenizer_fingerprint(byte_tokenizer) != tokenizer_fingerprint(Shifted())
    assert tokenizer_fingerprint(byte_tokenizer) != tokenizer_fingerprint(HFLikeTokenizer())


@pytest.fixture
def fake_streaming_corpus(monkeypatch):
    """A paper-profile corpus served by an in-memory IterableDataset, as the hub would stream it."""
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]
    docs = [" ".join(rng.choice(words, size=int(rng.integers(20, 200)))) + f" doc{i}" for i in range(600)]
    info = registry.CorpusInfo(
        name="fake-stream", profile="paper", package="test/fake", version="", sha256=None,
        description="test", domain="test", hf_splits={"train": "train", "validation": "validation",
                                                      "test": "test"}, streaming=True,
    )

    def build(info, split):
        part = docs[:500] if split == "train" else docs[500:]
        return datasets.IterableDataset.from_generator(lambda: ({"text": t} for t in part))

    monkeypatch.setitem(registry._REGISTRY, "fake-stream", registry.CorpusEntry(info, build))
    return docs


def test_streaming_corpus_streams_are_disjoint_and_seeded(fake_streaming_corpus, byte_tokenizer):
    def sample(stream, seed):
        return sample_sequences(byte_tokenizer, "fake-stream", n=8, seq_len=32, seed=seed, stream=stream)

    assert torch.equal(sample("calibration", 0), sample("calibration", 0))
    assert not torch.equal(sample("calibration", 0), sample("calibration", 1))
    ids = {}
    for stream in ("pretrain", "calibration", "finetune"):
        tokens = stream_tokens(byte_tokenizer, "fake-stream", stream, budget=10**9)
        text = bytes(np.where(tokens == 256, 10, tokens).astype(np.uint8)).decode()
        ids[stream] = {w for w in text.split() if w.startswith("doc")}
    assert not ids["pretrain"] & ids["calibration"] and not ids["calibration"] & ids["finetune"]
    assert not ids["pretrain"] & ids["finetune"]
    assert sum(map(len, ids.values())) == 500
    with pytest.raises(ValueError, match="needs a token budget"):
        stream_tokens(byte_tokenizer, "fake-stream", "pretrain")



def test_hf_fast_tokenizer_batch_path_matches_encode():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<eos>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(["the river flows north past the village"] * 20, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", bos_token="<eos>")
    texts = [d.text for d in sampler.tiny_documents("bible", "test")]
    tokens, offsets = sampler._tokenize_documents(tok, texts, "test")
    expected = [tok.encode(t, add_special_tokens=False) + [tok.eos_token_id] for t in texts]
    assert tokens.tolist() == [i for ids in expected for i in ids]
    assert offsets[-1] == len(tokens) and len(offsets) == len(texts) + 1
