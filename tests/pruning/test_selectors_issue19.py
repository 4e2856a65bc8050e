"""The issue-19 selectors: think, ghost and taylor equal a direct dense computation of their formula on tiny
examples, an all-zero channel scores lowest, and ghost on a family without a decay is a one-line error."""

import pytest
import torch

import state_reduction  # noqa: F401
from state_reduction.backend import install_cpu_backend
from state_reduction.models import build_model
from state_reduction.models.families import get_adapter
from state_reduction.pruning.calibration import _accumulate_qk, accumulate_gramians, calibrate
from state_reduction.pruning.selectors import SELECTORS, ghost_scores, select, taylor_scores
from state_reduction.pruning.types import LayerCalibration

B, T, H, K, D = 3, 7, 2, 6, 5
MODES = ("kq", "k", "q")


def gen(seed):
    return torch.Generator().manual_seed(seed)


def weights():
    g = gen(0)
    return torch.randn(H, K, D, generator=g), torch.randn(H, K, D, generator=g)


def top(scores, keep):
    """Per head: the `keep` largest scores, ties to the lower index, sorted."""
    return [sorted(sorted(range(len(row)), key=lambda j: (-row[j], j))[:keep]) for row in scores.tolist()]


def qk(seed=1, zero=None):
    g = gen(seed)
    q = torch.randn(B, T, H, K, generator=g, dtype=torch.float64) * torch.linspace(0.2, 2, K, dtype=torch.float64)
    k = torch.randn(B, T, H, K, generator=g, dtype=torch.float64) * torch.linspace(2, 0.2, K, dtype=torch.float64)
    if zero is not None:
        q[:, :, zero[0], zero[1]] = 0
        k[:, :, zero[0], zero[1]] = 0
    return q, k


