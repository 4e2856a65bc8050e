"""Transcribe the paper's published Tables 1, 3, 4, 8, 9, 10, 11, 12, 13, 14, 15 and 20-24 into JSON, once (also Tables 2,
7, 16 and the rank analysis: Tables 5, 6 and the two overlap numbers of appendix C.2, as tableC2.json).

    python paper_tables/reference_data/transcribe.py

reads `state_reduction_in_linear_attention.md` (a verbatim copy of ../shared/papers/, sha256 checked)
and writes table1.json, table3.json ... table24.json beside it. The files are committed;
tests/paper_tables/test_reference_tables.py re-reads the paper and checks every number in them.
Accuracies stay in percent, as printed.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
PAPER = HERE / "state_reduction_in_linear_attention.md"
PAPER_SHA256 = "06139d16ea835f6640ee8c3b3b43da189b23c27a2378b8a698d24d97c9112365"
METHODS = {"Rand": "rand", "L1": "l1", "S-Wanda": "wanda", "Grad": "grad", "DRRQR": "drrqr", "Baseline": "baseline"}
ZS_COLUMNS = ["wiki_ppl", "lambada_ppl", "arc_easy_acc_norm", "arc_challenge_acc_norm", "hellaswag_acc_norm",
              "winogrande_acc", "piqa_acc_norm", "lambada_acc", "zero_shot_avg"]
ZS_TABLES = {21: "DeltaNet 370M", 22: "DeltaNet 1.3B", 23: "Gated DeltaNet 370M", 24: "Gated DeltaNet 1.3B"}
CODESTRAL, MAMBA2_370M, QWEN = "Mamba-Codestral 7B", "Mamba-2 370M", "Qwen3.5 9B"
# Table 8 names its tasks only; the accuracies are taken to be the same metrics as Tables 10 and 21-24
TABLE8_COLUMNS = ["arc_easy_acc_norm", "arc_challenge_acc_norm", "hellaswag_acc_norm", "winogrande_acc",
                  "piqa_acc_norm", "wiki_ppl"]
# Table 12 (long context, percent): RULER and single-needle NIAH at 2K/4K tokens, SQuAD and SWDE completion
LONG_CONTEXT_COLUMNS = ["ruler_2k_acc", "ruler_4k_acc", "niah_2k_acc", "niah_4k_acc", "squad_acc", "swde_acc"]


def paper_text() -> str:
    data = PAPER.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != PAPER_SHA256:
        raise ValueError(f"{PAPER}: sha256 {digest} != {PAPER_SHA256}; the paper copy changed")
    return data.decode()


def markdown_table(text: str, number: int) -> tuple[str, list[list[str]]]:
    """The caption of 'Table N:' and the cells of the first markdown table after it (header rows included,
    the --- separator dropped)."""
    match = re.search(rf"^Table {number}: (.*)$", text, flags=re.MULTILINE)
    if match is None:
        raise ValueError(f"Table {number} not found in {PAPER.name}")
    rows, started = [], False
    for line in text[match.end():].splitlines():
        if line.startswith("|"):
            started = True
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r"-+", c) for c in cells):
                rows.append(cells)
        elif started:
            break
    return match.group(1).strip(), rows


def _num(cell: str) -> float:
    return float(cell)


def transcribe_table1(text):
    caption, rows = markdown_table(text, 1)
    out = []
    for cells in rows[2:]:
        method = METHODS[cells[0]]
        for i, ratio in enumerate((0.75, 0.5, 0.3)):
            wiki, lmb, zs = (_num(c) for c in cells[1 + 3 * i: 4 + 3 * i])
            out.append({"model": "Gated DeltaNet 1.3B", "method": method, "ratio": 0.0 if method == "baseline" else ratio,
                        "column_ratio": ratio, "rft": method != "baseline",
                        "wiki_ppl": wiki, "lambada_ppl": lmb, "zero_shot_avg": zs})
    return caption, out


def transcribe_table20(text):
    caption, rows = markdown_table(text, 20)
    out, model = [], None
    for cells in rows[2:]:
        if cells[0] not in METHODS:  # the first row of a model group carries the model name
            model, cells = cells[0], cells[1:]
        else:
            cells = cells[:-1]  # the markdown conversion left an empty trailing cell on other rows
        method = METHODS[cells[0]]
        values = [_num(c) for c in cells[1:7]]
        for rft, part in ((False, values[:3]), (True, values[3:])):
            out.append({"model": model, "method": method, "ratio": 0.0 if method == "baseline" else 0.5,
                        "rft": rft and method != "baseline", "column_rft": rft,
                        **dict(zip(["wiki_ppl", "lambada_ppl", "zero_shot_avg"], part))})
    return caption, out


def transcribe_zero_shot(text, number):
    caption, rows = markdown_table(text, number)
    out = []
    for cells in rows[1:]:
        if cells[0] == "Baseline":
            rft, method, ratio = False, "baseline", 0.0
        else:
            rft = {"✓": True, "$\\times$": False}[cells[0]]
            method, ratio = METHODS[cells[1]], float(cells[2].rstrip("%")) / 100
        out.append({"model": ZS_TABLES[number], "method": method, "ratio": ratio, "rft": rft,
                    **dict(zip(ZS_COLUMNS, (_num(c) for c in cells[3:12])))})
    return caption, out


def _row(model, method, ratio, rft, **values) -> dict:
    return {"model": model, "method": method, "ratio": 0.0 if method == "baseline" else ratio,
            "rft": rft and method != "baseline", **values}


def _configuration(cell: str) -> tuple[str, float]:
    """'DRRQR 25%' -> ('drrqr', 0.25); 'Baseline' -> ('baseline', 0.0)."""
    if cell == "Baseline":
        return "baseline", 0.0
    name, pct = cell.rsplit(" ", 1)
    return METHODS[name], float(pct.rstrip("%")) / 100


def transcribe_table3(text):
    caption, rows = markdown_table(text, 3)
    return caption, [_row(CODESTRAL, METHODS[c[0]], 0.5, False, wiki_ppl=_num(c[1]), zero_shot_avg=_num(c[2]))
                     for c in rows[1:]]


def transcribe_table8(text):
    caption, rows = markdown_table(text, 8)
    return caption, [_row(MAMBA2_370M, METHODS[c[0]], 0.75, False, **dict(zip(TABLE8_COLUMNS, map(_num, c[1:7]))))
                     for c in rows[1:]]


def transcribe_table9(text):
    caption, rows = markdown_table(text, 9)
    out, model = [], None
    for cells in rows[1:]:
        model = cells[0] or model  # the first row of a model group carries the model name
        out.append(_row(model, METHODS[cells[1]], float(cells[2].rstrip("%")) / 100, False,
                        wiki_ppl=_num(cells[3]), zero_shot_avg=_num(cells[4])))
    return caption, out


def transcribe_table10(text):
    caption, rows = markdown_table(text, 10)
    return caption, [_row(CODESTRAL, METHODS[c[0]], float(c[1].rstrip("%")) / 100, False,
                          **dict(zip(ZS_COLUMNS, map(_num, c[2:11])))) for c in rows[1:]]


def transcribe_table12(text):
    caption, rows = markdown_table(text, 12)
    return caption, [_row(QWEN, *_configuration(c[0]), True, **dict(zip(LONG_CONTEXT_COLUMNS, map(_num, c[1:7]))))
                     for c in rows[1:]]


def transcribe_table11(text):
    caption, rows = markdown_table(text, 11)
    return caption, [_row("Gated DeltaNet 1.3B", *_configuration(c[0]), True,
                          **dict(zip(LONG_CONTEXT_COLUMNS, map(_num, c[1:7])))) for c in rows[1:]]


# Table 4 abbreviates Gated DeltaNet; its second row of each model lost the model cell in the conversion
# ("| DRRQR | 27.5 | 61.9 |  |"): the model carries over and the cells shift left by one.
TABLE4_MODELS = {"GDN 1.3B": "Gated DeltaNet 1.3B", "Qwen3.5 9B": QWEN}


def transcribe_table4(text):
    caption, rows = markdown_table(text, 4)
    assert rows[0][2:] == ["RULER $\\uparrow$ 4K", "NIAH $\\uparrow$ 4K"], rows[0]
    out, model = [], None
    for cells in rows[1:]:
        if cells[0] in TABLE4_MODELS:
            model, cells = TABLE4_MODELS[cells[0]], cells[1:]
        else:
            assert cells[-1] == "", cells
        out.append(_row(model, METHODS[cells[0]], 0.5, True, ruler_4k_acc=_num(cells[1]), niah_4k_acc=_num(cells[2])))
    return caption, out


def transcribe_table13(text):
    caption, rows = markdown_table(text, 13)
    return caption, [_row(QWEN, *_configuration(c[0]), False, wiki_ppl=_num(c[1]), lambada_ppl=_num(c[2]),
                          zero_shot_avg=_num(c[3])) for c in rows[1:]]


# Ablations (Tables 2, 7, 16): DeltaNet 370M at 75% (calibration) and every DeltaNet/GDN at 50% (selection), pre-RFT.
CORPORA = {"FineWeb": "fineweb-edu", "PG19": "pg19", "Pile": "pile"}
SELECT = {"$\\mathbf{K},\\mathbf{Q}$": "kq", "$\\mathbf{K}$": "k", "$\\mathbf{Q}$": "q"}
TABLE16_MODELS = ["DeltaNet 370M", "DeltaNet 1.3B", "Gated DeltaNet 370M", "Gated DeltaNet 1.3B"]


def _calibration_label(cell: str) -> dict:
    """'FineWeb, $n=128$, seed 111' -> calib, n_calib, seed (None where the row names no seed)."""
    parts = [p.strip() for p in cell.split(",")]
    n = next((int(re.fullmatch(r"\$n=(\d+)\$", p).group(1)) for p in parts[1:] if p.startswith("$n=")), 128)
    seed = next((int(p.split()[1]) for p in parts[1:] if p.startswith("seed ")), None)
    return {"calib": CORPORA[parts[0]], "n_calib": n, "seed": seed}


def transcribe_calibration(text, number):
    """Table 2 (corpus; 128 sequences, as its caption says) and Table 7 (corpus, n, seed): DRRQR and Grad."""
    caption, rows = markdown_table(text, number)
    assert rows[0][1:] == ["DRRQR", "Grad"], rows[0]
    out = []
    for cells in rows[1:]:
        setting = _calibration_label(cells[0])
        for method, value in zip(("drrqr", "grad"), cells[1:3]):
            out.append({"model": "DeltaNet 370M", "method": method, "ratio": 0.75, "rft": False, **setting,
                        "wiki_ppl": _num(value)})
    return caption, out


def transcribe_table16(text):
    """Columns: four models x (K,Q | K | Q); the baseline row has one number per model."""
    caption, rows = markdown_table(text, 16)
    selects = [SELECT[c] for c in rows[2][1:13]]
    out = []
    for cells in rows[3:]:
        method = METHODS[cells[0]]
        if method == "baseline":
            values = [c for c in cells[1:] if c]
            out += [{"model": m, "method": "baseline", "ratio": 0.0, "rft": False, "select": None,
                     "wiki_ppl": _num(v)} for m, v in zip(TABLE16_MODELS, values, strict=True)]
            continue
        for i, (select, value) in enumerate(zip(selects, cells[1:13], strict=True)):
            out.append({"model": TABLE16_MODELS[i // 3], "method": method, "ratio": 0.5, "rft": False,
                        "select": select, "wiki_ppl": _num(value)})
    return caption, out


def transcribe_ablations(text) -> dict:
    return {2: transcribe_calibration(text, 2), 7: transcribe_calibration(text, 7), 16: transcribe_table16(text)}


# Rank analysis (appendix C.1, C.2): DeltaNet 370M at 75%, pre-RFT.
RANK_UNITS = {"u_*": "rank utilisation er(S)/d_k, a fraction", "pearson": "Pearson rho with the baseline per head",
              "sigma_*": "singular values of the kept [Q;K] columns (the authors' 5000+5000 subsampled rows)",
              "kappa": "median over heads of sigma_max/sigma_min", "*shared*": "channels per head"}


def _method_and_dk(cell: str) -> tuple[str, int | None]:
    """'Baseline ($d_{k}\\!=\\!128$)' -> ('baseline', 128); 'DRRQR' -> ('drrqr', None)."""
    name = cell.split(" (")[0].strip()
    dk = re.search(r"=(?:\\!)?(\d+)\$", cell)
    return METHODS[name], int(dk.group(1)) if dk else None


def transcribe_table5(text):
    """Per-head rank utilisation: mean, std, min, max over (layer, head) and rho with the baseline."""
    caption, rows = markdown_table(text, 5)
    assert rows[0][1:5] == ["Mean", "Std", "Min", "Max"], rows[0]
    out = []
    for cells in rows[1:]:
        method, dk = _method_and_dk(cells[0])
        out.append({"model": "DeltaNet 370M", "method": method, "ratio": 0.0 if method == "baseline" else 0.75,
                    "rft": False, "d_k": dk, **dict(zip(("u_mean", "u_std", "u_min", "u_max", "pearson"),
                                                        map(_num, cells[1:6])))})
    return caption, out


def transcribe_table6(text):
    """Median sigma_min, sigma_max and kappa of the kept [Q;K] columns per head."""
    caption, rows = markdown_table(text, 6)
    out = []
    for cells in rows[1:]:
        method, dk = _method_and_dk(cells[0])
        out.append({"model": "DeltaNet 370M", "method": method, "ratio": 0.0 if method == "baseline" else 0.75,
                    "rft": False, "d_k": dk, **dict(zip(("sigma_min", "sigma_max", "kappa"), map(_num, cells[1:4])))})
    return caption, out


def transcribe_overlap(text):
    """Appendix C.2's prose: median channels per head that DRRQR shares with Grad and with Rand."""
    match = re.search(r"DRRQR and Grad share a median of (\d+) of the (\d+) retained channels per head on "
                      r"(DeltaNet 370M) at (\d+)% compression, whereas random selection shares (\d+)\.", text)
    if match is None:
        raise ValueError(f"the overlap sentence of appendix C.2 is not in {PAPER.name}")
    grad, kept, model, pct, rand = match.groups()
    caption = "Appendix C.2: kept channels per head shared by two selections (median over heads)"
    base = {"model": model, "ratio": int(pct) / 100, "rft": False, "kept": int(kept)}
    return caption, [{**base, "method": "drrqr", "compare": "grad", "median_shared": int(grad)},
                     {**base, "method": "drrqr", "compare": "rand", "median_shared": int(rand)}]


