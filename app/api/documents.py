"""HTTP routes of writes to the index: `POST /api/documents` (done at once, or a job), `DELETE
/api/documents/{id}`, and the jobs (`GET /api/jobs`, `GET /api/jobs/{id}`); the work of a job, which reads
its documents from the document record (app/api/jobs.py keeps the jobs).

Every route here needs the admin token (`app.api.deps.require_admin`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse

from app.access.scope import ACCESS, TENANT, AccessFieldError, scope_fields
from app.api.bounds import MAX_ID_CHARS
from app.api.deps import require_admin, require_sieve, sieve_state
from app.api.errors import ApiError, safe_text
from app.api.jobs import Job, JobDocuments, JobInterrupted, QueueFull
from app.api.schemas import (
    JOB_ERRORS,
    REPORT_ERRORS,
    WRITE_ERRORS,
    DocumentDeleted,
    DocumentsRequest,
    ErrorResponse,
    IngestResponse,
    JobAccepted,
    error_responses,
)
from app.ingest.pipeline import IngestReport, bounds_problem
from app.ingest.types import Document
from app.models import EmbeddingInterrupted
from app.settings import IngestSettings
from app.store.record import Tombstone

if TYPE_CHECKING:
    from app.api.state import AppState
    from app.service import Sieve

log = logging.getLogger(__name__)

router = APIRouter()
admin = [Depends(require_admin)]


# a write that becomes a job can be refused because the queue is full
QUEUED_WRITE_ERRORS: dict[int | str, dict[str, Any]] = {
    **WRITE_ERRORS,
    429: {
        "model": ErrorResponse,
        "description": "the write queue is full (rag.server.max_queued_documents, max_queued_bytes): nothing "
        "of the write was written; retry after the `Retry-After` header's seconds",
    },
}


@router.post(
    "/api/documents",
    response_model=IngestResponse,
    tags=["ingest"],
    dependencies=admin,
    responses={
        **QUEUED_WRITE_ERRORS,
        202: {"model": JobAccepted, "description": "a large write, kept and accepted as a background job"},
    },
)
def add_documents(body: DocumentsRequest, request: Request) -> Any:
    """Add or replace documents (JSON objects with `id`, `title`, `text` and any scalar metadata).

    A write of at most `rag.server.sync_write_chunks` chunks is done before the answer (200, the ingest
    report). A larger one, or one that arrives while another write runs, becomes a job: its documents are
    kept in the document record, then 202 `{"job": id}`; `GET /api/jobs/{id}` shows its progress and, once
    done, the same ingest report. A job stopped by a restart resumes after it. When the queued jobs would
    pass `rag.server.max_queued_documents` or `max_queued_bytes`, the write is a 429 with `Retry-After` and
    nothing of it is written. When it would leave less than `rag.store.min_free_mb` free where Sieve writes,
    or the disk fills under it, it is a 507 naming the folder (a job's write leaves nothing; a write done
    at once may have kept its documents in the record, not all of them indexed: send it again)."""
    state = sieve_state(request)
    sieve = require_sieve(request)
    docs = _documents(body, state.settings.rag.ingest)
    nbytes = sum(document_bytes(d) for d in docs)
    state.space.check(need=nbytes)  # 507 before anything of the write is kept
    chunks = sieve.chunk_count(docs)
    buried = sieve.record.tombstones([d.doc_id for d in docs]) if sieve.record is not None else {}
    if chunks <= state.settings.rag.server.sync_write_chunks and state.write_lock.acquire(blocking=False):
        try:
            report = sieve.ingest_documents(docs, should_stop=state.stopping.is_set)
        except EmbeddingInterrupted as exc:
            raise ApiError(
                503,
                f"the server is shutting down; the write stopped before it finished ({exc}). Send it "
                "again: chunks already stored are not embedded again",
            ) from None
        except Exception:
            # its documents may be kept in the record and not all indexed: the job worker reconciles
            state.job_runner.reconcile_soon()
            raise
        finally:
            state.write_lock.release()
        _log_lifted(buried.values())
        return ingest_view(report)
    job = _accept_job(
        state,
        sieve,
        "ingest",
        [d.doc_id for d in docs],
        nbytes,
        chunks,
        keep=lambda: kept_record(state, sieve).put(docs),
    )
    _log_lifted(buried.values())
    return JSONResponse(JobAccepted(job=job.id).model_dump(), status_code=202)


def _log_lifted(tombstones: Iterable[Tombstone]) -> None:
    """One line for each document written again through the API after a delete through it: the write lifted
    its tombstone."""
    for stone in tombstones:
        log.info(
            "document '%s' (deleted through the API at %s) was written again: its tombstone is lifted",
            safe_text(stone.doc_id),
            stone.deleted_at,
        )


@router.delete(
    "/api/documents/{doc_id:path}",
    response_model=DocumentDeleted,
    tags=["ingest"],
    dependencies=admin,
    responses={
        **QUEUED_WRITE_ERRORS,
        **error_responses(404),
        202: {
            "model": JobAccepted,
            "description": "another write runs: the document left the record; a job deletes its chunks next",
        },
    },
)
def delete_document(
    doc_id: Annotated[str, PathParam(min_length=1, max_length=MAX_ID_CHARS)], request: Request
) -> Any:
    """Delete a document: from the document record, and its chunks from the index (vector and BM25).

    404 when neither the record nor the index knows `doc_id`. While another write runs, the document leaves
    the record at once and a job removes its chunks after that write (202 `{"job": id}`; its report says
    how many chunks): a write of the same id accepted after this delete keeps its own version.

    The delete stays: the record keeps a tombstone of the document (id, when, its file, its content hash), so
    the start-up ingest, `sieve ingest` and `sieve store rebuild` leave it out while its file is unchanged. A
    changed file, or a write of the same id, brings it back."""
    state = sieve_state(request)
    sieve = require_sieve(request)
    state.space.check()  # a delete writes too (a tombstone, the index's log)
    if state.write_lock.acquire(blocking=False):
        try:
            documents, chunks = sieve.delete_documents([doc_id])
        finally:
            state.write_lock.release()
        if not documents and not chunks:
            raise _unknown_document(doc_id)
        return DocumentDeleted(id=doc_id, documents=documents, chunks=chunks)
    record = kept_record(state, sieve)
    if not record.get([doc_id]) and not sieve.store.metadata_of([], [doc_id]):
        raise _unknown_document(doc_id)
    job = _accept_job(
        state, sieve, "delete", [doc_id], 0, 0, keep=lambda: record.delete([doc_id], tombstone=True)
    )
    return JSONResponse(JobAccepted(job=job.id).model_dump(), status_code=202)


def _unknown_document(doc_id: str) -> ApiError:
    return ApiError(404, f"no document {safe_text(doc_id)!r} in the record or the index", field="doc_id")


def _accept_job(
    state: AppState,
    sieve: Sieve,
    kind: str,
    doc_ids: list[str],
    nbytes: int,
    chunks: int,
    keep: Callable[[], object],
) -> Job:
    """Create and submit a job over `doc_ids` when the queue has room, after `keep()` (the record write);
    a 429 with `Retry-After`, before `keep()`, when it has none."""
    try:
        job = state.jobs.accept(kind, doc_ids, nbytes, chunks, before=keep)
    except QueueFull as exc:
        raise ApiError(429, str(exc), headers={"Retry-After": str(exc.retry_after)}) from None
    state.job_runner.submit(job, job_work(state, sieve))
    log.info("job %s queued: %s of %d documents, %d chunks", job.id, kind, len(doc_ids), chunks)
    return job


def resume_jobs(state: AppState, sieve: Sieve) -> int:
    """Submit the jobs the last start found unfinished, oldest first; how many."""
    waiting = state.jobs.unfinished()
    work = job_work(state, sieve)
    for job in waiting:
        state.job_runner.submit(job, work)
    return len(waiting)


def job_work(state: AppState, sieve: Sieve) -> Callable[[Job], dict[str, Any]]:
    """The work of a job, by its kind: `ingest` its documents as the record holds them, or `delete` them."""

    def work(job: Job) -> dict[str, Any]:
        if job.kind == "delete":
            return _delete_job(state, sieve, job)
        return _ingest_job(state, sieve, job)

    return work


def _delete_job(state: AppState, sieve: Sieve, job: Job) -> dict[str, Any]:
    """Delete the chunks of the job's documents (the record forgot them when the job was accepted), except
    those of a document written again since: its chunks are the new version's (`keptAgain`)."""
    ids = job.documentIds or []
    with state.write_lock:
        again = {d.doc_id for d in kept_record(state, sieve).get(ids)}
        _, chunks = sieve.delete_documents([i for i in ids if i not in again])
    return {"chunks": chunks, "keptAgain": len(again)}


