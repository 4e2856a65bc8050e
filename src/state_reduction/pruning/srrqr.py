"""Strong rank-revealing QR (Gu & Eisenstat 1996, Algorithm 4; paper appendix B.2) for column selection.

For M Pi = Q [[A, B], [0, C]] with A the k x k block of the kept columns, a split is strong when every
rho_ij = sqrt((A^-1 B)_ij^2 + (gamma_j(C) / omega_i(A))^2) <= f, with gamma_j the norm of column j of C
and 1/omega_i the norm of row i of A^-1. Swapping kept column i with residual column j multiplies
|det A| by rho_ij, so the swap loop started from QR with column pivoting (QRCP) terminates.

Everything here depends on M only through its column geometry (M^T M), so the routine runs on any
triangular factor R of M: the Gram path takes R = cholesky(G)^T of a Gram matrix accumulated over tokens.
The matrices are small (K <= 256), so after each swap the factor is simply re-triangularised by a fresh
QR instead of the paper's Givens updates.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

RANK_RTOL = 1e-10  # |R_pp| <= RANK_RTOL * |R_00| after QRCP counts as numerically zero
GRAM_JITTER = 1e-12  # diagonal jitter added to a Gram matrix, relative to trace(G) / K


@dataclass(frozen=True)
class SRRQRInfo:
    swaps: int  # column swaps done after QRCP
    max_rho: float  # max_ij rho_ij of the returned split (0 when k = 0 or k = n)
    converged: bool  # max_rho <= f; False only when max_swaps stopped the loop
    rank: int  # numerical rank seen by QRCP (the strong bound is enforced on min(k, rank) columns)
    jitter: float = 0.0  # absolute diagonal jitter the Gram path added before its Cholesky factorisation


def _as_float64(x, what: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu", torch.float64).numpy()
    x = np.array(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"{what} must be a 2-D matrix, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(f"{what} has NaN or Inf entries")
    return x


def _qrcp(R: np.ndarray, perm: np.ndarray, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Householder QR with column pivoting from column `start` on (columns before it stay as they are).

    Residual column norms are recomputed at every step (no downdating); ties go to the lower position."""
    R, perm = R.copy(), perm.copy()
    m, n = R.shape
    for p in range(start, min(m, n)):
        norms = np.linalg.norm(R[p:, p:], axis=0)
        j = p + int(np.argmax(norms))
        if norms[j - p] == 0.0:
            break
        if j != p:
            R[:, [p, j]] = R[:, [j, p]]
            perm[[p, j]] = perm[[j, p]]
        x = R[p:, p]
        alpha = -np.copysign(np.linalg.norm(x), x[0])
        v = x.copy()
        v[0] -= alpha
        vnorm = np.linalg.norm(v)
        if vnorm > 0.0:
            v /= vnorm
            R[p:, p:] -= 2.0 * np.outer(v, v @ R[p:, p:])
        R[p + 1 :, p] = 0.0
    return R, perm


def _rho(R: np.ndarray, k: int) -> np.ndarray:
    """[k, n-k] matrix of rho_ij for the split of the upper-trapezoidal R after its first k columns."""
    A, B, C = R[:k, :k], R[:k, k:], R[k:, k:]
    A_inv = np.linalg.solve(A, np.eye(k))
    A_inv_B = A_inv @ B
    inv_omega = np.linalg.norm(A_inv, axis=1)  # 1 / omega_i(A)
    gamma = np.linalg.norm(C, axis=0) if C.shape[0] else np.zeros(B.shape[1])
    return np.sqrt(A_inv_B**2 + np.outer(inv_omega, gamma) ** 2)


def srrqr(M, k: int, f: float = 1.5, max_swaps: int | None = None) -> tuple[np.ndarray, SRRQRInfo]:
    """Strong RRQR column selection of the [m, n] matrix M (or any triangular factor R of it).

    Returns (perm, info): perm is a permutation of 0..n-1 (int64) whose first k entries are the kept
    columns. QRCP gives the start; then, while some rho_ij > f, the pair with the largest rho is swapped
    (at most `max_swaps` times; None = until the bound holds). If M has numerical rank r < k (see
    RANK_RTOL), a warning is issued, the bound is enforced on the first r columns and the remaining k - r
    kept columns continue in QRCP order."""
    M = _as_float64(M, "srrqr matrix")
    m, n = M.shape
    if not 0 <= k <= n:
        raise ValueError(f"srrqr: k must be in 0..{n} (number of columns), got {k}")
    if f < 1.0:
        raise ValueError(f"srrqr: f must be >= 1 (Gu & Eisenstat), got {f}")
    if max_swaps is not None and max_swaps < 0:
        raise ValueError(f"srrqr: max_swaps must be >= 0 or None, got {max_swaps}")
    R = np.linalg.qr(M, mode="r") if m > n else M  # same column geometry, n x n
    R, perm = _qrcp(R, np.arange(n, dtype=np.int64))
    diag = np.abs(np.diag(R))
    rank = int(np.sum(diag > RANK_RTOL * diag[0])) if diag.size and diag[0] > 0 else 0
    k_eff = min(k, rank)
    if k_eff < k:
        warnings.warn(
            f"srrqr: matrix has numerical rank {rank} < k = {k}; the strong-RRQR bound covers the first "
            f"{rank} kept columns, the other {k - k_eff} follow QR with column pivoting",
            stacklevel=2,
        )
    swaps, max_rho = 0, 0.0
    if 0 < k_eff < n:
        while True:
            rho = _rho(R, k_eff)
            i, j = np.unravel_index(int(np.argmax(rho)), rho.shape)
            max_rho = float(rho[i, j])
            if max_rho <= f or (max_swaps is not None and swaps >= max_swaps):
                break
            cols = np.arange(n)
            cols[[i, k_eff + j]] = cols[[k_eff + j, i]]
            R = np.linalg.qr(R[:, cols], mode="r")
            perm = perm[cols]
            swaps += 1
        if k_eff < k:
            R, perm = _qrcp(R, perm, start=k_eff)
    return perm, SRRQRInfo(swaps=swaps, max_rho=max_rho, converged=max_rho <= f, rank=rank)


