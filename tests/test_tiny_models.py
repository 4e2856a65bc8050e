"""The committed tiny-profile checkpoints: they load with stock Auto classes, have the promised
shapes, and their held-out perplexity is at most a third of a unigram model's (recomputed here)."""

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import state_reduction  # noqa: F401  (registers the families)
from state_reduction.backend import install_cpu_backend
from state_reduction.data import get_corpus_info
from state_reduction.data.sampler import stream_tokens
from state_reduction.models.families import FAMILIES
from state_reduction.models.families import get_adapter
from state_reduction.tokenizer import tokenizer_hash
from state_reduction.training.pretrain import EVAL_CORPORA, pretrain_unigram_counts, unigram_nll, window_nll

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "experiments" / "tiny_models"
CHECKPOINTS = TINY / "checkpoints"
# committed checkpoint -> the model_type of its family (ModelFamily.tiny_checkpoints / recall_checkpoints)
TEXT_MODELS = {name: f.model_type for f in FAMILIES.values() for name in f.tiny_checkpoints}
RECALL_MODELS = {name: f.model_type for f in FAMILIES.values() for name in f.recall_checkpoints}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(TINY / "tokenizer"))


@pytest.fixture(scope="module")
def unigram_counts(tokenizer):
    """Add-one unigram fitted on the same pretraining streams the models were trained on."""
    return pretrain_unigram_counts(tokenizer, ("ptb", "wiki", "books", "bible"))


def test_checkpoints_fit_the_size_budget():
    total = sum(f.stat().st_size for f in CHECKPOINTS.rglob("*") if f.is_file())
    # six text models of ~8.5 MiB and twenty-nine recall models of ~3 MiB (*_mqar, three pretraining seeds per family,
    # the recall recipes' seeds of the hybrid, Gated DeltaNet (two) and Mamba-2, whose recipe has five more seeds as
    # a confirmation set; ~134.5 MiB in all), with room for three more
    assert total <= 144 * 2**20, f"checkpoints take {total / 2**20:.1f} MiB > 144 MiB"


def test_tokenizer_is_byte_level_bpe_of_about_8k(tokenizer):
    assert 7000 <= len(tokenizer) <= 9000
    text = "Pierre Vinken, 61 years old, will join the board. Ünïcödé 漢字\n\tAnd God said"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    assert tokenizer.eos_token_id is not None and tokenizer.pad_token_id is not None


def test_every_committed_checkpoint_belongs_to_a_family():
    committed = {p.name for p in CHECKPOINTS.iterdir() if (p / "config.json").is_file()}
    assert committed - set(TEXT_MODELS) - set(RECALL_MODELS) == set()
    assert set(TEXT_MODELS) <= committed, "every family names a committed text checkpoint"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TEXT_MODELS))
def test_checkpoint_loads_and_beats_unigram_by_3x(name, tokenizer, unigram_counts):
    install_cpu_backend()
    path = CHECKPOINTS / name
    model = AutoModelForCausalLM.from_pretrained(str(path))
    assert model.config.model_type == TEXT_MODELS[name]
    family = FAMILIES[next(f for f in FAMILIES if name in FAMILIES[f].tiny_checkpoints)]
    assert type(model) is family.model_class, "mamba2 must load as transformers' class, not fla's"
    assert get_adapter(model).key_heads(model.config)[1] == 64
    record = json.loads((path / "training_record.json").read_text())
    assert record["tokenizer_sha256"] == tokenizer_hash(TINY / "tokenizer") == tokenizer_hash(path)
    for corpus, meta in record["data"].items():
        assert meta["sha256"] == get_corpus_info(corpus).sha256, corpus
    assert record["train_tokens_seen"] > 0 and record["wall_time_s"] > 0
    seq_len = record["config"]["seq_len"]
    for corpus in EVAL_CORPORA:
        tokens = torch.from_numpy(stream_tokens(tokenizer, corpus, "evaluation", split="test"))
        ppl = math.exp(window_nll(model, tokens, seq_len, 32).double().mean().item())
        uni = math.exp(unigram_nll(unigram_counts, tokens, seq_len).mean().item())
        reported = record["eval"][f"{corpus}_test"]
        assert ppl == pytest.approx(reported["ppl"], rel=1e-3), (corpus, ppl, reported)
        assert uni == pytest.approx(reported["unigram_ppl"], rel=1e-6), (corpus, uni, reported)
        assert ppl <= uni / 3, f"{name} {corpus} test ppl {ppl:.1f} > unigram {uni:.1f} / 3"


@pytest.mark.parametrize("name", [n for n in RECALL_MODELS if (CHECKPOINTS / n / "training_record.json").is_file()])
def test_recall_checkpoint_reproduces_its_recorded_mqar_accuracy(name, tokenizer):
    """A committed recall model (experiments/tiny_models/configs/*_mqar.yaml) loads with the stock classes at key
    dimension 16, and its MQAR accuracy recomputed on the recorded query sets equals the training record's."""
    from state_reduction.data.mqar import mqar_sequences
    from state_reduction.evaluation.mqar import mqar_accuracy
    from state_reduction.training.pretrain import MQAR_EVAL_QUERIES, MQAR_EVAL_SEED, PretrainConfig

    install_cpu_backend()
    path = CHECKPOINTS / name
    model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    assert model.config.model_type == RECALL_MODELS[name]
    assert get_adapter(model).key_heads(model.config)[1] == 16
    record = json.loads((path / "training_record.json").read_text())
    assert record["tokenizer_sha256"] == tokenizer_hash(TINY / "tokenizer")
    cfg = PretrainConfig(**{**record["config"], "adam_betas": tuple(record["config"]["adam_betas"])})
    for key, entry in record["eval"]["mqar"].items():
        n_pairs = int(key.removeprefix("pairs_"))
        assert entry["queries"] >= MQAR_EVAL_QUERIES
        ids, labels = mqar_sequences(-(-MQAR_EVAL_QUERIES // n_pairs), cfg.seq_len, n_pairs,
                                     MQAR_EVAL_SEED + n_pairs, cfg.mqar_vocab())
        correct, total = mqar_accuracy(model, ids, labels, batch_size=64)
        assert (correct / total, total) == (pytest.approx(entry["accuracy"], abs=1e-9), entry["queries"]), key