def _ingest_job(state: AppState, sieve: Sieve, job: Job) -> dict[str, Any]:
    """Ingest the job's documents, read from the record when it runs (the newest version accepted); a
    document deleted since it was accepted is skipped and counted (`skipped`)."""

    def progress(done: int, total: int) -> None:
        state.jobs.update(job, embedded=done)

    def committed(stored: int, total: int) -> None:
        state.jobs.update(job, stored=stored)

    ids = job.documentIds or []
    with state.write_lock:
        docs = kept_record(state, sieve).get(ids)
        try:
            report = (
                sieve.ingest_documents(
                    docs, on_progress=progress, should_stop=state.stopping.is_set, on_committed=committed
                )
                if docs
                else IngestReport()
            )
        except EmbeddingInterrupted as exc:
            raise JobInterrupted(
                f"the server shut down before this job finished ({exc}); its documents are kept and it "
                "resumes at the next start"
            ) from None
    return {**ingest_view(report).model_dump(), "skipped": len(ids) - len(docs)}


def kept_record(state: AppState, sieve: Sieve) -> JobDocuments:
    """Where jobs keep their documents: the Sieve's document record, or, for a Sieve opened without one
    (tests of the index alone), the job book's memory."""
    return sieve.record if sieve.record is not None else state.jobs.held


