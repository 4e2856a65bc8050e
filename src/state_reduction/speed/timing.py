"""Side-by-side timing: every variant is measured in the same process, interleaved per repetition (the order
rotates), and the median over repetitions is reported. Paper protocol (G.1): 10 warm-up steps, 100 measured
steps, median of 3 repetitions."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from state_reduction.errors import InputError


@dataclass(frozen=True)
class TimingProtocol:
    warmup: int = 10
    steps: int = 100
    repeats: int = 3

    def __post_init__(self):
        if self.warmup < 0 or self.steps < 1 or self.repeats < 1:
            raise InputError(f"need warmup >= 0, steps >= 1, repeats >= 1; got {asdict(self)}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_interleaved(fns: dict[str, Callable[[], object]], protocol: TimingProtocol,
                     device: torch.device) -> dict[str, list[float]]:
    """Seconds per call of each function, one value per repetition."""
    names = list(fns)
    samples = {n: [] for n in names}
    for r in range(protocol.repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn = fns[name]
            for _ in range(protocol.warmup):
                fn()
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(protocol.steps):
                fn()
            _sync(device)
            samples[name].append((time.perf_counter() - t0) / protocol.steps)
    return samples


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def paired_speedup(samples: dict[str, list[float]], label: str, base: str = "base") -> float:
    """Median over repetitions of base time / variant time. Within a repetition the variants run next to each
    other, so each ratio is taken under the same machine load; the ratio of medians is not (shared machines)."""
    return statistics.median(b / v for b, v in zip(samples[base], samples[label], strict=True))
