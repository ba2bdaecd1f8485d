"""`AppState`: what one running application holds: its settings, the startup's progress, the loaded Sieve,
the lock that serialises writers, the stop signal, the write jobs, the query log, the admission of
retrievals, the free-space guard of the folders it writes to, the store probe behind /ready and what the
reconciliation left unindexed.

`app.main.create_app` makes one per application (`app.state.sieve_state`); the routes read it through
`app.api.deps.sieve_state`."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from app.api.admission import Admission
from app.api.jobs import JobBook, JobRunner, QueueBound
from app.api.principals import PrincipalBook
from app.api.querylog import QueryLog
from app.api.readiness import StoreProbe
from app.settings import Settings
from app.store.space import MIB, SpaceGuard


@dataclass
class AppState:
    settings: Settings
    phase: str = "starting"
    ready: bool = False
    error: str | None = None
    exit_code: int = 0
    sieve: object | None = None  # app.service.Sieve once loaded
    owns_sieve: bool = False  # opened by this app's startup (then its shutdown closes it)
    # the process is `sieve serve` itself: its startup freezes what it loaded (`freeze_loaded_objects`)
    freeze_after_load: bool = False
    evaluation_progress: str | None = None
    # recorded documents the last reconciliation left unindexed, and why (app/api/reconcile.py): /ready
    unindexed: str | None = None
    reconcile_retry_s: float = 0.0  # the delay of the last retry scheduled while documents are unindexed
    reconcile_timer: threading.Timer | None = None
    # serialises writers (ingest, evaluation) against each other; reads need no lock
    write_lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)
    # monotonic time by which the process must be gone; set when the stop is asked (SIGTERM)
    stop_deadline: float | None = None
    jobs: JobBook = field(init=False)
    job_runner: JobRunner = field(init=False)
    querylog: QueryLog | None = None  # rag.querylog.enabled: opened and closed by the lifespan
    admission: Admission = field(init=False)
    space: SpaceGuard = field(init=False)
    store_probe: StoreProbe = field(default_factory=StoreProbe)
    principals: PrincipalBook = field(init=False)  # rag.access: who each token reads as

    def __post_init__(self) -> None:
        self.principals = PrincipalBook(self.settings.rag.access)
        server = self.settings.rag.server
        self.jobs = JobBook(
            Path(server.jobs_dir),
            server.keep_jobs,
            server.keep_jobs_hours,
            QueueBound(server.max_queued_documents, server.max_queued_bytes),
            attempts=server.job_attempts,
        )
        # the folders this server writes to: writes and jobs wait or are refused while one is nearly full
        store = self.settings.rag.store
        folders = [server.jobs_dir, *([store.path] if store.mode == "embedded" else [])]
        self.space = SpaceGuard(folders, int(store.min_free_mb * MIB))
        self.job_runner = JobRunner(self.jobs, space=self.space.problem)
        self.store_probe.space = self.space.problem
        self.jobs.kept_without_job = self.job_runner.reconcile_soon
        self.admission = Admission(
            server.max_concurrent_retrievals, server.max_queued_retrievals, server.queue_timeout_ms / 1000
        )
