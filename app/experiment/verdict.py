"""The experiment's verdict as pure functions: the smallest difference the golden set can detect, whether the
base is at the set's ceiling, and which variants are on the Pareto front of quality, p95 and context size.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist, stdev

ALPHA = 0.05
POWER = 0.8


def detectable_difference(diffs: Sequence[float], alpha: float = ALPHA, power: float = POWER) -> float | None:
    """The smallest mean paired difference a two-sided paired test at level `alpha` detects with probability
    `power`, from the observed per-case differences d_1..d_n (normal approximation):

        d = (z_{1-α/2} + z_{power}) · sd / sqrt(n),   sd = the sample standard deviation of the d_i (n - 1)

    For α = 0.05 and power 0.8, z_{0.975} + z_{0.8} = 1.959964 + 0.841621 = 2.801585. None with fewer than
    two differences (no spread to estimate)."""
    n = len(diffs)
    if n < 2:
        return None
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)
    return z * stdev(diffs) / math.sqrt(n)


@dataclass(frozen=True)
class Ceiling:
    """How many of the base's scored cases are at 1.0 on the measure, and whether that is the ceiling."""

    at_one: int
    cases: int
    share: float

    def warning(self, measure: str, threshold: float) -> str | None:
        if self.cases == 0 or self.share < threshold:
            return None
        return (
            f"the base scores {measure} 1.0 on {self.at_one} of {self.cases} scored cases "
            f"({self.share:.0%}): the golden set is at its ceiling, a better variant can only show on the "
            f"other {self.cases - self.at_one}; add harder cases to tell variants apart"
        )


def ceiling(values: Sequence[float]) -> Ceiling:
    """The base's per-case figures of one measure: how many are 1.0 (within 1e-9)."""
    at_one = sum(1 for v in values if v >= 1.0 - 1e-9)
    return Ceiling(at_one, len(values), at_one / len(values) if values else 0.0)


def pareto_front(points: Mapping[str, tuple[float | None, float | None, float | None]]) -> set[str]:
    """The names of the points no other point dominates: (quality, p95 ms, context characters), quality
    higher-is-better, the two costs lower-is-better. A point dominates another when it is at least as good on
    all three and strictly better on one; a missing figure counts as the worst."""
    scored = {name: _as_costs(point) for name, point in points.items()}
    return {name for name, p in scored.items() if not any(_dominates(q, p) for q in scored.values())}


def _as_costs(point: tuple[float | None, float | None, float | None]) -> tuple[float, float, float]:
    quality, p95, context = point
    worst = math.inf
    return (
        -quality if quality is not None else worst,
        p95 if p95 is not None else worst,
        context if context is not None else worst,
    )


def _dominates(a: tuple[float, float, float], b: tuple[float, float, float]) -> bool:
    return all(x <= y for x, y in zip(a, b, strict=True)) and any(x < y for x, y in zip(a, b, strict=True))