# Appendix C.6 (Tables 14, 15): DeltaNet 370M pretrained without / with shared q/k conv filters. The paper's
# "Shared" column of Table 15 is the per-head variant: its 0% row (29.55) is Table 14's ×✓ row (29.5).
SHARED_CONV_MODELS = {"$\\times$$\\times$": "DeltaNet 370M (no shared conv)",
                      "$\\times$✓": "DeltaNet 370M (conv shared within heads)",
                      "✓✓": "DeltaNet 370M (conv shared within and across heads)"}
TABLE15_METHODS = {"PCA (adv.)": "pca-adv", "PCA (prop.)": "pca", "Grad": "grad", "–": "baseline"}


def _scientific(cell: str) -> float:
    """'$3.1\\cdot 10^{5}$' -> 310000.0; '${184.48}$' -> 184.48."""
    match = re.fullmatch(r"\$\{?([\d.]+)\}?(?:\\cdot 10\^\{(\d+)\})?\$|([\d.]+)", cell)
    if match is None:
        raise ValueError(f"not a number: {cell!r}")
    mantissa, exponent, plain = match.groups()
    return float(plain) if plain else float(mantissa) * 10 ** int(exponent or 0)


def transcribe_table14(text):
    caption, rows = markdown_table(text, 14)
    return caption, [_row(SHARED_CONV_MODELS[c[0]], "baseline", 0.0, False, **dict(zip(ZS_COLUMNS, map(_num, c[1:10]))))
                     for c in rows[1:]]


