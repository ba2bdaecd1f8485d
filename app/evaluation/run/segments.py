"""Segments (per tag, knowledge tag, query language, origin and literalness band), paraphrase groups and
the generated-vs-manual comparison, over report case records.

Pure functions over the report's case records (`CaseRecord`), so a baseline read from a file segments the
same way.
"""

from __future__ import annotations

from collections import defaultdict
from statistics import fmean

from app.evaluation.golden.segments import ORIGINS, members
from app.evaluation.report.model import (
    CaseRecord,
    Comparison,
    GeneratedVsManual,
    Group,
    OriginFigures,
    Origins,
    Segment,
    SegmentComparison,
    SegmentDelta,
)
from app.evaluation.scoring import measures

SMALL_SEGMENT = 10


def segment_means(cases: list[CaseRecord]) -> dict[str, float | None]:
    """Per compared measure (`measures.COMPARED`), the mean of the per-case figures over the cases that have
    metrics (scored cases); None when none has."""
    scored = [c.scores.metrics for c in cases if c.scores.metrics]
    return {m: (fmean(float(s[m]) for s in scored) if scored else None) for m in measures.COMPARED}


def segments(cases: list[CaseRecord]) -> list[Segment]:
    """One segment per tag value, knowledge tag, risk (high, medium, low; a case without one is in none),
    golden-set part (core, incremental; only when the set has both), query language, origin (manual,
    generated, log; a case without one is manual), literalness band (low < 1/3 <= mid < 2/3 <= high,
    `golden.authoring.literalness.band`; a case without literalness is in none) and the principal a case
    ran as (`(unscoped)` for none; only when some case ran as one), sorted by kind in that order, then by
    name (origins and bands in the order just given). `cases` is the number of cases in it (scored or
    not); `small` when under 10. The deltas against a baseline come from the comparison
    (`with_deltas`)."""
    return [
        Segment(
            kind=kind,
            name=name,
            cases=len(group),
            small=len(group) < SMALL_SEGMENT,
            metrics=segment_means(group),
        )
        for (kind, name), group in members(cases).items()
    ]


def with_deltas(segs: list[Segment], comparison: Comparison | None) -> list[Segment]:
    """`segs` with each segment's paired difference against the baseline, read from the comparison's
    segment rows (`compare.comparison.segment_comparisons`: the same segments over the paired scored
    cases): per measure the mean difference and its uncorrected sign-flip p-value (exploratory). As they
    are without a comparison that paired anything; a segment no paired case is in gets 0 paired cases."""
    if comparison is None or not comparison.comparable:
        return segs
    rows: dict[tuple[str, str], list[SegmentComparison]] = defaultdict(list)
    for row in comparison.segments:
        rows[(row.kind, row.name)].append(row)
    out = []
    for sg in segs:
        mine = rows.get((sg.kind, sg.name), [])
        delta = SegmentDelta(
            paired_cases=mine[0].paired_cases if mine else 0,
            metrics={r.metric: {"delta": r.delta, "pValue": r.p_value} for r in mine},
        )
        out.append(sg.model_copy(update={"delta": delta}))
    return out


def groups(cases: list[CaseRecord]) -> list[Group]:
    """One record per golden `group` (paraphrases of one need), sorted by name: hitRate = mean hit over
    its scored cases; ndcgMin / ndcgMax over them; spread = ndcgMax - ndcgMin; sameTop1 = every case of
    the group returned the same document at rank 1 (false when one returned nothing)."""
    by_group: dict[str, list[CaseRecord]] = defaultdict(list)
    for c in cases:
        if c.case.group:
            by_group[c.case.group].append(c)
    out = []
    for name in sorted(by_group):
        members = by_group[name]
        scored = [c.scores.metrics for c in members if c.scores.metrics]
        ndcgs = [float(m["ndcg"]) for m in scored]
        tops = [c.outcome.ranked_documents[0].doc_id if c.outcome.ranked_documents else None for c in members]
        out.append(
            Group(
                name=name,
                cases=[c.case.id for c in members],
                hit_rate=fmean(float(m["hitRate"]) for m in scored) if scored else None,
                ndcg_min=min(ndcgs) if ndcgs else None,
                ndcg_max=max(ndcgs) if ndcgs else None,
                spread=(max(ndcgs) - min(ndcgs)) if ndcgs else None,
                same_top1=None not in tops and len(set(tops)) == 1,
            )
        )
    return out


def origin_comparison(cases: list[CaseRecord], metric: str = "ndcg") -> Origins:
    """How generated cases score against manual ones, the report's `origins`:

    * `byOrigin`: for each origin present (manual, generated, log; a case without one is manual), its
      `cases`, its `scored` cases (those with metrics) and the mean per-case `metric` over them (None when
      none is scored);
    * `generatedVsManual`: {metric, generated, manual, delta = generated - manual, generatedCases,
      manualCases} over the scored cases of each side, or None unless both have scored cases. The two sides
      are different queries: an unpaired difference of means, with no test of significance.
    """
    by_origin: dict[str, list[CaseRecord]] = defaultdict(list)
    for c in cases:
        by_origin[c.case.origin or "manual"].append(c)
    order = sorted(by_origin, key=lambda o: (ORIGINS.index(o) if o in ORIGINS else len(ORIGINS), o))
    scores = {
        origin: [float(c.scores.metrics[metric]) for c in by_origin[origin] if c.scores.metrics]
        for origin in order
    }
    figures = {
        origin: OriginFigures.model_validate(
            {
                "cases": len(by_origin[origin]),
                "scored": len(scored),
                metric: fmean(scored) if scored else None,
            }
        )
        for origin, scored in scores.items()
    }
    generated, manual = scores.get("generated"), scores.get("manual")
    versus = None
    if generated and manual:
        generated_mean, manual_mean = fmean(generated), fmean(manual)
        versus = GeneratedVsManual(
            metric=metric,
            generated=generated_mean,
            manual=manual_mean,
            delta=generated_mean - manual_mean,
            generated_cases=len(generated),
            manual_cases=len(manual),
        )
    return Origins(by_origin=figures, generated_vs_manual=versus)
