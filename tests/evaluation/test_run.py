"""evaluate() on a real tiny checkpoint through lm-eval, checked against direct computations with the model."""

import json
import logging
import math
import os
import re
from pathlib import Path

import pytest
import torch

import state_reduction  # noqa: F401  (registers the model families)
from state_reduction.backend import install_cpu_backend
from state_reduction.data import load_corpus
from state_reduction.evaluation import (
    TINY_METRICS,
    EvaluationError,
    build_tiny_suite,
    evaluate,
)
from state_reduction.evaluation import run as run_module
from state_reduction.provenance import REPO_ROOT

CHECKPOINT = REPO_ROOT / "experiments" / "tiny_models" / "checkpoints" / "deltanet"
LIMIT = 10


@pytest.fixture(scope="module")
def model_and_tokenizer():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (CHECKPOINT / "config.json").is_file():
        pytest.skip(f"{CHECKPOINT} missing; run `make tiny-models`")
    install_cpu_backend()
    return AutoModelForCausalLM.from_pretrained(str(CHECKPOINT)).eval(), AutoTokenizer.from_pretrained(str(CHECKPOINT))


@pytest.fixture(scope="module")
def result(model_and_tokenizer):
    model, tok = model_and_tokenizer
    return evaluate(model, tok, suite="tiny", batch_size=16, max_length=256, limit=LIMIT)


def test_an_evaluation_logs_no_expected_lm_eval_warnings(model_and_tokenizer, caplog):
    """lm-eval's per-evaluation noise is gone: its warnings about the in-memory model (filtered while the wrapper is
    built), the tiny tasks' metric defaults and the zero-shot override (stated in the task YAMLs). Other warnings of
    lm-eval's model wrapper still pass."""
    model, tok = model_and_tokenizer
    with caplog.at_level(logging.INFO):
        evaluate(model, tok, suite="tiny", batch_size=16, max_length=256, limit=2)
    lm_eval_warnings = [r.getMessage() for r in caplog.records
                        if r.name.startswith("lm_eval") and r.levelno >= logging.WARNING]
    noise = ("is defined, but", "Overwriting default num_fewshot") + run_module.EXPECTED_HFLM_WARNINGS
    assert not [m for m in lm_eval_warnings if any(n in m for n in noise)], lm_eval_warnings
    logger = logging.getLogger(run_module.HFLM_LOGGER)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=run_module.HFLM_LOGGER):
        logger.addFilter(drop := run_module._DropExpectedWarnings())
        try:
            logger.warning(run_module.EXPECTED_HFLM_WARNINGS[0] + " ...")
            logger.warning("some other problem")
        finally:
            logger.removeFilter(drop)
    assert [r.getMessage() for r in caplog.records] == ["some other problem"]


