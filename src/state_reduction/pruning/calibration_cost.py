"""Benchmarks that print ratios measured in one run (never timed tests).

`calibration`: wall time and peak memory of streaming calibration plus DRRQR selection on a tiny model
for growing numbers of calibration sequences. Each size runs in a fresh subprocess so that its peak
resident memory (ru_maxrss) is its own; the part above the RSS after loading the model is what
calibration adds and must not grow with the number of tokens."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import torch

from state_reduction.backend import install_cpu_backend
from state_reduction.checkpoints import load_model, load_tokenizer
from state_reduction.data import sample_sequences
from state_reduction.models.families import get_adapter
from state_reduction.peak_memory import host_peak_rss_bytes, host_rss_bytes
from state_reduction.pruning.calibration import calibrate
from state_reduction.pruning.selectors import keep_count, select


def calibration_point(model_path: str, n: int, seq_len: int, batch_size: int, corpus: str, seed: int) -> dict:
    """One measurement, in this process: load, calibrate on n sequences, select with DRRQR at 50%."""
    install_cpu_backend()
    torch.set_num_threads(1)
    model = load_model(model_path)
    tokenizer = load_tokenizer(model_path)
    adapter = get_adapter(model)
    windows = sample_sequences(tokenizer, corpus, n=n, seq_len=seq_len, seed=seed, stream="calibration")
    with torch.no_grad():  # warm-up: allocator pools and lazy imports belong to the baseline
        model(input_ids=windows[:batch_size])
    baseline = host_rss_bytes()
    t0 = time.perf_counter()
    stats = calibrate(model, adapter, windows, batch_size=batch_size)
    _, K = adapter.key_heads(model.config)
    for ref in adapter.mixers(model):
        w_q, w_k = adapter.qk_weights(ref.module)
        select("drrqr", stats[ref.layer], w_q.detach(), w_k.detach(), keep_count(K, 0.5), "kq",
               torch.Generator().manual_seed(seed), ref.layer)
    wall = time.perf_counter() - t0
    peak = host_peak_rss_bytes()
    return {"n": n, "tokens": int(windows.numel()), "wall_s": wall, "peak_rss_bytes": peak,
            "baseline_rss_bytes": baseline, "calibration_extra_bytes": max(0, peak - baseline)}


def bench_calibration(model_path: str, sizes=(8, 32, 128, 512), seq_len: int = 256, batch_size: int = 8,
                      corpus: str = "books", seed: int = 0) -> list[dict]:
    rows = []
    for n in sizes:
        code = ("import json,sys; from state_reduction.pruning.calibration_cost import calibration_point; "
                f"print('BENCH ' + json.dumps(calibration_point({model_path!r}, {n}, {seq_len}, {batch_size}, "
                f"{corpus!r}, {seed})))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("BENCH ")), None)
        if out.returncode != 0 or line is None:
            raise RuntimeError(f"bench calibration n={n} failed:\n{out.stderr[-2000:]}")
        rows.append(json.loads(line[len("BENCH "):]))
    return rows


def format_calibration(rows: list[dict]) -> str:
    first = rows[0]
    lines = [f"{'n':>5} {'tokens':>8} {'wall s':>8} {'peak RSS MiB':>13} {'calib extra MiB':>16} {'peak / peak(n0)':>16}"]
    for r in rows:
        lines.append(f"{r['n']:>5} {r['tokens']:>8} {r['wall_s']:>8.2f} {r['peak_rss_bytes'] / 2**20:>13.1f} "
                     f"{r['calibration_extra_bytes'] / 2**20:>16.1f} {r['peak_rss_bytes'] / first['peak_rss_bytes']:>16.3f}")
    return "\n".join(lines)
