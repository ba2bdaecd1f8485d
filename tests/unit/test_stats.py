"""Paired statistics: expected values written as the definitions' arithmetic."""

from __future__ import annotations

import random
from statistics import fmean

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.evaluation.scoring.stats import (
    bootstrap_ci,
    changed_by,
    fixed_and_broken,
    holm,
    sign_flip_p_value,
)


def test_exact_sign_flip_on_five_unit_differences() -> None:
    # d = [1, 1, 1, 1, -1]: T = |3/5|. A sign pattern gives a sum of five ±1, i.e. ±5, ±3 or ±1; it is at
    # least as extreme when |sum| >= 3: all five the same sign (2 patterns) or exactly one differs (2·5).
    assert sign_flip_p_value([1, 1, 1, 1, -1]) == (2 * (1 + 5)) / 2**5


def test_exact_sign_flip_counts_ties_within_the_tolerance() -> None:
    # d = [0.4, 0.2, 0.2, 0.0, -0.2]: T = 0.6 / 5. With +0.4 the three 0.2s sum to 0.6, 0.2, -0.2 or -0.6
    # (1, 3, 3, 1 patterns), so S = 1.0, 0.6, 0.2, -0.2: |S| >= 0.6 in 1 + 3 patterns; with -0.4 the
    # mirror image, 4 more; the zero's sign doubles everything: (4 + 4)·2 of 2^5. Some of those sums are
    # 0.6000000000000001 or 0.5999999999999999 in floating point: the 1e-12 tolerance counts them all.
    assert sign_flip_p_value([0.4, 0.2, 0.2, 0.0, -0.2]) == (4 + 4) * 2 / 2**5


def test_sign_flip_of_no_difference_is_one() -> None:
    assert sign_flip_p_value([0.0] * 5) == 1.0
    assert sign_flip_p_value([0.0] * 40) == 1.0
    assert sign_flip_p_value([]) == 1.0


def test_sampled_sign_flip_where_no_random_pattern_is_as_extreme() -> None:
    # n = 17 > 16: sampled. Only the all-plus and all-minus patterns reach |mean| = 1, 2 of 2^17; with
    # seed 42 none of the 10,000 draws is one of them, so count = 0 and p = (1 + 0) / (10,000 + 1).
    diffs = [1.0] * 17
    rng = random.Random(42)
    draws = [rng.getrandbits(17) for _ in range(10_000)]
    assert 0 not in draws and 2**17 - 1 not in draws
    assert sign_flip_p_value(diffs, seed=42) == (1 + 0) / (10_000 + 1)


def test_sampled_sign_flip_where_every_pattern_is_as_extreme() -> None:
    # d = [1, -1] * 9, n = 18: T = 0 and every pattern has |mean| >= 0: count = B, p = (1 + B)/(B + 1).
    assert sign_flip_p_value([1.0, -1.0] * 9, patterns=500) == (1 + 500) / (500 + 1)


def test_sampled_sign_flip_is_the_share_of_the_seeded_patterns() -> None:
    diffs = [0.5, -0.1, 0.2, 0.0, 0.3, 0.1, -0.2, 0.4, 0.1, 0.0, 0.2, 0.1, -0.3, 0.2, 0.1, 0.0, 0.3, 0.2]
    n, big_b, t = len(diffs), 2_000, abs(sum(diffs) / len(diffs))
    rng = random.Random(7)
    count = 0
    for _ in range(big_b):
        bits = rng.getrandbits(n)
        s = sum(-d if (bits >> i) & 1 else d for i, d in enumerate(diffs))
        count += abs(s / n) >= t - 1e-12
    assert sign_flip_p_value(diffs, seed=7, patterns=big_b) == (1 + count) / (big_b + 1)


def test_exact_and_sampled_branches_meet_at_sixteen() -> None:
    diffs = [1.0] * 16  # exact: 2 patterns of 2^16
    assert sign_flip_p_value(diffs) == 2 / 2**16


