import numpy as np
import pytest

from state_reduction.ralimp.quadrature import atom_quadrature, gauss_laguerre, node_coefficients, shifted_atom

# Measured: max error on [-3, 3] at order 40 is 1.2e-6 (centred); the shifted atoms below at order 60 stay under
# 1e-6 (order 40: up to 1.9e-5 where |u - p| reaches 3.2); order 5 gives 5e-4 on [-1, 1].
U = np.linspace(-3, 3, 601)


def test_centred_atom_reproduced():
    nodes = gauss_laguerre(40)
    assert np.abs(atom_quadrature(U, nodes) - 1 / (1 + U ** 2)).max() < 1e-5
    small = np.linspace(-1, 1, 201)
    assert np.abs(atom_quadrature(small, gauss_laguerre(5)) - 1 / (1 + small ** 2)).max() < 1e-3


@pytest.mark.parametrize("A,B,p,q", [(0.7, -0.4, 0.5, 1.5), (1.0, 1.0, -1.0, 2.0), (-2.0, 0.3, 0.2, 1.0)])
def test_shifted_atoms_reproduced(A, B, p, q):
    got = atom_quadrature(U, gauss_laguerre(60), A, B, p, q)
    assert np.abs(got - shifted_atom(U, A, B, p, q)).max() < 1e-5


def test_weights_and_cutoff():
    full = gauss_laguerre(7)
    assert sum(full.weights) == pytest.approx(1.0, abs=1e-12) and min(full.weights) > 0
    cut = gauss_laguerre(3, s_max=4.0)
    assert len(cut.nodes) == 3 and max(cut.nodes) <= 4.0 and cut.order == 5
    assert cut.discarded_weight == pytest.approx(1 - sum(cut.weights), abs=1e-12) and cut.discarded_weight > 0


def test_node_rotation_keeps_norm():
    nodes = gauss_laguerre(4)
    wc, ws = node_coefficients(nodes, 0.8, -0.3, 0.6, 1.7)
    g = np.asarray(nodes.weights)
    np.testing.assert_allclose(wc ** 2 + ws ** 2, g ** 2 * ((0.8 / 1.7 ** 2) ** 2 + (0.3 / 1.7) ** 2))


@pytest.mark.parametrize("call,word", [(lambda: gauss_laguerre(0), "n_freq"), (lambda: gauss_laguerre(3, 0.0), "s_max"),
                                       (lambda: node_coefficients(gauss_laguerre(3), 1, 0, 0, 0.0), "q"),
                                       (lambda: gauss_laguerre(20, 0.05), "s_max")])
def test_bad_input(call, word):
    with pytest.raises(ValueError, match=word):
        call()
