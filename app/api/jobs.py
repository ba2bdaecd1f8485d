"""Write jobs: large writes run in the background, one at a time, and are recorded on disk.

`POST /api/documents` above `rag.server.sync_write_chunks` chunks (or while another write runs) answers 202
with a job id, after the documents are in the document record (`Sieve.record`, durable): a job record holds
only their ids (`documentIds`) and size, and the job's work reads them back from the record when it runs.
The one worker thread runs jobs in the order they came, under the same write lock as every other writer.
Each job is a JSON file in `rag.server.jobs_dir`, rewritten atomically at every change of state.

A 202 is a promise: a job stopped by a shutdown goes back to `queued`, and a job found `queued` or `running`
at the next start (after SIGTERM, a crash, kill -9) is `queued` again (`resumed` counts how often) and runs
once the service is up, until it is `done`. A job that `failed` is queued again at the next start too, until
it has failed `attempts` times (rag.server.job_attempts; each failure's time and reason kept in `failures`).
Only a record of the older shape, without `documentIds`, cannot be resumed: it is reported `interrupted`,
saying what of it was stored. A job file that cannot be read is reported `unreadable` under the id its name
carries, with the reason: its documents are in the document record, and the start-up reconciliation
indexes them (app/ingest/reconcile.py).

A full disk stops no job for good and never the worker: a job waits `queued` while `space()` says the disk
is below its reserve (or after its work failed for lack of space) and runs once there is room, and a job
record that cannot be saved is logged and saved later (`JobBook.update`). An accepted job's record is saved
before its documents are kept, and taken away again when they cannot be (`JobBook.accept`).

The queue is bounded (`rag.server.max_queued_documents`, `max_queued_bytes`): a write that would pass the
bound is refused (`QueueFull`, a 429) before anything of it is written. Finished jobs are kept by count and
by age: one is pruned only when it is beyond the newest `rag.server.keep_jobs` and was accepted more than
`rag.server.keep_jobs_hours` ago.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import re
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from app.ingest.types import Document
from app.store import storage_exhausted

log = logging.getLogger(__name__)

JobState = Literal["queued", "running", "done", "failed", "interrupted", "unreadable"]
FINISHED: frozenset[str] = frozenset({"done", "failed", "interrupted", "unreadable"})
JOB_ID = re.compile(r"^j-[0-9]{8}T[0-9]{6}-[0-9a-f]{8}$")
# Retry-After of a refused write: the time the worker needs to make room at its recent pace, within these
RETRY_AFTER_MIN_S = 1
RETRY_AFTER_MAX_S = 120
# the pace assumed before this process has finished a job (documents a second)
UNMEASURED_DOCUMENTS_PER_S = 5.0
# finished jobs the pace is measured over
PACE_WINDOW = 20
# how often a job waiting for disk space looks again
SPACE_POLL_S = 1.0
# ... and the longest it waits before running again a job stopped for lack of space
SPACE_RETRY_MAX_S = 60.0


class JobInterrupted(Exception):
    """A job's work stopped early on request (shutdown); the message says what was left undone."""


