"""Paired statistics for comparing two evaluation runs, as pure functions with their definitions.

Every function takes the per-case differences d_i = current_i - baseline_i of one metric over the paired
cases (the same case in both runs), in a fixed order (sorted case ids), so the results are reproducible
for a given seed. The measures the gate checks are tested together (`max_t`: exact sign-flip enumeration up
to 20 non-zero pairs, the Westfall-Young step-down max-T adjustment for their dependence); docs/baselines.md
says why.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

# the exact test enumerates every sign pattern of the non-zero pairs up to this many of them (2^20 patterns)
EXACT_MAX_NONZERO = 20
# Monte Carlo sign patterns drawn beyond that; up to MAX_DRAWS when a p-value lies within ERROR_MARGIN
# standard errors of alpha after the first DRAWS
DRAWS = 20_000
MAX_DRAWS = 200_000
ERROR_MARGIN = 3.0
BOOTSTRAP_RESAMPLES = 10_000
# a pattern's statistic counts as "at least as extreme" within this much of the observed one (rounding)
TOLERANCE = 1e-9
# the name of the multiple-testing adjustment `max_t` makes, as the report writes it
MAX_T = "Westfall-Young step-down max-T"


@dataclass(frozen=True)
class FamilyResult:
    """One measure's test within a family (`max_t`): its raw sign-flip p-value, its adjusted p-value, whether
    both were enumerated exactly, how many sign patterns they count, and, for Monte Carlo, the standard error
    of the adjusted p-value, sqrt(p(1 - p) / draws) (None when exact)."""

    p_value: float
    p_adjusted: float
    exact: bool
    patterns: int
    error: float | None = None

    def near(self, alpha: float) -> bool:
        """Whether the adjusted p-value lies within `ERROR_MARGIN` Monte Carlo standard errors of `alpha`,
        so another seed could decide the other way (never for an exact p-value)."""
        return self.error is not None and abs(self.p_adjusted - alpha) <= ERROR_MARGIN * self.error


def max_t(
    diffs: Mapping[str, Sequence[float]], seed: int = 42, alpha: float = 0.05
) -> dict[str, FamilyResult]:
    """Paired sign-flip tests of several measures over the same cases, with the Westfall-Young step-down
    max-T adjustment for testing them together (Westfall & Young 1993, algorithm 2.8; Boytsov, Belova and
    Westfall, SIGIR 2013, on IR runs).

    `diffs` maps each measure to its per-case differences d_im = current - baseline, aligned by case (the
    same n cases, in the same order, for every measure). Under H0 each case's differences are as likely to
    have the opposite sign, all measures of a case flipping together, so the correlation between measures
    (MRR, nDCG and top-1 move together case by case) is kept and not paid for as if they were unrelated.

    * Statistic: t_m = |Σ_i s_i·d_im| / sqrt(Σ_i d_im²) for a sign pattern s ∈ {-1, +1}^n (the observed
      one: s = +1). The denominator does not change under flips, so each measure's raw p is the sign-flip
      test of its mean; it puts the measures on one scale for the max. A measure with every d_im = 0 has
      t = 0 and p = 1.
    * Raw p_m = #{s : t_m(s) >= t_m - 1e-9} / #patterns.
    * Adjusted (step-down): order the measures by observed t, largest first, r_1..r_M; for each pattern
      u_j(s) = max_{l >= j} t_{r_l}(s); p~_j = #{s : u_j(s) >= t_{r_j} - 1e-9} / #patterns, then
      p~_j = max(p~_{j-1}, p~_j) (monotone). p~ >= raw p; with one measure p~ = p.
    * Exact when at most `EXACT_MAX_NONZERO` (20) cases have a non-zero difference: all 2^n' patterns of
      those n' cases (a case whose differences are all 0 contributes nothing in any pattern). Otherwise
      Monte Carlo: `DRAWS` patterns from `numpy.random.default_rng(seed)`, p = (1 + count) / (draws + 1)
      (the observed pattern counts once); while some adjusted p lies within `ERROR_MARGIN` standard errors
      of `alpha`, more are drawn, up to `MAX_DRAWS`.
    * No cases: every p is 1.

    Example: 7 cases each losing 0.5 of MRR and 0.37 of nDCG, 30 unchanged: n' = 7, 2^7 patterns, only
    all-same-sign ones reach the observed t, so p = p~ = 2/2^7 = 0.015625 for both measures.
    """
    names = list(diffs)
    if not names:
        return {}
    matrix = np.asarray([list(diffs[name]) for name in names], dtype=float).T.reshape(-1, len(names))
    matrix = matrix[np.any(matrix != 0, axis=1)]
    if matrix.shape[0] == 0:
        return {name: FamilyResult(1.0, 1.0, True, 1) for name in names}
    family = _Family(matrix)
    matrix = family.matrix
    if matrix.shape[0] <= EXACT_MAX_NONZERO:
        counts = family.count(_all_patterns(matrix))
        total = 2 ** matrix.shape[0]
        return _results(names, family, counts, total, exact=True)
    rng = np.random.default_rng(seed)
    counts = family.count(_drawn_patterns(matrix, rng, DRAWS))
    draws = DRAWS
    while draws < MAX_DRAWS:
        results = _results(names, family, counts, draws, exact=False)
        if not any(r.near(alpha) for r in results.values()):
            return results
        more = min(draws, MAX_DRAWS - draws)
        counts = counts + family.count(_drawn_patterns(matrix, rng, more))
        draws += more
    return _results(names, family, counts, draws, exact=False)


class _Family:
    """The observed statistics of a family's non-zero cases (rows) × measures (columns), and the counts of
    patterns at least as extreme, raw per measure and step-down by the order of the observed statistics.
    The columns are kept in that order (largest observed statistic first), so a block of pattern sums is
    read in place."""

    def __init__(self, matrix: np.ndarray) -> None:
        scale = np.sqrt(np.sum(matrix**2, axis=0))
        inverse = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale > 0)
        observed = np.abs(matrix.sum(axis=0)) * inverse
        self.order = np.argsort(-observed, kind="stable")
        self.matrix = matrix[:, self.order]
        self.inverse = inverse[self.order]
        self.threshold = observed[self.order] - TOLERANCE

    def count(self, sums: Iterator[np.ndarray]) -> np.ndarray:
        """(raw counts, step-down counts), a 2 × M array in the family's order, over blocks of pattern sums
        Σ s_i·d_im (patterns × measures, the columns in the family's order)."""
        m = self.matrix.shape[1]
        counts = np.zeros((2, m), dtype=np.int64)
        for block in sums:
            t = np.abs(block, out=block)
            t *= self.inverse
            running = t[:, m - 1].copy()
            for j in range(m - 1, -1, -1):
                column = t[:, j]
                counts[0, j] += np.count_nonzero(column >= self.threshold[j])
                np.maximum(running, column, out=running)
                counts[1, j] += np.count_nonzero(running >= self.threshold[j])
        return counts


def _results(
    names: list[str], family: _Family, counts: np.ndarray, patterns: int, exact: bool
) -> dict[str, FamilyResult]:
    """Counts as p-values: exact shares, or Monte Carlo (1 + count) / (draws + 1); the step-down p-values
    made monotone, then put back in the measures' order."""

    def share(count: int) -> float:
        return count / patterns if exact else (1 + count) / (patterns + 1)

    adjusted = np.maximum.accumulate([share(int(c)) for c in counts[1]])
    out: dict[str, FamilyResult] = {}
    for position, index in enumerate(family.order):
        p_adj = min(1.0, float(adjusted[position]))
        error = None if exact else math.sqrt(p_adj * (1 - p_adj) / patterns)
        raw = share(int(counts[0][position]))
        out[names[index]] = FamilyResult(raw, p_adj, exact, patterns, error)
    return {name: out[name] for name in names}


def _signs(bits: int) -> np.ndarray:
    """All 2^bits sign patterns as rows of ±1 (bit i of the row number set = case i flipped)."""
    rows = (np.arange(2**bits)[:, None] >> np.arange(bits)) & 1
    return 1.0 - 2.0 * rows


def _all_patterns(matrix: np.ndarray, block_rows: int = 256) -> Iterator[np.ndarray]:
    """Σ s_i·d_im for every sign pattern s of the rows, in blocks: the rows split in two halves whose
    pattern sums are added pairwise (2^n1 + 2^n2 products instead of 2^n)."""
    n = matrix.shape[0]
    half = n // 2
    low = _signs(half) @ matrix[:half]
    high = _signs(n - half) @ matrix[half:]
    block_rows = max(1, block_rows * 1024 // high.shape[0])
    for start in range(0, low.shape[0], block_rows):
        part = low[start : start + block_rows]
        yield (part[:, None, :] + high[None, :, :]).reshape(-1, matrix.shape[1])


def _drawn_patterns(
    matrix: np.ndarray, rng: np.random.Generator, draws: int, block_rows: int = 2_000
) -> Iterator[np.ndarray]:
    """Σ s_i·d_im for `draws` sign patterns drawn from `rng` (each sign ±1, probability 1/2), in blocks."""
    n = matrix.shape[0]
    for start in range(0, draws, block_rows):
        rows = min(block_rows, draws - start)
        signs = 1.0 - 2.0 * rng.integers(0, 2, size=(rows, n), dtype=np.int8)
        yield signs @ matrix


def sign_flip_p_value(diffs: Sequence[float], seed: int = 42) -> float:
    """Two-sided paired sign-flip (randomization) test of the mean difference of one measure: the raw p of
    `max_t` with one measure. p = #{s : |Σ s_i·d_i| >= |Σ d_i| - tolerance} / #patterns, exact over all
    2^n' sign patterns of the n' non-zero differences when n' <= 20, else Monte Carlo
    ((1 + count) / (draws + 1)); 1 when there are no cases or every d_i = 0. Example: [1, 1, 1, 1, -1]
    gives 2·(1 + 5) / 2^5 (the patterns whose sum is ±5 or ±3)."""
    return max_t({"d": diffs}, seed)["d"].p_value


def bootstrap_ci(
    diffs: Sequence[float], seed: int = 42, resamples: int = BOOTSTRAP_RESAMPLES, level: float = 0.95
) -> tuple[float, float] | None:
    """Percentile bootstrap confidence interval of the mean difference.

    With `rng = numpy.random.default_rng(seed)`, `resamples` (10,000) times: draw n case indices with
    replacement, `rng.integers(0, n, size=n)`, and take the mean of those d (`numpy.mean`); sort the means
    m_(1) <= ... <= m_(B). With a = (1 - level) / 2 the interval is [m_(r_lo), m_(r_hi)],
    r_lo = max(1, ceil(a·B)), r_hi = ceil((1 - a)·B) (nearest rank, as `metrics.percentile`): for
    B = 10,000 and 95 %, the 250th and the 9,750th mean. None when there are no cases. The draws are made
    a block of resamples at a time (the same stream of indices).
    """
    n = len(diffs)
    if n == 0:
        return None
    rng = np.random.default_rng(seed)
    values = np.asarray(diffs, dtype=float)
    block = max(1, 1_000_000 // n)
    parts = []
    for start in range(0, resamples, block):
        rows = min(block, resamples - start)
        parts.append(values[rng.integers(0, n, size=(rows, n))].mean(axis=1))
    means = np.sort(np.concatenate(parts))
    alpha = (1 - level) / 2
    lo = max(1, math.ceil(round(alpha * resamples, 9)))
    hi = max(1, math.ceil(round((1 - alpha) * resamples, 9)))
    return float(means[lo - 1]), float(means[hi - 1])


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm step-down adjusted p-values, in the input order (None entries are skipped and stay None).

    With the m given p-values sorted ascending p_(1) <= ... <= p_(m):
    adj_(j) = max_{i <= j} min(1, (m - i + 1) · p_(i)). Example: [0.01, 0.04, 0.03] ->
    sorted 0.01, 0.03, 0.04 -> 3·0.01 = 0.03, max(0.03, 2·0.03) = 0.06, max(0.06, 1·0.04) = 0.06 ->
    [0.03, 0.06, 0.06]. Ties keep their input order.
    """
    indexed = [(p, i) for i, p in enumerate(p_values) if p is not None]
    m = len(indexed)
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(sorted(indexed, key=lambda pair: (pair[0], pair[1])), start=1):
        running = max(running, min(1.0, (m - rank + 1) * p))
        out[i] = running
    return out


def fixed_and_broken(
    baseline_hits: Mapping[str, float], current_hits: Mapping[str, float]
) -> tuple[list[str], list[str]]:
    """Cases whose hit (any relevant document in the top K, 1 or 0) changed, over the ids on both sides:
    fixed = 0 -> 1, broken = 1 -> 0; each sorted by id."""
    paired = sorted(set(baseline_hits) & set(current_hits))
    fixed = [i for i in paired if baseline_hits[i] < 0.5 <= current_hits[i]]
    broken = [i for i in paired if current_hits[i] < 0.5 <= baseline_hits[i]]
    return fixed, broken


def changed_by(
    baseline: Mapping[str, float], current: Mapping[str, float]
) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """(improved, worsened): paired ids with current - baseline > 0 (resp. < 0), largest change first
    (ties by id)."""
    paired = sorted(set(baseline) & set(current))
    deltas = [(i, current[i] - baseline[i]) for i in paired]
    improved = sorted(((i, d) for i, d in deltas if d > 1e-12), key=lambda x: (-x[1], x[0]))
    worsened = sorted(((i, d) for i, d in deltas if d < -1e-12), key=lambda x: (x[1], x[0]))
    return improved, worsened
