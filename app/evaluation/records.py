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
    # fixed and broken cases: {id: {"query", "before": [top docIds], "now": [top docIds]}} for the Markdown
    case_details: dict[str, dict[str, Any]] = field(default_factory=dict)


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
