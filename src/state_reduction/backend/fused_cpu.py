"""A fused CPU decode step of the (gated) delta rule: one pass over each head's state (issue 20, part 3).

The torch reference (`delta_rule._recurrent_scan_inplace`) needs three ops per block of heads (decayed copy, read,
rank-1 update), so each state element is touched three or four times, in cache. This kernel touches it once: with
the state stored V-first ([V, K] per head, fla's Gated DeltaNet layout) every row h[v, :] gives its own
u_v = b (v_v - e^g h[v, :] . k) and r_v = e^g h[v, :] . q, so the row is read, its two dot products taken and the
updated row e^g h[v, :] + u_v k written in one sweep. In the [K, V] layout (DeltaNet) the read needs the whole head
first: two sweeps over the head, the second from L1/L2 (a head is K x V x 4 bytes, 64 KiB at 128 x 128). In float32
with AVX2 and K <= 64 the V-first rows go eight at a time, ending their dot products in one transposed reduction per
eight rows (short rows otherwise pay two horizontal sums each); at K 128 the row-by-row sweep measured faster. The
step also takes the kernel's L2 norm of q and k itself (`l2norm_eps`), which as torch ops cost 0.15-0.2 ms a call.

Per token and head (g = 0 for the plain delta rule), as `_recurrent_scan_inplace`:
    u = b (v - e^g h^T k),   h' = e^g h + k u^T,   o = scale (e^g h^T q + (q . k) u) = scale h'^T q.

The kernel is plain C (no torch headers), compiled once per machine with the system's C compiler into the user's
cache (`kernel_path`), loaded with ctypes and called on the tensors' data pointers. It is chosen with
STATE_REDUCTION_CPU_RECURRENCE=fused (default `torch`: the reference); a missing compiler is then an error naming
it, never a silent switch back. Float32 and float64. Tested against the plain loop in float64 at 1e-10.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from state_reduction.errors import Error

ENV = "STATE_REDUCTION_CPU_RECURRENCE"
KERNELS = ("torch", "fused")

_SOURCE = r"""
#include <math.h>

/* V-first rows, float32, AVX2 + FMA, K <= 64: eight rows at a time, so the two dot products of each row end in one
   8 x 8 transposed reduction per block instead of two horizontal sums per row, which short rows pay for. At K 128 the
   row-by-row sweep below is at the copy bound and this one measured 1.3-1.5x slower (experiments/speed/README.md),
   so it takes only K <= 64. */
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
static inline __attribute__((always_inline)) __m256 sum8x8(const __m256 *a)
{
    const __m256 s0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 s1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(s0, s1, 0x20), _mm256_permute2f128_ps(s0, s1, 0x31));
}

static inline __attribute__((always_inline))
long rows8_f32(const float *src, float *dst, const float *kt, const float *qt, const float *vt, float *ot, long K,
               long V, float b, float d, float qk, float scale)
{
    if (K % 8 || K > 64) return 0;
    const __m256 dv = _mm256_set1_ps(d), bv = _mm256_set1_ps(b), qkv = _mm256_set1_ps(qk);
    const __m256 sv = _mm256_set1_ps(scale);
    long r = 0;
    for (; r + 8 <= V; r += 8) {
        const float *rows = src + r * K;
        float *out = dst + r * K;
        __m256 ak[8], aq[8];
        for (int j = 0; j < 8; ++j) {
            __m256 a = _mm256_setzero_ps(), e = _mm256_setzero_ps();
            for (long c = 0; c < K; c += 8) {
                const __m256 x = _mm256_loadu_ps(rows + j * K + c);
                a = _mm256_fmadd_ps(x, _mm256_loadu_ps(kt + c), a);
                e = _mm256_fmadd_ps(x, _mm256_loadu_ps(qt + c), e);
            }
            ak[j] = a; aq[j] = e;
        }
        const __m256 sk = sum8x8(ak), sq = sum8x8(aq);
        const __m256 u = _mm256_mul_ps(bv, _mm256_fnmadd_ps(dv, sk, _mm256_loadu_ps(vt + r)));
        _mm256_storeu_ps(ot + r, _mm256_mul_ps(sv, _mm256_fmadd_ps(dv, sq, _mm256_mul_ps(qkv, u))));
        float us[8];
        _mm256_storeu_ps(us, u);
        for (int j = 0; j < 8; ++j) {
            const __m256 uj = _mm256_set1_ps(us[j]);
            for (long c = 0; c < K; c += 8)
                _mm256_storeu_ps(out + j * K + c, _mm256_fmadd_ps(uj, _mm256_loadu_ps(kt + c),
                                                                  _mm256_mul_ps(dv, _mm256_loadu_ps(rows + j * K + c))));
        }
    }
    return r;
}
#define ROWS_F32 rows8_f32
#else
#define ROWS_F32(...) 0L
#endif
#define ROWS_NONE(...) 0L