def document_bytes(doc: Document) -> int:
    """A document's size as the queue's bound counts it: its id, title, text and metadata as UTF-8 JSON."""
    return len(json.dumps([doc.doc_id, doc.title, doc.text, doc.metadata], ensure_ascii=False).encode())


def _documents(body: DocumentsRequest, ingest: IngestSettings) -> list[Document]:
    docs = []
    for i, item in enumerate(body.documents):
        extra = dict(item.model_extra or {})
        try:
            extra.update(scope_fields(extra))
        except AccessFieldError as exc:
            bad_field = ACCESS if "'access'" in str(exc) else TENANT
            raise ApiError(
                422, f"documents[{i}] (id {item.id}): {exc}", field=f"documents.{i}.{bad_field}"
            ) from None
        for key in (TENANT, ACCESS):
            if extra.get(key) is None:
                extra.pop(key)
        bad = [k for k, v in extra.items() if isinstance(v, dict) or (isinstance(v, list) and k != ACCESS)]
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
        if len(item.text) > ingest.max_document_chars:
            raise ApiError(
                422,
                f"documents[{i}] (id {item.id}): text has {len(item.text)} characters, more than "
                f"rag.ingest.max_document_chars={ingest.max_document_chars}",
                field=f"documents.{i}.text",
            )
        doc = Document(doc_id=item.id, text=item.text, title=item.title, metadata=extra, origin="api")
        problem = bounds_problem(doc, ingest)
        if problem:
            raise ApiError(
                422,
                f"documents[{i}] (id {item.id}): {problem}; nothing of this request was written",
                field=f"documents.{i}",
            )
        docs.append(doc)
    return docs


def ingest_view(report: IngestReport) -> IngestResponse:
    return IngestResponse(
        documents=report.documents,
        chunks=report.chunks,
        added=report.added,
        updated=report.updated,
        unchanged=report.unchanged,
        deleted=report.deleted,
        errors=[str(e) for e in report.errors],
    )


@router.get("/api/jobs", tags=["ingest"], dependencies=admin, responses=REPORT_ERRORS)
def list_jobs(request: Request) -> JSONResponse:
    """Write jobs, newest first (without their `documentIds`): the running and queued ones and the newest
    `rag.server.keep_jobs` finished ones (`GET /api/jobs/{id}` finds any accepted in the last
    `keep_jobs_hours` too)."""
    return JSONResponse({"jobs": [job.view(with_ids=False) for job in sieve_state(request).jobs.listed()]})


@router.get("/api/jobs/{job_id}", tags=["ingest"], dependencies=admin, responses=JOB_ERRORS)
def get_job(job_id: str, request: Request) -> JSONResponse:
    """One job: `state` (queued, running, done, failed, interrupted), `progress`, `report` or `error`,
    `documentIds`, `resumed` (how many restarts it was queued again after). Known for at least
    `rag.server.keep_jobs_hours` after it was accepted."""
    job = sieve_state(request).jobs.get(job_id)
    if job is None:
        raise ApiError(
            404, f"no job {safe_text(job_id)!r} (GET /api/jobs lists the known ones)", field="job_id"
        )
    return JSONResponse(job.view())
