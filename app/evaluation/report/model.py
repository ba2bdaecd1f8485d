"""Typed records of a report's computed parts, and the one serialiser that turns them into report JSON.

`to_json` maps a dataclass to a dict with camelCase keys (`p_holm` -> `pHolm`, `ci95` stays), tuples to
lists, and recurses into lists and dicts; the Markdown and the comparison read the JSON these records
become, so there is one shape.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def to_json(value: Any) -> Any:
    """The one serialiser: dataclass -> {camelCase field: value}, recursively."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {camel(f.name): to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return value


@dataclass(frozen=True)
class Loss:
    """Where one expected id that is not in the top K was lost (`where`: NOT_IN_INDEX, NOT_RETRIEVED,
    REMOVED_BY_<stage> with `stage` and the removal's `reason`, or RANKED_OUT)."""

    id: str
    where: str
    stage: str
    reason: str


@dataclass(frozen=True)
class RemovedItem:
    chunk_id: str
    doc_id: str
    reason: str
    relevant: bool


@dataclass(frozen=True)
class StageStat:
    """What one stage did for one case (report JSON: a case's `filterStats` entry)."""

    name: str
    enabled: bool
    skipped: str | None
    input: int
    output: int
    removed: int
    removed_relevant: int  # expected ids the stage made disappear from the list
    removed_relevant_chunks: int  # removed chunks of expected ids (a second chunk of a kept document too)
    added: int
    latency_ms: float
    removed_items: list[RemovedItem]


@dataclass(frozen=True)
class StageRow:
    """One row of the report's per-stage table, over all cases (`afterStage`: mean Recall/MRR/nDCG of
    the list after the stage, cut at K)."""

    name: str
    enabled: bool
    skipped: str | None
    removed: int
    removed_relevant: int
    added: int
    latency_ms: float | None
    after_stage: dict[str, float | None]


@dataclass(frozen=True)
class MetricComparison:
    baseline: float
    current: float
    delta: float
    ci95: tuple[float, float] | None
    p_value: float
    p_holm: float | None = None
    significant: bool = False


@dataclass(frozen=True)
class CaseDelta:
    id: str
    delta: float


@dataclass
class CaseChanges:
    fixed: list[str] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)
    improved: list[CaseDelta] = field(default_factory=list)
    worsened: list[CaseDelta] = field(default_factory=list)
    only_in_baseline: list[str] = field(default_factory=list)
    only_in_current: list[str] = field(default_factory=list)
    # broken or worsened cases whose drop may come from unjudged documents (compare.unverified_reason)
    unverified: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class UnjudgedAccount:
    """How much of what the change brought into the top K nobody has judged: over the paired scored
    cases, `new_in_top_k` = Σ |top K now − top K before| (distinct ids at the case's matching level) and
    `new_unjudged` = how many of those carry no judgment in the current golden set."""

    new_in_top_k: int
    new_unjudged: int
    headline: str


@dataclass(frozen=True)
class BeforeAfter:
    baseline: float | None
    current: float | None


@dataclass(frozen=True)
class StageDelta:
    name: str
    removed_relevant: BeforeAfter
    recall_after: BeforeAfter


@dataclass(frozen=True)
class BaselineRef:
    path: str
    evaluated_at: str | None
    run: dict[str, Any]


@dataclass
class Comparison:
    baseline: BaselineRef
    comparable: bool
    differences: list[str]
    paired_cases: int
    metrics: dict[str, MetricComparison]
    cases: CaseChanges
    stages: list[StageDelta]
    # fixed, broken and worsened cases: {id: {"query", "before": [top docIds], "now": [top docIds],
    # "newInTopK": [...], "newUnjudged": [...], "verified": bool, "why": str}}
    case_details: dict[str, dict[str, Any]] = field(default_factory=dict)
    unjudged: UnjudgedAccount | None = None
    # the same paired statistics on the condensed lists (unjudged documents removed)
    condensed_metrics: dict[str, MetricComparison] = field(default_factory=dict)


@dataclass(frozen=True)
class GateFailure:
    check: str
    actual: Any
    limit: Any
    message: str


