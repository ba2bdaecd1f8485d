"""Paired statistics: expected values written as the definitions' arithmetic."""

from __future__ import annotations

import math
import time
from statistics import fmean

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.evaluation.scoring.stats import (
    DRAWS,
    ERROR_MARGIN,
    FamilyResult,
    bootstrap_ci,
    changed_by,
    fixed_and_broken,
    holm,
    max_t,
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
    # 0.6000000000000001 or 0.5999999999999999 in floating point: the 1e-9 tolerance counts them all.
    assert sign_flip_p_value([0.4, 0.2, 0.2, 0.0, -0.2]) == (4 + 4) * 2 / 2**5


def test_sign_flip_of_no_difference_is_one() -> None:
    assert sign_flip_p_value([0.0] * 5) == 1.0
    assert sign_flip_p_value([0.0] * 40) == 1.0
    assert sign_flip_p_value([]) == 1.0


def test_zero_differences_do_not_count_towards_the_exact_limit() -> None:
    # 20 non-zero pairs among 60: exact over the 2^20 patterns of the non-zero pairs (the zeros' signs
    # change nothing), only all-plus and all-minus reach |sum| = 20.
    assert sign_flip_p_value([1.0] * 20 + [0.0] * 40) == 2 / 2**20


def test_sampled_sign_flip_is_the_share_of_the_seeded_patterns() -> None:
    # 21 non-zero pairs: Monte Carlo. The patterns are numpy's default_rng(seed).integers(0, 2, (B, n))
    # (1 = flipped), drawn in blocks of 2,000 rows; p = (1 + count) / (B + 1).
    diffs = [0.5, -0.1, 0.2, 0.3, 0.1, -0.2, 0.4, 0.1, 0.2, 0.1, -0.3, 0.2, 0.1, 0.3, 0.2, -0.4, 0.1]
    diffs += [0.2, -0.1, 0.3, 0.1]
    d = np.asarray(diffs)
    rng = np.random.default_rng(7)
    count = 0
    for _ in range(DRAWS // 2_000):
        signs = 1 - 2 * rng.integers(0, 2, size=(2_000, len(diffs)), dtype=np.int8).astype(float)
        count += int(np.count_nonzero(np.abs(signs @ d) >= abs(d.sum()) - 1e-9 * np.sqrt((d**2).sum())))
    assert sign_flip_p_value(diffs, seed=7) == (1 + count) / (DRAWS + 1)


def test_sampled_sign_flip_where_every_pattern_is_as_extreme() -> None:
    # d = [1, -1] * 11, 22 non-zero pairs: T = 0 and every pattern has |sum| >= 0: p = (1 + B) / (B + 1).
    assert sign_flip_p_value([1.0, -1.0] * 11) == 1.0


def test_seven_same_sign_drops_among_thirty_seven_give_two_in_two_to_the_seven() -> None:
    # The road 5: 7 of 37 paired cases lose rank 1 -> 2 (MRR -1/2, nDCG -(1 - 1/log2(3))), none
    # gains; recall and hit rate do not move. Exact over 2^7 patterns: only the two all-same-sign ones
    # reach the observed statistic, raw p = 2/2^7 for MRR and nDCG; they move together, so max-T adjusts
    # nothing: p~ = 2/2^7 < 0.05 (Holm over six measures made it 6·2/2^7 = 0.09).
    ndcg_drop = -(1 - 1 / math.log2(3))
    family = max_t(
        {
            "recall": [0.0] * 37,
            "hitRate": [0.0] * 37,
            "mrr": [-0.5] * 7 + [0.0] * 30,
            "ndcg": [ndcg_drop] * 7 + [0.0] * 30,
        },
        seed=0,
    )
    assert family["mrr"] == FamilyResult(2 / 2**7, 2 / 2**7, True, 2**7)
    assert family["ndcg"] == FamilyResult(2 / 2**7, 2 / 2**7, True, 2**7)
    assert family["recall"] == FamilyResult(1.0, 1.0, True, 2**7)


def test_max_t_step_down_by_hand() -> None:
    # Two measures over three cases: a = [1, 1, 1], b = [1, 0, 0]. Statistics t = |Σ s·d| / sqrt(Σ d²):
    # observed t_a = 3/√3 = √3, t_b = 1. The 8 patterns give t_a = √3 for s = ±(1, 1, 1) (2 patterns),
    # else 1/√3; t_b = 1 always. Raw: p_a = 2/8, p_b = 8/8. Step-down, a first (larger t): u_1 =
    # max(t_a, t_b) >= √3 in the 2 patterns: p~_a = 2/8; u_2 = t_b >= 1 always: p~_b = max(2/8, 8/8) = 1.
    family = max_t({"a": [1.0, 1.0, 1.0], "b": [1.0, 0.0, 0.0]})
    assert family["a"] == FamilyResult(2 / 8, 2 / 8, True, 8)
    assert family["b"] == FamilyResult(8 / 8, 8 / 8, True, 8)


def test_max_t_adjusts_unrelated_measures_like_a_union_bound() -> None:
    # a moves on cases 1-3, b on cases 4-6, each all-plus: raw p = 2/2^3 each. Over the 2^6 patterns of
    # the six non-zero cases, max(t_a, t_b) >= √3 when either half is all-same-sign: 2·8 + 8·2 - 2·2 = 28
    # patterns, p~ = 28/64 (Bonferroni: 2·16/64 = 32/64; independent, so a little less).
    family = max_t({"a": [1.0, 1.0, 1.0, 0.0, 0.0, 0.0], "b": [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]})
    assert family["a"].p_value == 16 / 64 == family["b"].p_value
    assert family["a"].p_adjusted == 28 / 64 == family["b"].p_adjusted


@pytest.mark.parametrize("seed", [0, 1, 42])
def test_monte_carlo_p_values_carry_their_error(seed: int) -> None:
    diffs = [(-1.0) ** i * 0.1 - 0.05 for i in range(40)]
    result = max_t({"ndcg": diffs, "mrr": [2 * d for d in diffs]}, seed=seed)["ndcg"]
    assert not result.exact and result.patterns >= DRAWS
    p = result.p_adjusted
    assert result.error == pytest.approx(math.sqrt(p * (1 - p) / result.patterns))


def test_monte_carlo_near_alpha_draws_more() -> None:
    # 42 drops of 1 and 25 gains of 1 among 67 pairs: the exact (binomial) p is 2·P(X >= 42), X ~ B(67,
    # 1/2) = 0.0498, so after the first draws p lies within 3 standard errors of alpha and more are drawn;
    # the seeds then agree within the error.
    diffs = [-1.0] * 42 + [1.0] * 25
    results = [max_t({"d": diffs}, seed=seed, alpha=0.05)["d"] for seed in (0, 1, 42)]
    result = results[-1]
    assert result.patterns > DRAWS
    assert max(r.p_value for r in results) - min(r.p_value for r in results) < 2 * ERROR_MARGIN * result.error
    assert result.near(0.05) == (abs(result.p_adjusted - 0.05) <= ERROR_MARGIN * (result.error or 0))


def test_exact_enumeration_of_twenty_pairs_and_four_measures_is_fast() -> None:
    rng = np.random.default_rng(0)
    family = {m: list(rng.normal(-0.1, 0.3, 20)) for m in ("recall", "hitRate", "mrr", "ndcg")}
    max_t(family)
    started = time.perf_counter()
    result = max_t(family)
    elapsed = time.perf_counter() - started
    assert all(r.exact and r.patterns == 2**20 for r in result.values())
    print(f"exact max-T, 20 pairs x 4 measures: {elapsed * 1000:.1f} ms")


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