def transcribe_table15(text):
    """Rows after the first of a ratio lost their 'Comp.' cell in the markdown (shifted left by one)."""
    caption, rows = markdown_table(text, 15)
    assert rows[0] == ["Comp.", "Method", "Non Shared", "Shared"], rows[0]
    out, ratio = [], None
    models = [SHARED_CONV_MODELS["$\\times$$\\times$"], SHARED_CONV_MODELS["$\\times$✓"]]
    for cells in rows[1:]:
        if cells[0].endswith("%"):
            ratio, cells = int(cells[0][:-1]) / 100, cells[1:]
        method = TABLE15_METHODS[cells[0]]
        for model, value in zip(models, cells[1:3], strict=True):
            out.append(_row(model, method, ratio, False, wiki_ppl=_scientific(value)))
    return caption, out


def main() -> None:
    text = paper_text()
    tables = {1: transcribe_table1(text), 3: transcribe_table3(text), 8: transcribe_table8(text),
              9: transcribe_table9(text), 10: transcribe_table10(text), 12: transcribe_table12(text),
              4: transcribe_table4(text), 11: transcribe_table11(text),
              13: transcribe_table13(text), 20: transcribe_table20(text)}
    tables.update({n: transcribe_zero_shot(text, n) for n in ZS_TABLES})
    tables.update(transcribe_ablations(text))
    tables.update({14: transcribe_table14(text), 15: transcribe_table15(text)})
    for number, (caption, rows) in tables.items():
        doc = {"table": number, "source": PAPER.name, "source_sha256": PAPER_SHA256, "caption": caption,
               "units": {"*_ppl": "perplexity", "*_acc*, zero_shot_avg": "percent"}, "rows": rows}
        (HERE / f"table{number}.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(f"table{number}.json: {len(rows)} rows")
    for name, (caption, rows) in {5: transcribe_table5(text), 6: transcribe_table6(text),
                                  "C2": transcribe_overlap(text)}.items():
        doc = {"table": name, "source": PAPER.name, "source_sha256": PAPER_SHA256, "caption": caption,
               "units": RANK_UNITS, "rows": rows}
        (HERE / f"table{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(f"table{name}.json: {len(rows)} rows")


if __name__ == "__main__":
    main()
