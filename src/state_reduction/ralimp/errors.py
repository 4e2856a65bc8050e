"""The RaLiMP modules' one error type: a bad option (budget, degree, tau, layer count, a non-gated MLP) named with
the value given and the accepted range. An InputError (so a ValueError), printed by the CLIs as one line."""

from state_reduction.errors import InputError


class RalimpError(InputError):
    """An option of a linearization that cannot be built as asked; the message names the option and its limit."""
