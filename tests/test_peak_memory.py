"""HeapPeak: the heap's peak inside a block, read after ops once their outputs add up to the resolution."""

import gc

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


def _both(block):
    """The block under a reading after every op (resolution 0, the reference) and under the default resolution,
    nested, so that both see the same ops on the same heap."""
    with _Counted() as coarse, _Counted(resolution=0) as fine:
        block()
    return coarse, fine


def test_many_small_ops_read_the_heap_once_per_resolution_and_the_peak_is_within_it():
    n, numel = 2000, 1024  # 2000 tensors of 4 KiB, alive together (~8 MiB), then freed

    def block():
        kept = [torch.full((numel,), float(i)) for i in range(n)]
        del kept
    coarse, fine = _both(block)
    assert fine.reads >= n + 2  # the reference reads after every op
    # entry, exit, and one reading per MiB of outputs: not one per op
    assert 2 <= coarse.reads <= 2 + n * numel * 4 // coarse.resolution
    assert fine.peak > n * numel * 4 / 2  # the block's tensors are what the heap holds at its peak
    assert fine.peak - coarse.resolution <= coarse.peak <= fine.peak + coarse.resolution


def test_large_outputs_are_read_after_every_op():
    def block():
        for _ in range(5):
            x = torch.ones(1 << 19)  # 2 MiB each; two are alive while the next is made
        del x
    coarse, fine = _both(block)
    assert coarse.reads == 2 + 5
    assert abs(coarse.peak - fine.peak) < 1 << 16  # the same readings, from bases a few allocations apart


def test_garbage_from_before_the_block_does_not_lower_its_peak():
    """A collection inside the block (one the interpreter triggers, here forced) must not free what was garbage
    before it: that would pull the heap under the base and the block's 8 MiB under zero."""
    held = [torch.zeros(1 << 24)]  # 64 MiB in a reference cycle: garbage only the collector frees
    held.append(held)
    del held
    was_enabled = gc.isenabled()
    with HeapPeak() as peak:
        assert not gc.isenabled()
        gc.collect()
        block = torch.ones(1 << 21)  # 8 MiB
    assert gc.isenabled() == was_enabled
    assert peak.peak >= block.untyped_storage().nbytes()
