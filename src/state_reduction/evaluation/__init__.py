"""Zero-shot evaluation through lm-eval: the `paper` suite (hub datasets) and the offline `tiny` suite
(task data built from the tiny corpora's held-out splits, see `tiny_suite`).

`evaluate(model, tokenizer, suite, batch_size, max_length, limit)` -> dict of flat metrics.
"""

from state_reduction.evaluation.run import (
    PAPER_METRICS,
    SUITES,
    TINY_METRICS,
    EvaluationError,
    evaluate,
    load_causal_lm,
)
from state_reduction.evaluation.tiny_suite import (
    TASKS,
    build_tiny_suite,
    render_task_yamls,
    task_sizes,
)

__all__ = [
    "PAPER_METRICS",
    "SUITES",
    "TASKS",
    "TINY_METRICS",
    "EvaluationError",
    "build_tiny_suite",
    "evaluate",
    "load_causal_lm",
    "render_task_yamls",
    "task_sizes",
]
