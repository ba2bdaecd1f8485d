"""HTTP routes: retrieval, ingest, health/readiness and evaluations."""

from __future__ import annotations

import json
import logging
import secrets
from typing import Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse

from app.api.deps import require_sieve, sieve_state
from app.api.errors import ApiError, safe_text
from app.api.readiness import store_probe
from app.api.schemas import (
    READ_ERRORS,
    REPORT_ERRORS,
    WRITE_ERRORS,
    DocumentsRequest,
    IngestResponse,
    ReadyResponse,
    RetrieveRequest,
    RetrieveResponse,
    retrieve_response,
)
from app.ingest.types import Document

log = logging.getLogger(__name__)

router = APIRouter()


@router.get("/health", tags=["ops"])
def health() -> dict[str, str]:
    """Alive: the process answers. Says nothing about models or index (see /ready)."""
    return {"status": "alive"}


@router.get(
    "/ready",
    tags=["ops"],
    response_model=ReadyResponse,
    response_model_exclude_none=True,
    responses={
        503: {"model": ReadyResponse, "description": "starting, startup failed, or the store is down"}
    },
)
def ready(request: Request) -> JSONResponse:
    """Ready: models loaded, index built, startup evaluation done, and the store answers its heartbeat
    (checked at most once a second)."""
    state = sieve_state(request)
    if state.ready and state.sieve is not None:
        problem = store_probe(request.app.state).problem(state.sieve.store)  # type: ignore[attr-defined]
        if problem is None:
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "unavailable", "reason": safe_text(problem)}, status_code=503)
    body: dict[str, Any] = {
        "status": "failed" if state.error else "starting",
        "reason": safe_text(state.error or state.phase),
    }
    if state.evaluation_progress:
        body["evaluationProgress"] = state.evaluation_progress
    return JSONResponse(body, status_code=503)


@router.post("/api/retrieve", response_model=RetrieveResponse, tags=["retrieval"], responses=READ_ERRORS)
def retrieve(body: RetrieveRequest, request: Request) -> RetrieveResponse:
    sieve = require_sieve(request)
    limit = sieve.settings.rag.retrieval.max_query_chars
    if len(body.query) > limit:
        raise ApiError(
            422,
            f"query: {len(body.query)} characters, more than rag.retrieval.max_query_chars={limit}",
            field="query",
        )
    top_k = body.topK or sieve.settings.rag.retrieval.top_k
    result = sieve.retrieve(body.query, top_k, body.knowledgeTag)
    return retrieve_response(result, debug=body.debug)


@router.post("/api/documents", response_model=IngestResponse, tags=["ingest"], responses=WRITE_ERRORS)
def add_documents(body: DocumentsRequest, request: Request) -> IngestResponse:
    """Add or replace documents (JSON objects with `id`, `title`, `text` and any scalar metadata)."""
    state = sieve_state(request)
    sieve = require_sieve(request)
    docs = []
    for i, item in enumerate(body.documents):
        extra = dict(item.model_extra or {})
        bad = [k for k, v in extra.items() if isinstance(v, dict | list)]
        if bad:
            raise ApiError(
                422,
                f"documents[{i}] (id {item.id}): metadata field {bad[0]!r} must be a scalar",
                field=f"documents.{i}.{bad[0]}",
            )
        if not item.text.strip():
            raise ApiError(
                422, f"documents[{i}] (id {item.id}): text must not be blank", field=f"documents.{i}.text"
            )
        docs.append(Document(doc_id=item.id, text=item.text, title=item.title, metadata=extra, origin="api"))
    with state.write_lock:
        report = sieve.ingest_documents(docs)
    return IngestResponse(
        documents=report.documents,
        chunks=report.chunks,
        added=report.added,
        unchanged=report.unchanged,
        deleted=report.deleted,
        errors=[str(e) for e in report.errors],
    )


@router.get("/api/evaluations/latest", tags=["evaluation"], responses=REPORT_ERRORS)
def latest_evaluation(request: Request) -> JSONResponse:
    from app.evaluation.startup import latest_report_path

    state = sieve_state(request)
    path = latest_report_path(state.settings.rag.evaluate)
    if not path.exists():
        raise ApiError(
            404,
            f"no evaluation report yet ({path} does not exist); run one with POST /api/evaluations "
            f"or start with rag.evaluate.enabled=true",
        )
    return JSONResponse(json.loads(path.read_text(encoding="utf-8")))


@router.post("/api/evaluations", tags=["evaluation"], responses=WRITE_ERRORS)
def run_evaluation(
    request: Request,
    authorization: str | None = Header(None),
    x_admin_token: str | None = Header(None),
) -> JSONResponse:
    """Run an evaluation now; needs `Authorization: Bearer <rag.server.admin_token>` (or `X-Admin-Token`)."""
    from app.evaluation.startup import run_startup_evaluation

    state = sieve_state(request)
    expected = state.settings.rag.server.admin_token
    if not expected:
        raise ApiError(403, "evaluations over HTTP are disabled: set rag.server.admin_token")
    given = x_admin_token or (authorization or "").removeprefix("Bearer ").strip()
    if not given or not secrets.compare_digest(given, expected):
        raise ApiError(401, "missing or wrong admin token")
    sieve = require_sieve(request)
    if not state.write_lock.acquire(blocking=False):
        raise ApiError(409, "an evaluation or ingest is already running")
    try:
        outcome = run_startup_evaluation(sieve, state.settings.rag.evaluate, None)
    finally:
        state.write_lock.release()
    if outcome.report is None:
        raise ApiError(422, f"evaluation did not run: {outcome.invalid_golden_set}")
    return JSONResponse(outcome.report)
