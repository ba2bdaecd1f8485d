"""The values that flow through the RetrievalQualityFilter chain and its trace.

A `Candidate` is one chunk under consideration for one query. Each stage writes only its own score key
(`dense`, `bm25`, `fused`, `rerank`) and never compares scores that different models produced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from typing import Any, Protocol

import numpy as np

SCORE_DENSE = "dense"
SCORE_BM25 = "bm25"
SCORE_FUSED = "fused"
SCORE_RERANK = "rerank"
# Chunk metadata written at ingest (chunker.DOC_SHA256): sha256 of the normalised document text.
META_DOC_SHA256 = "doc_sha256"


def knowledge_tag_of(metadata: dict[str, Any]) -> str | None:
    """A chunk's knowledge tag: its `knowledge` metadata as a string, None when absent or empty."""
    tag = metadata.get("knowledge")
    return str(tag) if tag not in (None, "") else None


@dataclass
class Candidate:
    chunk_id: str
    doc_id: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    # unit-length vector from the store; used by the diversity stage
    embedding: np.ndarray | None = None
    scores: dict[str, float] = field(default_factory=dict)
    # where the candidate came from: {"dense"}, {"bm25"} or both
    origin: frozenset[str] = frozenset({"dense"})

    @property
    def source(self) -> str:
        return str(self.metadata.get("source", ""))

    @property
    def title(self) -> str:
        return str(self.metadata.get("title", ""))

    @property
    def knowledge_tag(self) -> str | None:
        return knowledge_tag_of(self.metadata)

    @property
    def doc_sha256(self) -> str | None:
        """The hash of its whole document's normalised text, written at ingest (None in older stores)."""
        value = self.metadata.get(META_DOC_SHA256)
        return str(value) if value else None


@dataclass(frozen=True)
class Removal:
    chunk_id: str
    doc_id: str
    reason: str


@dataclass
class StageOutcome:
    """What one stage did: the survivors in their new order, and every removal with its reason.

    Invariant for every stage except `fallback`: ids(kept) + ids(removed) == ids(input), as multisets.
    `fallback` may only add (`added`), never remove.
    """

    kept: list[Candidate]
    removed: list[Removal] = field(default_factory=list)
    added: list[Candidate] = field(default_factory=list)
    skipped: str | None = None  # e.g. "skipped: no reranker model"
    score_key: str | None = None  # the score this stage wrote or ordered by


@dataclass
class QueryContext:
    text: str
    knowledge_tag: str | None = None
    today: date = field(default_factory=date.today)
    # every candidate before any stage ran, in candidate order (the fallback refills from these)
    raw_candidates: list[Candidate] = field(default_factory=list)
    # removals so far in this chain run, by stage name (the fallback does not refill hard-filtered ones)
    removed_by_stage: dict[str, list[Removal]] = field(default_factory=dict)


class Stage(Protocol):
    name: str

    def run(self, query: QueryContext, candidates: list[Candidate]) -> StageOutcome: ...


@dataclass
class StageTrace:
    name: str
    input_count: int
    output_count: int
    removed: list[Removal]
    added: list[str]
    latency_ms: float
    score_key: str | None = None
    skipped: str | None = None
    enabled: bool = True


@dataclass
class RetrievalTrace:
    candidates_ms: float = 0.0
    candidate_origins: dict[str, int] = field(default_factory=dict)  # {"dense": n, "bm25": n, "both": n}
    stages: list[StageTrace] = field(default_factory=list)
    # ids after each stage, in order: lets the evaluation score the list after every stage
    ranked_after: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class RetrievalResult:
    query: str
    documents: list[Candidate]
    original_count: int
    fallback_used: bool
    trace: RetrievalTrace
    latency_ms: float
    raw_candidates: list[Candidate] = field(default_factory=list)
