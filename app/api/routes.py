"""HTTP routes: retrieval, health/readiness, evaluations and the query log (the writes to the index are
app/api/documents.py).

Who may call what is decided by the dependencies in `app.api.deps` (reads, writes); see its docstring."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Security
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from app.access.scope import Principal
from app.api.admission import RETRY_AFTER_S
from app.api.deps import (
    READER_SECURITY,
    bearer,
    is_admin,
    request_principal,
    require_admin,
    require_reader,
    require_sieve,
    sieve_state,
)
from app.api.errors import ApiError, safe_text
from app.api.evaluations import EvaluationRunRequest, EvaluationRunResponse
from app.api.experiments import ExperimentRequest
from app.api.querylog import QueryLogParams, query_record, read_newest
from app.api.readiness import record_problem
from app.api.schemas import (
    HTML_REPORT_ERRORS,
    READ_ERRORS,
    REPORT_ERRORS,
    WRITE_ERRORS,
    JobAccepted,
    ReadyResponse,
    RetrieveRequest,
    error_responses,
)
from app.retrieve_response import RetrieveResponse, retrieve_response

if TYPE_CHECKING:
    from app.api.state import AppState
    from app.service import Sieve

log = logging.getLogger(__name__)

router = APIRouter()
reader = [Depends(require_reader)]
admin = [Depends(require_admin)]


# /health and /ready are `async`: they answer from the event loop, never waiting for a worker thread (the
# retrievals hold those), a model, or a lock a retrieval holds.


@router.get("/health", tags=["ops"])
async def health() -> dict[str, str]:
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
async def ready(request: Request) -> JSONResponse:
    """Ready: models loaded, index built and reconciled with the document record, startup evaluation done,
    and the store answers its heartbeat (checked at most once a second, in a thread of its own) with no
    failed read or write recorded since. `unindexed`: recorded documents the reconciliation could not index
    (not served), and why."""
    state = sieve_state(request)
    if state.ready and state.sieve is not None:
        problem = await state.store_probe.problem_soon(state.sieve.store)  # type: ignore[attr-defined]
        problem = problem or record_problem(getattr(state.sieve, "record", None))
        if problem is None:
            if state.unindexed:  # serving, but not every recorded document: say which and why
                return JSONResponse({"status": "ready", "unindexed": safe_text(state.unindexed)})
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "unavailable", "reason": safe_text(problem)}, status_code=503)
    body: dict[str, Any] = {
        "status": "failed" if state.error else "starting",
        "reason": safe_text(state.error or state.phase),
    }
    if state.evaluation_progress:
        body["evaluationProgress"] = state.evaluation_progress
    return JSONResponse(body, status_code=503)


@router.post(
    "/api/retrieve",
    response_model=RetrieveResponse,
    tags=["retrieval"],
    dependencies=reader,
    responses=READ_ERRORS,
    openapi_extra=READER_SECURITY,
)
async def retrieve(body: RetrieveRequest, request: Request) -> Response:
    """Retrieve the `topK` best documents for `query`, through the chain.

    At most `rag.server.max_concurrent_retrievals` run at once and `max_queued_retrievals` wait, each at
    most `queue_timeout_ms`; any other request is a 429 with `Retry-After`. With `debug`, each stage lists
    what it removed and why; a reader (anyone without the admin token) sees the removals of documents
    hidden from readers (draft, retired, not effective, denied source) only as counts by reason."""
    state = sieve_state(request)
    sieve = require_sieve(request)
    limit = sieve.settings.rag.retrieval.max_query_chars
    if len(body.query) > limit:
        raise ApiError(
            422,
            f"query: {len(body.query)} characters, more than rag.retrieval.max_query_chars={limit}",
            field="query",
        )
    refusal = await state.admission.acquire()
    if refusal is not None:
        raise ApiError(429, refusal.message(state.admission), headers={"Retry-After": str(RETRY_AFTER_S)})
    try:
        # the chain, the response model and its JSON all run in a worker thread: a 100-document debug
        # answer takes milliseconds to build, which the event loop owes to /health
        principal = request_principal(request)
        answer = await run_in_threadpool(_retrieve_json, state, sieve, body, not is_admin(request), principal)
    finally:
        state.admission.release()
    return Response(answer, media_type="application/json")


def _retrieve_json(
    state: AppState, sieve: Sieve, body: RetrieveRequest, withhold: bool, principal: Principal | None
) -> bytes:
    top_k = body.topK or sieve.settings.rag.retrieval.top_k
    result = sieve.retrieve(body.query, top_k, body.knowledgeTag, principal)
    if state.querylog is not None:
        state.querylog.submit(query_record(result, body.knowledgeTag, top_k, principal))
    return retrieve_response(result, debug=body.debug, withhold=withhold).model_dump_json().encode()


@router.get("/api/evaluations/latest", tags=["evaluation"], dependencies=admin, responses=REPORT_ERRORS)
def latest_evaluation(request: Request) -> JSONResponse:
    """The latest evaluation report (JSON). It holds every golden query and the ids of draft and retired
    documents, so it needs the admin token."""
    from app.evaluation.session import latest_report_path

    state = sieve_state(request)
    path = latest_report_path(state.settings.rag.evaluate)
    if not path.exists():
        raise ApiError(
            404,
            f"no evaluation report yet ({path.name} does not exist); run one with POST /api/evaluations "
            f"or start with rag.evaluate.enabled=true",
        )
    return JSONResponse(json.loads(path.read_text(encoding="utf-8")))


# the page carries golden queries and document text: it may run its own inline script, and fetch nothing
HTML_REPORT_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
    "img-src data:",
    "X-Content-Type-Options": "nosniff",
}


@router.get(
    "/api/evaluations/latest.html",
    tags=["evaluation"],
    dependencies=admin,
    response_class=HTMLResponse,
    responses={
        **HTML_REPORT_ERRORS,
        200: {"content": {"text/html": {}}, "description": "the latest report as one self-contained page"},
    },
)
def latest_evaluation_html(request: Request) -> HTMLResponse:
    """The latest evaluation report as HTML (inline CSS and SVG, no outside resource); admin token, like
    the JSON."""
    from app.evaluation.session import latest_report_path

    settings = sieve_state(request).settings.rag.evaluate
    path = latest_report_path(settings).with_suffix(".html")
    if not path.exists():
        hint = (
            "rag.evaluate.write_html is false"
            if not settings.write_html
            else "run one with POST /api/evaluations or start with rag.evaluate.enabled=true"
        )
        raise ApiError(404, f"no HTML evaluation report yet ({path.name} does not exist); {hint}")
    return HTMLResponse(path.read_text(encoding="utf-8"), headers=HTML_REPORT_HEADERS)


@router.post("/api/evaluations", tags=["evaluation"], dependencies=admin, responses=WRITE_ERRORS)
def run_evaluation(request: Request) -> JSONResponse:
    """Run an evaluation now (admin token) and return its report."""
    from app.evaluation.session import evaluate

    state = sieve_state(request)
    sieve = require_sieve(request)
    if not state.write_lock.acquire(blocking=False):
        raise ApiError(409, "an evaluation or ingest is already running")
    try:
        outcome = evaluate(sieve.evaluation_target(), state.settings.rag.evaluate)
    finally:
        state.write_lock.release()
    return JSONResponse(outcome.json)


@router.post(
    "/api/evaluations/runs",
    response_model=EvaluationRunResponse,
    tags=["evaluation"],
    dependencies=admin,
    responses=WRITE_ERRORS,
)
def run_evaluation_outcome(
    request: Request, body: EvaluationRunRequest | None = None
) -> EvaluationRunResponse:
    """Run an evaluation now (admin token), as the startup one does with this server's chain and
    `rag.evaluate` (the body may change K, the baseline and the thresholds for this run), write its reports
    and answer with its outcome: the lines `sieve eval` prints, the report files, the gate. The answer comes
    when the golden set has run (`sieve eval --server` waits for it). A baseline or golden set that cannot
    be used is a 422 naming it; a write already running, 409."""
    from app.evaluation.compare.comparison import BaselineError
    from app.evaluation.session import evaluate, resolve_baseline

    state = sieve_state(request)
    sieve = require_sieve(request)
    settings = (body or EvaluationRunRequest()).apply(state.settings.rag.evaluate)
    try:
        resolve_baseline(settings)
    except BaselineError as exc:
        raise ApiError(422, str(exc), field="baseline") from None
    if not state.write_lock.acquire(blocking=False):
        raise ApiError(409, "an evaluation or ingest is already running")
    try:
        outcome = evaluate(sieve.evaluation_target(), settings)
    finally:
        state.write_lock.release()
    if outcome.invalid_golden_set is not None:
        raise ApiError(422, outcome.invalid_golden_set)
    return outcome.view()


@router.post(
    "/api/experiments",
    status_code=202,
    tags=["evaluation"],
    dependencies=admin,
    responses={
        202: {
            "model": JobAccepted,
            "description": "the experiment, checked and accepted as a background job",
        },
        **WRITE_ERRORS,
    },
)
def start_experiment(request: Request, body: ExperimentRequest) -> JSONResponse:
    """Run an experiment on this server (admin token): variants of the settings side by side on its store,
    models and golden set (`sieve experiment --server`; docs/cli.md). The file is checked first (a misspelt
    key, a value the settings refuse, a broken golden set: 422 naming it); then 202 `{"job": id}`, and
    `GET /api/jobs/{id}` shows the job, whose report once done is the experiment JSON and the files written
    in `<rag.evaluate.output_dir>/experiments/`. The serving collection and the baseline are never changed;
    the job runs after the write jobs before it (and they after it)."""
    from pathlib import Path as FilePath

    from app.api.experiments import experiment_work
    from app.evaluation.golden.cases import GoldenSetError, load_golden_set
    from app.experiment.spec import ExperimentFileError, parse_spec

    state = sieve_state(request)
    sieve = require_sieve(request)
    try:
        spec = parse_spec(body.experiment, FilePath("experiment"), state.settings)
        golden = load_golden_set(state.settings.rag.evaluate.resource_location)
    except ExperimentFileError as exc:
        raise ApiError(422, str(exc), field="experiment") from None
    except GoldenSetError as exc:
        raise ApiError(422, str(exc)) from None
    job = state.jobs.create("experiment", 0, 0)
    state.job_runner.submit(job, experiment_work(state.settings, sieve, spec, golden, body.rerun))
    log.info("job %s queued: an experiment of %d variant(s)", job.id, len(spec.variants))
    return JSONResponse(JobAccepted(job=job.id).model_dump(), status_code=202)


def _own_entries_only(request: Request) -> str | None:
    """The principal whose entries alone a query-log read may see, None for all of them (the admin);
    anyone else gets the admin check's 401/403."""
    principal = request_principal(request) if sieve_state(request).principals.enabled else None
    if principal is not None and not principal.admin:
        return principal.name
    require_admin(request)
    return None


