"""The theory of section 2.2 and appendix F on random instances, and Prop. 3.1 on real layers."""

from __future__ import annotations

import types

import pytest
import torch

import state_reduction  # noqa: F401  (registers the families)
from state_reduction.analysis.rank import effective_rank, rank_utilization
from state_reduction.models import build_model
from state_reduction.models.families import get_adapter


def spectrum(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.svdvals(x)


@pytest.mark.parametrize("seed", range(20))
def test_effective_rank_bound_eq4(seed):
    """Eq. (4) / appendix F.1: er(S) >= er(V_par) / kappa(K)^2 for S = V K^T, K [d_k, T] of full row rank and
    V_par the projection of V [d_v, T] onto the row space of K."""
    g = torch.Generator().manual_seed(seed)
    d_k, d_v, t = [int(x) for x in torch.randint(2, 12, (3,), generator=g)]
    t += d_k
    scales = torch.logspace(0, float(torch.rand((), generator=g)) * 3, d_k, dtype=torch.float64)
    k = scales[:, None] * torch.randn(d_k, t, generator=g, dtype=torch.float64)  # ill-conditioned keys
    v = torch.randn(d_v, t, generator=g, dtype=torch.float64)
    s = v @ k.T
    proj = k.T @ torch.linalg.solve(k @ k.T, k)  # onto row(K)
    v_par = v @ proj
    sk = spectrum(k)
    kappa = sk[0] / sk[-1]
    assert effective_rank(s) >= effective_rank(v_par) / kappa ** 2 * (1 - 1e-10)
    torch.testing.assert_close(v_par @ k.T, s)  # V_perp K^T = 0, as the proof uses


@pytest.mark.parametrize("seed", range(20))
def test_amplification_bound_prop21(seed):
    """Prop. 2.1 / F.3: R(q*, eps) <= kappa(S), attained, and kappa(S) >= 1 / sqrt(u(S))."""
    g = torch.Generator().manual_seed(seed)
    d = int(torch.randint(2, 10, (), generator=g))
    s = torch.randn(d, d, generator=g, dtype=torch.float64) @ torch.diag(torch.logspace(0, 2, d, dtype=torch.float64))
    _, sv, vh = torch.linalg.svd(s)
    kappa = sv[0] / sv[-1]

    def amplification(q, eps):
        o_star, o = s @ q, s @ (q + eps)
        return ((o - o_star).norm() / o_star.norm()) / (eps.norm() / q.norm())

    for _ in range(50):
        q = torch.randn(d, generator=g, dtype=torch.float64)
        eps = 1e-3 * torch.randn(d, generator=g, dtype=torch.float64)
        assert amplification(q / q.norm(), eps) <= kappa * (1 + 1e-10)
    # worst case: the query along the weakest direction, the noise along the strongest
    torch.testing.assert_close(amplification(vh[-1], 1e-6 * vh[0]), kappa)
    assert kappa >= 1 / rank_utilization(s).sqrt() * (1 - 1e-12)


@pytest.mark.parametrize("seed", range(10))
def test_pca_does_not_decrease_key_utilisation_f2(seed):
    """Appendix F.2: K' = T K with T the top-r eigenvectors of K K^T gives u(K') >= u(K)."""
    g = torch.Generator().manual_seed(seed)
    d_k, t = 16, 64
    k = torch.diag(torch.logspace(0, 1.5, d_k, dtype=torch.float64)) @ torch.randn(d_k, t, generator=g, dtype=torch.float64)
    _, vecs = torch.linalg.eigh(k @ k.T)  # ascending eigenvalues
    for r in (1, 4, 8, 12, 16):
        proper = vecs[:, -r:].T @ k
        assert rank_utilization(proper, r) >= rank_utilization(k, d_k) - 1e-12
    adversarial = vecs[:, :4].T @ k  # the inequality is about the top components only
    assert rank_utilization(adversarial, 4) > 0


CONFIGS = {
    "deltanet": {"hidden_size": 64, "num_hidden_layers": 2, "num_heads": 4, "expand_k": 1.0, "expand_v": 1.0,
                 "use_short_conv": False, "qk_activation": "identity", "vocab_size": 97, "fuse_cross_entropy": False},
    "gated_deltanet": {"hidden_size": 64, "num_hidden_layers": 2, "num_heads": 4, "head_dim": 16, "expand_v": 2,
                       "use_short_conv": False, "vocab_size": 97, "fuse_cross_entropy": False},
}


class _FunctionalWithoutSilu(types.ModuleType):
    """torch.nn.functional with silu = identity: fla's GatedDeltaNet hard-codes SiLU on q/k when it has no short
    conv, so this is how a GDN layer with nothing between the projections and the mixer is built."""

    def __init__(self):
        super().__init__("functional_without_silu")

    def __getattr__(self, name):
        return (lambda x, *a, **k: x) if name == "silu" else getattr(torch.nn.functional, name)


def _rotate_qk_weights(model, t: torch.Tensor) -> None:
    adapter = get_adapter(model)
    with torch.no_grad():
        for ref in adapter.mixers(model):
            for w in adapter.qk_weights(ref.module):  # [H, K, d_in] views
                w.copy_(torch.einsum("hrk,hki->hri", t, w.clone()))


def _logits_before_and_after_rotation(family: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of a float64 tiny model, then of the same model with W_Q and W_K rotated per head by one random
    orthogonal T."""
    model = build_model(family, CONFIGS[family], seed=0, dtype=torch.float64).eval()
    ids = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        dense = model(input_ids=ids).logits
    heads, channels = get_adapter(model).key_heads(model.config)
    t = torch.linalg.qr(torch.randn(heads, channels, channels, generator=torch.Generator().manual_seed(1),
                                    dtype=torch.float64))[0]
    _rotate_qk_weights(model, t)
    with torch.no_grad():
        rotated = model(input_ids=ids).logits
    return dense, rotated


@pytest.mark.parametrize("family", list(CONFIGS))
def test_orthogonal_invariance_prop31_on_real_layers(family, monkeypatch):
    """Prop. 3.1: W_Q -> T W_Q, W_K -> T W_K (T orthogonal per head) leaves a (Gated) DeltaNet without q/k conv or
    activation unchanged, decay and beta included, to float64 precision."""
    if family == "gated_deltanet":
        import fla.layers.gated_deltanet as gdn

        monkeypatch.setattr(gdn, "F", _FunctionalWithoutSilu())
    dense, rotated = _logits_before_and_after_rotation(family)
    torch.testing.assert_close(rotated, dense, atol=1e-10, rtol=0)


def test_orthogonal_rotation_is_not_invariant_through_an_activation():
    """The same rotation through GDN's q/k SiLU changes the output: the invariance needs nothing in between."""
    dense, rotated = _logits_before_and_after_rotation("gated_deltanet")
    assert (rotated - dense).abs().max() > 1e-6
