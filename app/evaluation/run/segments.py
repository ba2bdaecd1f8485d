"""Segments (per tag, knowledge tag, query language, origin and literalness band), paraphrase groups and
the generated-vs-manual comparison, over report case records.

Pure functions over the report's case records (`CaseRecord`), so a baseline read from a file segments the
same way.
"""

from __future__ import annotations

from collections import defaultdict
from statistics import fmean

from app.evaluation.golden.authoring.literalness import band
from app.evaluation.golden.language import query_language
from app.evaluation.report.model import (
    CaseRecord,
    GeneratedVsManual,
    Group,
    OriginFigures,
    Origins,
    Segment,
    SegmentDelta,
)
from app.evaluation.scoring import measures, stats

SMALL_SEGMENT = 10
SEGMENT_KINDS = ("tag", "knowledgeTag", "risk", "set", "language", "origin", "literalness")
ORIGINS = ("manual", "generated", "log")
# segment names in reading order where alphabetical order would not do
_NAME_ORDER = {
    "origin": ORIGINS,
    "literalness": ("low", "mid", "high"),
    "risk": ("high", "medium", "low"),
    "set": ("core", "incremental"),
}


def _members(cases: list[CaseRecord]) -> dict[tuple[str, str], list[CaseRecord]]:
    out: dict[tuple[str, str], list[CaseRecord]] = defaultdict(list)
    parts = {c.case.case_set or "core" for c in cases}
    for c in cases:
        if c.case.risk:
            out[("risk", c.case.risk)].append(c)
        if len(parts) > 1:  # a set of one part: its segment would be the whole set
            out[("set", c.case.case_set or "core")].append(c)
        for tag in dict.fromkeys(c.case.tags):
            out[("tag", tag)].append(c)
        if c.case.knowledge_tag:
            out[("knowledgeTag", c.case.knowledge_tag)].append(c)
        out[("language", c.case.language or query_language(c.case.query))].append(c)
        out[("origin", c.case.origin or "manual")].append(c)
        literal = band(c.case.literalness)
        if literal is not None:
            out[("literalness", literal)].append(c)
    return out


def _segment_order(key: tuple[str, str]) -> tuple[int, int, str]:
    kind, name = key
    names = _NAME_ORDER.get(kind, ())
    return (SEGMENT_KINDS.index(kind), names.index(name) if name in names else len(names), name)


def segment_means(cases: list[CaseRecord]) -> dict[str, float | None]:
    """Per compared measure (`measures.COMPARED`), the mean of the per-case figures over the cases that have
    metrics (scored cases); None when none has."""
    scored = [c.scores.metrics for c in cases if c.scores.metrics]
    return {m: (fmean(float(s[m]) for s in scored) if scored else None) for m in measures.COMPARED}


def segments(
    cases: list[CaseRecord], baseline_cases: list[CaseRecord] | None = None, seed: int = 42
) -> list[Segment]:
    """One segment per tag value, knowledge tag, risk (high, medium, low; a case without one is in none),
    golden-set part (core, incremental; only when the set has both), query language, origin (manual,
    generated, log; a case without one is manual) and literalness band (low < 1/3 <= mid < 2/3 <= high,
    `golden.authoring.literalness.band`; a case without literalness is in none), sorted by kind in
    that order, then by name (origins and bands in the order just given). `cases` is the number of cases
    in it (scored or not); `small` when under 10. With a baseline, `delta` holds per metric the mean
    paired difference over the segment's cases scored on both sides and its uncorrected sign-flip p-value
    (exploratory: many segments, no correction)."""
    out = []
    for (kind, name), members in sorted(_members(cases).items(), key=lambda kv: _segment_order(kv[0])):
        out.append(
            Segment(
                kind=kind,
                name=name,
                cases=len(members),
                small=len(members) < SMALL_SEGMENT,
                metrics=segment_means(members),
                delta=_delta(members, baseline_cases, seed) if baseline_cases is not None else None,
            )
        )
    return out


def _delta(members: list[CaseRecord], baseline_cases: list[CaseRecord], seed: int) -> SegmentDelta:
    """The segment's exploratory paired differences against the baseline's cases of the same ids."""
    base = {c.case.id: c.scores.metrics for c in baseline_cases}
    paired = [(old, c.scores.metrics) for c in members if c.scores.metrics and (old := base.get(c.case.id))]
    per_metric = {}
    for m in measures.COMPARED:
        diffs = [float(cur[m]) - float(old[m]) for old, cur in paired]
        if diffs:
            per_metric[m] = {"delta": fmean(diffs), "pValue": stats.sign_flip_p_value(diffs, seed=seed)}
    return SegmentDelta(paired_cases=len(paired), metrics=per_metric)


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
