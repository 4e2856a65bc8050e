"""Rationally linearized MLPs (RaLiMP, seed paper /work/shared/papers/rationally_linearized_mlps.md)."""

from state_reduction.ralimp.gated import FoldedGatedMLP, GatedLinearization, gated_weights
from state_reduction.ralimp.layers import ACTIVATIONS, METHODS, Linearization, build_linearization
from state_reduction.ralimp.quadrature import atom_quadrature, gauss_laguerre, node_coefficients, shifted_atom

__all__ = ["ACTIVATIONS", "METHODS", "FoldedGatedMLP", "GatedLinearization", "Linearization", "atom_quadrature",
           "build_linearization", "gated_weights", "gauss_laguerre", "node_coefficients", "shifted_atom"]
