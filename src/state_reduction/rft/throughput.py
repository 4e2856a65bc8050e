"""`state-reduction bench-rft`: tokens/s and peak memory of RFT on the tiny models (CPU), with and
without the teacher. Each point runs in a fresh subprocess so that its peak RSS (ru_maxrss) is its own."""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from state_reduction.peak_memory import host_peak_rss_bytes
from state_reduction.pruning.prune import PruneConfig, prune
from state_reduction.rft import RFTConfig, run_rft
from state_reduction.rft.trainer import LOG_FILE, DistContext, _setup


def rft_point(student: str, teacher: str | None, out: str, steps: int, batch_size: int, seq_len: int) -> dict:
    """One measurement in this process: a short RFT run (1 thread, no wandb, no progress bar)."""
    cfg = RFTConfig.tiny_preset(student, teacher, out, steps=steps, batch_size=batch_size, seq_len=seq_len,
                                warmup_steps=1, save_every=steps, overwrite=True, resume=False, wandb="disabled", progress=False,
                                threads=1)
    bare_before = bare_step_seconds(cfg, steps)
    record = run_rft(cfg)
    bare = bare_before + bare_step_seconds(cfg, steps)
    m = record["metrics"]
    log = Path(out) / LOG_FILE
    step_s = [batch_size * seq_len / json.loads(ln)["tokens_per_s"] for ln in log.read_text().splitlines()]
    return {"teacher": teacher is not None, "steps": steps, "batch_size": batch_size, "seq_len": seq_len,
            "tokens_per_s": m["tokens_per_s"], "final_loss": m["final_loss"],
            "step_s": statistics.median(step_s), "bare_step_s": statistics.median(bare),
            "fraction_of_bare": statistics.median(bare) / statistics.median(step_s),
            "peak_rss_bytes": host_peak_rss_bytes(),
            "trainable_parameters": record["extra"]["trainable_parameters"]}


def bare_step_seconds(cfg: RFTConfig, repeats: int) -> list[float]:
    """Seconds of the compute no RFT step can avoid, on batches of the run's shape: the student's forward and
    backward (LoRA attached, as trained) and the teacher's forward; no loss beyond a sum of the logits, no
    optimizer, no logging. The RFT step's time divided into this is its efficiency (issue 20 part 4)."""
    cfg = dataclasses.replace(cfg, out=f"{cfg.out}-bare")
    run = _setup(cfg, DistContext(cfg))
    model, teacher = run.model, run.teacher
    seconds = []
    for i in range(repeats + 1):  # the first is warm-up
        x = run.windows[[(i * cfg.batch_size + j) % run.windows.shape[0] for j in range(cfg.batch_size)]]
        t0 = time.perf_counter()
        if teacher is not None:
            with torch.no_grad():
                teacher(input_ids=x).logits
        model(input_ids=x).logits.float().sum().backward()
        seconds.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
    return seconds[1:]


def bench_rft(families, checkpoints: Path, steps: int = 5, batch_size: int = 4, seq_len: int = 128,
              method: str = "l1", ratio: float = 0.5) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-rft-") as tmp:
        for family in families:
            dense = str(Path(checkpoints) / family)
            pruned = str(Path(tmp) / f"{family}-{method}")
            prune(PruneConfig(model=dense, method=method, ratio=ratio, out=pruned))
            for teacher in (dense, None):
                code = ("import json; from state_reduction.rft.throughput import rft_point; "
                        f"print('BENCH ' + json.dumps(rft_point({pruned!r}, {teacher!r}, {str(Path(tmp) / 'run')!r}, "
                        f"{steps}, {batch_size}, {seq_len})))")
                proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
                line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH ")), None)
                if proc.returncode != 0 or line is None:
                    raise RuntimeError(f"bench-rft {family} (teacher={teacher is not None}) failed:\n{proc.stderr[-2000:]}")
                rows.append({"family": family, **json.loads(line[len("BENCH "):])})
    return rows


def format_rft_bench(rows: list[dict]) -> str:
    lines = [f"{'family':<16} {'teacher':>7} {'tokens/s':>9} {'step s':>7} {'bare s':>7} {'bare/step':>9} "
             f"{'peak RSS MiB':>13} {'final loss':>11}"]
    for r in rows:
        lines.append(f"{r['family']:<16} {'yes' if r['teacher'] else 'no':>7} {r['tokens_per_s']:>9.0f} "
                     f"{r['step_s']:>7.3f} {r['bare_step_s']:>7.3f} {r['fraction_of_bare']:>9.2f} "
                     f"{r['peak_rss_bytes'] / 2**20:>13.1f} {r['final_loss']:>11.3f}")
    lines.append("bare: student forward+backward (LoRA) + teacher forward on batches of the same shape, in the same "
                 "process (median of the steps before and after the run); bare/step: the RFT step's efficiency")
    return "\n".join(lines)
