"""The rank-analysis numbers of the paper (Tables 5, 6 and the overlap of appendix C.2) as transcribed into
paper_tables/reference_data/, checked against the paper copy by a route independent of transcribe.py."""

import collections
import json
import re
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2] / "paper_tables" / "reference_data"
TEXT = (DATA / "state_reduction_in_linear_attention.md").read_text()
LABELS = {"Baseline": "baseline", "DRRQR": "drrqr", "Grad": "grad", "S-Wanda": "wanda", "L1": "l1", "Rand": "rand"}
COLUMNS = {5: ("u_mean", "u_std", "u_min", "u_max", "pearson"), 6: ("sigma_min", "sigma_max", "kappa")}


def body_rows(number):
    """Cells of the rows below the header of the table whose caption is 'Table N:'."""
    block = TEXT.split(f"\nTable {number}: ", 1)[1].split("\n\n", 2)[1]
    lines = [line for line in block.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip("| ").split(" | ")] for line in lines[2:]]


@pytest.mark.parametrize("number", (5, 6))
def test_every_number_of_the_table_is_transcribed_with_its_row(number):
    doc = json.loads((DATA / f"table{number}.json").read_text())
    rows = body_rows(number)
    assert len(doc["rows"]) == len(rows) > 0
    for cells, row in zip(rows, doc["rows"]):
        assert LABELS[cells[0].split(" ")[0]] == row["method"]
        assert [float(c) for c in cells[1:]] == [row[k] for k in COLUMNS[number]]
        dk = re.findall(r"=\D*(\d+)", cells[0])
        assert row["d_k"] == (int(dk[-1]) if dk else None)
        assert row["model"] == "DeltaNet 370M" and not row["rft"]
        assert row["ratio"] == (0.0 if row["method"] == "baseline" else 0.75)
    numbers = collections.Counter(float(x) for cells in rows for x in cells[1:])
    assert numbers == collections.Counter(row[k] for row in doc["rows"] for k in COLUMNS[number])


def test_the_c2_overlap_numbers_are_the_papers():
    doc = json.loads((DATA / "tableC2.json").read_text())
    section = TEXT.split("### C.2 ", 1)[1].split("Table 6:", 1)[0]
    words = section.split()
    shared = int(words[words.index("median") + 2])  # "a median of 26 of the 32 retained channels"
    kept = int(words[words.index("median") + 5])
    random_shares = int(words[words.index("shares", words.index("random")) + 1].rstrip("."))
    by_pair = {(r["method"], r["compare"]): r for r in doc["rows"]}
    assert by_pair["drrqr", "grad"]["median_shared"] == shared == 26
    assert by_pair["drrqr", "rand"]["median_shared"] == random_shares
    assert {r["kept"] for r in doc["rows"]} == {kept} and {r["ratio"] for r in doc["rows"]} == {0.75}
