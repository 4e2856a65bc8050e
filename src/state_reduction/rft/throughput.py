"""`state-reduction bench-rft`: tokens/s and peak memory of RFT on the tiny models (CPU), with and
without the teacher. Each point runs in a fresh subprocess so that its peak RSS (ru_maxrss) is its own."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from state_reduction.peak_memory import host_peak_rss_bytes
from state_reduction.pruning.prune import PruneConfig, prune
from state_reduction.rft import RFTConfig, run_rft


def rft_point(student: str, teacher: str | None, out: str, steps: int, batch_size: int, seq_len: int) -> dict:
    """One measurement in this process: a short RFT run (1 thread, no wandb, no progress bar)."""
    cfg = RFTConfig.tiny_preset(student, teacher, out, steps=steps, batch_size=batch_size, seq_len=seq_len,
                                warmup_steps=1, save_every=steps, overwrite=True, resume=False, wandb="disabled", progress=False,
                                threads=1)
    record = run_rft(cfg)
    m = record["metrics"]
    return {"teacher": teacher is not None, "steps": steps, "batch_size": batch_size, "seq_len": seq_len,
            "tokens_per_s": m["tokens_per_s"], "final_loss": m["final_loss"],
            "peak_rss_bytes": host_peak_rss_bytes(),
            "trainable_parameters": record["extra"]["trainable_parameters"]}


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
    lines = [f"{'family':<16} {'teacher':>7} {'tokens/s':>9} {'peak RSS MiB':>13} {'final loss':>11}"]
    for r in rows:
        lines.append(f"{r['family']:<16} {'yes' if r['teacher'] else 'no':>7} {r['tokens_per_s']:>9.0f} "
                     f"{r['peak_rss_bytes'] / 2**20:>13.1f} {r['final_loss']:>11.3f}")
    return "\n".join(lines)
