"""glibc malloc settings of this project's processes (issue 20).

By default glibc serves every block above its mmap threshold (dynamic, at most 32 MiB) with a fresh mmap and unmaps
it on free, so the next block of that size page-faults in again. The tiny evaluation allocates a [32, 256, 8192]
fp32 logits tensor (256 MiB) and its log-softmax per batch: in one `evaluate --suite tiny` of the tiny DeltaNet that
was 8.2 s of system time in a 45 s run, 1.5 s with the blocks served from the heap (the metrics bit-identical; only
where memory comes from changes). `pipeline_heap()` is what the CLI sets for every command except `bench` (which
measures glibc's default unless `--malloc-heap`); `heap_only()` is the benchmarks' `--malloc-heap`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

from state_reduction.errors import Error

# Blocks up to this size come from the heap (above the 256 MiB logits of the tiny evaluation's batches) ...
PIPELINE_MMAP_THRESHOLD = 512 << 20
# ... and the heap gives memory back to the system once more than this is free at its top, so a process keeps at most
# about this much of freed memory (a 7B model's weights loaded on the CPU are not held on to).
PIPELINE_TRIM_THRESHOLD = 1 << 30
# STATE_REDUCTION_MALLOC=default keeps glibc's own settings in every command.
ENV = "STATE_REDUCTION_MALLOC"

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


class AllocatorError(Error, RuntimeError):
    pass


def _mallopt(mmap_threshold: int, trim_threshold: int) -> bool:
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold) and libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold))


def heap_only() -> str:
    """Serve every block below 1 GiB from the heap and never trim it (the benchmarks' `--malloc-heap`: a dedicated
    benchmark process). Process-wide and irreversible. Raises if this libc has no mallopt (not glibc)."""
    if not _mallopt(1 << 30, (1 << 31) - 1):
        raise AllocatorError("mallopt refused the heap-only setting (not glibc?)")
    return "heap (glibc mmap threshold 1 GiB, no trim)"


def pipeline_heap() -> str:
    """The setting of the pipeline's commands (prune, evaluate, rft, run-table, render ...), unless
    STATE_REDUCTION_MALLOC=default: blocks below PIPELINE_MMAP_THRESHOLD from the heap, trimmed above
    PIPELINE_TRIM_THRESHOLD. Returns what is in effect; on a libc without mallopt that is its default (speed only)."""
    setting = os.environ.get(ENV, "pipeline")
    if setting not in ("pipeline", "default"):
        raise AllocatorError(f"{ENV} must be 'pipeline' or 'default', got {setting!r}")
    if setting == "default" or not _mallopt(PIPELINE_MMAP_THRESHOLD, PIPELINE_TRIM_THRESHOLD):
        return "default"
    return f"heap below {PIPELINE_MMAP_THRESHOLD >> 20} MiB, trimmed above {PIPELINE_TRIM_THRESHOLD >> 20} MiB"
