"""Run a suite through lm-eval (HFLM over an in-memory model) and flatten the paper's metric choices.

Each suite is one table: task -> [(lm-eval metric, our key, counted in zero_shot_avg)].
"""

from __future__ import annotations

import difflib
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import HfApi, constants
from transformers import AutoModelForCausalLM

from state_reduction.checkpoints import load_config, load_model, load_tokenizer
from state_reduction.devices import compute_dtype
from state_reduction.errors import Error
from state_reduction.evaluation.longctx import LENGTHS as LONGCTX_LENGTHS, check_length_option
from state_reduction.evaluation.longctx import TASKS as LONGCTX_TASKS
from state_reduction.evaluation.longctx import build_longctx_suite, check_context_length
from state_reduction.evaluation.mqar import CELLS as MQAR_CELLS
from state_reduction.evaluation.mqar import run_mqar_suite
from state_reduction.evaluation.tiny_suite import build_tiny_suite, render_task_yamls
from state_reduction.options import example_limit, length_int, positive_int


class EvaluationError(Error, RuntimeError):
    """A suite could not be run; the message names the suite and what is missing."""


# Reference section 3: acc_norm for ARC-e/ARC-c/HellaSwag/PIQA, acc for WinoGrande and LAMBADA,
# their average; WikiText word perplexity; LAMBADA perplexity.
PAPER_METRICS: dict[str, list[tuple[str, str, bool]]] = {
    "arc_easy": [("acc_norm", "arc_easy_acc_norm", True)],
    "arc_challenge": [("acc_norm", "arc_challenge_acc_norm", True)],
    "hellaswag": [("acc_norm", "hellaswag_acc_norm", True)],
    "piqa": [("acc_norm", "piqa_acc_norm", True)],
    "winogrande": [("acc", "winogrande_acc", True)],
    "lambada_openai": [("acc", "lambada_acc", True), ("perplexity", "lambada_ppl", False)],
    "wikitext": [("word_perplexity", "wiki_word_perplexity", False)],
}

# The same choices on the offline stand-ins: acc_norm for the HellaSwag-like task, acc for the
# LAMBADA-like and the 2-way (WinoGrande-like) tasks.
def _rolling_ppl(corpus: str) -> list[tuple[str, str, bool]]:
    """A rolling-perplexity task's metrics, named after its corpus (none counted in zero_shot_avg)."""
    return [(m, f"{corpus}_{m}", False) for m in ("word_perplexity", "byte_perplexity", "bits_per_byte")]


TINY_METRICS: dict[str, list[tuple[str, str, bool]]] = {
    "tiny_wiki_ppl": _rolling_ppl("wiki"),
    "tiny_ptb_ppl": _rolling_ppl("ptb"),
    "tiny_lambada": [("acc", "lambada_acc", True), ("perplexity", "lambada_ppl", False)],
    "tiny_continuation": [("acc_norm", "continuation_acc_norm", True), ("acc", "continuation_acc", False)],
    "tiny_next_sentence": [("acc", "next_sentence_acc", True), ("acc_norm", "next_sentence_acc_norm", False)],
}
# A second held-out corpus for ptb-calibrated sweeps (the selector benchmark): the books test split, and on the
# paper profile the first validation shard of C4 (lm-eval's `c4` task). Neither is part of the suites above.
HELDOUT_METRICS: dict[str, list[tuple[str, str, bool]]] = {
    "tiny_books_ppl": _rolling_ppl("books"),
    "c4": [("word_perplexity", "c4_word_perplexity", False), ("bits_per_byte", "c4_bits_per_byte", False)],
}

# Long-context retrieval (Tables 4, 11, 12). Tiny: the synthetic tasks of `longctx` at the tiny models' training
# length (256) and twice that, as the paper evaluates its 2K-trained models at 2K and 4K. Paper: lm-eval's
# RULER (13 tasks, sized at 2K and 4K through the metadata `max_seq_lengths`), SQuAD and SWDE completion.
TINY_LONGCTX: dict[str, list[tuple[str, str, bool]]] = {
    name: [("acc", f"{task.family}_{task.length}_acc", False)] for name, task in LONGCTX_TASKS.items()}
RULER_TASKS = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
               "niah_multikey_3", "niah_multiquery", "niah_multivalue", "ruler_vt", "ruler_cwe", "ruler_fwe",
               "ruler_qa_squad", "ruler_qa_hotpot")
