"""argparse types of numeric options: a bad value is a one-line usage error naming the option."""

from __future__ import annotations

import argparse


def _number(kind, least, text: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {'an integer' if kind is int else 'a number'}, got {text!r}") from None
    if value < least or value != value:
        raise argparse.ArgumentTypeError(f"must be >= {least}, got {text}")
    return value


def positive_int(text: str) -> int:
    return _number(int, 1, text)


def length_int(text: str) -> int:
    """A sequence length: at least 2 tokens (one prediction)."""
    return _number(int, 2, text)


def nonnegative_int(text: str) -> int:
    return _number(int, 0, text)


def positive_float(text: str) -> float:
    value = _number(float, 0.0, text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value
