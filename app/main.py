"""create_app(): the FastAPI application.

Startup runs in a background thread so that `/health` and `/ready` answer from the first second: load
the models, open the store, ingest `rag.ingest.paths` when the index is empty or out of date, build the
BM25 index, then (when `rag.evaluate.enabled`) run the startup evaluation. `/ready` answers 503 with the
current phase until all of that is done. A fatal startup error, or a failed gate with
`fail_on_gate: true`, asks the server to stop with a non-zero exit code.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI

from app import exit_codes
from app.api.errors import install_error_handlers
from app.api.routes import router
from app.settings import Settings

log = logging.getLogger("sieve")

# the one exit-code table (app/exit_codes.py), shared with the CLI
EXIT_STARTUP_FAILED = exit_codes.UNAVAILABLE
EXIT_GATE_FAILED = exit_codes.GATE_FAILED
EXIT_INVALID_GOLDEN_SET = exit_codes.BAD_INPUT


@dataclass
class AppState:
    settings: Settings
    phase: str = "starting"
    ready: bool = False
    error: str | None = None
    exit_code: int = 0
    sieve: object | None = None  # app.service.Sieve once loaded
    evaluation_progress: str | None = None
    # serialises writers (ingest, evaluation) against each other; reads need no lock
    write_lock: threading.Lock = field(default_factory=threading.Lock)


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
        worker = threading.Thread(
            target=_startup,
            args=(state, start or startup_sequence, on_fatal),
            name="sieve-startup",
            daemon=True,
        )
        worker.start()
        yield
        sieve = state.sieve
        if sieve is not None:
            sieve.close()  # type: ignore[attr-defined]

    app = FastAPI(
        title="Sieve",
        description="RAG retrieval through a traced RetrievalQualityFilter chain, with startup evaluation.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.sieve_state = state
    app.include_router(router)
    install_error_handlers(app)
    return app


def _startup(
    state: AppState, sequence: Callable[[AppState], None], on_fatal: Callable[[int], None] | None
) -> None:
    try:
        sequence(state)
    except Exception as exc:
        state.error = f"{type(exc).__name__}: {exc}"
        state.phase = "failed"
        log.error("startup failed: %s", exc, exc_info=not _is_user_error(exc))
        state.exit_code = EXIT_STARTUP_FAILED
        if on_fatal:
            on_fatal(EXIT_STARTUP_FAILED)
        return
    if state.exit_code and on_fatal:
        on_fatal(state.exit_code)


def startup_sequence(state: AppState) -> None:
    from app.evaluation.startup import run_startup_evaluation
    from app.service import Sieve

    rag = state.settings.rag
    state.phase = "loading models and opening the store"
    sieve = Sieve.open(state.settings)
    state.sieve = sieve
    if rag.ingest.on_startup and rag.ingest.paths:
        state.phase = f"ingesting {', '.join(rag.ingest.paths)}"
        with state.write_lock:
            report = sieve.ingest(rag.ingest.paths, progress=True)
        for error in report.errors:
            log.error("ingest error: %s", error)
    log.info("index ready: %d chunks in %s", sieve.store.count(), sieve.store.description)
    if rag.evaluate.enabled:
        state.phase = "running the startup evaluation"

        def progress(done: int, total: int) -> None:
            state.evaluation_progress = f"{done}/{total} cases"

        with state.write_lock:
            outcome = run_startup_evaluation(sieve, rag.evaluate, progress)
        if outcome.gate_failures and rag.evaluate.fail_on_gate:
            state.phase = "failed"
            state.error = "evaluation gate failed: " + "; ".join(outcome.gate_failures)
            state.exit_code = EXIT_GATE_FAILED
            return
        if outcome.invalid_golden_set and rag.evaluate.fail_on_invalid_golden_set:
            state.phase = "failed"
            state.error = f"invalid golden set: {outcome.invalid_golden_set}"
            state.exit_code = EXIT_INVALID_GOLDEN_SET
            return
    state.phase = "ready"
    state.ready = True
    log.info("Sieve is ready")


def _is_user_error(exc: Exception) -> bool:
    from app.models import ModelLoadError
    from app.settings import SettingsError
    from app.store import StoreError

    return isinstance(exc, StoreError | ModelLoadError | SettingsError)