PAPER_LONGCTX_LENGTHS = (2048, 4096)
PAPER_LONGCTX: dict[str, list[tuple[str, str, bool]]] = {
    **{t: [(str(n), f"{t}_{n // 1024}k_acc", False) for n in PAPER_LONGCTX_LENGTHS] for t in RULER_TASKS},
    "squad_completion": [("contains", "squad_acc", False)],
    "swde": [("contains", "swde_acc", False)],
}
# Table columns that are means over tasks: RULER = the unweighted mean of its tasks (lm-eval's group with
# weight_by_size False); NIAH = the single-needle tasks (the paper names "single-needle" without a variant).
SUITE_MEANS = {
    "tiny_longctx": {f"{col}_{n}_acc": [f"{f}_{n}_acc" for f in families]
                     for n in LONGCTX_LENGTHS for col, families in (("ruler", ("passkey", "kv")), ("niah", ("passkey",)))},
    "paper_longctx": {f"{col}_{n // 1024}k_acc": [f"{t}_{n // 1024}k_acc" for t in tasks]
                      for n in PAPER_LONGCTX_LENGTHS
                      for col, tasks in (("ruler", RULER_TASKS), ("niah", RULER_TASKS[:3]))},
}
# The context length (tokens) each long-context suite asks of the model, checked before any compute.
SUITE_CONTEXT = {"tiny_longctx": max(LONGCTX_LENGTHS), "paper_longctx": max(PAPER_LONGCTX_LENGTHS)}

# Recall (MQAR, section `evaluation.mqar`): scored directly (greedy value at each queried key), not through lm-eval.
TINY_MQAR: dict[str, list[tuple[str, str, bool]]] = {
    name: [("acc", f"{name}_acc", False)] for name in MQAR_CELLS}
SUITE_CONTEXT["tiny_mqar"] = max(length for _, length in MQAR_CELLS.values())

# Perplexity only (the ablations of Tables 2, 7, 14-16 report WikiText-2 perplexity): the same tasks and
# metrics without the choice tasks, which dominate the run time.
SUITES = {"tiny": TINY_METRICS, "paper": PAPER_METRICS,
          "tiny_ppl": {t: TINY_METRICS[t] for t in ("tiny_wiki_ppl", "tiny_ptb_ppl")},
          # held-out perplexity alone for ptb-calibrated sweeps: the 4 wiki test documents are ~21% of tiny_ppl's
          # text (the 76 ptb ones the rest), so a selector grid costs a fifth of the evaluation
          "tiny_wiki": {"tiny_wiki_ppl": TINY_METRICS["tiny_wiki_ppl"]},
          # the choice tasks only: a few examples cost seconds where rolling perplexity over whole documents costs
          # minutes at 1.3B width on a CPU (the rehearsal's evaluation stage)
          "tiny_choice": {t: TINY_METRICS[t] for t in ("tiny_lambada", "tiny_continuation", "tiny_next_sentence")},
          "paper_ppl": {"wikitext": PAPER_METRICS["wikitext"]},
          "tiny_books": {"tiny_books_ppl": HELDOUT_METRICS["tiny_books_ppl"]},
          "paper_c4": {"c4": HELDOUT_METRICS["c4"]},
          "tiny_longctx": TINY_LONGCTX, "paper_longctx": PAPER_LONGCTX, "tiny_mqar": TINY_MQAR}
def metric_tasks(suite: str, metric: str) -> list[str]:
    """The tasks of `suite` behind one of its metrics: the task that reports it; for `zero_shot_avg`, the tasks whose
    metric is counted in the average; for a mean over tasks (SUITE_MEANS), the tasks of its parts. [] when the suite
    has no such metric (e.g. a column read from another suite)."""
    table = SUITES.get(suite, {})
    reported = {key: task for task, entries in table.items() for _, key, _ in entries}
    if metric == "zero_shot_avg":
        return [task for task, entries in table.items() if any(in_avg for *_, in_avg in entries)]
    if metric in SUITE_MEANS.get(suite, {}):
        return list(dict.fromkeys(reported[part] for part in SUITE_MEANS[suite][metric] if part in reported))
    return [reported[metric]] if metric in reported else []


# Suites scored by their own function instead of lm-eval: suite -> f(model, batch_size, max_length, limit, data_dir).
DIRECT_SUITES = {"tiny_mqar": lambda model, batch_size, max_length, limit, data_dir: run_mqar_suite(
    model, batch_size=batch_size, max_length=max_length, limit=int(limit) if limit else None, data_dir=data_dir)}
