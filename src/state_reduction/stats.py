"""Means with confidence intervals: over seeds (Student t) and over examples (percentile bootstrap).

Every tiny-profile number that a claim or a table rests on is a mean over repeated draws (pretraining,
calibration or RFT seeds; documents or examples). `mean_ci` is the t-interval of such a mean, `diff_ci` the
interval of a difference of two means (paired on a shared seed, or Welch's for independent draws) and
`bootstrap_ci` resamples examples. With fewer than two samples there is no interval: `Interval.low` and
`.high` are None and `str()` says so, so nothing prints a spurious "+- 0".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as _scipy_stats

LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    """A mean with its two-sided confidence interval (None without one: fewer than two samples)."""

    mean: float
    low: float | None
    high: float | None
    n: int
    level: float = LEVEL
    method: str = "t"

    @property
    def half_width(self) -> float | None:
        return None if self.low is None else (self.high - self.low) / 2

    def format(self, digits: int = 3) -> str:
        if self.low is None:
            return f"{self.mean:.{digits}g} (n={self.n}, no CI)"
        return f"{self.mean:.{digits}g} [{self.low:.{digits}g}, {self.high:.{digits}g}] (n={self.n})"

    __str__ = format

    def as_dict(self) -> dict:
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": self.n, "level": self.level,
                "method": self.method}


def _values(values: Sequence[float], what: str) -> np.ndarray:
    arr = np.asarray(list(values), dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{what}: need a non-empty list of numbers, got {list(values)!r}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{what}: non-finite values {arr.tolist()}")
    return arr


def t_quantile(level: float, df: float) -> float:
    """The two-sided Student-t critical value: P(|T_df| <= q) = level."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must be in (0, 1), got {level!r}")
    return float(_scipy_stats.t.ppf(0.5 + level / 2, df))


def mean_ci(values: Sequence[float], level: float = LEVEL) -> Interval:
    """Mean and t-interval over independent draws (e.g. one value per seed)."""
    x = _values(values, "mean_ci")
    n = x.size
    mean = float(x.mean())
    if n < 2:
        return Interval(mean, None, None, n, level)
    half = t_quantile(level, n - 1) * float(x.std(ddof=1)) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, level)


def diff_ci(a: Sequence[float], b: Sequence[float] | float, *, paired: bool = False,
            level: float = LEVEL) -> Interval:
    """Interval of mean(a) - mean(b). `b` a number: one-sample interval of a - b. `paired`: a[i] and b[i] share a
    draw (the same seed), the interval of the mean difference. Otherwise Welch's interval (unequal variances)."""
    x = _values(a, "diff_ci lhs")
    if isinstance(b, (int, float)):
        return mean_ci(x - float(b), level)
    y = _values(b, "diff_ci rhs")
    if paired:
        if x.size != y.size:
            raise ValueError(f"diff_ci: paired samples need equal lengths, got {x.size} and {y.size}")
        return mean_ci(x - y, level)
    mean = float(x.mean() - y.mean())
    n = min(x.size, y.size)
    if n < 2:
        return Interval(mean, None, None, n, level, "welch")
    va, vb = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    se = math.sqrt(va + vb)
    if se == 0.0:
        return Interval(mean, mean, mean, n, level, "welch")
    df = (va + vb) ** 2 / (va ** 2 / (x.size - 1) + vb ** 2 / (y.size - 1))
    half = t_quantile(level, df) * se
    return Interval(mean, mean - half, mean + half, n, level, "welch")


def bootstrap_ci(values: Sequence[float], level: float = LEVEL, n_boot: int = 2000, seed: int = 0) -> Interval:
    """Mean and percentile-bootstrap interval over examples (e.g. per-document log-likelihoods)."""
    x = _values(values, "bootstrap_ci")
    if n_boot < 100:
        raise ValueError(f"bootstrap_ci: n_boot must be >= 100, got {n_boot}")
    if x.size < 2:
        return Interval(float(x.mean()), None, None, x.size, level, "bootstrap")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return Interval(float(x.mean()), float(low), float(high), x.size, level, "bootstrap")
