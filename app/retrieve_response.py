"""The answer to one retrieval (`RetrieveResponse`, camelCase): what `POST /api/retrieve` returns and what
`sieve query` prints (as this JSON with `--json`, as a table otherwise), built from the chain's result."""

from __future__ import annotations

from collections import Counter

from pydantic import BaseModel, Field

from app.records import RemovedItem
from app.retrieval.types import Candidate, Removal, RetrievalResult


class Scores(BaseModel):
    dense: float | None = None
    bm25: float | None = None
    fused: float | None = None
    rerank: float | None = None


class AttachedChunk(BaseModel):
    """A further chunk of the document, attached by the diversity stage (`attach_per_document`)."""

    chunkId: str
    headingPath: str
    text: str
    scores: Scores


class RetrievedDocument(BaseModel):
    rank: int
    docId: str
    chunkId: str
    source: str
    title: str
    text: str
    knowledgeTag: str | None
    headingPath: str
    origin: list[str]
    scores: Scores
    attached: list[AttachedChunk] = []


class WithheldCount(BaseModel):
    reason: str = Field(
        ..., description="why the documents are hidden: `status=draft`, `not yet effective`, ..."
    )
    count: int


class StageReport(BaseModel):
    name: str
    enabled: bool
    inputCount: int
    outputCount: int
    removed: int
    added: int
    latencyMs: float
    scoreKey: str | None = None
    skipped: str | None = None
    removedItems: list[RemovedItem] | None = None  # only with debug
    # only with debug: the removals left out of removedItems because their documents are hidden from the
    # caller (draft, retired, not effective, denied source; an admin sees every id), counted by reason
    withheld: list[WithheldCount] | None = None


class ScopeView(BaseModel):
    """Whose scope the candidates were taken in (`Principal.describe()`): who, never what it left out."""

    name: str
    admin: bool = Field(False, description="the admin token: every document")
    tenant: str | None = None
    readers: list[str] = Field(
        default_factory=list, description="the `access` entries it reads under: public, group:g, user:u"
    )


class RetrieveResponse(BaseModel):
    query: str
    documents: list[RetrievedDocument]
    originalCount: int
    finalCount: int
    fallbackUsed: bool
    candidateOrigins: dict[str, int]
    stages: list[StageReport]
    latencyMs: float
    # only with debug and access scopes on (rag.access.enabled); absent otherwise, so an unscoped answer
    # keeps the keys it had before scopes existed
    scope: ScopeView | None = Field(
        None,
        exclude_if=lambda value: value is None,
        description="with debug and rag.access.enabled: whose scope the candidates were taken in",
    )


def document_view(rank: int, c: Candidate) -> RetrievedDocument:
    return RetrievedDocument(
        rank=rank,
        docId=c.doc_id,
        chunkId=c.chunk_id,
        source=c.source,
        title=c.title,
        text=c.text,
        knowledgeTag=c.knowledge_tag,
        headingPath=str(c.metadata.get("heading_path", "")),
        origin=sorted(c.origin),
        scores=_scores(c),
        attached=[
            AttachedChunk(
                chunkId=a.chunk_id,
                headingPath=str(a.metadata.get("heading_path", "")),
                text=a.text,
                scores=_scores(a),
            )
            for a in c.attached
        ],
    )


def _scores(c: Candidate) -> Scores:
    return Scores(**{k: round(v, 6) for k, v in c.scores.items() if k in Scores.model_fields})


def retrieve_response(
    result: RetrievalResult, debug: bool = False, withhold: bool = False
) -> RetrieveResponse:
    """The answer to a retrieval. `debug`: each stage's removed items with their reasons, and the scope the
    candidates were taken in (`scope`, when there was one); `withhold` (a
    reader's view): removed items of documents hidden from readers (`RetrievalTrace.withheld`) are left out
    of `removedItems` and only counted, by reason, in `withheld`."""
    hidden = result.trace.withheld if withhold else {}
    return RetrieveResponse(
        query=result.query,
        documents=[document_view(i + 1, c) for i, c in enumerate(result.documents)],
        originalCount=result.original_count,
        finalCount=len(result.documents),
        fallbackUsed=result.fallback_used,
        candidateOrigins=result.trace.candidate_origins,
        stages=[
            StageReport(
                name=s.name,
                enabled=s.enabled,
                inputCount=s.input_count,
                outputCount=s.output_count,
                removed=len(s.removed),
                added=len(s.added),
                latencyMs=round(s.latency_ms, 3),
                scoreKey=s.score_key,
                skipped=s.skipped,
                removedItems=[
                    RemovedItem(chunk_id=r.chunk_id, doc_id=r.doc_id, reason=r.reason)
                    for r in s.removed
                    if r.chunk_id not in hidden
                ]
                if debug
                else None,
                withheld=_withheld_counts(s.removed, hidden) if debug else None,
            )
            for s in result.trace.stages
        ],
        latencyMs=round(result.latency_ms, 3),
        scope=ScopeView(**result.trace.scope) if debug and result.trace.scope is not None else None,
    )


def _withheld_counts(removed: list[Removal], hidden: dict[str, str]) -> list[WithheldCount]:
    """How many of `removed` are hidden, by reason, the most frequent first (ties by reason)."""
    counts = Counter(hidden[r.chunk_id] for r in removed if r.chunk_id in hidden)
    return [
        WithheldCount(reason=reason, count=n)
        for reason, n in sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    ]