#define DEFINE(NAME, REAL, EXP, SQRT, ROWS)                                                                           \
static inline __attribute__((always_inline))                                                                     \
void NAME##_body(const REAL *q, const REAL *k, const REAL *v, const REAL *beta, const REAL *g, const REAL *h0,          \
          REAL *h, REAL *o, long BH, long T, long K, long V, REAL scale, int v_first, REAL eps, REAL *work)      \
{                                                                                                                \
    REAL *kh = work, *qh = work + V, *kn = work + 2 * V, *qn = work + 2 * V + K;                                  \
    for (long i = 0; i < BH; ++i) {                                                                               \
        for (long t = 0; t < T; ++t) {                                                                            \
            const long it = i * T + t;                                                                            \
            const REAL *qt = q + it * K, *kt = k + it * K, *vt = v + it * V;                                      \
            if (eps >= 0) { /* the kernel's L2 norm of q and k: x / sqrt(sum x^2 + eps), as delta_rule.l2norm */  \
                REAL ssq = 0, ssk = 0;                                                                            \
                _Pragma("omp simd reduction(+:ssq,ssk)")                                                          \
                for (long c = 0; c < K; ++c) { ssq += qt[c] * qt[c]; ssk += kt[c] * kt[c]; }                      \
                const REAL rq = 1 / SQRT(ssq + eps), rk = 1 / SQRT(ssk + eps);                                    \
                _Pragma("omp simd")                                                                               \
                for (long c = 0; c < K; ++c) { qn[c] = qt[c] * rq; kn[c] = kt[c] * rk; }                          \
                qt = qn; kt = kn;                                                                                 \
            }                                                                                                     \
            const REAL *src = (t == 0 ? h0 : h) + i * K * V;                                                      \
            REAL *dst = h + i * K * V, *ot = o + it * V;                                                          \
            const REAL b = beta[it], d = g ? EXP(g[it]) : (REAL)1;                                                \
            REAL qk = 0;                                                                                          \
            _Pragma("omp simd reduction(+:qk)")                                                                   \
            for (long c = 0; c < K; ++c) qk += qt[c] * kt[c];                                                     \
            if (v_first) {                                                                                        \
                for (long r = ROWS(src, dst, kt, qt, vt, ot, K, V, b, d, qk, scale); r < V; ++r) {                 \
                    const REAL *row = src + r * K;                                                                \
                    REAL *out = dst + r * K;                                                                      \
                    REAL sk = 0, sq = 0;                                                                          \
                    _Pragma("omp simd reduction(+:sk,sq)")                                                        \
                    for (long c = 0; c < K; ++c) { sk += row[c] * kt[c]; sq += row[c] * qt[c]; }                  \
                    const REAL u = b * (vt[r] - d * sk);                                                          \
                    _Pragma("omp simd")                                                                           \
                    for (long c = 0; c < K; ++c) out[c] = d * row[c] + u * kt[c];                                 \
                    ot[r] = scale * (d * sq + qk * u);                                                            \
                }                                                                                                 \
            } else {                                                                                              \
                for (long c = 0; c < V; ++c) { kh[c] = 0; qh[c] = 0; }                                            \
                for (long r = 0; r < K; ++r) {                                                                    \
                    const REAL *row = src + r * V;                                                                \
                    const REAL a = kt[r], e = qt[r];                                                              \
                    _Pragma("omp simd")                                                                           \
                    for (long c = 0; c < V; ++c) { kh[c] += a * row[c]; qh[c] += e * row[c]; }                    \
                }                                                                                                 \
                for (long c = 0; c < V; ++c) {                                                                    \
                    kh[c] = b * (vt[c] - d * kh[c]);                                                              \
                    ot[c] = scale * (d * qh[c] + qk * kh[c]);                                                     \
                }                                                                                                 \
                for (long r = 0; r < K; ++r) {                                                                    \
                    const REAL *row = src + r * V;                                                                \
                    REAL *out = dst + r * V;                                                                      \
                    const REAL a = kt[r];                                                                         \
                    _Pragma("omp simd")                                                                           \
                    for (long c = 0; c < V; ++c) out[c] = d * row[c] + a * kh[c];                                 \
                }                                                                                                 \
            }                                                                                                     \
        }                                                                                                         \
    }                                                                                                             \
}

