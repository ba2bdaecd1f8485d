"""Each variant against the base on the same cases, with the paired statistics of Sieve's comparison.

Cases are paired as `sieve compare` pairs them (`pairing.pair`: by id, then by content, at the common K);
each gated measure (recall, hit rate, MRR, nDCG) gets the two-sided paired sign-flip test (exact up to 20
non-zero differences, Monte Carlo beyond, as `stats.sign_flip_p_value`) and a bootstrap 95 % interval of the
mean difference; the raw p-values of every variant × measure form one family, adjusted by Holm
(`stats.holm`). Fixed / broken cases (the hit, a relevant document in the top K, went 0 -> 1 / 1 -> 0) and
unverified drops (broken or worse cases whose drop may come from documents nobody judged) are those
`sieve compare` names (`compare_reports`). Each measure also gets the detectable difference of its paired
differences (`verdict.detectable_difference`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import fmean
from typing import Any

from app.evaluation.compare.comparison import compare_reports, scored_figures
from app.evaluation.compare.pairing import pair
from app.evaluation.report.model import Report
from app.evaluation.scoring import measures, stats
from app.experiment.verdict import detectable_difference


@dataclass
class MeasureTest:
    base: float
    variant: float
    delta: float
    sd: float | None
    ci95: tuple[float, float] | None
    p_value: float
    exact: bool
    detectable: float | None
    p_holm: float | None = None
    significant: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "variant": self.variant,
            "delta": self.delta,
            "sd": self.sd,
            "ci95": list(self.ci95) if self.ci95 else None,
            "pValue": self.p_value,
            "pHolm": self.p_holm,
            "exact": self.exact,
            "significant": self.significant,
            "detectableDifference": self.detectable,
        }


@dataclass
class VariantComparison:
    paired_cases: int
    tests: dict[str, MeasureTest] = field(default_factory=dict)
    fixed: list[str] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "pairedCases": self.paired_cases,
            "measures": {name: t.to_json() for name, t in self.tests.items()},
            "fixed": self.fixed,
            "broken": self.broken,
            "unverified": self.unverified,
        }


def compare_with_base(base: Report, variant: Report, seed: int) -> VariantComparison:
    """`variant` against `base` over their paired scored cases; p-values raw (Holm comes over the family)."""
    pairing = pair(base, variant)
    before, after = scored_figures(pairing.baseline, pairing.current)
    ids = sorted(before)
    out = VariantComparison(paired_cases=len(ids))
    if not ids:
        return out
    for name in measures.GATED:
        b = [float(before[i][name]) for i in ids]
        a = [float(after[i][name]) for i in ids]
        diffs = [y - x for x, y in zip(b, a, strict=True)]
        nonzero = sum(1 for d in diffs if abs(d) > 1e-12)
        out.tests[name] = MeasureTest(
            base=fmean(b),
            variant=fmean(a),
            delta=fmean(diffs),
            sd=_sd(diffs),
            ci95=stats.bootstrap_ci(diffs, seed=seed),
            p_value=stats.sign_flip_p_value(diffs, seed),
            exact=nonzero <= stats.EXACT_MAX_NONZERO,
            detectable=detectable_difference(diffs),
        )
    cases = compare_reports(base, variant, "base", seed=seed).cases
    out.fixed, out.broken, out.unverified = cases.fixed, cases.broken, cases.unverified
    return out


def _sd(diffs: list[float]) -> float | None:
    from statistics import stdev

    return stdev(diffs) if len(diffs) >= 2 else None


def holm_over_family(comparisons: dict[str, VariantComparison], alpha: float) -> None:
    """Adjust every variant × measure raw p-value together by Holm, in place; significant: pHolm < alpha."""
    tests = [t for c in comparisons.values() for t in c.tests.values()]
    adjusted = stats.holm([t.p_value for t in tests])
    for test, p in zip(tests, adjusted, strict=True):
        test.p_holm = p
        test.significant = p is not None and p < alpha
