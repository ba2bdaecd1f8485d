"""The query log: one JSON line per answered `/api/retrieve` request, written off the request path, kept
within a size and an age (settings `rag.querylog`, docs/query-log.md).

A record, one line of UTF-8 JSON (`query_record`):
  time          when the answer was made: UTC, ISO 8601 with milliseconds and "Z" (2026-05-04T09:12:03.120Z)
  query         the query text as sent
  knowledgeTag  the request's knowledge tag, or null
  topK          the K the chain was asked for (the request's topK, else rag.retrieval.top_k)
  results       the returned documents in rank order: {chunkId, docId, score, scoreKey}, where scoreKey is
                the score that ordered the list at that rank: "rerank" when the candidate has one, else
                "fused", else "dense", else "bm25" (the chain ranks by fusion, then reranks the best); score
                is that score rounded to 6 decimals (both null for a candidate with none)
  abstained     true when no document was returned
  latencyMs     the chain's time for the query (the response's latencyMs)
  principal     with access scopes on (rag.access.enabled): the name of the principal that asked ("admin"
                for the admin token); `GET /api/querylog` shows a principal only its own records

Every field a client sends is bounded before it gets here (`app.api.bounds`: the query by
rag.retrieval.max_query_chars, the tag by MAX_TAG_CHARS), so a record is a few kilobytes at most.

Writing: `QueryLog.submit` encodes a record (`app.jsonl.encode_line`), puts it on a bounded queue and returns
at once, so a request never waits for the disk. A record is dropped, and counted in `dropped`, when the queue
is full (`dropped_queue_full`) or when it is over the byte budget (`dropped_over_budget`): with
`keep_hours` set, a token bucket lets through at most `capacity * 0.9 / keep_hours` bytes an hour plus a burst
of `capacity * 0.1`, where capacity is what the rotated files hold (max_files * max_bytes; max_bytes with
max_files 0). So no burst of requests, however fast or large, writes more than the rotated files hold in
keep_hours hours: the history of the last keep_hours hours stays on disk (entries older than that may be
rotated out). One daemon thread writes what is queued, in order, and is flushed and stopped by `close` (the
server's shutdown).

Files: the current file is `path`; rotated files are `path.1` (the newest) to `path.<max_files>` (the oldest).
Every file is created with mode 0600 (query text can be sensitive) and the current file is set to 0600 when
opened; the folder, when created, is 0700.
- Size: before a line would take the current file past `max_bytes`, the file is rotated: `path.<max_files>`
  is deleted, each `path.i` becomes `path.<i+1>`, and `path` becomes `path.1` (with max_files 0 it is
  deleted). A file always receives at least one line, so one line longer than max_bytes still is written.
- Age: with `max_age_days` set, `prune` (at start, then every `PRUNE_EVERY_S` while the writer runs) deletes
  a rotated file last modified before the cut-off (now - max_age_days days: all its lines are older), and in
  every remaining file drops the lines before the first one whose time is at or after the cut-off (lines are
  written in order). Numbered files beyond max_files (left by a larger setting) are deleted too.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field

from app.access.scope import Principal
from app.jsonl import encode_line
from app.querylog_files import log_files, rotated_file
from app.retrieval.types import SCORE_BM25, SCORE_DENSE, SCORE_FUSED, SCORE_RERANK, RetrievalResult
from app.settings import QueryLogSettings

log = logging.getLogger(__name__)

FILE_MODE = 0o600
FOLDER_MODE = 0o700
# how often the writer applies the age limit while it runs (it also does at start)
PRUNE_EVERY_S = 600.0
# the writer wakes this often when idle, to see whether it is asked to stop or a prune is due
IDLE_WAKE_S = 0.25
# records written with one write call at most
WRITE_BATCH = 256
# of the byte budget's capacity, the part that may come at once; the rest comes at the steady rate
BURST_SHARE = 0.1
# the scores that can have ordered a returned list, the one applied last first
ORDER_KEYS = (SCORE_RERANK, SCORE_FUSED, SCORE_DENSE, SCORE_BM25)
READ_BLOCK = 64 * 1024

_WAKE = object()


class QueryLogParams(BaseModel):
    """The query parameters of `GET /api/querylog`; any other parameter is a 422."""

    model_config = ConfigDict(extra="forbid")

    limit: int = Field(100, ge=1, le=1000, description="how many entries, the newest first")


class ByteBudget:
    """A token bucket over bytes: `take(n)` is True while the bytes taken stay within `burst` plus `rate`
    bytes a second since the start (thread-safe)."""

    def __init__(self, rate: float, burst: float, monotonic: Callable[[], float] = time.monotonic):
        self.rate = rate
        self.burst = burst
        self.monotonic = monotonic
        self._tokens = burst
        self._last = monotonic()
        self._lock = threading.Lock()

    @classmethod
    def for_settings(
        cls, settings: QueryLogSettings, monotonic: Callable[[], float] = time.monotonic
    ) -> ByteBudget | None:
        """The budget that keeps `settings.keep_hours` of history in the rotated files, or None (no
        keep_hours)."""
        if settings.keep_hours is None:
            return None
        capacity = settings.max_bytes * max(settings.max_files, 1)
        rate = capacity * (1.0 - BURST_SHARE) / (settings.keep_hours * 3600.0)
        return cls(rate, capacity * BURST_SHARE, monotonic)

    def take(self, size: int) -> bool:
        with self._lock:
            now = self.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            if size > self._tokens:
                return False
            self._tokens -= size
            return True


def utc_timestamp(moment: datetime) -> str:
    """`moment` (aware) as UTC ISO 8601 with milliseconds and a "Z": 2026-05-04T09:12:03.120Z."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_timestamp(text: str) -> datetime:
    """The inverse of `utc_timestamp` (any ISO 8601 time with an offset or "Z"); a time without an offset
    is taken as UTC. ValueError for anything else."""
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def query_record(
    result: RetrievalResult,
    knowledge_tag: str | None,
    top_k: int,
    principal: Principal | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The log record of one answered query (see the module docstring for each field)."""
    results = []
    for c in result.documents:
        key = next((k for k in ORDER_KEYS if k in c.scores), None)
        score = round(float(c.scores[key]), 6) if key is not None else None
        results.append({"chunkId": c.chunk_id, "docId": c.doc_id, "score": score, "scoreKey": key})
    record: dict[str, Any] = {
        "time": utc_timestamp(now or datetime.now(UTC)),
        "query": result.query,
        "knowledgeTag": knowledge_tag,
        "topK": top_k,
        "results": results,
        "abstained": not result.documents,
        "latencyMs": round(float(result.latency_ms), 3),
    }
    if principal is not None:
        record["principal"] = principal.name
    return record


class QueryLog:
    """The writer: `start()`, then `submit(record)` from any thread, `newest(n)` to read back, `close()`."""

    def __init__(
        self,
        settings: QueryLogSettings,
        clock: Callable[[], float] = time.time,
        prune_every_s: float = PRUNE_EVERY_S,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        """`clock`: seconds since the epoch, for the age limit; `monotonic`: seconds, for the byte budget
        (tests pass their own)."""
        self.settings = settings
        self.path = Path(settings.path)
        self.clock = clock
        self.monotonic = monotonic
        self.prune_every_s = prune_every_s
        self.dropped_queue_full = 0  # records not logged because the queue was full (or the log was closed)
        self.dropped_over_budget = 0  # records not logged because they were over the byte budget
        self.write_errors = 0  # records lost to a failed write
        self.budget = ByteBudget.for_settings(settings, monotonic)
        self._queue: queue.Queue[object] = queue.Queue(maxsize=settings.queue_size)
        self._file_lock = threading.Lock()  # the files: the writer's writes, rotations and prunes; reads
        self._fd: int | None = None
        self._size = 0
        self._counts = threading.Condition()  # submitted / processed, for `wait_written`
        self._submitted = 0
        self._processed = 0
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_prune = -float("inf")
        self._warned_full = False

    # -- the request side ------------------------------------------------------------------------------

    @property
    def dropped(self) -> int:
        """Records not logged: the queue full, the log closed, or over the byte budget."""
        return self.dropped_queue_full + self.dropped_over_budget

    def submit(self, record: dict[str, Any]) -> bool:
        """Queue `record` for the writer; False (and `dropped` + 1) when it cannot be encoded, is over the
        byte budget, or the queue is full or the log closed. Never blocks."""
        if self._closing.is_set():
            self._count_drop()
            return False
        try:
            line = encode_line(record)
        except (TypeError, ValueError) as exc:
            log.error("query log: an entry could not be encoded, skipped: %s", exc)
            with self._counts:
                self.write_errors += 1
            return False
        if self.budget is not None and not self.budget.take(len(line)):
            with self._counts:
                self.dropped_over_budget += 1
                first = self.dropped_over_budget == 1
            if first:
                log.warning(
                    "query log: entries come faster than rag.querylog.keep_hours=%s allows (%.0f bytes/s); "
                    "those over the budget are dropped (counted; GET /api/querylog shows how many)",
                    self.settings.keep_hours,
                    self.budget.rate,
                )
            return False
        try:
            self._queue.put_nowait(line)
        except queue.Full:
            self._count_drop()
            if not self._warned_full:
                self._warned_full = True
                log.warning(
                    "query log: the queue of %d entries is full, entries are dropped (counted; GET "
                    "/api/querylog shows how many)",
                    self.settings.queue_size,
                )
            return False
        with self._counts:
            self._submitted += 1
        return True

    def _count_drop(self) -> None:
        with self._counts:
            self.dropped_queue_full += 1

    # -- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> QueryLog:
        """Open the current file (creating the folder and the file) and start the writer thread. OSError
        when the file cannot be opened."""
        with self._file_lock:
            self._open()
        self._thread = threading.Thread(target=self._run, name="sieve-querylog", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> bool:
        """Stop taking records, write every queued one, close the file; True when the writer finished
        within `timeout` seconds."""
        self._closing.set()
        try:
            self._queue.put_nowait(_WAKE)
        except queue.Full:
            pass  # the writer is busy with a full queue and sees `_closing` when it has written it
        finished = True
        if self._thread is not None:
            self._thread.join(timeout)
            finished = not self._thread.is_alive()
        if finished:
            with self._file_lock:
                self._close_file()
        if self.dropped or self.write_errors:
            log.warning(
                "query log: %d entries dropped (queue full), %d over the byte budget, %d lost to write "
                "errors",
                self.dropped_queue_full,
                self.dropped_over_budget,
                self.write_errors,
            )
        return finished

    def wait_written(self, timeout: float) -> bool:
        """Wait until every record submitted before this call is written (or failed); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._counts:
            target = self._submitted
            while self._processed < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._counts.wait(left)
        return True

    # -- the writer thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        self._prune_if_due()
        while True:
            try:
                first = self._queue.get(timeout=IDLE_WAKE_S)
            except queue.Empty:
                if self._closing.is_set():
                    return
                self._prune_if_due()
                continue
            batch = [first]
            while len(batch) < WRITE_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            records = [r for r in batch if r is not _WAKE]
            if records:
                self._write(records)
            if self._closing.is_set() and self._queue.empty():
                return
            self._prune_if_due()

    def _write(self, records: list[object]) -> None:
        lines = [r for r in records if isinstance(r, bytes)]  # encoded by `submit`
        with self._file_lock:
            for line in lines:
                try:
                    self._append(line)
                except OSError as exc:
                    self.write_errors += 1
                    log.error("query log: writing %s failed: %s", self.path, exc)
                    self._close_file()
        with self._counts:
            self._processed += len(records)
            self._counts.notify_all()

    def _append(self, line: bytes) -> None:
        if self._fd is None:
            self._open()
        if self._size > 0 and self._size + len(line) > self.settings.max_bytes:
            self._rotate()
        os.write(cast(int, self._fd), line)  # opened above or by _rotate
        self._size += len(line)

    def _prune_if_due(self) -> None:
        now = time.monotonic()
        if now - self._last_prune < self.prune_every_s:
            return
        self._last_prune = now
        try:
            self.prune()
        except OSError as exc:
            log.error("query log: applying the age limit to %s failed: %s", self.path, exc)

    # -- files ---------------------------------------------------------------------------------------

    def rotated(self, index: int) -> Path:
        return rotated_file(self.path, index)

    def files(self) -> list[Path]:
        return log_files(self.path)

    def _open(self) -> None:
        if not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, mode=FOLDER_MODE, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
        os.fchmod(fd, FILE_MODE)  # a file made before with a wider mode (or under another umask)
        self._fd = fd
        self._size = os.fstat(fd).st_size

    def _close_file(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _rotate(self) -> None:
        self._close_file()
        keep = self.settings.max_files
        if keep == 0:
            self.path.unlink(missing_ok=True)
        else:
            self.rotated(keep).unlink(missing_ok=True)
            for index in range(keep - 1, 0, -1):
                if self.rotated(index).exists():
                    os.replace(self.rotated(index), self.rotated(index + 1))
            os.replace(self.path, self.rotated(1))
        self._open()

    def prune(self) -> None:
        """Apply `max_files` and `max_age_days` to the files on disk now (see the module docstring)."""
        with self._file_lock:
            index = self.settings.max_files + 1
            while self.rotated(index).exists():
                self.rotated(index).unlink()
                index += 1
            if self.settings.max_age_days is None:
                return
            cutoff = self.clock() - self.settings.max_age_days * 86400.0
            for path in self.files():
                if path != self.path and path.stat().st_mtime < cutoff:
                    path.unlink()
                elif self._starts_before(path, cutoff):
                    self._drop_lines_before(path, cutoff)

    @staticmethod
    def _starts_before(path: Path, cutoff: float) -> bool:
        with path.open("rb") as f:
            first = f.readline()
        return bool(first) and _line_time(first) < cutoff

    def _drop_lines_before(self, path: Path, cutoff: float) -> None:
        """Rewrite `path` from its first line whose time is at or after `cutoff` (atomically, mode 0600)."""
        with path.open("rb") as f:
            lines = f.readlines()
        start = next((i for i, line in enumerate(lines) if _line_time(line) >= cutoff), len(lines))
        current = path == self.path
        if current:
            self._close_file()
        if start == len(lines) and not current:
            path.unlink()
            return
        temporary = path.with_name(f".{path.name}.pruning")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        try:
            os.fchmod(fd, FILE_MODE)
            os.write(fd, b"".join(lines[start:]))
        finally:
            os.close(fd)
        os.replace(temporary, path)
        if current:
            self._open()

    # -- reading -------------------------------------------------------------------------------------

    def newest(self, limit: int, principal: str | None = None) -> list[dict[str, Any]]:
        """The newest `limit` records on disk, newest first (a line that is not a JSON object is skipped);
        with `principal`, only that principal's records."""
        with self._file_lock:
            return read_newest(self.path, limit, self.files(), principal)


def read_newest(
    path: Path, limit: int, files: list[Path] | None = None, principal: str | None = None
) -> list[dict[str, Any]]:
    """The newest `limit` records of the log at `path` (its current file, then path.1, path.2, ...),
    newest first; with `principal`, only the records whose `principal` is that name. Lines that are not
    JSON objects (a line cut short by a crash) are skipped."""
    if files is None:
        files = log_files(path)
    out: list[dict[str, Any]] = []
    for file in files:
        for line in _reverse_lines(file):
            if len(out) >= limit:
                return out
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and (principal is None or record.get("principal") == principal):
                out.append(record)
    return out


def _reverse_lines(path: Path) -> Iterator[bytes]:
    """The non-empty lines of `path`, last first, reading blocks from the end."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return
    with f:
        position = f.seek(0, os.SEEK_END)
        tail = b""
        while position > 0:
            step = min(READ_BLOCK, position)
            position -= step
            f.seek(position)
            block = f.read(step) + tail
            parts = block.split(b"\n")
            tail = parts[0]
            for part in reversed(parts[1:]):
                if part.strip():
                    yield part
        if tail.strip():
            yield tail


def _line_time(line: bytes) -> float:
    """The `time` of a log line in seconds since the epoch; -inf for a line without a readable one (so
    the age limit drops it with the old lines before it)."""
    try:
        return parse_timestamp(json.loads(line)["time"]).timestamp()
    except (ValueError, KeyError, TypeError):
        return -float("inf")


def open_query_log(settings: QueryLogSettings) -> QueryLog | None:
    """The started query log when `settings.enabled`, else None; None (and an error in the log) when its
    file cannot be opened, so a bad path costs the log, not the service."""
    if not settings.enabled:
        return None
    try:
        return QueryLog(settings).start()
    except OSError as exc:
        log.error("query log is off: cannot open %s: %s", settings.path, exc)
        return None