class QueueFull(Exception):
    """A write refused because its job would pass the queue's bound; the message names the bound and what
    the queue holds, `retry_after` is the seconds the worker needs to make room (an estimate)."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


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
    # the ids of its documents, kept in the document record; None in a record of the older shape, whose
    # documents were held in memory only (such a job cannot be resumed)
    documentIds: list[str] | None = None
    bytes: int = 0  # the size of its documents (`document_bytes`), counted against max_queued_bytes
    resumed: int = 0  # how many starts found it unfinished and queued it again
    sequence: int = 0  # the order of acceptance in its jobs_dir (createdAt can tie), 0 in older records
    # each run that failed: {"at": when, "error": why}; a failed job is queued again at the next start
    # until it has failed `JobBook.attempts` times
    failures: list[dict[str, str]] = field(default_factory=list)

    @property
    def resumable(self) -> bool:
        return self.documentIds is not None

    def view(self, with_ids: bool = True) -> dict[str, Any]:
        """The job as the API shows it; `with_ids=False` leaves out `documentIds` (the list of jobs)."""
        shown = asdict(self)
        if not with_ids:
            del shown["documentIds"]
        return {
            **shown,
            "progress": {"embedded": self.embedded, "stored": self.stored, "chunks": self.chunks},
        }


class JobDocuments(Protocol):
    """Where a job's documents wait: the document record (`app.store.record.DocumentRecord`), or
    `HeldDocuments` for a service that keeps none."""

    def put(self, documents: Sequence[Document]) -> int: ...

    def get(self, doc_ids: Sequence[str]) -> list[Document]: ...

    def delete(self, doc_ids: Sequence[str], tombstone: bool = False) -> int: ...


class HeldDocuments:
    """The jobs' documents of a service whose Sieve keeps no document record (tests and benchmarks of the
    index alone): held in memory, so lost with the process; a job resumed without them skips them."""

    def __init__(self) -> None:
        self._documents: dict[str, Document] = {}
        self._lock = threading.Lock()

    def put(self, documents: Sequence[Document]) -> int:
        with self._lock:
            self._documents.update((d.doc_id, d) for d in documents)
        return len(documents)

    def get(self, doc_ids: Sequence[str]) -> list[Document]:
        with self._lock:
            return [self._documents[i] for i in doc_ids if i in self._documents]

    def delete(self, doc_ids: Sequence[str], tombstone: bool = False) -> int:
        """Forget `doc_ids` (no tombstone is kept: without a record there is nothing to keep it in)."""
        with self._lock:
            return sum(self._documents.pop(i, None) is not None for i in doc_ids)


@dataclass(frozen=True)
class QueueBound:
    """At most this many documents and bytes in unfinished jobs (rag.server.max_queued_documents and
    max_queued_bytes)."""

    documents: int
    bytes: int


@dataclass
class _Queued:
    job: Job
    work: Callable[[Job], dict[str, Any]]


@dataclass
class JobBook:
    """The jobs of this server: kept in memory, each also a JSON file in `directory`. `clock()`: the time
    (seconds since the epoch) retention compares `createdAt` with."""

    directory: Path
    keep: int = 100
    keep_hours: float = 24.0
    bound: QueueBound | None = None
    clock: Callable[[], float] = time.time
    attempts: int = 3  # runs of a job that fails, the first included (rag.server.job_attempts)
    # called when `accept` kept documents (`before()`) and then could not record their job
    kept_without_job: Callable[[], None] | None = None
    _jobs: dict[str, Job] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # serialises the acceptance of jobs: the bound is checked and the job created with no other in between
    _accepting: threading.Lock = field(default_factory=threading.Lock)
    # (documents, bytes, seconds) of the last finished jobs: the pace Retry-After is estimated from
    _pace: list[tuple[int, int, float]] = field(default_factory=list)
    _sequence: int = 0  # the highest `Job.sequence` given or read
    # the jobs' documents when the Sieve keeps no document record
    held: HeldDocuments = field(default_factory=HeldDocuments)
    # ids of jobs whose last change could not be saved to their record (`update`)
    _unsaved: set[str] = field(default_factory=set)

    def recover(self) -> list[Job]:
        """Load the recorded jobs. Those that were queued or running, and those that failed fewer than
        `attempts` times, are queued again when they carry their `documentIds` (`unfinished()` lists them,
        to be submitted once the service is up); those of the older shape become `interrupted` (returned).
        A file that cannot be read becomes an `unreadable` job of the id its name carries (left on disk as
        it is, for a person to look at, until retention prunes it)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        interrupted = []
        for path in sorted(self.directory.glob("j-*.json")):
            try:
                job = Job(**json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError, TypeError) as exc:
                unreadable = unreadable_job(path, exc)
                if unreadable is None:
                    log.warning(
                        "ignoring job file %s: its name is no job id and it cannot be read: %s", path, exc
                    )
                    continue
                log.error(
                    "job %s: its record %s cannot be read (%s); it is reported `unreadable`. Its documents "
                    "are in the document record: the start-up reconciliation indexes them",
                    unreadable.id,
                    path,
                    exc,
                )
                job = unreadable
            if job.state == "failed" and job.resumable and len(job.failures) < self.attempts:
                log.info(
                    "job %s failed %d of %d times (rag.server.job_attempts; last: %s): queued again",
                    job.id,
                    len(job.failures),
                    self.attempts,
                    job.error,
                )
                job.state, job.finishedAt, job.error = "queued", None, None
            if job.state not in FINISHED and job.resumable:
                job.state, job.startedAt, job.resumed = "queued", None, job.resumed + 1
                self._save(job)
            elif job.state not in FINISHED:
                job.state = "interrupted"
                job.finishedAt = job.finishedAt or _now()
                job.error = (
                    EXPERIMENT_INTERRUPTED if job.kind == "experiment" else interrupted_error(job.stored)
                )
                self._save(job)
                interrupted.append(job)
            self._jobs[job.id] = job
            self._sequence = max(self._sequence, job.sequence)
        self._prune()
        return interrupted

    def unfinished(self) -> list[Job]:
        """The queued and running jobs, oldest first."""
        with self._lock:
            waiting = [j for j in self._jobs.values() if j.state not in FINISHED]
        return sorted(waiting, key=_acceptance)

    def accept(
        self, kind: str, document_ids: Sequence[str], nbytes: int, chunks: int, before: Callable[[], object]
    ) -> Job:
        """Create a job over `document_ids` if the queue has room for it (else `QueueFull`, and `before` is
        not called). Its record is saved first, then `before()` (the documents' record write) is called,
        and only then does the job exist: a record that cannot be saved (a full disk) raises before any
        document is kept, and a `before()` that raises takes the saved record away again, so a refused
        write leaves neither. (Killed between the two, the next start resumes a job whose documents the
        record may lack: it skips them, `skipped`.) A job is refused only while others wait: one alone
        larger than the bound is accepted into an empty queue."""
        with self._accepting:
            self._check_room(len(document_ids), nbytes)
            job = self._new(kind, len(document_ids), chunks, list(document_ids), nbytes)
            self._save(job)
            try:
                before()
            except BaseException:
                (self.directory / f"{job.id}.json").unlink(missing_ok=True)
                # some may have been kept before the failure, with no job to index them
                if self.kept_without_job is not None:
                    self.kept_without_job()
                raise
            with self._lock:
                self._jobs[job.id] = job
        self._prune()
        return job

    def create(
        self,
        kind: str,
        documents: int,
        chunks: int,
        document_ids: list[str] | None = None,
        nbytes: int = 0,
    ) -> Job:
        job = self._new(kind, documents, chunks, document_ids, nbytes)
        with self._lock:
            self._jobs[job.id] = job
        self._save(job)
        self._prune()
        return job

    def _new(
        self, kind: str, documents: int, chunks: int, document_ids: list[str] | None, nbytes: int
    ) -> Job:
        """A queued job with the next sequence number, not yet kept in memory or on disk."""
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        job = Job(
            f"j-{stamp}-{secrets.token_hex(4)}",
            kind,
            "queued",
            _now(),
            documents,
            chunks,
            documentIds=document_ids,
            bytes=nbytes,
        )
        with self._lock:
            self._sequence = job.sequence = self._sequence + 1
        return job

    def update(self, job: Job, **changes: Any) -> None:
        """Change `job` in memory, then save its record. A record that cannot be saved (a full disk) is
        logged, not raised: the job goes on and the API shows it as it is; its record is saved again with
        the next save that succeeds (`save_unsaved`), and until then the file holds its last saved state
        (at worst an unfinished one, which the next start resumes)."""
        with self._lock:
            for key, value in changes.items():
                setattr(job, key, value)
        try:
            self._save(job)
        except OSError as exc:
            with self._lock:
                first = job.id not in self._unsaved
                self._unsaved.add(job.id)
            if first:
                log.warning(
                    "job %s: its record could not be saved (kept in memory; saved later): %s", job.id, exc
                )
            return
        self.save_unsaved()

    def save_unsaved(self) -> int:
        """Save the records `update` could not save; how many are still unsaved."""
        with self._lock:
            waiting = [self._jobs[i] for i in self._unsaved if i in self._jobs]
            self._unsaved.clear()
        for job in waiting:
            try:
                self._save(job)
            except OSError:
                with self._lock:
                    self._unsaved.add(job.id)
        with self._lock:
            return len(self._unsaved)

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id) if JOB_ID.match(job_id) else None

    def all(self) -> list[Job]:
        with self._lock:
            return sorted(self._jobs.values(), key=_acceptance, reverse=True)

    def listed(self) -> list[Job]:
        """What GET /api/jobs lists, newest first: every unfinished job and the newest `keep` finished ones
        (those kept longer for `keep_hours` are still found by id)."""
        everything = self.all()
        finished = [j for j in everything if j.state in FINISHED][: self.keep]
        shown = {j.id for j in finished}
        return [j for j in everything if j.state not in FINISHED or j.id in shown]

    def finished_in(self, job: Job, seconds: float) -> None:
        """Record how long `job` took: the pace Retry-After estimates come from. A job of no documents (an
        experiment) says nothing of the write pace: not recorded."""
        if job.documents == 0:
            return
        with self._lock:
            self._pace = [*self._pace[-(PACE_WINDOW - 1) :], (job.documents, job.bytes, seconds)]

    def _check_room(self, documents: int, nbytes: int) -> None:
        """`QueueFull` when the unfinished jobs and this one together pass the bound."""
        waiting = self.unfinished()
        if self.bound is None or not waiting:
            return
        queued_docs = sum(j.documents for j in waiting)
        queued_bytes = sum(j.bytes for j in waiting)
        held = f"the write queue holds {len(waiting)} jobs ({queued_docs} documents, {queued_bytes} bytes)"
        docs_per_s, bytes_per_s = self._measured_pace()
        if queued_docs + documents > self.bound.documents:
            excess = queued_docs + documents - self.bound.documents
            raise QueueFull(
                f"{held}; {documents} more documents would pass rag.server.max_queued_documents="
                f"{self.bound.documents}. Retry later",
                _retry_after(excess / docs_per_s),
            )
        if queued_bytes + nbytes > self.bound.bytes:
            excess = queued_bytes + nbytes - self.bound.bytes
            raise QueueFull(
                f"{held}; {nbytes} more bytes would pass rag.server.max_queued_bytes={self.bound.bytes}. "
                "Retry later",
                _retry_after(excess / bytes_per_s if bytes_per_s else excess / docs_per_s),
            )

    def _measured_pace(self) -> tuple[float, float]:
        """(documents, bytes) a second over the last finished jobs; bytes 0.0 when unmeasured."""
        with self._lock:
            pace = list(self._pace)
        seconds = sum(s for _, _, s in pace)
        if not pace or seconds <= 0:
            return UNMEASURED_DOCUMENTS_PER_S, 0.0
        docs = sum(d for d, _, _ in pace)
        return max(docs / seconds, 1e-3), sum(b for _, b, _ in pace) / seconds

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
        """Drop the finished jobs that are both beyond the newest `keep` and accepted more than
        `keep_hours` ago (every unfinished one stays)."""
        cutoff = self.clock() - self.keep_hours * 3600
        with self._lock:
            finished = sorted((j for j in self._jobs.values() if j.state in FINISHED), key=_acceptance)
            beyond = finished[: max(0, len(finished) - self.keep)]
            drop = [j for j in beyond if _epoch(j.createdAt) < cutoff]
            for job in drop:
                del self._jobs[job.id]
        for job in drop:
            (self.directory / f"{job.id}.json").unlink(missing_ok=True)


