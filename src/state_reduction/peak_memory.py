"""Every peak-memory reading: the process's peak (host RSS, CUDA allocator) and the peak inside one block of work
(`HeapPeak`: the glibc heap; `TensorPeak`: live CPU tensor storages; `measure_peak_bytes`: either device)."""

from __future__ import annotations

import ctypes
import gc
import resource
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def host_rss_bytes() -> int:
    """Resident set size of this process now (Linux: /proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def host_peak_rss_bytes() -> int:
    """Peak resident set size of this process (Linux reports KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def cuda_peak_bytes(device: str | torch.device | None = None) -> int:
    """CUDA's caching-allocator peak on `device` (the current one for None) since its last reset."""
    return int(torch.cuda.max_memory_allocated(device))


def process_peaks() -> dict:
    """{rss_bytes, cuda_bytes} of this process (cuda_bytes None without a GPU): what every result records."""
    return {"rss_bytes": host_peak_rss_bytes(), "cuda_bytes": cuda_peak_bytes() if torch.cuda.is_available() else None}


def peak_memory_bytes(device: str | torch.device) -> int:
    """Peak memory of work on `device`: CUDA's allocator peak for a CUDA device, the process's peak RSS otherwise
    (CPU work on a machine that also has a GPU must not read the idle GPU's ~0)."""
    device = torch.device(device)
    if device.type == "cuda":
        return cuda_peak_bytes(device)
    return host_peak_rss_bytes()


def _glibc_heap():
    libc = ctypes.CDLL("libc.so.6")

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                     "keepcost")]

    libc.mallinfo2.restype = Mallinfo2

    def in_use() -> int:
        info = libc.mallinfo2()
        return info.uordblks + info.hblkhd  # bytes in malloc'd chunks, small (arena) and mmap'd

    return in_use


class HeapPeak(TorchDispatchMode):
    """Peak of the process heap above its level at entry (CPU tensors are malloc'd, so this counts every tensor
    created inside, activations and autograd's saved tensors included). glibc only.

    The heap is read (mallinfo2) after an op once the storages the ops returned since the last reading add up to
    `resolution` bytes, and on exit. mallinfo2 walks the heap's free lists, which costs milliseconds on a large,
    fragmented heap; reading it after each of a greedy selection's ~1e5 tiny ops took minutes. The heap can only
    have grown by what the ops returned in between, so the peak is low by at most `resolution` (default 1 MiB),
    and a block whose ops each return at least that much is read after every op, as before.

    Cyclic garbage is collected at entry and the collector is held off inside: garbage from before the block (a
    model just replaced, say) freed by a collection inside it would pull the heap below its base and the peak low by
    that much (a CI run read a block's Grad increment 16 MiB, one 2048 x 2048 fp32 matrix, under its usual 76 MiB)."""

    def __init__(self, resolution: int = 1 << 20):
        super().__init__()
        self.in_use = _glibc_heap()
        self.resolution = resolution
        self.base = self.peak = self._pending = 0
        self._gc_was_enabled = False

    def __enter__(self):
        gc.collect()
        self._gc_was_enabled = gc.isenabled()
        gc.disable()
        self.base = self.in_use()
        self.peak = self._pending = 0
        return super().__enter__()

    def __exit__(self, *exc):
        self._read()
        if self._gc_was_enabled:
            gc.enable()
        return super().__exit__(*exc)

    def _read(self) -> None:
        self.peak = max(self.peak, self.in_use() - self.base)
        self._pending = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                self._pending += t.untyped_storage().nbytes()
        if self._pending >= self.resolution:
            self._read()
        return out


class TensorPeak(TorchDispatchMode):
    """Peak bytes of the CPU tensors allocated inside the block (tensors alive before it, e.g. weights, are not
    counted): every op output's storage is counted once, until it is freed. `with TensorPeak() as m: ...; m.peak`.
    The dispatch overhead makes it a separate, untimed pass."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def _free(self, key: int, nbytes: int) -> None:
        if self.live.pop(key, None) is not None:
            self.current -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                key, nbytes = storage.data_ptr(), storage.nbytes()
                if nbytes == 0 or key in self.live:
                    continue
                self.live[key] = nbytes
                self.current += nbytes
                self.peak = max(self.peak, self.current)
                weakref.finalize(storage, self._free, key, nbytes)
        return out


def measure_peak_bytes(fn, device: torch.device) -> int:
    """Peak bytes allocated while `fn()` runs, above what was allocated before (CUDA: the caching allocator's
    counter; CPU: `TensorPeak`)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return cuda_peak_bytes(device) - before
    with TensorPeak() as m:
        fn()
    return m.peak
