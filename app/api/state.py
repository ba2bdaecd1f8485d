"""`AppState`: what one running application holds: its settings, the startup's progress, the loaded Sieve,
the lock that serialises writers, the stop signal, the write jobs, the query log, the admission of
retrievals and the store probe behind /ready.

`app.main.create_app` makes one per application (`app.state.sieve_state`); the routes read it through
`app.api.deps.sieve_state`."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from app.api.admission import Admission
from app.api.jobs import JobBook, JobRunner, QueueBound
from app.api.querylog import QueryLog
from app.api.readiness import StoreProbe
from app.settings import Settings


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
    # serialises writers (ingest, evaluation) against each other; reads need no lock
    write_lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)
    # monotonic time by which the process must be gone; set when the stop is asked (SIGTERM)
    stop_deadline: float | None = None
    jobs: JobBook = field(init=False)
    job_runner: JobRunner = field(init=False)
    querylog: QueryLog | None = None  # rag.querylog.enabled: opened and closed by the lifespan
    admission: Admission = field(init=False)
    store_probe: StoreProbe = field(default_factory=StoreProbe)

    def __post_init__(self) -> None:
        server = self.settings.rag.server
        self.jobs = JobBook(
            Path(server.jobs_dir),
            server.keep_jobs,
            server.keep_jobs_hours,
            QueueBound(server.max_queued_documents, server.max_queued_bytes),
        )
        self.job_runner = JobRunner(self.jobs)
        self.admission = Admission(
            server.max_concurrent_retrievals, server.max_queued_retrievals, server.queue_timeout_ms / 1000
        )
