"""Segments (per tag, knowledge tag and query language) and paraphrase groups, over report case records.

Pure functions over the case records of the report JSON, so a baseline read from a file segments the
same way.
"""

from __future__ import annotations

from collections import defaultdict
from statistics import fmean
from typing import Any

from app.evaluation import stats
from app.evaluation.records import Group, Segment, SegmentDelta

SEGMENT_METRICS = ("recall", "hitRate", "mrr", "ndcg", "precision", "top1Accuracy")
SMALL_SEGMENT = 10


def is_cjk(ch: str) -> bool:
    """A CJK ideograph (the Unified Ideographs blocks, extension A, the compatibility block, and
    extensions B and later in planes 2-3)."""
    code = ord(ch)
    return (
        0x4E00 <= code <= 0x9FFF
        or 0x3400 <= code <= 0x4DBF
        or 0xF900 <= code <= 0xFAFF
        or 0x20000 <= code <= 0x3FFFF
    )


def query_language(text: str) -> str:
    """ "zh" when more than half of the query's letters (`str.isalpha`) are CJK ideographs, else "en"
    (a query with no letters is "en")."""
    letters = [ch for ch in text if ch.isalpha()]
    cjk = sum(1 for ch in letters if is_cjk(ch))
    return "zh" if letters and 2 * cjk > len(letters) else "en"


def _members(cases: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    out: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for c in cases:
        for tag in dict.fromkeys(c.get("tags") or []):
            out[("tag", tag)].append(c)
        if c.get("knowledgeTag"):
            out[("knowledgeTag", c["knowledgeTag"])].append(c)
        out[("language", c.get("language") or query_language(c.get("query", "")))].append(c)
    return out


def segment_means(cases: list[dict[str, Any]]) -> dict[str, float | None]:
    """Per metric, the mean of the per-case figures over the cases that have metrics (scored cases);
    None when none has."""
    scored = [c["metrics"] for c in cases if c.get("metrics")]
    return {m: (fmean(float(s[m]) for s in scored) if scored else None) for m in SEGMENT_METRICS}


def segments(
    cases: list[dict[str, Any]], baseline_cases: list[dict[str, Any]] | None = None, seed: int = 42
) -> list[Segment]:
    """One segment per tag value, knowledge tag and query language, sorted by kind then name. `cases` is
    the number of cases in it (scored or not); `small` when under 10. With a baseline, `delta` holds per
    metric the mean paired difference over the segment's cases scored on both sides and its uncorrected
    sign-flip p-value (exploratory: many segments, no correction)."""
    base = {c["id"]: c for c in baseline_cases or []}
    order = {"tag": 0, "knowledgeTag": 1, "language": 2}
    out = []
    for (kind, name), members in sorted(_members(cases).items(), key=lambda kv: (order[kv[0][0]], kv[0][1])):
        delta = None
        if baseline_cases is not None:
            paired = [
                (base[c["id"]]["metrics"], c["metrics"])
                for c in members
                if c.get("metrics") and c["id"] in base and base[c["id"]].get("metrics")
            ]
            per_metric = {}
            for m in SEGMENT_METRICS:
                diffs = [float(cur[m]) - float(old[m]) for old, cur in paired]
                if diffs:
                    per_metric[m] = {
                        "delta": fmean(diffs),
                        "pValue": stats.sign_flip_p_value(diffs, seed=seed),
                    }
            delta = SegmentDelta(paired_cases=len(paired), metrics=per_metric)
        out.append(
            Segment(
                kind=kind,
                name=name,
                cases=len(members),
                small=len(members) < SMALL_SEGMENT,
                metrics=segment_means(members),
                delta=delta,
            )
        )
    return out


def groups(cases: list[dict[str, Any]]) -> list[Group]:
    """One record per golden `group` (paraphrases of one need), sorted by name: hitRate = mean hit over
    its scored cases; ndcgMin / ndcgMax over them; spread = ndcgMax - ndcgMin; sameTop1 = every case of
    the group returned the same document at rank 1 (false when one returned nothing)."""
    by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for c in cases:
        if c.get("group"):
            by_group[c["group"]].append(c)
    out = []
    for name in sorted(by_group):
        members = by_group[name]
        scored = [c["metrics"] for c in members if c.get("metrics")]
        ndcgs = [float(m["ndcg"]) for m in scored]
        tops = [c["rankedDocuments"][0]["docId"] if c.get("rankedDocuments") else None for c in members]
        out.append(
            Group(
                name=name,
                cases=[c["id"] for c in members],
                hit_rate=fmean(float(m["hitRate"]) for m in scored) if scored else None,
                ndcg_min=min(ndcgs) if ndcgs else None,
                ndcg_max=max(ndcgs) if ndcgs else None,
                spread=(max(ndcgs) - min(ndcgs)) if ndcgs else None,
                same_top1=None not in tops and len(set(tops)) == 1,
            )
        )
    return out
