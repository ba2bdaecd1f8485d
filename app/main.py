"""create_app(): the FastAPI application.

Startup runs in a background thread so that `/health` and `/ready` answer from the first second: load
the models, open the store, ingest `rag.ingest.paths` when the index is empty or out of date, build the
BM25 index, reconcile the index with the document record (index what the record holds and the index lacks:
app/api/reconcile.py), then (when `rag.evaluate.enabled`) run the startup evaluation, then submit again the
write jobs the last run left unfinished or failed (app/api/jobs.py). `/ready` answers 503 with the current
phase until all of that is done. A fatal startup error, or a failed gate with `fail_on_gate: true`, asks
the server to stop with a non-zero exit code.

Stopping: `AppState.stopping` is set as soon as the server is asked to stop (the CLI sets it on SIGTERM),
so a running ingest, startup's or a job's, stops at its next slice, keeping the batches it committed; the
shutdown then waits for the job worker at most `rag.server.shutdown_seconds`.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI

from app import exit_codes
from app.api.admission import AdmissionGate
from app.api.bounds import max_object_keys
from app.api.docs_ui import install_docs
from app.api.documents import resume_jobs
from app.api.documents import router as documents_router
from app.api.errors import install_error_handlers
from app.api.label import router as label_router
from app.api.limits import BodySizeLimit, JsonShapeLimit
from app.api.querylog import open_query_log
from app.api.reconcile import reconcile_after_jobs, reconcile_index
from app.api.routes import router
from app.api.state import AppState
from app.label_desk import LabelDesk
from app.settings import Settings

__all__ = ["AppState", "create_app", "create_label_app", "startup_sequence", "stop_writers"]

if TYPE_CHECKING:
    from app.service import Sieve

log = logging.getLogger("sieve")

# of rag.server.shutdown_seconds, what the shutdown keeps for the process's own exit after the writers stop
EXIT_ALLOWANCE_S = 1.5
# of that allowance, what the query log's writer may take to write its queue at shutdown
QUERYLOG_CLOSE_S = 1.0
# how many chunks the start-up looks at for character spans (`_say_missing_spans`)
SPAN_SAMPLE = 2000


def create_app(
    settings: Settings,
    on_fatal: Callable[[int], None] | None = None,
    start: Callable[[AppState], None] | None = None,
) -> FastAPI:
    """`on_fatal(code)` is called when startup fails or the gate fails with fail_on_gate (the CLI stops
    the server with that code). `start` replaces the default startup sequence (tests)."""
    state = AppState(settings=settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # an app started again in the same process (test clients do) is no longer stopping
        state.stopping.clear()
        state.stop_deadline = None
        _recover_jobs(state)
        worker = threading.Thread(
            target=_startup,
            args=(state, start or startup_sequence, on_fatal),
            name="sieve-startup",
            daemon=True,
        )
        worker.start()
        state.querylog = open_query_log(settings.rag.querylog)
        yield
        _log_refusals(state)
        stop_writers(state)
        if state.querylog is not None:
            state.querylog.close(timeout=QUERYLOG_CLOSE_S)
            state.querylog = None

    app = FastAPI(
        title="Sieve",
        description="RAG retrieval through a traced retrieval chain, with startup evaluation.",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,  # install_docs: served from the pinned package, no CDN
        redoc_url=None,
    )
    app.state.sieve_state = state
    install_docs(app)
    app.include_router(router)
    app.include_router(documents_router)
    app.include_router(label_router)
    # the middleware added last runs first: BodySizeLimit bounds the body JsonShapeLimit reads
    app.add_middleware(JsonShapeLimit, max_object_keys=max_object_keys(settings.rag.ingest.max_metadata_keys))
    app.add_middleware(BodySizeLimit, max_bytes=settings.rag.server.max_body_bytes)
    # outermost: a burst's refusals cost neither a body read nor a validation
    app.add_middleware(AdmissionGate, admission=lambda: state.admission)
    install_error_handlers(app)
    return app


def _log_refusals(state: AppState) -> None:
    """At shutdown, one line on the retrievals the admission refused, when it refused any."""
    counts = state.admission.counts()
    if counts["refusedQueueFull"] or counts["refusedWaitedTooLong"]:
        log.info(
            "admission: %d retrievals admitted, refused %d with the queue full and %d that waited too long",
            counts["admitted"],
            counts["refusedQueueFull"],
            counts["refusedWaitedTooLong"],
        )


def _recover_jobs(state: AppState) -> None:
    """Read the job records of the last run: those it left unfinished resume once the service is up; those
    of the older shape (no document ids) are reported interrupted."""
    for job in state.jobs.recover():
        log.warning("job %s (%d documents) was interrupted by the last shutdown", job.id, job.documents)
    if waiting := state.jobs.unfinished():
        log.info(
            "%d unfinished jobs (%d documents) resume once the service is up",
            len(waiting),
            sum(j.documents for j in waiting),
        )


def create_label_app(
    settings: Settings, desk: LabelDesk, on_fatal: Callable[[int], None] | None = None
) -> FastAPI:
    """`sieve label`: the labelling page and its API only (app/api/label.py, the router `/label` of
    `create_app` serves too), over `desk`'s files. Startup opens the Sieve in the background as
    `create_app`'s does (ingesting `rag.ingest.paths` when `on_startup`), without the evaluation."""
    settings = settings.model_copy(
        update={
            "rag": settings.rag.model_copy(
                update={"evaluate": settings.rag.evaluate.model_copy(update={"enabled": False})}
            )
        }
    )
    state = AppState(settings=settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.stopping.clear()
        state.stop_deadline = None
        threading.Thread(
            target=_startup, args=(state, startup_sequence, on_fatal), name="sieve-startup", daemon=True
        ).start()
        yield
        stop_writers(state)

    app = FastAPI(title="Sieve labelling", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.sieve_state = state
    app.state.label_desk = desk
    app.include_router(label_router)
    # the middleware added last runs first: BodySizeLimit bounds the body JsonShapeLimit reads
    app.add_middleware(JsonShapeLimit, max_object_keys=max_object_keys(settings.rag.ingest.max_metadata_keys))
    app.add_middleware(BodySizeLimit, max_bytes=settings.rag.server.max_body_bytes)
    install_error_handlers(app)
    return app


def stop_writers(state: AppState) -> None:
    """Ask every writer to stop, wait for the job worker within the deadline, then close the store.

    A write still running at the deadline is left to die with the process: ingest writes committed batches,
    each one Chroma call, and deletes stale chunks only at its end, so what is stored stays consistent."""
    state.stopping.set()
    if state.stop_deadline is None:
        state.stop_deadline = time.monotonic() + state.settings.rag.server.shutdown_seconds
    # what is left after the writers stop is the process's own exit (torch, Chroma): keep time for it
    deadline = state.stop_deadline - EXIT_ALLOWANCE_S
    if not state.job_runner.stop(timeout=max(0.0, deadline - time.monotonic())):
        log.error("shutdown: the running job did not stop in time; it resumes at the next start")
        return
    # the startup thread or a request may still be writing; close only when no writer holds the lock
    if state.write_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
        try:
            if state.sieve is not None and state.owns_sieve:
                state.sieve.close()  # type: ignore[attr-defined]
        finally:
            state.write_lock.release()
    else:
        log.error("shutdown: a write did not stop in time; the store is left to the process exit")


def _startup(
    state: AppState, sequence: Callable[[AppState], None], on_fatal: Callable[[int], None] | None
) -> None:
    try:
        sequence(state)
    except Exception as exc:
        if state.stopping.is_set():
            state.phase = "stopped"
            log.info("startup stopped by the shutdown: %s", exc)
            return
        state.error = _startup_error(exc)
        state.phase = "failed"
        log.error("startup failed: %s", state.error, exc_info=not _is_user_error(exc))
        state.exit_code = exit_codes.UNAVAILABLE
        if on_fatal:
            on_fatal(exit_codes.UNAVAILABLE)
        return
    if state.exit_code and on_fatal:
        on_fatal(state.exit_code)


def _say_missing_spans(sieve: Sieve) -> None:
    """One warning when chunks of the index carry no character span (a store indexed before chunker
    md-v2), naming the command that gives them spans. It looks at the first `SPAN_SAMPLE` chunks only (one
    page: a start at a million chunks does not read every chunk's metadata for a warning); a store
    indexed before md-v2 has no span on any of them."""
    from app.ingest.check import spanless_chunks, spans_missing_line

    sample = list(itertools.islice(sieve.store.iter_all(include_text=False), SPAN_SAMPLE))
    missing = spanless_chunks(sample)
    if missing:
        log.warning("%s", spans_missing_line(missing, len(sample)))


def _say_index_notes(sieve: Sieve) -> None:
    """What the log says of the index once it is ready: chunks without spans, chunks without scope."""
    _say_missing_spans(sieve)
    _say_unscoped(sieve)


def _say_unscoped(sieve: Sieve) -> None:
    """With access scopes on, how many chunks carry no access list (only the admin token reads them)."""
    if not sieve.settings.rag.access.enabled:
        return
    unscoped = sieve.lexical.unscoped_count()
    if unscoped:
        log.warning(
            "access scopes on: %d of %d chunks carry no access list; only the admin token reads them "
            "(give their documents `access:` in front matter or JSONL, or rag.ingest.access_defaults)",
            unscoped,
            len(sieve.lexical),
        )
    else:
        log.info("access scopes on: every one of %d chunks carries an access list", len(sieve.lexical))


def startup_sequence(state: AppState) -> None:
    from app.evaluation.session import evaluate
    from app.service import Sieve, freeze_loaded_objects

    rag = state.settings.rag
    state.phase = "loading models and opening the store"
    sieve = Sieve.open(state.settings)
    state.sieve = sieve
    state.owns_sieve = True
    damaged = sieve.record is not None and sieve.record.damage is not None
    if damaged:
        log.error("start-up ingest skipped: the document record is damaged and refuses writes")
    if rag.ingest.on_startup and rag.ingest.paths and not damaged:
        state.phase = f"ingesting {', '.join(rag.ingest.paths)}"
        with state.write_lock:
            report = sieve.ingest(rag.ingest.paths, progress="log", should_stop=state.stopping.is_set)
        for error in report.errors:
            log.error("ingest error: %s", error)
    # the record is the truth: index what it holds and the index lacks (a job whose record was lost or
    # that failed, a store that lost chunks) before the evaluation reads the index and the jobs resume
    reconcile_index(state, sieve, full=True)
    state.job_runner.after_jobs = lambda: reconcile_after_jobs(state, sieve)
    log.info("index ready: %d chunks in %s", sieve.store.count(), sieve.store.description)
    _say_index_notes(sieve)
    if state.freeze_after_load:
        freeze_loaded_objects()
    if rag.evaluate.enabled:
        state.phase = "running the startup evaluation"

        def progress(done: int, total: int) -> None:
            state.evaluation_progress = f"{done}/{total} cases"

        with state.write_lock:
            outcome = evaluate(sieve.evaluation_target(), rag.evaluate, progress=progress)
        if outcome.gate_failures and rag.evaluate.fail_on_gate:
            state.phase = "failed"
            state.error = "evaluation gate failed: " + "; ".join(outcome.gate_failures)
            state.exit_code = exit_codes.GATE_FAILED
            return
        if outcome.invalid_golden_set and rag.evaluate.fail_on_invalid_golden_set:
            state.phase = "failed"
            state.error = f"invalid golden set: {outcome.invalid_golden_set}"
            state.exit_code = exit_codes.BAD_INPUT
            return
    if resumed := resume_jobs(state, sieve):
        log.info("%d unfinished jobs submitted again", resumed)
    # /ready answers from the event loop with the probe's last answer: make the first one now
    state.store_probe.problem(sieve.store)
    state.phase = "ready"
    state.ready = True
    log.info("Sieve is ready")


def _startup_error(exc: Exception) -> str:
    """What a failed startup says. A store that answers but fails a read or a write of the index (opening,
    warm-up, counting, the BM25 catch-up, the startup ingest) is said in one message that names the commands
    that diagnose and repair it."""
    from app.store import StoreFailedError

    if isinstance(exc, StoreFailedError):
        return exc.with_remedy()
    return f"{type(exc).__name__}: {exc}"


def _is_user_error(exc: Exception) -> bool:
    from app.models import ModelLoadError
    from app.settings import SettingsError
    from app.store import StoreError

    return isinstance(exc, StoreError | ModelLoadError | SettingsError)
