"""Request and response shapes of the HTTP API (camelCase on the wire).

The CLI's `--json` prints these too.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.retrieval.types import Candidate, RetrievalResult


class RetrieveRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(..., description="the question; not blank, at most rag.retrieval.max_query_chars")
    topK: int | None = Field(
        None, ge=1, le=100, description="how many documents; default rag.retrieval.top_k"
    )
    knowledgeTag: str | None = Field(None, description="only chunks with this `knowledge` metadata")
    debug: bool = Field(False, description="add every removed id with its reason to each stage")

    @field_validator("query")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("query must not be blank")
        return value


class Scores(BaseModel):
    dense: float | None = None
    bm25: float | None = None
    fused: float | None = None
    rerank: float | None = None


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


class RemovedItem(BaseModel):
    chunkId: str
    docId: str
    reason: str


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


class RetrieveResponse(BaseModel):
    query: str
    documents: list[RetrievedDocument]
    originalCount: int
    finalCount: int
    fallbackUsed: bool
    candidateOrigins: dict[str, int]
    stages: list[StageReport]
    latencyMs: float


class DocumentIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str = Field(..., min_length=1)
    title: str = ""
    text: str = Field(..., min_length=1)


class DocumentsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    documents: list[DocumentIn] = Field(..., min_length=1, max_length=10_000)


class IngestResponse(BaseModel):
    documents: int
    chunks: int
    added: int
    updated: int = Field(description="metadata rewritten, text and vector unchanged")
    unchanged: int
    deleted: int
    errors: list[str]


class JobAccepted(BaseModel):
    job: str = Field(description="the job id; GET /api/jobs/{job} shows its progress and result")


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
        scores=Scores(**{k: round(v, 6) for k, v in c.scores.items() if k in Scores.model_fields}),
    )


def retrieve_response(result: RetrievalResult, debug: bool = False) -> RetrieveResponse:
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
                    RemovedItem(chunkId=r.chunk_id, docId=r.doc_id, reason=r.reason) for r in s.removed
                ]
                if debug
                else None,
            )
            for s in result.trace.stages
        ],
        latencyMs=round(result.latency_ms, 3),
    )


def to_json(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json", exclude_none=False)
