"""Tables 14 and 15 (appendix C.6) as transcribed into paper_tables/reference_data, checked against the paper by a
route independent of transcribe.py: every number of the published block appears in the JSON as often as in the
paper (Table 15 writes large values as `3.1\\cdot 10^{5}`), and each row keeps its labels."""

import collections
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "paper_tables" / "reference_data"
PAPER = DATA / "state_reduction_in_linear_attention.md"
MODELS = {"no": "DeltaNet 370M (no shared conv)", "head": "DeltaNet 370M (conv shared within heads)",
          "all": "DeltaNet 370M (conv shared within and across heads)"}


def block(number: int) -> list[str]:
    lines = PAPER.read_text().split(f"\nTable {number}: ", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return [line for line in lines[start:end] if not set(line) <= set("|- ")]


def published_numbers(lines: list[str]) -> collections.Counter:
    text = " ".join(lines)
    found = [float(m) * 10 ** int(e) for m, e in re.findall(r"(\d+(?:\.\d+)?)\\cdot 10\^\{(\d+)\}", text)]
    text = re.sub(r"\d+(?:\.\d+)?\\cdot 10\^\{\d+\}", " ", text)
    found += [float(m) for m in re.findall(r"(?<![\w.])\d+\.\d+(?![\w.])", text)]
    return collections.Counter(round(v, 6) for v in found)


def transcribed_numbers(number: int) -> collections.Counter:
    doc = json.loads((DATA / f"table{number}.json").read_text())
    assert doc["table"] == number
    return collections.Counter(round(v, 6) for row in doc["rows"] for k, v in row.items()
                               if k.endswith(("_ppl", "_acc", "_acc_norm", "_avg")))


def test_every_published_number_is_transcribed_exactly_once():
    for number, expected in ((14, 27), (15, 14)):
        published = published_numbers(block(number))
        assert sum(published.values()) == expected
        assert transcribed_numbers(number) == published


def test_table14_rows_are_the_three_sharing_variants_in_order():
    rows = json.loads((DATA / "table14.json").read_text())["rows"]
    lines = block(14)[1:]
    marks = [line.split("|")[1].replace("$\\times$", "x").strip() for line in lines]
    assert marks == ["xx", "x✓", "✓✓"]
    assert [r["model"] for r in rows] == [MODELS["no"], MODELS["head"], MODELS["all"]]
    for line, row in zip(lines, rows):
        values = [float(c) for c in line.split("|")[2:-1]]
        assert values == [row[k] for k in ("wiki_ppl", "lambada_ppl", "arc_easy_acc_norm", "arc_challenge_acc_norm",
                                           "hellaswag_acc_norm", "winogrande_acc", "piqa_acc_norm", "lambada_acc",
                                           "zero_shot_avg")]
        assert row["method"] == "baseline" and row["ratio"] == 0.0 and not row["rft"]


def test_table15_cells_keep_ratio_method_and_column():
    """Read each line from the right: the last two non-empty cells are (non-shared, shared), the one before is
    the method, and a ratio cell starts a new block."""
    by_cell = {(r["model"], r["method"], r["ratio"]): r["wiki_ppl"] for r in json.loads((DATA / "table15.json").read_text())["rows"]}
    assert len(by_cell) == 14
    methods = {"PCA (adv.)": "pca-adv", "PCA (prop.)": "pca", "Grad": "grad", "–": "baseline"}
    ratio = None
    for line in block(15)[1:]:
        cells = [c.strip() for c in line.split("|")[1:-1] if c.strip()]
        if cells[0].endswith("%"):
            ratio = float(cells[0][:-1]) / 100
        method = methods[cells[-3]]
        for model, cell in zip(("no", "head"), cells[-2:]):
            (value,) = published_numbers([cell]).keys()
            assert by_cell[(MODELS[model], method, 0.0 if method == "baseline" else ratio)] == value
    assert by_cell[(MODELS["head"], "baseline", 0.0)] == 29.55  # the "Shared" column is Table 14's ×✓ model