@pytest.mark.parametrize("normalised", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_think_equals_the_frobenius_norm_of_each_channels_query_key_product(mode, normalised):
    q, k = qk(zero=(1, 2))
    stats = LayerCalibration(qk_l2_normalised=normalised)
    _accumulate_qk(stats, q[:2], k[:2], {"window_norms"})  # two calls: the sums add over batches
    _accumulate_qk(stats, q[2:], k[2:], {"window_norms"})
    seen_q, seen_k = (torch.nn.functional.normalize(x, dim=-1) if normalised else x for x in (q, k))
    want = torch.zeros(H, K, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for j in range(K):
                Q, Kc = seen_q[b, :, h, j], seen_k[b, :, h, j]  # [T]: column j of the window's Q and K
                product = {"kq": torch.outer(Q, Kc), "k": Kc[:, None], "q": Q[:, None]}[mode]
                want[h, j] += torch.linalg.matrix_norm(product, "fro")
    field = {"kq": stats.window_norm_qk, "k": stats.window_norm_k, "q": stats.window_norm_q}[mode]
    torch.testing.assert_close(field, want, rtol=1e-12, atol=1e-12)
    assert stats.gram_q is None and stats.sum_kk is None  # only what was asked for
    w_q, w_k = weights()
    sel = select("think", stats, w_q, w_k, K - 1, mode)
    assert sel.keep.tolist() == top(want, K - 1)
    assert 2 not in sel.keep[1].tolist()  # the all-zero channel goes first


def _series(Hv, seed=3):
    g = gen(seed)
    decay = torch.rand(B, T, Hv, generator=g, dtype=torch.float64) * 0.9 + 0.05
    gain = torch.rand(B, T, Hv, generator=g, dtype=torch.float64) + 0.5
    return decay, gain


def _dense_gramians(q, k, decay, gain):
    """Per window, value head and channel, the state s_t = a_t s_{t-1} + g_t k_t[j] u_t run as a linear system:
    P_t = sum of squares of the state's response to each unit input u_s (s <= t), Q_t = sum of squares of the
    read-outs y_r = q_r[j] s_r (r >= t) from a unit state at t. Returns sum_t P_t, sum_t Q_t [H_v, K]."""
    Hv = decay.shape[-1]
    rep = Hv // k.shape[2]
    P = torch.zeros(Hv, K, dtype=torch.float64)
    Q = torch.zeros(Hv, K, dtype=torch.float64)
    for b in range(B):
        for v in range(Hv):
            for j in range(K):
                a, g = decay[b, :, v], gain[b, :, v]
                kk, qq = k[b, :, v // rep, j], q[b, :, v // rep, j]
                state = torch.zeros(T, dtype=torch.float64)  # response to each of the T unit inputs
                for t in range(T):
                    impulse = torch.zeros(T, dtype=torch.float64)
                    impulse[t] = 1.0
                    state = a[t] * state + g[t] * kk[t] * impulse
                    P[v, j] += state.pow(2).sum()
                for t in range(T):
                    s, out = torch.tensor(1.0, dtype=torch.float64), []
                    for r in range(t, T):
                        if r > t:
                            s = a[r] * s
                        out.append(qq[r] * s)
                    Q[v, j] += torch.stack(out).pow(2).sum()
    return P, Q


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rep", [1, 2])  # value heads per key head (a Mamba-2 B/C group of 2 heads)
def test_ghost_gramians_and_scores_equal_a_dense_run_of_the_state_system(mode, rep):
    q, k = qk(zero=(0, 4))
    decay, gain = _series(H * rep)
    stats = LayerCalibration()
    accumulate_gramians(stats, q[:1], k[:1], decay[:1], gain[:1])
    accumulate_gramians(stats, q[1:], k[1:], decay[1:], gain[1:])
    P, Q = _dense_gramians(q, k, decay, gain)
    torch.testing.assert_close(stats.gramian_ctrl, P, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(stats.gramian_obs, Q, rtol=1e-10, atol=1e-12)
    per_v = {"kq": (P * Q).sqrt(), "k": P, "q": Q}[mode]
    want = per_v.view(H, rep, K).sum(1)
    torch.testing.assert_close(ghost_scores(stats, H, K, mode), want, rtol=1e-10, atol=1e-12)
    w_q, w_k = weights()
    sel = select("ghost", stats, w_q, w_k, K - 1, mode)
    assert sel.keep.tolist() == top(want, K - 1)
    if mode != "q":  # a key channel that is all zeros is never written: no controllability
        assert 4 not in sel.keep[0].tolist()


def test_ghost_without_gain_is_unit_gain():
    q, k = qk()
    decay, gain = _series(H)
    a, b = LayerCalibration(), LayerCalibration()
    accumulate_gramians(a, q, k, decay, None)
    accumulate_gramians(b, q, k, decay, torch.ones_like(gain))
    assert torch.equal(a.gramian_ctrl, b.gramian_ctrl) and torch.equal(a.gramian_obs, b.gramian_obs)


def test_ghost_on_a_family_without_decay_is_one_line(tmp_path, capsys):
    from pathlib import Path

    from state_reduction.cli import main

    checkpoint = Path(__file__).resolve().parents[2] / "experiments" / "tiny_models" / "checkpoints" / "deltanet"
    rc = main(["prune", str(checkpoint), "--method", "ghost", "--ratio", "0.5", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "'ghost'" in err and "DeltaNet" in err and "decay" in err
    assert not (tmp_path / "o").exists()
    adapter = get_adapter(build_model("deltanet", DELTANET, seed=0))
    assert "decay" in SELECTORS["ghost"].missing(adapter)
    assert all(SELECTORS[name].missing(adapter) is None for name in SELECTORS if name != "ghost")


VOCAB = 61
DELTANET = {"hidden_size": 32, "num_hidden_layers": 2, "num_heads": 2, "expand_k": 1.0, "expand_v": 1.0,
            "conv_size": 4, "vocab_size": VOCAB, "fuse_cross_entropy": False}


@pytest.mark.parametrize("batch_size", [1, 3])
def test_taylor_equals_second_order_expansion_with_the_batch_fisher(batch_size):
    install_cpu_backend()
    model = build_model("deltanet", DELTANET, seed=1, dtype=torch.float64)
    adapter = get_adapter(model)
    hk = adapter.key_heads(model.config)
    ref0 = next(iter(adapter.mixers(model)))
    with torch.no_grad():  # channel 5 of head 0 in layer 0 has all-zero q and k rows: it changes nothing
        ref0.module.q_proj.weight[5] = 0
        ref0.module.k_proj.weight[5] = 0
    windows = torch.randint(0, VOCAB, (4, 10), generator=gen(0))
    stats = calibrate(model, adapter, windows, batch_size=batch_size, needs={"taylor"})
    assert all(s.saliency_q is None and s.gram_q is None for s in stats.values())

    N = windows.shape[0]
    batches = [windows[i:i + batch_size] for i in range(0, N, batch_size)]
    u = {}  # (layer, side) -> [batch] of [H, K]: sum_i W dL_b/dW * B_b / N
    for x in batches:
        model.zero_grad()
        model(input_ids=x, labels=x).loss.backward()
        for ref in adapter.mixers(model):
            for side, proj in (("q", ref.module.q_proj), ("k", ref.module.k_proj)):
                share = (proj.weight * proj.weight.grad).sum(-1).view(*hk) * x.shape[0] / N
                u.setdefault((ref.layer, side), []).append(share.detach())
    model.zero_grad()
    c = [N / x.shape[0] for x in batches]
    for ref in adapter.mixers(model):
        uq, uk = u[(ref.layer, "q")], u[(ref.layer, "k")]
        for mode, terms in (("kq", [a + b for a, b in zip(uq, uk)]), ("k", uk), ("q", uq)):
            first = sum(terms)
            second = sum(cb * t ** 2 for cb, t in zip(c, terms))
            want = (0.5 * second - first).abs()
            torch.testing.assert_close(taylor_scores(stats[ref.layer], *hk, mode), want, rtol=1e-6, atol=1e-14)
            w_q, w_k = (w.detach() for w in adapter.qk_weights(ref.module))
            sel = select("taylor", stats[ref.layer], w_q, w_k, hk[1] - 1, mode)
            assert sel.keep.tolist() == top(want, hk[1] - 1)
            if ref.layer == ref0.layer:
                assert taylor_scores(stats[ref.layer], *hk, mode)[0, 5] == 0
                assert 5 not in sel.keep[0].tolist()
