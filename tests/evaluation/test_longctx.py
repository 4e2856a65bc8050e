"""The long-context suite: deterministic data with recorded sha256, needles really in the context at the
requested depth and length, the context-length check before any compute, and the tasks running through
lm-eval on a tiny model, checked against a direct computation."""

import hashlib
import json
import re
from pathlib import Path

import pytest
import torch
import yaml

import state_reduction  # noqa: F401  (registers the model families)
from state_reduction.backend import install_cpu_backend
from state_reduction.data import resolve_data_dir
from state_reduction.evaluation import evaluate, longctx
from state_reduction.evaluation import run as run_module
from state_reduction.evaluation.longctx import (
    LENGTHS,
    TASKS,
    ContextLengthError,
    build_longctx_suite,
    check_context_length,
    context_limits,
)
from state_reduction.provenance import REPO_ROOT

CHECKPOINTS = REPO_ROOT / "experiments" / "tiny_models" / "checkpoints"
GDN, QWEN = CHECKPOINTS / "gated_deltanet", CHECKPOINTS / "qwen3_5"


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(GDN))


@pytest.fixture(scope="module")
def manifest(tokenizer):
    return build_longctx_suite(tokenizer)


def _rows(manifest, task):
    return [json.loads(line) for line in Path(manifest["tasks"][task]["data_file"]).read_text().splitlines()]


def _n(tokenizer, text):
    return len(tokenizer(text, add_special_tokens=False).input_ids)


def test_build_is_deterministic_and_hashed(tmp_path, monkeypatch, tokenizer, manifest):
    for task in manifest["tasks"].values():
        assert hashlib.sha256(Path(task["data_file"]).read_bytes()).hexdigest() == task["sha256"]
    # Two fresh builds in other data dirs (corpora linked) give the same bytes; fewer rows keep it fast.
    monkeypatch.setattr(longctx, "N_EXAMPLES", 4)
    builds = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "corpora").symlink_to(resolve_data_dir() / "corpora")
        builds.append(build_longctx_suite(tokenizer, tmp_path / name))
    assert {t: v["sha256"] for t, v in builds[0]["tasks"].items()} == {t: v["sha256"] for t, v in builds[1]["tasks"].items()}
    for t, v in builds[0]["tasks"].items():  # the first rows of the full build are the same rows
        assert Path(v["data_file"]).read_text().splitlines() == _rows_text(manifest, t)[:4]
    assert set(builds[0]["tasks"]) == set(TASKS) == set(run_module.TINY_LONGCTX)
    # A file edited after the build is detected and rebuilt.
    path = Path(builds[0]["tasks"]["tiny_kv_256"]["data_file"])
    path.write_text(path.read_text().replace("The word for", "The word of", 1))
    assert build_longctx_suite(tokenizer, tmp_path / "a")["tasks"]["tiny_kv_256"]["sha256"] == builds[1]["tasks"]["tiny_kv_256"]["sha256"]


def _rows_text(manifest, task):
    return Path(manifest["tasks"][task]["data_file"]).read_text().splitlines()


@pytest.mark.parametrize("task", list(TASKS))
def test_the_answer_is_in_the_context_at_the_requested_depth_and_length(tokenizer, manifest, task):
    length = TASKS[task].length
    rows = _rows(manifest, task)
    assert len(rows) == longctx.N_EXAMPLES and len({r["label"] for r in rows}) == longctx.N_CHOICES
    for row in rows:
        context, answer = row["context"], row["answer"]
        n = _n(tokenizer, context + " " + answer)
        assert n == row["n_tokens"] == _n(tokenizer, context) + 1 and length - 12 <= n <= length
        assert row["choices"][row["label"]] == answer and len(set(row["choices"])) == longctx.N_CHOICES
        assert all(_n(tokenizer, " " + c) == 1 for c in row["choices"])  # one forward scores every choice
        words = re.findall(r"[a-z]+", context.lower())
        haystack = context
        for needle in row["needles"]:
            haystack = haystack.replace(needle + " ", "", 1)
        n_hay = _n(tokenizer, haystack.rsplit(" What is the", 1)[0])
        for needle, start, depth in zip(row["needles"], row["needle_char_starts"], row["depths"]):
            assert context[start:start + len(needle)] == needle
            # the needle sits where `depth` of the haystack's tokens lie before it, up to the word it borders
            # (held-out words such as "<unk>" or "(1900–1980)" are several tokens)
            before = context[:start]
            for other in row["needles"]:
                before = before.replace(other + " ", "")
            after = context[start + len(needle):].split()
            word = max(_n(tokenizer, " " + w) for w in (before.split() or [""])[-1:] + after[:1])
            assert abs(_n(tokenizer, before) - depth * n_hay) <= word + 1
        if TASKS[task].family == "passkey":
            assert words.count(answer) == 2  # twice in the needle, nowhere in the haystack
            assert all(c not in words for c in row["choices"] if c != answer)
            assert context.endswith("The secret word is")
        else:
            assert all(words.count(v) == 1 for v in row["choices"])  # every value once, in its needle
            assert f"The word for {row['query']} is {answer}." in row["needles"]
            assert context.endswith(f"The word for {row['query']} is")
    depths = [r["depths"][0] for r in rows]
    if TASKS[task].family == "passkey":
        assert sorted(set(depths)) == list(longctx.DEPTHS)


