import time
import warnings

import numpy as np
import pytest
import torch

from state_reduction.pruning.srrqr import srrqr, srrqr_from_gram

F = 1.5


def rho_matrix(M: np.ndarray, perm: np.ndarray, k: int) -> np.ndarray:
    """Independent rho_ij of the split M[:, perm] = Q [[A, B], [0, C]] (Gu & Eisenstat, appendix B.2)."""
    R = np.linalg.qr(M[:, perm], mode="r")
    A, B, C = R[:k, :k], R[:k, k:], R[k:, k:]
    A_inv = np.linalg.inv(A)
    A_inv_B = A_inv @ B
    rho = np.empty((k, M.shape[1] - k))
    for i in range(k):
        omega = 1.0 / np.linalg.norm(A_inv[i, :])
        for j in range(M.shape[1] - k):
            gamma = np.linalg.norm(C[:, j])
            rho[i, j] = np.sqrt(A_inv_B[i, j] ** 2 + (gamma / omega) ** 2)
    return rho


def kahan(n: int, c: float = 0.285) -> np.ndarray:
    """Kahan's matrix: QR with column pivoting keeps the natural order and misses its small singular value."""
    s = np.sqrt(1 - c * c)
    R = np.diag(s ** np.arange(n)) @ (np.triu(-c * np.ones((n, n)), 1) + np.eye(n))
    return R @ np.diag((1 - 1e-13) ** np.arange(n))


def block_kahan() -> np.ndarray:
    """Three Kahan blocks: strong RRQR needs three swaps after QRCP."""
    blocks = [kahan(24), kahan(24) * (1 - 1e-10), kahan(16) * (1 - 2e-10)]
    M = np.zeros((64, 64))
    at = 0
    for b in blocks:
        M[at : at + len(b), at : at + len(b)] = b
        at += len(b)
    return M


