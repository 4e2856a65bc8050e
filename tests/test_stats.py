"""Confidence intervals: against closed forms and textbook values, and the no-CI case."""

import math

import numpy as np
import pytest

from state_reduction.stats import bootstrap_ci, diff_ci, mean_ci, t_quantile


def test_t_quantile_textbook_values():
    assert t_quantile(0.95, 2) == pytest.approx(4.302653, abs=1e-6)
    assert t_quantile(0.95, 10) == pytest.approx(2.228139, abs=1e-6)
    assert t_quantile(0.95, 1e9) == pytest.approx(1.959964, abs=1e-6)


def test_mean_ci_closed_form():
    ci = mean_ci([1.0, 2.0, 3.0])
    half = 4.302653 * 1.0 / math.sqrt(3)  # sd of 1, 2, 3 is 1
    assert (ci.mean, ci.low, ci.high, ci.n) == pytest.approx((2.0, 2.0 - half, 2.0 + half, 3), abs=1e-6)


def test_one_sample_has_no_interval_and_says_so():
    ci = mean_ci([5.0])
    assert ci.low is None and ci.high is None and ci.half_width is None
    assert "no CI" in str(ci) and "±" not in str(ci)


def test_paired_difference_is_the_interval_of_differences():
    a, b = [10.0, 12.0, 11.0, 13.0], [9.0, 11.5, 10.0, 12.0]
    assert diff_ci(a, b, paired=True) == mean_ci(np.subtract(a, b))
    with pytest.raises(ValueError, match="equal lengths"):
        diff_ci(a, b[:3], paired=True)


def test_welch_interval_matches_the_formula():
    a, b = [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0]
    ci = diff_ci(a, b)
    va, vb = np.var(a, ddof=1) / 4, np.var(b, ddof=1) / 3
    df = (va + vb) ** 2 / (va ** 2 / 3 + vb ** 2 / 2)
    half = t_quantile(0.95, df) * math.sqrt(va + vb)
    assert ci.mean == pytest.approx(2.5 - 4.0)
    assert (ci.low, ci.high) == pytest.approx((-1.5 - half, -1.5 + half))


def test_difference_to_a_number():
    assert diff_ci([1.0, 2.0, 3.0], 2.0) == mean_ci([-1.0, 0.0, 1.0])


def test_intervals_cover_the_true_mean_at_about_the_nominal_rate():
    rng = np.random.default_rng(0)
    t_hits = boot_hits = 0
    trials = 400
    for i in range(trials):
        x = rng.normal(3.0, 2.0, size=8)
        ci = mean_ci(x)
        t_hits += ci.low <= 3.0 <= ci.high
        y = rng.normal(3.0, 2.0, size=60)
        b = bootstrap_ci(y, n_boot=400, seed=i)
        boot_hits += b.low <= 3.0 <= b.high
    assert 0.91 <= t_hits / trials <= 0.985  # binomial sd at 95% over 400 trials: 1.1 points
    assert 0.89 <= boot_hits / trials <= 0.985  # the percentile bootstrap undercovers slightly at n = 60


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="non-empty"):
        mean_ci([])
    with pytest.raises(ValueError, match="non-finite"):
        mean_ci([1.0, float("nan")])
    with pytest.raises(ValueError, match="confidence level"):
        mean_ci([1.0, 2.0], level=1.5)