@dataclass(frozen=True)
class SegmentDelta:
    paired_cases: int
    metrics: dict[str, dict[str, float]]  # metric -> {"delta", "pValue"} (uncorrected, exploratory)
    exploratory: bool = True


@dataclass(frozen=True)
class Segment:
    kind: str  # "tag" | "knowledgeTag" | "language"
    name: str
    cases: int
    small: bool
    metrics: dict[str, float | None]
    delta: SegmentDelta | None = None


@dataclass(frozen=True)
class Group:
    name: str
    cases: list[str]
    hit_rate: float | None
    ndcg_min: float | None
    ndcg_max: float | None
    spread: float | None
    same_top1: bool


@dataclass(frozen=True)
class RankedDocument:
    """One document of a case's final top K (`matched`: the first hit of an expected id)."""

    rank: int
    doc_id: str
    chunk_id: str
    source: str
    title: str
    scores: dict[str, float]
    origin: list[str]
    matched: bool
    reason: str  # "relevant (grade 1)", "duplicate of a higher-ranked hit", "FORBIDDEN", "not relevant"
    snippet: str  # the first SNIPPET_CHARS characters of the chunk's text
    attached: list[str]  # chunk ids the diversity stage attached to it (its document's further chunks)


@dataclass(frozen=True)
class CaseRecord:
    """One golden case as the report shows it: the case, its figures, its ranking and its trace."""

    id: str
    query: str
    knowledge_tag: str | None
    top_k: int
    note: str | None
    tags: list[str]
    group: str | None
    language: str
    origin: str  # manual | generated | log
    generator: str | None
    passage_chunk_id: str | None
    literalness: float | None
    case_sha256: str
    match_on: str
    expected: dict[str, float]
    forbidden_doc_ids: list[str]
    expect_no_answer: bool
    status: str
    error: str | None
    metrics: dict[str, float] | None
    at_k: dict[str, dict[str, float]]
    expected_count: int
    hit_count: int | None
    first_hit_rank: int | None
    original_count: int | None
    final_count: int | None
    abstained: bool | None
    latency_ms: float | None
    single_latency_ms: float | None
    fallback_used: bool | None
    ranked_documents: list[RankedDocument]
    filter_stats: list[StageStat]
    after_stage: dict[str, Any]
    lost: list[Loss]
    forbidden_found: list[str]
    missing_from_index: list[str]
    judged: float | None  # Judged@K of the top K (metrics.judged_at_k)
    unjudged: list[str]  # the top K's ids that carry no judgment
    condensed: dict[str, float] | None  # metrics at K of the condensed (judged-only) list
    evidence_groups: list[list[str]]
    evidence: dict[str, float] | None  # evidenceRecall, evidenceHit at K
    evidence_lost: list[Loss]
    expanded_sources: dict[str, list[str]]


@dataclass(frozen=True)
class Summary:
    """The run's headline figures: macro means over the scored cases (those with relevant documents);
    no-answer cases, forbidden hits and where expected ids were lost are counted apart."""

    cases: int
    succeeded: int
    failed: int
    scored_cases: int
    recall: float | None
    hit_rate: float | None
    mrr: float | None
    ndcg: float | None
    precision: float | None
    top1_accuracy: float | None
    duplicate_rate: float | None
    counts: dict[str, int]  # scoredCases, hits, relevantFound, relevantTotal
    k_mixed: bool
    at_k: dict[str, dict[str, float | None]]
    latency_ms: dict[str, float] | None  # single-query retrieve() over the timed sample
    latency_sample_cases: int
    batch_latency_ms: dict[str, float] | None
    no_answer: dict[str, Any]
    forbidden: dict[str, int]
    expected_missing_from_index: int
    lost_by: dict[str, int]
    failed_case_ids: list[str]
    judged: float | None  # mean Judged@K over the scored cases
    unjudged_in_top_k: int  # distinct (case, id) pairs in the scored cases' top K with no judgment
    condensed: dict[
        str, float | None
    ]  # mean metrics of the condensed lists (recall, hitRate, mrr, ndcg, precision)
    evidence: dict[str, Any]  # cases, evidenceRecall, evidenceHit, lostBy
