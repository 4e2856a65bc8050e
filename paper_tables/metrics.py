"""The metric registry: every metric a table column may show, by id (the key in result files' `metrics`).

A table's `render:` mapping (experiments/*/config.yaml) names its columns by these ids; the label may be
overridden per column (`{metric: zero_shot_avg, label: "Avg $\\uparrow$"}`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace

from state_reduction.errors import InputError


@dataclass(frozen=True)
class Metric:
    id: str  # the key in a result's `metrics`
    label: str  # LaTeX column header
    lower_is_better: bool
    scale: float = 1.0  # shown value = stored value * scale (accuracies as percent)
    format: str = ".1f"  # of the shown value; magnitudes of 1e5 and more use 3 significant digits (_fmt)
    paper_key: str | None = None  # the key of the paper's column in reference_data/*.json (None: the same id)
    # read from the cells of this other table of the experiment (a companion, e.g. recall_table4: the same cells on
    # other models, which stand in row for row for the table's); None: the table's own cells
    table: str | None = None

    def with_label(self, label: str) -> Metric:
        return replace(self, label=label)

    def of_table(self, table: str | None) -> Metric:
        return replace(self, table=table)


def _acc(id: str, label: str, paper_key: str | None = None) -> Metric:
    return Metric(id, label, False, 100.0, paper_key=paper_key)


METRICS = {m.id: m for m in [
    Metric("wiki_word_perplexity", "Wiki $\\downarrow$", True, paper_key="wiki_ppl"),
    Metric("ptb_word_perplexity", "PTB $\\downarrow$", True),
    Metric("books_word_perplexity", "Books $\\downarrow$", True),
    Metric("c4_word_perplexity", "C4 $\\downarrow$", True),
    Metric("lambada_ppl", "LMB $\\downarrow$", True),
    _acc("zero_shot_avg", "ZS $\\uparrow$"),
    _acc("arc_easy_acc_norm", "ARC-e acc\\_n"), _acc("arc_challenge_acc_norm", "ARC-c acc\\_n"),
    _acc("hellaswag_acc_norm", "Hella. acc\\_n"), _acc("winogrande_acc", "Wino. acc"),
    _acc("piqa_acc_norm", "PIQA acc\\_n"), _acc("lambada_acc", "LMB. acc"),
    _acc("mqar_32_p2_acc", "MQAR 32/2 $\\uparrow$"), _acc("mqar_32_p4_acc", "MQAR 32/4 $\\uparrow$"),
    _acc("mqar_32_p6_acc", "MQAR 32/6 $\\uparrow$"), _acc("mqar_32_p8_acc", "MQAR 32/8 $\\uparrow$"),
    _acc("continuation_acc_norm", "Cont. acc\\_n"), _acc("next_sentence_acc", "NextS. acc"),
    _acc("ruler_2k_acc", "RULER 2K $\\uparrow$"), _acc("ruler_4k_acc", "RULER 4K $\\uparrow$"),
    _acc("niah_2k_acc", "NIAH 2K $\\uparrow$"), _acc("niah_4k_acc", "NIAH 4K $\\uparrow$"),
    _acc("squad_acc", "SQuAD $\\uparrow$"), _acc("swde_acc", "SWDE $\\uparrow$"),
    # tiny_longctx: the tiny models' training length (256) stands for the paper's 2K, twice it for 4K
    _acc("ruler_256_acc", "RULER 256 $\\uparrow$", "ruler_2k_acc"),
    _acc("ruler_512_acc", "RULER 512 $\\uparrow$", "ruler_4k_acc"),
    _acc("niah_256_acc", "NIAH 256 $\\uparrow$", "niah_2k_acc"),
    _acc("niah_512_acc", "NIAH 512 $\\uparrow$", "niah_4k_acc"),
]}


class TableSpecError(InputError):
    """A table's `render:` mapping, or the table asked for, is not valid; the message names the file, the key and
    the closest valid names."""


def closest(name: str, valid) -> str:
    valid = list(valid)
    close = difflib.get_close_matches(str(name), valid, n=3)
    return f"did you mean {', '.join(close)}?" if close else f"valid: {', '.join(valid)}"


def metric(id: str, where: str = "the metric registry") -> Metric:
    """The registered metric `id`; an unknown id is a TableSpecError naming `where` and the closest ids."""
    if id not in METRICS:
        raise TableSpecError(f"{where}: metric {id!r} is not in the registry (paper_tables/metrics.py); "
                             f"{closest(id, METRICS)}")
    return METRICS[id]