def make(kind: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "random":
        return rng.standard_normal((200, 64))
    if kind == "rank40":
        return rng.standard_normal((200, 40)) @ rng.standard_normal((40, 64))
    if kind == "illcond":  # singular values 1 .. 1e-8
        U, _ = np.linalg.qr(rng.standard_normal((200, 64)))
        V, _ = np.linalg.qr(rng.standard_normal((64, 64)))
        return U @ np.diag(np.logspace(0, -8, 64)) @ V.T
    if kind == "scaled":  # column scales over 4 decades plus a shared direction
        return rng.standard_normal((200, 64)) * np.logspace(0, -4, 64) + 0.5 * rng.standard_normal((200, 1))
    if kind == "kahan":
        return block_kahan()
    raise ValueError(kind)


CASES = [
    (kind, k)
    for kind in ("random", "rank40", "illcond", "scaled", "kahan")
    for k in (8, 16, 32, 48)
    if not (kind == "rank40" and k > 40)  # k above the rank: test_rank_below_k_warns
]


@pytest.mark.parametrize("kind,k", CASES)
def test_strong_bound_holds(kind, k):
    M = make(kind)
    perm, info = srrqr(M, k, f=F)
    assert sorted(perm.tolist()) == list(range(64))
    assert info.converged
    rho = rho_matrix(M, perm, k)
    assert rho.max() <= F + 1e-9
    assert abs(rho.max() - info.max_rho) < 1e-6 * max(1.0, rho.max())


def test_swaps_fix_kahan():
    M = block_kahan()
    k = 61
    qrcp_perm, qrcp_info = srrqr(M, k, max_swaps=0)
    assert qrcp_info.swaps == 0 and not qrcp_info.converged
    assert rho_matrix(M, qrcp_perm, k).max() > 10
    perm, info = srrqr(M, k)
    assert info.swaps >= 2
    # each swap multiplies |det A| by rho > f
    vol = lambda p: np.abs(np.diag(np.linalg.qr(M[:, p[:k]], mode="r"))).prod()
    assert vol(perm) > F ** info.swaps * vol(qrcp_perm) * (1 - 1e-9)


@pytest.mark.parametrize("max_swaps", [0, 1, 2])
def test_max_swaps_respected(max_swaps):
    _, full = srrqr(block_kahan(), 61)
    assert full.swaps > max_swaps
    _perm, info = srrqr(block_kahan(), 61, max_swaps=max_swaps)
    assert info.swaps == max_swaps and not info.converged and info.max_rho > F


@pytest.mark.parametrize("kind", ["random", "rank40", "scaled"])
@pytest.mark.parametrize("k", [8, 16, 32])
def test_gram_path_matches_matrix_path(kind, k):
    M = make(kind, seed=1)
    perm, _ = srrqr(M, k)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # rank40 warns about its Gram matrix
        perm_g, _ = srrqr_from_gram(M.T @ M, k)
    assert set(perm[:k].tolist()) == set(perm_g[:k].tolist())


def test_gram_path_accepts_torch_and_matches_on_kahan_free_data():
    M = make("random", seed=2)
    G = torch.from_numpy(M.T @ M)
    a, _ = srrqr_from_gram(G, 16)
    b, _ = srrqr(torch.from_numpy(M), 16)
    assert set(a[:16].tolist()) == set(b[:16].tolist())


def test_no_swap_equals_scipy_qrcp():
    linalg = pytest.importorskip("scipy.linalg")
    for seed in range(3):
        M = make("random", seed)
        perm, info = srrqr(M, 16)
        assert info.swaps == 0
        _, _, ref = linalg.qr(M, mode="economic", pivoting=True)
        assert perm.tolist() == ref.tolist()


def test_max_swaps_zero_is_qrcp_order():
    M = make("scaled", seed=3)
    perm0, _ = srrqr(M, 32, max_swaps=0)
    norms = np.linalg.norm(M, axis=0)
    assert perm0[0] == int(np.argmax(norms))
    R = np.linalg.qr(M[:, perm0], mode="r")
    d = np.abs(np.diag(R))
    assert (d[:-1] >= d[1:] - 1e-12).all()  # QRCP: non-increasing |R_pp|


def test_rank_deficient_gram_warns():
    M = make("random", seed=4)[:10]  # 10 tokens, 64 channels
    with pytest.warns(UserWarning, match="rank-deficient.*10 of 64"):
        perm, info = srrqr_from_gram(M.T @ M, 16, n_rows=10, label="layer 2 head 1")
    assert sorted(perm.tolist()) == list(range(64)) and info.jitter > 0
    assert info.rank == 10
    # the first 10 kept columns span M's row space
    assert np.linalg.matrix_rank(M[:, perm[:10]]) == 10


def test_few_rows_warns_even_if_full_rank_by_noise():
    M = make("random", seed=5)[:60]
    with pytest.warns(UserWarning, match="layer 0 head 3: Gram matrix from 60 rows"):
        srrqr_from_gram(M.T @ M, 8, n_rows=60, label="layer 0 head 3")


def test_full_rank_gram_does_not_warn():
    M = make("random", seed=6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        srrqr_from_gram(M.T @ M, 16, n_rows=200)


def test_rank_below_k_warns():
    M = make("rank40")
    with pytest.warns(UserWarning, match="numerical rank 40 < k = 48"):
        perm, info = srrqr(M, 48)
    assert info.rank == 40
    assert np.linalg.matrix_rank(M[:, perm[:48]]) == 40
    assert rho_matrix(M, perm, 40).max() <= F + 1e-9


def test_deterministic():
    M = make("illcond", seed=7)
    runs = [srrqr(M, 24)[0] for _ in range(3)] + [srrqr(M.copy(), 24)[0]]
    assert all((r == runs[0]).all() for r in runs)
    G = M.T @ M
    with pytest.warns(UserWarning, match="rank-deficient"):  # cond(G) = 1e16
        runs = [srrqr_from_gram(G, 24)[0] for _ in range(3)]
    assert all((r == runs[0]).all() for r in runs)


def test_edge_cases_and_errors():
    M = make("random")
    assert srrqr(M, 0)[0].shape == (64,)
    perm, info = srrqr(M, 64)
    assert sorted(perm.tolist()) == list(range(64)) and info.swaps == 0
    with pytest.raises(ValueError, match="k must be in 0..64"):
        srrqr(M, 65)
    with pytest.raises(ValueError, match="f must be >= 1"):
        srrqr(M, 4, f=0.5)
    with pytest.raises(ValueError, match="NaN or Inf"):
        srrqr(np.full((4, 4), np.nan), 2)
    with pytest.raises(ValueError, match="square"):
        srrqr_from_gram(np.ones((3, 4)), 2)
    with pytest.warns(UserWarning, match="zero"):
        perm, _ = srrqr_from_gram(np.zeros((8, 8)), 2)
    assert perm.tolist() == list(range(8))


def test_fast_enough():
    M = make("scaled", seed=8)
    G = M.T @ M
    t = time.perf_counter()
    for k in (16, 32, 48):
        srrqr_from_gram(G, k)
        srrqr(block_kahan(), k)
    assert time.perf_counter() - t < 3.0  # well under a second each, with slack for a shared CPU