/* the key dimensions the models use get their own copy with K a constant (short rows unrolled) */
#define DISPATCH(NAME, REAL)                                                                                      \
void NAME(const REAL *q, const REAL *k, const REAL *v, const REAL *beta, const REAL *g, const REAL *h0,          \
          REAL *h, REAL *o, long BH, long T, long K, long V, REAL scale, int v_first, REAL eps, REAL *work)      \
{                                                                                                                \
    switch (K) {                                                                                                  \
    case 16: NAME##_body(q, k, v, beta, g, h0, h, o, BH, T, 16, V, scale, v_first, eps, work); break;                  \
    case 32: NAME##_body(q, k, v, beta, g, h0, h, o, BH, T, 32, V, scale, v_first, eps, work); break;                  \
    case 64: NAME##_body(q, k, v, beta, g, h0, h, o, BH, T, 64, V, scale, v_first, eps, work); break;                  \
    case 128: NAME##_body(q, k, v, beta, g, h0, h, o, BH, T, 128, V, scale, v_first, eps, work); break;                \
    default: NAME##_body(q, k, v, beta, g, h0, h, o, BH, T, K, V, scale, v_first, eps, work);                          \
    }                                                                                                             \
}

DEFINE(delta_step_f32, float, expf, sqrtf, ROWS_F32)
DEFINE(delta_step_f64, double, exp, sqrt, ROWS_NONE)
DISPATCH(delta_step_f32, float)
DISPATCH(delta_step_f64, double)
"""
# -fopenmp-simd: the `omp simd` reductions vectorise without -ffast-math (only those loops may reassociate)
_FLAGS = ["-O3", "-march=native", "-fopenmp-simd", "-fPIC", "-shared", "-std=c11"]


class FusedKernelError(Error, RuntimeError):
    pass


_FORCED: list[str] = []  # use_kernel's stack: the benchmarks time both kernels in one process


def selected_kernel() -> str:
    """The decode-step kernel in effect: `use_kernel`'s, else the one STATE_REDUCTION_CPU_RECURRENCE names (default
    `torch`)."""
    name = _FORCED[-1] if _FORCED else os.environ.get(ENV, "torch")
    if name not in KERNELS:
        raise FusedKernelError(f"{ENV} must be one of {', '.join(KERNELS)}, got {name!r}")
    return name


@contextlib.contextmanager
def use_kernel(name: str):
    """Run the CPU decode steps inside with kernel `name` (`torch` or `fused`)."""
    if name not in KERNELS:
        raise FusedKernelError(f"decode-step kernel must be one of {', '.join(KERNELS)}, got {name!r}")
    _FORCED.append(name)
    try:
        yield
    finally:
        _FORCED.pop()


def _compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise FusedKernelError(f"{ENV}=fused needs a C compiler (cc, gcc or $CC) to build the fused decode step; "
                               "none is on PATH (unset it for the torch reference)")
    return cc


def kernel_path(cc: str) -> Path:
    """Where the compiled kernel of this source, compiler, flags and machine lives (built once, reused)."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    key = hashlib.sha256("\n".join([_SOURCE, " ".join(_FLAGS), *version, platform.machine(),
                                    platform.processor(), _cpu_model()]).encode()).hexdigest()[:16]
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "state_reduction" / "kernels"
    return root / f"delta_step_{key}.so"