class JobRunner:
    """One worker thread that runs submitted jobs in order.

    The thread outlives any job: a job's failure, or a record that cannot be saved, is the job's (or is
    logged), never the thread's. `space()` says why writes cannot be made now (a full disk:
    `SpaceGuard.problem`) or None: a job does not start while it says so, and a job stopped for lack of
    space (`storage_exhausted`) is queued again (`error` says why it waits) and runs again once there is
    space, its committed batches kept."""

    def __init__(self, book: JobBook, space: Callable[[], str | None] | None = None):
        self.book = book
        # called in the worker thread after a job ends (done or failed) when no other job waits: the
        # service's reconciliation of the index with the document record (app/api/reconcile.py)
        self.after_jobs: Callable[[], None] | None = None
        self.space = space
        self._queue: queue.Queue[_Queued | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="sieve-jobs", daemon=True)
        self._start_lock = threading.Lock()
        self._stopping = threading.Event()

    def reconcile_soon(self) -> None:
        """Run `after_jobs()` after the jobs queued now (documents were kept with no job to index them)."""
        self._start()
        self._queue.put(_RECONCILE)

    def _start(self) -> None:
        with self._start_lock:
            if not self._thread.is_alive() and self._thread.ident is None:
                self._thread.start()

    def submit(self, job: Job, work: Callable[[Job], dict[str, Any]]) -> None:
        """Run `work(job)` after the jobs before it; its return value becomes the job's report.
        `JobInterrupted` queues a resumable job again (the next start runs it) and marks one of the older
        shape interrupted; any other exception marks it failed. The worker thread starts with the first
        job."""
        self._start()
        self._queue.put(_Queued(job, work))

    def stop(self, timeout: float) -> bool:
        """Stop taking jobs and wait up to `timeout` s for the running one; False if it is still running.
        Jobs still queued stay `queued` on disk and resume at the next start."""
        self._stopping.set()
        with self._start_lock:
            if self._thread.ident is None:
                return True  # never started: nothing runs
        self._queue.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            if item is _RECONCILE:
                self._after_jobs()
                continue
            try:
                if not self._run(item):
                    return  # shutting down: the queued jobs stay as they are on disk
            except Exception:  # a bug in the bookkeeping: the job's, not the thread's
                log.exception("job %s: the job runner failed on it; it goes on with the next", item.job.id)
            self._after_jobs()

    def _run(self, item: _Queued) -> bool:
        """Run one job until it ends (or the shutdown stops it: False)."""
        job = item.job
        retries = 0
        while True:
            if not self._wait_for_space(job):
                return False
            self.book.update(job, state="running", startedAt=_now(), error=None)
            started = time.perf_counter()
            try:
                report = item.work(job)
            except JobInterrupted as exc:
                if job.resumable:
                    self.book.update(job, state="queued", startedAt=None)
                    log.warning("job %s stopped by the shutdown, resumes at the next start: %s", job.id, exc)
                else:
                    self.book.update(job, state="interrupted", finishedAt=_now(), error=str(exc))
                    log.warning("job %s interrupted: %s", job.id, exc)
                return False
            except Exception as exc:
                if storage_exhausted(exc) and self.space is not None:
                    self.book.update(job, state="queued", startedAt=None, error=_waiting(exc))
                    log.warning(
                        "job %s stopped for lack of disk space, runs again once there is: %s", job.id, exc
                    )
                    # the guard may find room while the write still fails: look again, ever less often
                    retries += 1
                    if self._stopping.wait(min(SPACE_RETRY_MAX_S, SPACE_POLL_S * 2**retries)):
                        return False
                    continue
                log.exception("job %s failed", job.id)
                error, at = f"{type(exc).__name__}: {exc}", _now()
                failures = [*job.failures, {"at": at, "error": error}]
                self.book.update(job, state="failed", finishedAt=at, error=error, failures=failures)
                return True
            seconds = time.perf_counter() - started
            self.book.update(job, state="done", finishedAt=_now(), report=report)
            self.book.finished_in(job, seconds)
            log.info("job %s done in %.1fs", job.id, seconds)
            return True

    def _after_jobs(self) -> None:
        """`after_jobs()` once the queue is empty; what it raises is logged, never the worker's end."""
        if self.after_jobs is None or not self._queue.empty():
            return
        try:
            self.after_jobs()
        except Exception:
            log.exception("the reconciliation after the write jobs failed")

    def _wait_for_space(self, job: Job) -> bool:
        """Return once `space()` finds room (True), or when the runner is stopped (False); meanwhile the job
        stays queued, its `error` saying why it waits."""
        if self.space is None:
            return not self._stopping.is_set()
        said = None
        while (problem := self.space()) is not None:
            if problem != said:
                self.book.update(job, state="queued", error=_waiting(problem))
                if said is None:
                    log.warning("job %s waits for disk space: %s", job.id, problem)
                said = problem
            if self._stopping.wait(SPACE_POLL_S):
                return False
        self.book.save_unsaved()
        return not self._stopping.is_set()


