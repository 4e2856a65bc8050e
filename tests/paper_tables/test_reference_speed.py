"""The paper's speed numbers (Tables 17-19, H100), as transcribed into paper_tables/reference_data/table1[789].json,
checked against the paper markdown re-parsed here (own parser, independent of the transcription)."""

import hashlib
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "paper_tables" / "reference_data"
PAPER = DATA / "state_reduction_in_linear_attention.md"


def table_lines(number: int) -> list[list[str]]:
    """Cells of the body rows of Table `number` (header and separator rows dropped)."""
    text = PAPER.read_text()
    start = text.index(f"\nTable {number}: ")
    rows, seen_table = [], False
    for line in text[start:].splitlines()[1:]:
        if not line.startswith("|"):
            if seen_table:
                break
            continue
        seen_table = True
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if all(re.fullmatch(r"-+", c) for c in cells):
            continue
        rows.append(cells)
    return rows


def number(cell: str) -> float:
    m = re.fullmatch(r"\$?(\d+\.\d+)(?:\\times)?\$?", cell)
    assert m, f"not a number cell: {cell!r}"
    return float(m.group(1))


def load(n: int) -> dict:
    return json.loads((DATA / f"table{n}.json").read_text())


@pytest.mark.parametrize("n", (17, 18, 19))
def test_transcription_names_the_paper_copy(n):
    doc = load(n)
    assert doc["table"] == n
    assert doc["source_sha256"] == hashlib.sha256(PAPER.read_bytes()).hexdigest()


def test_table17_decode():
    parsed = {}
    for cells in table_lines(17):
        if re.fullmatch(r"\d+", cells[0]):
            parsed[int(cells[0])] = [number(c) for c in cells[1:7]]
    assert sorted(parsed) == [1, 2, 4, 8, 16, 32, 64]
    keys = ("gdn_base_ms", "gdn_speedup_50", "gdn_speedup_75", "dn_base_ms", "dn_speedup_50", "dn_speedup_75")
    rows = load(17)["rows"]
    assert {r["batch"]: [r[k] for k in keys] for r in rows} == parsed
    assert len(rows) == len(parsed)


def test_table18_prefill_grid():
    parsed = {}
    for cells in table_lines(18):
        m = re.fullmatch(r"\$(\d+)\\times (\d+)\$K", cells[0])
        if m:
            parsed[(int(m.group(1)), int(m.group(2)) * 1024)] = [number(c) for c in cells[1:5]]
    assert len(parsed) == 19
    keys = ("gdn_speedup_50", "gdn_speedup_75", "dn_speedup_50", "dn_speedup_75")
    rows = load(18)["rows"]
    assert {(r["batch"], r["seq_len"]): [r[k] for k in keys] for r in rows} == parsed
    assert len(rows) == len(parsed)


def test_table19_mixer():
    parsed, batch = {}, None
    for cells in table_lines(19):
        if re.fullmatch(r"\d+", cells[0]):
            batch, cells = int(cells[0]), cells[1:]
        m = re.fullmatch(r"(\d+)%", cells[0])
        if m:
            parsed[(batch, int(m.group(1)) / 100)] = (number(cells[1]), number(cells[2]))
    assert len(parsed) == 6
    rows = load(19)["rows"]
    assert {(r["batch"], r["ratio"]): (r["speedup"], r["vram_ratio"]) for r in rows} == parsed
    assert len(rows) == len(parsed)