HUB_SUITES = ("paper", "paper_ppl", "paper_longctx", "paper_c4")
_OFFLINE_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def _suite_table(suite: str) -> dict:
    if suite not in SUITES:
        close = difflib.get_close_matches(suite, SUITES, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise EvaluationError(f"unknown suite {suite!r}.{hint} Known suites: {', '.join(SUITES)}.")
    return SUITES[suite]


def _require_hub() -> None:
    """The paper suite's datasets come from the Hugging Face hub: fail before loading any model input."""
    if constants.HF_HUB_OFFLINE and os.environ.get("STATE_REDUCTION_CACHE"):
        return  # a prefetched cache (state-reduction prefetch), checked by run-table before any compute
    if constants.HF_HUB_OFFLINE:
        raise EvaluationError(
            "suite 'paper' needs the Hugging Face hub (datasets allenai/ai2_arc, Rowan/hellaswag, ...), "
            "but HF_HUB_OFFLINE is set; run it where the hub is reachable, or use suite='tiny'")
    try:
        HfApi().dataset_info("allenai/ai2_arc", timeout=10)
    except Exception as exc:  # noqa: BLE001  (DNS, proxy, HTTP: any failure means no hub here)
        raise EvaluationError(
            f"suite 'paper' needs the Hugging Face hub, which is not reachable from here "
            f"({type(exc).__name__}: {exc}); run it where the hub is reachable, or use suite='tiny'") from None


def _flatten(results: dict, table: dict) -> dict:
    metrics, averaged = {}, []
    for task, entries in table.items():
        task_results = results["results"][task]
        for metric, key, in_avg in entries:
            value = float(task_results[f"{metric},none"])
            metrics[key] = value
            if in_avg:
                averaged.append(value)
    if averaged:  # a perplexity-only suite has no accuracies to average
        metrics["zero_shot_avg"] = sum(averaged) / len(averaged)
    return metrics


def _with_means(metrics: dict, means: dict) -> dict:
    return {**metrics, **{key: sum(metrics[k] for k in parts) / len(parts) for key, parts in means.items()}}


def load_causal_lm(path: str, device: str = "cpu", max_length: int | None = None):
    """(model, tokenizer) from a local checkpoint or a hub id (checkpoints.load_model: files, config and finite
    weights checked, errors name the file); a model that is not a causal language model is refused, and
    `max_length` is checked against the model's limits before the weights load."""
    config = load_config(path)
    if type(config) not in AutoModelForCausalLM._model_mapping:
        raise EvaluationError(f"model {path} (model_type {config.model_type!r}) is not a causal language model")
    tokenizer = load_tokenizer(path)
    if max_length is not None:
        check_length_option(max_length, "--max-length", config, tokenizer,
                            model_dir=path if Path(path).is_dir() else None, name=path)

    model = load_model(path, dtype=compute_dtype(device)).to(device)  # fp32 on a CPU
    model.eval()
    return model, tokenizer


@dataclass
class EvaluateConfig:
    """What `state-reduction evaluate` runs; the command's options are generated from these fields."""

    model: str = field(metadata={"help": "checkpoint directory (or hub id on the paper suites)"})
    suite: str = field(default="tiny", metadata={"help": f"{', '.join(SUITES)} (tiny*: offline; paper*: hub tasks)"})
    batch_size: int = field(default=16, metadata={"help": "sequences per forward", "type": positive_int})
    max_length: int = field(default=256, metadata={"help": "context length in tokens", "type": length_int})
    limit: float | None = field(default=None, metadata={"help": "examples per task (int) or fraction (<1)",
                                                         "type": example_limit})
    device: str = field(default="auto", metadata={
        "help": "auto (the GPU when present, else the CPU), cpu, cuda"})
    data_dir: str | None = field(default=None, metadata={"help": "corpora folder (default: $STATE_REDUCTION_DATA, "
                                                                 "else data_cache/ in the clone, else ~/.cache)"})

    def result_config(self, device) -> dict:
        """The result's `config`, whose key finds a finished evaluation: every field but data_dir, with the
        device resolved."""
        return {"model": self.model, "suite": self.suite, "batch_size": self.batch_size,
                "max_length": self.max_length, "limit": self.limit, "device": str(device)}


def evaluate(model, tokenizer, suite: str = "tiny", batch_size: int = 16, max_length: int = 256,
             limit: float | None = None, data_dir=None) -> dict:
    """Evaluate `model` (a transformers causal LM, already on its device) 0-shot with lm-eval.

    Returns {"suite", "tasks", "metrics" (flat: wiki_word_perplexity, lambada_acc, ...,
    zero_shot_avg), "n_examples" (per task, after `limit`), "data" (per-task data file and sha256;
    None for hub datasets), "model" and "tokenizer" (class, name_or_path), the run settings,
    "lm_eval_version", "wall_time_s"}. Weight hashes and provenance are the caller's (it knows the
    path). `limit` caps the examples per task (an int, or a fraction as lm-eval takes it) and is for
    tests and smoke runs only.
    """
    table = _suite_table(suite)
    for option, value, least in (("batch_size", batch_size, 1), ("max_length", max_length, 2)):
        if not isinstance(value, int) or value < least:
            raise EvaluationError(f"evaluate: {option} must be an integer >= {least}, got {value!r}")
    if suite in SUITE_CONTEXT:
        path = getattr(model, "name_or_path", None)
        check_context_length(SUITE_CONTEXT[suite], model.config, tokenizer, name=path, max_length=max_length,
                             model_dir=path if path and Path(path).is_dir() else None)
    if suite in DIRECT_SUITES:
        result = DIRECT_SUITES[suite](model, batch_size, max_length, limit, data_dir)
        result["tokenizer"] = {"class": type(tokenizer).__name__, "name_or_path": getattr(tokenizer, "name_or_path", None),
                               "vocab_size": len(tokenizer)}
        return result
    if suite in HUB_SUITES:
        _require_hub()
        return _run(model, tokenizer, suite, table, batch_size, max_length, limit, data_dir)
    # The tiny suite reads only local JSON files: keep datasets and the hub client off the network.
    saved = {k: os.environ.get(k) for k in _OFFLINE_ENV}
    os.environ.update({k: "1" for k in _OFFLINE_ENV})
    try:
        return _run(model, tokenizer, suite, table, batch_size, max_length, limit, data_dir)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# lm-eval warns when `pretrained` is a model object, not a name; handing it the in-memory (pruned) model is the design
HFLM_LOGGER = "lm_eval.models.huggingface"
EXPECTED_HFLM_WARNINGS = ("`pretrained` model kwarg is not of type `str`", "Passed an already-initialized model")


class _DropExpectedWarnings(logging.Filter):
    """Drops lm-eval's warnings about an in-memory model (EXPECTED_HFLM_WARNINGS); every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(EXPECTED_HFLM_WARNINGS)


def _hflm(model, tokenizer, batch_size: int, max_length: int):
    from lm_eval.models.huggingface import HFLM

    drop, logger = _DropExpectedWarnings(), logging.getLogger(HFLM_LOGGER)
    logger.addFilter(drop)
    try:
        return HFLM(pretrained=model, tokenizer=tokenizer, backend="causal", batch_size=batch_size,
                    max_length=max_length)
    finally:
        logger.removeFilter(drop)


def _run(model, tokenizer, suite, table, batch_size, max_length, limit, data_dir) -> dict:
    # lazy: start-up time (lm_eval is imported only when a suite runs)
    import lm_eval
    from lm_eval.tasks import TaskManager

    t0 = time.time()
    lm = _hflm(model, tokenizer, batch_size, max_length)
    tasks = list(table)
    with tempfile.TemporaryDirectory(prefix="tiny_suite_tasks_") as task_dir:
        if suite not in HUB_SUITES:
            manifest = build_longctx_suite(tokenizer, data_dir) if suite == "tiny_longctx" else build_tiny_suite(data_dir)
            task_manager = TaskManager(include_path=str(render_task_yamls(manifest, task_dir)), include_defaults=False)
            data = {t: {"data_file": manifest["tasks"][t]["data_file"], "sha256": manifest["tasks"][t]["sha256"]}
                    for t in tasks}
        else:
            # RULER sizes its synthetic inputs with the model's own tokenizer, at the suite's lengths
            metadata = ({"tokenizer": tokenizer.name_or_path, "max_seq_lengths": list(PAPER_LONGCTX_LENGTHS)}
                        if suite == "paper_longctx" else None)
            task_manager = TaskManager(metadata=metadata)
            data = {t: None for t in tasks}
        results = lm_eval.simple_evaluate(model=lm, tasks=tasks, num_fewshot=0, limit=limit, task_manager=task_manager,
                                          log_samples=False, bootstrap_iters=0, batch_size=batch_size)
    return {
        "suite": suite,
        "tasks": tasks,
        "metrics": _with_means(_flatten(results, table), SUITE_MEANS.get(suite, {})),
        "n_examples": {t: int(results["n-samples"][t]["effective"]) for t in tasks},
        "data": data,
        "model": {"class": type(model).__name__, "name_or_path": getattr(model, "name_or_path", None),
                  "n_parameters": sum(p.numel() for p in model.parameters())},
        "tokenizer": {"class": type(tokenizer).__name__, "name_or_path": getattr(tokenizer, "name_or_path", None),
                      "vocab_size": len(tokenizer)},
        "batch_size": batch_size,
        "max_length": max_length,
        "limit": limit,
        "lm_eval_version": lm_eval.__version__,
        "wall_time_s": time.time() - t0,
    }
