import math

import pytest
import torch
from torch import nn

from state_reduction.ralimp import GatedLinearization, gated_weights


class SwiGLU(nn.Module):
    def __init__(self, d=6, f=10, act="swish"):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)
        self.hidden_act = act


def _gated(rank=16, seed=0):
    torch.manual_seed(0)
    mlp = SwiGLU()
    g, u, dn = gated_weights(mlp)
    x = torch.randn(4, 6, dtype=torch.float64)
    calib = (torch.randn(300, 6) @ g.detach().T).flatten()
    return GatedLinearization(g, u, dn, rank=rank, budget=32, calib_t=calib, seed=seed).double(), x


def test_folded_equals_unfolded():
    layer, x = _gated()
    with torch.no_grad():
        torch.testing.assert_close(layer(x), layer.unfolded(x))
        torch.testing.assert_close(layer.fold().double()(x), layer(x))


def test_sketch_unbiased():
    """Over independent (P, Q) the rank-r Hadamard factorisation averages to the un-sketched gated product."""
    layer, x = _gated(rank=8)
    with torch.no_grad():
        target = layer.kernel(x)
        outs = []
        g = torch.Generator().manual_seed(3)
        for _ in range(3000):
            layer.P.copy_(torch.randn(layer.P.shape, generator=g, dtype=torch.float64))
            layer.Q.copy_(torch.randn(layer.Q.shape, generator=g, dtype=torch.float64))
            outs.append(layer(x))
    outs = torch.stack(outs)
    se = outs.std(0) / math.sqrt(len(outs))
    assert ((outs.mean(0) - target).abs() <= 4 * se).all()


def test_parameters_and_flops():
    layer, _ = _gated(rank=16)
    folded = layer.fold()
    assert folded.folded.shape == (6, 16)
    assert folded.flops_per_token() > 0 and folded.deployed_parameters() > folded.folded.numel()


@pytest.mark.parametrize("mlp,word", [(nn.Sequential(nn.Linear(6, 10), nn.GELU(), nn.Linear(10, 6)), "not a gated MLP"),
                                      (SwiGLU(act="powlu"), "hidden_act='powlu'")])
def test_not_gated(mlp, word):
    with pytest.raises(ValueError, match=word):
        gated_weights(mlp, where="layer 3 mlp")


def test_bad_rank():
    torch.manual_seed(0)
    g, u, dn = gated_weights(SwiGLU())
    with pytest.raises(ValueError, match="rank"):
        GatedLinearization(g, u, dn, rank=0, calib_t=torch.randn(100))