def _rows(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.mark.slow
def test_every_task_runs_with_finite_metrics(result):
    m = result["metrics"]
    assert result["tasks"] == list(TINY_METRICS)
    assert all(math.isfinite(v) for v in m.values())
    for key in ("lambada_acc", "continuation_acc", "continuation_acc_norm", "next_sentence_acc", "zero_shot_avg"):
        assert 0.0 <= m[key] <= 1.0
    for key in ("wiki_word_perplexity", "ptb_word_perplexity", "wiki_byte_perplexity", "lambada_ppl"):
        assert m[key] > 1.0
    assert m["zero_shot_avg"] == pytest.approx((m["lambada_acc"] + m["continuation_acc_norm"] + m["next_sentence_acc"]) / 3)
    manifest = build_tiny_suite()
    assert result["data"] == {t: {"data_file": v["data_file"], "sha256": v["sha256"]}
                              for t, v in manifest["tasks"].items() if t in TINY_METRICS}
    assert result["n_examples"]["tiny_lambada"] == LIMIT
    assert result["model"]["name_or_path"] == str(CHECKPOINT) and result["tokenizer"]["vocab_size"] == 8192
    assert result["n_examples"]["tiny_wiki_ppl"] == min(LIMIT, len(load_corpus("wiki", "test")))


@torch.no_grad()
def test_lambada_acc_equals_greedy_check(result, model_and_tokenizer):
    model, tok = model_and_tokenizer
    rows = _rows(result["data"]["tiny_lambada"]["data_file"])[:LIMIT]
    hits, logliks = [], []
    for row in rows:
        context = tok.encode(row["context"])
        target = tok.encode(row["context"] + row["target"])[len(context):]
        ids = torch.tensor([context + target])
        logits = model(ids[:, :-1]).logits[0, len(context) - 1:]
        hits.append(logits.argmax(-1).tolist() == target)
        logliks.append(torch.log_softmax(logits.double(), -1).gather(-1, torch.tensor(target)[:, None]).sum().item())
    assert result["metrics"]["lambada_acc"] == pytest.approx(sum(hits) / len(hits))
    # lm-eval's `perplexity` aggregation: exp(-mean target log-likelihood); checks the same requests.
    assert result["metrics"]["lambada_ppl"] == pytest.approx(math.exp(-sum(logliks) / len(logliks)), rel=1e-4)


@torch.no_grad()
def _word_perplexity(model, tok, text):
    """exp(-sum log p / words): the first token is predicted from EOS, as lm-eval's rolling windows do."""
    ids = torch.tensor([[tok.eos_token_id] + tok.encode(text)])
    logp = torch.log_softmax(model(ids[:, :-1]).logits.double(), -1)
    loglik = logp[0].gather(-1, ids[0, 1:, None]).sum().item()
    return math.exp(-loglik / len(re.split(r"\s+", text)))


def test_word_perplexity_equals_direct_computation(tmp_path, monkeypatch, model_and_tokenizer):
    model, tok = model_and_tokenizer
    docs = {"tiny_ptb_ppl": "\n".join(load_corpus("ptb", "test")[0]["text"].split("\n")[:3]),
            "tiny_wiki_ppl": load_corpus("wiki", "test")[0]["text"][:400]}
    manifest = json.loads(json.dumps(build_tiny_suite()))
    for name, task in manifest["tasks"].items():
        rows = [{"id": "short", "text": docs[name]}] if name in docs else _rows(task["data_file"])[:2]
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        task["data_file"] = str(path)
    monkeypatch.setattr(run_module, "build_tiny_suite", lambda data_dir=None: manifest)
    for text in docs.values():
        assert len(tok.encode(text)) < 256
    env = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    result = evaluate(model, tok, max_length=256)
    assert {k: os.environ.get(k) for k in env} == env  # the offline switch is scoped to the call
    assert result["n_examples"]["tiny_next_sentence"] == 2
    assert result["metrics"]["ptb_word_perplexity"] == pytest.approx(_word_perplexity(model, tok, docs["tiny_ptb_ppl"]), rel=1e-4)
    assert result["metrics"]["wiki_word_perplexity"] == pytest.approx(_word_perplexity(model, tok, docs["tiny_wiki_ppl"]), rel=1e-4)


def test_paper_suite_offline_is_a_clear_error(monkeypatch):
    from huggingface_hub import HfApi, constants

    def no_tiny_data(*args, **kwargs):
        raise AssertionError("the paper suite must never fall back to tiny data")

    monkeypatch.setattr(run_module, "build_tiny_suite", no_tiny_data)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(EvaluationError, match="Hugging Face hub.*HF_HUB_OFFLINE"):
        evaluate(None, None, suite="paper")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    def unreachable(self, *args, **kwargs):
        raise ConnectionError("no route to huggingface.co")

    monkeypatch.setattr(HfApi, "dataset_info", unreachable)
    with pytest.raises(EvaluationError, match="Hugging Face hub, which is not reachable"):
        evaluate(None, None, suite="paper")


def test_unknown_suite_lists_the_suites():
    with pytest.raises(EvaluationError, match="unknown suite 'tinyy'. Did you mean 'tiny'.*tiny, paper"):
        evaluate(None, None, suite="tinyy")