@given(st.lists(st.floats(-1, 1, allow_nan=False), min_size=1, max_size=8))
def test_sign_flip_p_is_a_probability_and_symmetric(diffs: list[float]) -> None:
    p = sign_flip_p_value(diffs)
    assert 0 < p <= 1
    assert p == sign_flip_p_value([-d for d in diffs])


def test_holm_adjusts_in_the_input_order() -> None:
    # sorted 0.01, 0.03, 0.04: 3·0.01; max(3·0.01, 2·0.03); max(2·0.03, 1·0.04)
    adjusted = holm([0.01, 0.04, 0.03])
    assert adjusted == pytest.approx([3 * 0.01, max(3 * 0.01, 2 * 0.03), max(3 * 0.01, 2 * 0.03)])


def test_holm_caps_at_one_and_skips_missing_values() -> None:
    # m = 2 given values (the None stays None and does not count): sorted 0.02, 0.6 -> 2·0.02, max(., 1·0.6)
    first, missing, last = holm([0.6, None, 0.02])
    assert (first, missing) == (max(2 * 0.02, 1 * 0.6), None)
    assert last == pytest.approx(2 * 0.02)
    # 2·0.6 = 1.2 caps at 1, and the larger p then cannot go below it
    assert holm([0.7, None, 0.6]) == [1.0, None, 1.0]
    assert holm([]) == []


def test_bootstrap_of_a_constant_difference_is_that_constant() -> None:
    assert bootstrap_ci([0.25] * 7) == (0.25, 0.25)
    assert bootstrap_ci([]) is None


def test_bootstrap_is_the_seeded_percentile_interval() -> None:
    diffs = [0.0, 0.0, 1.0, 0.5, -0.5]
    rng = np.random.default_rng(42)
    values = np.asarray(diffs)
    means = sorted(float(np.mean(values[rng.integers(0, 5, size=5)])) for _ in range(10_000))
    # nearest rank: ceil(0.025·10,000) = 250th and ceil(0.975·10,000) = 9,750th of the sorted means
    assert bootstrap_ci(diffs, seed=42) == (means[250 - 1], means[9_750 - 1])
    lo, hi = bootstrap_ci(diffs, seed=42)  # type: ignore[misc]
    assert lo <= fmean(diffs) <= hi


def test_fixed_and_broken_are_hit_changes_over_paired_cases() -> None:
    base = {"a": 0.0, "b": 1.0, "c": 1.0, "d": 0.0, "only-base": 0.0}
    cur = {"a": 1.0, "b": 0.0, "c": 1.0, "d": 0.0, "only-cur": 1.0}
    assert fixed_and_broken(base, cur) == (["a"], ["b"])


def test_improved_and_worsened_largest_change_first() -> None:
    base = {"a": 0.5, "b": 1.0, "c": 0.2, "d": 0.7, "e": 0.3}
    cur = {"a": 0.6, "b": 0.5, "c": 0.9, "d": 0.7, "e": 0.1}
    improved, worsened = changed_by(base, cur)
    assert [i for i, _ in improved] == ["c", "a"]
    assert improved[0][1] == pytest.approx(0.9 - 0.2)
    assert [i for i, _ in worsened] == ["b", "e"]
    assert worsened[0][1] == pytest.approx(0.5 - 1.0)


@given(st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=8))
def test_holm_never_lowers_a_p_value_and_keeps_the_order(p_values: list[float]) -> None:
    adjusted = holm(p_values)
    assert all(a is not None and p <= a <= 1.0 for p, a in zip(p_values, adjusted, strict=True))
    ranked = sorted(range(len(p_values)), key=lambda i: p_values[i])
    assert all(adjusted[i] <= adjusted[j] for i, j in zip(ranked, ranked[1:], strict=False))  # type: ignore[operator]


@given(st.lists(st.floats(-1, 1, allow_nan=False), min_size=1, max_size=12))
def test_bootstrap_interval_is_ordered_and_within_the_data(diffs: list[float]) -> None:
    lo, hi = bootstrap_ci(diffs, resamples=200)  # type: ignore[misc]
    assert min(diffs) - 1e-12 <= lo <= hi <= max(diffs) + 1e-12