def _waiting(reason: object) -> str:
    return f"waiting for disk space (it runs once there is): {reason}"


# a request to the worker to reconcile (`JobRunner.reconcile_soon`), not a job
_RECONCILE = _Queued(Job("", "reconcile", "queued", "", 0, 0), lambda job: {})


def unreadable_job(path: Path, exc: Exception) -> Job | None:
    """The job a file that cannot be read stands for: the id its name carries (`j-<time>-<hex>.json`),
    `createdAt` the time in that id (retention counts from it), state `unreadable` and the reason in
    `error`; None when the name is no job id."""
    job_id = path.name.removesuffix(".json")
    if not JOB_ID.match(job_id):
        return None
    stamp = datetime.strptime(job_id[2:17], "%Y%m%dT%H%M%S").replace(tzinfo=UTC)
    return Job(
        job_id,
        "unknown",
        "unreadable",
        stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        0,
        0,
        error=(
            f"the job's record {path.name} could not be read at the last start "
            f"({type(exc).__name__}: {exc}); its documents were kept in the document record when it was "
            "accepted, and the start-up reconciliation indexes every recorded document the index lacks"
        ),
    )


EXPERIMENT_INTERRUPTED = (
    "the server stopped before this experiment finished; nothing the server serves was changed. Run it "
    "again: the variant collections it completed, and the evaluations it finished, are reused"
)


def interrupted_error(stored: int) -> str:
    """What a job of the older shape found unfinished at the next start says: what of it is stored, and
    what to do."""
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


def _acceptance(job: Job) -> tuple[int, str, str]:
    """The order jobs were accepted in (`sequence`; records of the older shape, 0, by time)."""
    return job.sequence, job.createdAt, job.id


def _retry_after(seconds: float) -> int:
    return int(min(RETRY_AFTER_MAX_S, max(RETRY_AFTER_MIN_S, math.ceil(seconds))))


def _epoch(stamp: str) -> float:
    """Seconds since the epoch of an ISO time (`createdAt`); 0.0 for one that cannot be read."""
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
