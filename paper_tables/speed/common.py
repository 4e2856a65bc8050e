"""Shared by the speed renderers (tables 17-19, figure 4): read bench results and the paper's transcribed numbers.

Reads only result JSON (results/<profile>/speed/<mode>_*.json) and paper_tables/reference_data/table1[789].json."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "paper_tables" / "out"
FIGURES = ROOT / "figures"


def load_results(profile: str, mode: str, make_target: str, results_root: Path | None = None) -> list[dict]:
    folder = Path(results_root or ROOT / "results") / profile / "speed"
    paths = sorted(folder.glob(f"{mode}_*.json"))
    if not paths:
        raise FileNotFoundError(f"no bench {mode} results in {folder}; run `make {make_target} PROFILE={profile}`")
    results = []
    for p in paths:
        r = json.loads(p.read_text())
        if r.get("schema") != "state-reduction/result" or r.get("kind") != "bench":
            raise ValueError(f"{p}: not a bench result")
        r["_path"] = str(p)
        results.append(r)
    return results


def reference(table: int) -> dict:
    return json.loads((ROOT / "paper_tables" / "reference_data" / f"table{table}.json").read_text())


def label_of(r: dict) -> str:
    """'gated_deltanet (CPU: ..., torch-reference-cpu)'."""
    model = r["config"].get("model") or "Gated DeltaNet layer"
    layers = r["config"].get("layers")
    return f"{model}{f', {layers} layers' if layers else ''}"


def ratio_label(row: dict) -> str:
    return "Base" if row["label"] == "base" else (f"{round(row['ratio'] * 100)}%" if row["label"].startswith("r")
                                                  else f"d_k {row['d_k']}")


def tex_escape(s: str) -> str:
    return s.replace("_", r"\_").replace("%", r"\%").replace("&", r"\&")


def write(name: str, tex: str, md: str, out_dir: Path | None = None) -> list[Path]:
    out_dir = Path(out_dir or OUT)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.tex", out_dir / f"{name}.md"]
    paths[0].write_text(tex)
    paths[1].write_text(md)
    return paths


def fmt(v, spec=".2f", suffix="") -> str:
    return "--" if v is None else f"{v:{spec}}{suffix}"


def merge_by_model(results: list[dict]) -> list[dict]:
    """One entry per (model, hardware, backend): results split over several runs (e.g. scripts/gpu_check.sh runs
    batch 64 apart from batches 1 and 16) are shown as one column group; later files win for a repeated cell."""
    merged: dict[tuple, dict] = {}
    for r in results:
        key = (label_of(r), r["extra"]["hardware"], r["extra"]["backend"])
        if key not in merged:
            merged[key] = {**r, "extra": {**r["extra"], "rows": list(r["extra"]["rows"]),
                                          "skipped": list(r["extra"].get("skipped", []))}}
        else:
            m = merged[key]["extra"]
            m["rows"] += r["extra"]["rows"]
            m["skipped"] += r["extra"].get("skipped", [])
    return list(merged.values())
