"""Paired statistics for comparing two evaluation runs, as pure functions with their definitions.

Every function takes the per-case differences d_i = current_i - baseline_i of one metric over the paired
cases (the same case id in both runs), in a fixed order (sorted case ids), so the results are reproducible
for a given seed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

import numpy as np

EXACT_MAX_N = 16
RANDOM_PATTERNS = 10_000
BOOTSTRAP_RESAMPLES = 10_000
TOLERANCE = 1e-12


def sign_flip_p_value(
    diffs: Sequence[float],
    seed: int = 42,
    patterns: int = RANDOM_PATTERNS,
    exact_max_n: int = EXACT_MAX_N,
) -> float:
    """Two-sided paired sign-flip (randomization) test of the mean difference.

    Under H0 (no difference) each d_i is as likely to be +|d_i| as -|d_i|. With n = len(diffs) and
    observed statistic T = |mean(d)|:

    * n <= exact_max_n (16): exact. p = #{s in {-1, +1}^n : |mean(s·d)| >= T - 1e-12} / 2^n, over all 2^n
      sign patterns (the identity pattern is one of them, so p >= 1/2^(n-1) for T > 0).
    * otherwise: `patterns` (10,000) sign patterns drawn from `random.Random(seed)`, one pattern per
      `rng.getrandbits(n)` (bit i set = d_i flipped), and p = (1 + count) / (patterns + 1), count = the
      patterns with |mean(s·d)| >= T - 1e-12 (the +1 counts the observed pattern, so p is never 0).
    * no cases, or every d_i = 0: p = 1.

    The 1e-12 tolerance makes patterns whose mean equals T up to rounding count as "at least as extreme".
    """
    n = len(diffs)
    if n == 0 or all(d == 0 for d in diffs):
        return 1.0
    d = np.asarray(diffs, dtype=float)
    observed = abs(math.fsum(diffs) / n)
    if n <= exact_max_n:
        bits: np.ndarray = (np.arange(2**n)[:, None] >> np.arange(n)) & 1
        count = int(np.count_nonzero(np.abs((1 - 2 * bits) @ d / n) >= observed - TOLERANCE))
        return count / 2**n
    rng = random.Random(seed)
    width = (n + 7) // 8
    count = 0
    for start in range(
        0, patterns, 1000
    ):  # in blocks, so a large n does not need patterns × n floats at once
        block = min(1000, patterns - start)
        raw = b"".join(rng.getrandbits(n).to_bytes(width, "little") for _ in range(block))
        bits = np.unpackbits(
            np.frombuffer(raw, dtype=np.uint8).reshape(block, width), axis=1, bitorder="little"
        )
        signs = 1 - 2 * bits[:, :n].astype(float)
        count += int(np.count_nonzero(np.abs(signs @ d / n) >= observed - TOLERANCE))
    return (1 + count) / (patterns + 1)


def bootstrap_ci(
    diffs: Sequence[float], seed: int = 42, resamples: int = BOOTSTRAP_RESAMPLES, level: float = 0.95
) -> tuple[float, float] | None:
    """Percentile bootstrap confidence interval of the mean difference.

    With `rng = numpy.random.default_rng(seed)`, `resamples` (10,000) times: draw n case indices with
    replacement, `rng.integers(0, n, size=n)`, and take the mean of those d (`numpy.mean`); sort the means
    m_(1) <= ... <= m_(B). With a = (1 - level) / 2 the interval is [m_(r_lo), m_(r_hi)],
    r_lo = max(1, ceil(a·B)), r_hi = ceil((1 - a)·B) (nearest rank, as `metrics.percentile`): for
    B = 10,000 and 95 %, the 250th and the 9,750th mean. None when there are no cases.
    """
    n = len(diffs)
    if n == 0:
        return None
    rng = np.random.default_rng(seed)
    values = np.asarray(diffs, dtype=float)
    means = sorted(float(np.mean(values[rng.integers(0, n, size=n)])) for _ in range(resamples))
    alpha = (1 - level) / 2
    lo = max(1, math.ceil(round(alpha * resamples, 9)))
    hi = max(1, math.ceil(round((1 - alpha) * resamples, 9)))
    return means[lo - 1], means[hi - 1]


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
    improved = sorted(((i, d) for i, d in deltas if d > TOLERANCE), key=lambda x: (-x[1], x[0]))
    worsened = sorted(((i, d) for i, d in deltas if d < -TOLERANCE), key=lambda x: (x[1], x[0]))
    return improved, worsened