# how long GET /api/querylog waits for the entries queued before it to be written
QUERYLOG_READ_WAIT_S = 1.0


@router.get("/api/querylog", tags=["evaluation"], responses=error_responses(401, 403, 422, 500))
def query_log(
    request: Request, params: Annotated[QueryLogParams, Query()], _: object = Security(bearer)
) -> JSONResponse:
    """The newest `limit` (1 to 1000, default 100) query-log entries, newest first (admin token: they hold
    users' query text). With access scopes on (rag.access.enabled), a principal's token reads that
    principal's own entries only (what it asked, and what its scope returned).

    `enabled` says whether this server logs queries now (rag.querylog.enabled); entries written before are
    read either way. `dropped`: entries this server did not log, `droppedBy` says why: `queueFull` (the
    writer's queue was full) or `overBudget` (more bytes than rag.querylog.keep_hours allows)."""
    state = sieve_state(request)
    own = _own_entries_only(request)
    querylog = state.querylog
    if querylog is not None:
        querylog.wait_written(QUERYLOG_READ_WAIT_S)
        entries = querylog.newest(params.limit, own)
    else:
        entries = read_newest(Path(state.settings.rag.querylog.path), params.limit, principal=own)
    return JSONResponse(
        {
            "enabled": querylog is not None,
            "dropped": querylog.dropped if querylog is not None else 0,
            "droppedBy": {
                "queueFull": querylog.dropped_queue_full if querylog is not None else 0,
                "overBudget": querylog.dropped_over_budget if querylog is not None else 0,
            },
            "entries": entries,
        }
    )
