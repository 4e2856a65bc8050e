"""Deterministic partitions of documents into splits and sampler streams, by hash."""

from __future__ import annotations

import hashlib
from typing import Mapping

from state_reduction.errors import InputError


def stable_hash(*parts: str) -> int:
    """A 64-bit hash that, unlike `hash()`, is the same in every process and on every machine."""
    return int.from_bytes(hashlib.sha256("\0".join(parts).encode()).digest()[:8], "big")


def unit_interval(*parts: str) -> float:
    return stable_hash(*parts) / 2**64


def bucket(u: float, fractions: Mapping[str, float]) -> str:
    """The part whose cumulative-fraction interval holds u in [0, 1)."""
    weight, acc = sum(fractions.values()), 0.0
    for part, fraction in fractions.items():
        acc += fraction / weight
        if u < acc:
            return part
    return part


def partition_groups(
    sizes: Mapping[str, int], fractions: Mapping[str, float], salt: str
) -> dict[str, str]:
    """Assign every group to a part so that each part holds about its fraction of the total size.

    Groups are visited in sha256(salt, group) order and go to the part whose cumulative-fraction
    interval holds the group's midpoint. Every part must end up non-empty.
    """
    total = sum(sizes.values())
    if total <= 0:
        raise InputError(f"nothing to partition (salt {salt!r})")
    assignment: dict[str, str] = {}
    seen = 0
    for group in sorted(sizes, key=lambda g: (stable_hash(salt, g), g)):
        assignment[group] = bucket((seen + sizes[group] / 2) / total, fractions)
        seen += sizes[group]
    empty = [p for p in fractions if p not in assignment.values()]
    if empty:
        raise InputError(
            f"partition {salt!r} of {len(sizes)} groups leaves {empty} empty; "
            f"fractions {dict(fractions)}"
        )
    return assignment