def _cpu_model() -> str:
    try:
        return next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if "model name" in line), "")
    except OSError:
        return ""


_LIB: ctypes.CDLL | None = None


def _library() -> ctypes.CDLL:
    global _LIB
    if _LIB is None:
        cc = _compiler()
        path = kernel_path(cc)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
                src, out = Path(tmp) / "delta_step.c", Path(tmp) / path.name
                src.write_text(_SOURCE)
                done = subprocess.run([cc, *_FLAGS, str(src), "-o", str(out), "-lm"], capture_output=True, text=True)
                if done.returncode != 0:
                    raise FusedKernelError(f"building the fused decode step with {cc} failed: "
                                           f"{' '.join(done.stderr.split())[:400]}")
                os.replace(out, path)  # atomic: a concurrent build leaves one whole file
        lib = ctypes.CDLL(str(path))
        for name in ("delta_step_f32", "delta_step_f64"):
            fn = getattr(lib, name)
            fn.restype = None
            real = ctypes.c_float if name.endswith("32") else ctypes.c_double
            fn.argtypes = [ctypes.c_void_p] * 8 + [ctypes.c_long] * 4 + [real, ctypes.c_int, real, ctypes.c_void_p]
        _LIB = lib
    return _LIB


def fused_recurrent_scan(q, k, v, beta, g, h0, scale: float, v_first: bool, out_state: torch.Tensor,
                         l2norm_eps: float | None = None):
    """`delta_rule._recurrent_scan_inplace`'s contract: q, k [B, H, T, K], v [B, H, T, V], beta, g [B, H, T] (g may be
    None), h0 [B, H, K, V] (or [B, H, V, K] if v_first), never written; the final state goes into `out_state` (same
    shape, contiguous, not aliasing h0). Returns o [B, H, T, V] and out_state. CPU, float32 or float64, no autograd.
    With `l2norm_eps` the step first divides each q and k row by sqrt(sum x^2 + eps) itself (the kernel's L2 norm,
    which as torch ops costs more than the step at d_k 32)."""
    B, H, T, K = q.shape
    V = v.shape[-1]
    dtype = q.dtype
    if dtype not in (torch.float32, torch.float64) or q.device.type != "cpu":
        raise FusedKernelError(f"the fused decode step runs float32/float64 CPU tensors, got {dtype} on {q.device}")
    fn = _library().delta_step_f32 if dtype == torch.float32 else _library().delta_step_f64
    q, k, v, beta = (x.contiguous() for x in (q, k, v, beta))
    g = None if g is None else g.contiguous()
    h0 = h0.contiguous()
    o = q.new_empty(B, H, T, V)
    if T == 0:
        return o, out_state.copy_(h0)
    if l2norm_eps is not None and not l2norm_eps >= 0:
        raise FusedKernelError(f"the fused decode step's l2norm_eps must be >= 0, got {l2norm_eps!r}")
    work = q.new_empty(2 * V + 2 * K)
    real = ctypes.c_float if dtype == torch.float32 else ctypes.c_double
    fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), beta.data_ptr(), None if g is None else g.data_ptr(), h0.data_ptr(),
       out_state.data_ptr(), o.data_ptr(), B * H, T, K, V, real(scale), int(v_first),
       real(-1.0 if l2norm_eps is None else l2norm_eps), work.data_ptr())
    return o, out_state
