"""HeapPeak: the heap's peak inside a block, read after ops once their outputs add up to the resolution."""

import torch

from state_reduction.peak_memory import HeapPeak


class _Counted(HeapPeak):
    def __init__(self, **kw):
        super().__init__(**kw)
        read, self.reads = self.in_use, 0

        def counted():
            self.reads += 1
            return read()
        self.in_use = counted


def test_many_small_ops_read_the_heap_once_per_resolution_and_the_peak_is_within_it():
    n, numel = 2000, 1024  # 2000 tensors of 4 KiB, alive together: ~8 MiB, then freed
    with _Counted() as peak:
        kept = [torch.full((numel,), float(i)) for i in range(n)]
        del kept
    # entry, exit, and one reading per MiB of outputs: not one per op
    assert 2 <= peak.reads <= 2 + n * numel * 4 // peak.resolution
    assert peak.peak >= n * numel * 4 - peak.resolution


def test_large_outputs_are_read_after_every_op():
    with _Counted() as peak:
        for _ in range(5):
            x = torch.ones(1 << 19)  # 2 MiB each, freed by the next
        del x
    assert peak.reads == 2 + 5
    assert peak.peak >= 2 * (1 << 21) - (1 << 20)  # the moment two of them are alive
