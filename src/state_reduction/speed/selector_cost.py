"""`bench selectors`: what each selector costs to choose its channels (issue 19 part 3).

For every model and selector of an experiment's table, one `state-reduction prune` at the table's first ratio with
the profile's prune settings runs in a fresh process, so that its peak resident memory is its own (a pipeline
worker's carries its earlier tasks'). From that prune's `selection.json`: the wall seconds of calibration and of
selection (`stage_seconds`), and the peak RSS up to the end of the selection above the RSS after loading the model
(`host_memory`), i.e. what calibration and selection add. A selector that cannot serve a family (ghost without a
decay) is a row with prune's one-line reason instead of numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from state_reduction.errors import InputError
from state_reduction.pipeline import load_experiment, profile_spec
from state_reduction.pipeline.spec import CONTROL, resolve_model_path, table_cells
from state_reduction.results import build_result

# the profile's prune settings that the prune command takes as flags
_FLAGS = {"calib": "--calib", "n_calib": "--n-calib", "seq_len": "--seq-len", "seed": "--seed",
          "batch_size": "--batch-size", "select": "--select", "grad_tokens": "--grad-tokens"}


def _prune_command(path: str, method: str, ratio: float, settings: dict, out: Path, data_dir) -> list[str]:
    cmd = [sys.executable, "-m", "state_reduction.cli", "prune", path, "--method", method, "--ratio", str(ratio),
           "--out", str(out)]
    for key, value in settings.items():
        if key in _FLAGS:
            cmd += [_FLAGS[key], str(value)]
    return cmd + (["--data-dir", str(data_dir)] if data_dir else [])


def _row(model: str, method: str, done: subprocess.CompletedProcess, out: Path) -> dict:
    row = {"model": model, "method": method}
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        # prune's own one-line refusal of this selector (e.g. a family it cannot serve); anything else is a failure
        if done.returncode == 2 and len(lines) == 1 and method in lines[0] and "usage:" not in done.stderr:
            return {**row, "status": "refused", "reason": lines[0]}
        raise RuntimeError(f"bench selectors: prune of {model} with {method} failed (exit {done.returncode}):\n"
                           f"{done.stderr[-2000:]}")
    record = json.loads((out / "selection.json").read_text())
    memory, seconds = record["host_memory"], record["stage_seconds"]
    return {**row, "status": "ok", "model_type": record["model_type"], "key_dim_after": record["key_dim_after"],
            "calibration_s": seconds.get("calibration", 0.0), "selection_s": seconds["selection"],
            "prune_wall_s": record["wall_time_s"], "rss_after_load_bytes": memory["rss_after_load_bytes"],
            "peak_rss_through_selection_bytes": memory["peak_rss_through_selection_bytes"],
            "extra_bytes": max(0, memory["peak_rss_through_selection_bytes"] - memory["rss_after_load_bytes"])}


def bench_selectors(experiment: str = "selector_benchmark", table: str = "selector_benchmark", profile: str = "tiny",
                    methods=None, models=None, data_dir=None, threads: int = 1, progress=None) -> dict:
    """A `bench` result (results schema): the settings in `config`, a row per model and selector in `extra.rows`."""
    spec = load_experiment(experiment)
    keys, cells, _ = table_cells(spec, table, profile)
    prof = profile_spec(spec, profile)
    methods = list(methods or spec["methods"])  # the experiment's: a selector some family cannot serve is a row too
    models = list(models or keys)
    for name, given, known, where in (("method", methods, spec["methods"], f"experiment {experiment}"),
                                      ("model", models, keys, f"table {table} of {experiment}")):
        unknown = [x for x in given if x not in known]
        if unknown:
            raise InputError(f"bench selectors: {name}(s) {unknown} are not in {where} "
                             f"(its {name}s: {', '.join(known)})")
    ratio = min(c.ratio for c in cells if c.method != CONTROL)  # the dense+RFT control prunes nothing
    settings = dict(prof.get("prune", {}))
    t0 = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-selectors-") as tmp:
        for model in models:
            path = resolve_model_path(prof["models"][model]["path"])
            for method in methods:
                out = Path(tmp) / f"{model}-{method}"
                done = subprocess.run(_prune_command(path, method, ratio, settings, out, data_dir),
                                      capture_output=True, text=True, env=env)
                rows.append(_row(model, method, done, out))
                if progress is not None:
                    progress(rows[-1])
    config = {"mode": "selectors", "table": table, "ratio": ratio, "prune_settings": settings, "threads": threads,
              "methods": methods, "models": models}
    return build_result("bench", profile=profile, experiment=spec["experiment"], config=config, metrics={},
                        wall_time_s=time.perf_counter() - t0, extra={"rows": rows})


def format_selectors(record: dict) -> str:
    """One line per model and selector: calibration and selection seconds, and the memory they add."""
    lines = [f"{'model':<16} {'selector':<14} {'calib s':>8} {'select s':>9} {'extra MiB':>10} {'peak MiB':>9}"]
    for r in record["extra"]["rows"]:
        if r["status"] != "ok":
            lines.append(f"{r['model']:<16} {r['method']:<14} refused: {r['reason']}")
            continue
        lines.append(f"{r['model']:<16} {r['method']:<14} {r['calibration_s']:>8.2f} {r['selection_s']:>9.2f} "
                     f"{r['extra_bytes'] / 2**20:>10.1f} {r['peak_rss_through_selection_bytes'] / 2**20:>9.1f}")
    return "\n".join(lines)


def selectors_markdown(record: dict) -> str:
    """The cost table as Markdown: a row per selector, per model its calibration s / selection s / extra MiB."""
    rows, config = record["extra"]["rows"], record["config"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    cell = {(r["model"], r["method"]): r for r in rows}
    head = "| selector | " + " | ".join(f"{m}: calib s / select s / extra MiB" for m in models) + " |"
    lines = [head, "|---|" + "---|" * len(models)]
    for method in methods:
        parts = []
        for model in models:
            r = cell.get((model, method))
            parts.append("--" if r is None else "n/a (refused)" if r["status"] != "ok" else
                         f"{r['calibration_s']:.2f} / {r['selection_s']:.2f} / {r['extra_bytes'] / 2**20:.0f}")
        lines.append(f"| {method} | " + " | ".join(parts) + " |")
    s = config["prune_settings"]
    lines.append("")
    lines.append(f"One `prune` per cell in a fresh process, {config['threads']} thread(s), ratio {config['ratio']}, "
                 f"calibration {s.get('calib')} {s.get('n_calib')} x {s.get('seq_len')} tokens, seed {s.get('seed')}; "
                 "extra MiB: peak RSS through the selection minus the RSS after loading the model.")
    refused = [r for r in rows if r["status"] != "ok"]
    lines += [f"- {r['method']} on {r['model']}: {r['reason']}" for r in refused]
    return "\n".join(lines) + "\n"