def test_context_limits_and_errors(tokenizer):
    from transformers import AutoConfig

    gdn, qwen = AutoConfig.from_pretrained(str(GDN)), AutoConfig.from_pretrained(str(QWEN))
    # Trained at 256: twice that (512) passes, 513 names model, length and limit.
    check_context_length(512, gdn, tokenizer, model_dir=GDN, max_length=512)
    with pytest.raises(ContextLengthError, match=r"context length 513 exceeds the limit 512 of model .*gated_deltanet.*training length 256"):
        check_context_length(513, gdn, tokenizer, model_dir=GDN)
    # lm-eval would cut the context from the left: max_length below the length is an error too.
    with pytest.raises(ContextLengthError, match="exceeds the evaluation's max_length 256"):
        check_context_length(512, gdn, tokenizer, model_dir=GDN, max_length=256)
    # max_position_embeddings binds a model that encodes positions (RoPE), not a recurrent one.
    gdn.max_position_embeddings = qwen.max_position_embeddings = 300
    check_context_length(400, gdn)
    with pytest.raises(ContextLengthError, match="limit 300 .*max_position_embeddings"):
        check_context_length(400, qwen)
    tokenizer = type(tokenizer).from_pretrained(str(GDN), model_max_length=200)
    with pytest.raises(ContextLengthError, match="limit 200 .*tokenizer model_max_length"):
        check_context_length(256, gdn, tokenizer)
    assert context_limits(gdn) == []  # no limit is known: nothing is invented


def test_evaluate_refuses_a_too_long_context_before_any_compute(monkeypatch, tokenizer):
    import lm_eval
    from transformers import AutoModelForCausalLM

    def fail(*a, **k):
        raise AssertionError("lm-eval ran")

    monkeypatch.setattr(lm_eval, "simple_evaluate", fail)
    monkeypatch.setattr(run_module, "build_longctx_suite", fail)
    model = AutoModelForCausalLM.from_pretrained(str(GDN))
    with pytest.raises(ContextLengthError, match="max_length 256"):
        evaluate(model, tokenizer, suite="tiny_longctx", max_length=256)
    model.config.max_position_embeddings = 128
    model.config.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0}  # as if it encoded positions
    with pytest.raises(ContextLengthError, match="limit 128"):
        evaluate(model, tokenizer, suite="tiny_longctx", max_length=512)


def test_pipeline_refuses_a_too_long_context_before_any_run(tmp_path):
    from state_reduction.pipeline import plan_table, run_table

    spec = yaml.safe_load((REPO_ROOT / "experiments" / "long_context" / "config.yaml").read_text())
    spec["profiles"]["tiny"]["evaluate"]["max_length"] = 256
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ContextLengthError, match="max_length 256"):
        plan_table(str(path), "table11", "tiny")
    with pytest.raises(ContextLengthError, match="max_length 256"):
        run_table(str(path), "table11", "tiny", results_root=tmp_path / "results")
    assert not (tmp_path / "results").exists()


def test_tiny_tasks_run_through_lm_eval_and_match_a_direct_computation(tokenizer):
    from transformers import AutoModelForCausalLM

    install_cpu_backend()
    model = AutoModelForCausalLM.from_pretrained(str(GDN)).eval()
    limit = 4
    out = evaluate(model, tokenizer, suite="tiny_longctx", batch_size=8, max_length=max(LENGTHS), limit=limit)
    m = out["metrics"]
    assert out["n_examples"] == {t: limit for t in TASKS}
    for n in LENGTHS:
        assert m[f"ruler_{n}_acc"] == pytest.approx((m[f"passkey_{n}_acc"] + m[f"kv_{n}_acc"]) / 2)
        assert m[f"niah_{n}_acc"] == m[f"passkey_{n}_acc"]
    manifest = build_longctx_suite(tokenizer)
    for task, key in (("tiny_passkey_256", "passkey_256_acc"), ("tiny_kv_512", "kv_512_acc")):
        hits = 0
        for row in _rows(manifest, task)[:limit]:
            ids = tokenizer(row["context"], return_tensors="pt").input_ids
            with torch.no_grad():
                logp = model(ids).logits[0, -1].log_softmax(-1)
            scores = [logp[tokenizer(" " + c, add_special_tokens=False).input_ids[0]].item() for c in row["choices"]]
            hits += max(range(len(scores)), key=scores.__getitem__) == row["label"]
        assert m[key] == pytest.approx(hits / limit)
    assert out["data"][task]["sha256"] == manifest["tasks"][task]["sha256"]


def test_paper_suite_names_installed_lm_eval_tasks():
    tasks_dir = Path(__import__("lm_eval").__file__).parent / "tasks"
    names = set()
    for path in tasks_dir.rglob("*.yaml"):
        match = re.search(r"^task: *(\S+)", path.read_text(), flags=re.MULTILINE)
        if match:
            names.add(match.group(1).strip("\"'"))
    assert set(run_module.PAPER_LONGCTX) <= names
    keys = {k for entries in run_module.PAPER_LONGCTX.values() for _, k, _ in entries}
    for column, parts in run_module.SUITE_MEANS["paper_longctx"].items():
        assert set(parts) <= keys and column.endswith(("_2k_acc", "_4k_acc"))
    assert run_module.SUITE_CONTEXT["paper_longctx"] == 4096 and "paper_longctx" in run_module.HUB_SUITES
