"""Speed and memory of reduced-state models (paper section 5 "Speedup", appendix G.1, Tables 17-19, Figure 4).

API: `state_bytes`, `largest_batch`, `state_memory_rows` (accounting); `bench_decode`, `bench_prefill`,
`bench_mixer`, `bench_recurrence` (side-by-side timing, result records of kind "bench").
"""

from state_reduction.speed.state_bytes import (
    largest_batch,
    parse_bytes,
    reduced_config,
    state_bytes,
    state_memory_rows,
)

__all__ = ["largest_batch", "parse_bytes", "reduced_config", "state_bytes", "state_memory_rows"]