def srrqr_from_gram(
    G,
    k: int,
    f: float = 1.5,
    max_swaps: int | None = None,
    n_rows: int | None = None,
    jitter: float = GRAM_JITTER,
    label: str = "",
) -> tuple[np.ndarray, SRRQRInfo]:
    """`srrqr` on a matrix M known only through its Gram matrix G = M^T M ([n, n], e.g. summed over tokens).

    R = cholesky(G + delta I)^T with delta = jitter * trace(G) / n (raised tenfold, at most six times, if
    the factorisation still fails); this adds sqrt(delta) to M's singular values, i.e. it acts on
    M' = [M; sqrt(delta) I]. A warning is issued when G is numerically rank-deficient (smallest eigenvalue
    <= n * eps * largest) or when `n_rows` (rows of M, e.g. calibration tokens) is below n: the selection
    among directions M does not span is then decided by the jitter alone. `label` prefixes the warnings
    (e.g. "layer 3 head 1")."""
    G = _as_float64(G, f"{label} Gram matrix".strip())
    n = G.shape[0]
    if G.shape != (n, n):
        raise ValueError(f"{label} Gram matrix must be square, got shape {G.shape}".strip())
    G = 0.5 * (G + G.T)
    prefix = f"{label}: " if label else ""
    scale = float(np.trace(G)) / n if n else 0.0
    eig = np.linalg.eigvalsh(G) if n else np.zeros(0)
    if scale <= 0.0:
        warnings.warn(f"{prefix}Gram matrix is zero; DRRQR falls back to the identity order", stacklevel=2)
        perm = np.arange(n, dtype=np.int64)
        return perm, SRRQRInfo(swaps=0, max_rho=0.0, converged=True, rank=0)
    rank = int(np.sum(eig > n * np.finfo(np.float64).eps * eig[-1]))
    if rank < n or (n_rows is not None and n_rows < n):
        rows = f" from {n_rows} rows" if n_rows is not None else ""
        warnings.warn(
            f"{prefix}Gram matrix{rows} is rank-deficient (numerical rank {rank} of {n}); regularised with "
            f"jitter {jitter:g} * trace/n, so channels beyond the rank are chosen by the jitter "
            "(use more calibration tokens)",
            stacklevel=2,
        )
    L, delta = _jittered_cholesky(G, jitter * scale)
    if L is None:
        raise np.linalg.LinAlgError(f"{prefix}Gram matrix is not positive semi-definite (min eigenvalue {eig[0]:g})")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # rank deficiency was reported above, on G itself
        perm, info = srrqr(L.T, k, f=f, max_swaps=max_swaps)
    return perm, SRRQRInfo(info.swaps, info.max_rho, info.converged, min(info.rank, rank), delta)


def _jittered_cholesky(G: np.ndarray, delta: float, tries: int = 7) -> tuple[np.ndarray | None, float]:
    """cholesky(G + delta I), the jitter growing tenfold until it factors (None after `tries`), and the delta used."""
    eye = np.eye(G.shape[0])
    for _ in range(tries):
        try:
            return np.linalg.cholesky(G + delta * eye), delta
        except np.linalg.LinAlgError:
            delta *= 10.0
    return None, delta


def qrcp_pivot_norms(G, jitter: float = GRAM_JITTER) -> np.ndarray:
    """[n] per-column importance of M known through G = M^T M: |R_pp| of QR with column pivoting, given to the column
    pivoted at position p (the norm of that column's residual after projecting out the columns pivoted before it;
    non-increasing in pivot order, so keeping the top k scores keeps QRCP's first k pivots). The factor is that of
    `srrqr_from_gram` (cholesky(G + delta I)^T); a zero G gives zeros."""
    G = _as_float64(G, "Gram matrix")
    G = 0.5 * (G + G.T)
    n = G.shape[0]
    scale = float(np.trace(G)) / n if n else 0.0
    if scale <= 0.0:
        return np.zeros(n)
    L, _ = _jittered_cholesky(G, jitter * scale)
    if L is None:
        raise np.linalg.LinAlgError("Gram matrix is not positive semi-definite")
    R, perm = _qrcp(L.T, np.arange(n))
    out = np.empty(n)
    out[perm] = np.abs(np.diag(R))
    return out
