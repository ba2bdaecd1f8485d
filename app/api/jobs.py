"""Write jobs: large writes run in the background, one at a time, and are recorded on disk.

`POST /api/documents` above `rag.server.sync_write_chunks` chunks answers 202 with a job id; the one worker
thread runs jobs in the order they came, under the same write lock as every other writer. Each job is a JSON
file in `rag.server.jobs_dir`, rewritten atomically at every change of state, so a job that was queued or
running when the process stopped (a deploy, a crash, kill -9) is found at the next start and reported as
`interrupted`. Ingest stores new chunks in committed batches (`rag.ingest.commit_chunks`), and `stored` in
the record counts those committed: they stay stored after an interruption, the rest of the job was not
written. Sending the documents again finishes it, embedding only the chunks still missing (and deleting the
older versions of changed documents, which an interrupted job leaves beside the new ones).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import secrets
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger(__name__)

JobState = Literal["queued", "running", "done", "failed", "interrupted"]
FINISHED: frozenset[str] = frozenset({"done", "failed", "interrupted"})
JOB_ID = re.compile(r"^j-[0-9]{8}T[0-9]{6}-[0-9a-f]{8}$")


class JobInterrupted(Exception):
    """A job's work stopped early on request (shutdown); the message says what was left undone."""


@dataclass
class Job:
    id: str
    kind: str
    state: JobState
    createdAt: str
    documents: int
    chunks: int
    embedded: int = 0
    stored: int = 0  # new chunks committed to the store so far
    startedAt: str | None = None
    finishedAt: str | None = None
    report: dict[str, Any] | None = None
    error: str | None = None

    def view(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "progress": {"embedded": self.embedded, "stored": self.stored, "chunks": self.chunks},
        }


@dataclass
class _Queued:
    job: Job
    work: Callable[[Job], dict[str, Any]]


@dataclass
class JobBook:
    """The jobs of this server: kept in memory, each also a JSON file in `directory`."""

    directory: Path
    keep: int = 100
    _jobs: dict[str, Job] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def recover(self) -> list[Job]:
        """Load the recorded jobs; those that were queued or running become `interrupted` (returned)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        interrupted = []
        for path in sorted(self.directory.glob("j-*.json")):
            try:
                job = Job(**json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError, TypeError) as exc:
                log.warning("ignoring unreadable job record %s: %s", path, exc)
                continue
            if job.state not in FINISHED:
                job.state = "interrupted"
                job.finishedAt = job.finishedAt or _now()
                job.error = interrupted_error(job.stored)
                self._save(job)
                interrupted.append(job)
            self._jobs[job.id] = job
        self._prune()
        return interrupted

    def create(self, kind: str, documents: int, chunks: int) -> Job:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        job = Job(f"j-{stamp}-{secrets.token_hex(4)}", kind, "queued", _now(), documents, chunks)
        with self._lock:
            self._jobs[job.id] = job
        self._save(job)
        self._prune()
        return job

    def update(self, job: Job, **changes: Any) -> None:
        with self._lock:
            for key, value in changes.items():
                setattr(job, key, value)
        self._save(job)

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id) if JOB_ID.match(job_id) else None

    def all(self) -> list[Job]:
        with self._lock:
            return sorted(self._jobs.values(), key=lambda j: j.id, reverse=True)

    def _save(self, job: Job) -> None:
        """Write the record atomically: a reader (or the next start) sees the old or the new, never half."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".job-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(asdict(job), fh, ensure_ascii=False)
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.directory / f"{job.id}.json")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _prune(self) -> None:
        """Keep the newest `keep` finished jobs (and every unfinished one)."""
        with self._lock:
            finished = sorted((j for j in self._jobs.values() if j.state in FINISHED), key=lambda j: j.id)
            drop = finished[: max(0, len(finished) - self.keep)]
            for job in drop:
                del self._jobs[job.id]
        for job in drop:
            (self.directory / f"{job.id}.json").unlink(missing_ok=True)


class JobRunner:
    """One worker thread that runs submitted jobs in order."""

    def __init__(self, book: JobBook):
        self.book = book
        self._queue: queue.Queue[_Queued | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="sieve-jobs", daemon=True)
        self._start_lock = threading.Lock()

    def submit(self, job: Job, work: Callable[[Job], dict[str, Any]]) -> None:
        """Run `work(job)` after the jobs before it; its return value becomes the job's report.
        `JobInterrupted` marks the job interrupted, any other exception failed. The worker thread starts
        with the first job."""
        with self._start_lock:
            if not self._thread.is_alive() and self._thread.ident is None:
                self._thread.start()
        self._queue.put(_Queued(job, work))

    def stop(self, timeout: float) -> bool:
        """Stop taking jobs and wait up to `timeout` s for the running one; False if it is still running.
        Jobs still queued stay `queued` on disk and are reported interrupted at the next start."""
        with self._start_lock:
            if self._thread.ident is None:
                return True  # never started: nothing runs
        self._queue.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            job = item.job
            self.book.update(job, state="running", startedAt=_now())
            started = time.perf_counter()
            try:
                report = item.work(job)
            except JobInterrupted as exc:
                self.book.update(job, state="interrupted", finishedAt=_now(), error=str(exc))
                log.warning("job %s interrupted: %s", job.id, exc)
                # Shutting down: leave the queued jobs as they are on disk.
                return
            except Exception as exc:
                log.exception("job %s failed", job.id)
                self.book.update(job, state="failed", finishedAt=_now(), error=f"{type(exc).__name__}: {exc}")
                continue
            self.book.update(job, state="done", finishedAt=_now(), report=report)
            log.info("job %s done in %.1fs", job.id, time.perf_counter() - started)


def interrupted_error(stored: int) -> str:
    """What a job found unfinished at the next start says: what of it is stored, and what to do."""
    if stored:
        done = (
            f"{stored} of its new chunks had been stored in committed batches and stay stored; the rest "
            "was not written"
        )
    else:
        done = "none of its chunks had been stored (nothing of it was written)"
    return (
        f"the server stopped before this job finished; {done}. Send the documents again: chunks already "
        "stored are not embedded again."
    )


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
