"""A full disk is refused, never a hang: the free-space guard (`SpaceGuard`), which failures count as a full
disk (`storage_exhausted`), the 507 the API answers for them, a job record that cannot be saved, a job that
waits for space, and an embedded store that is never called on a full disk. Fakes only: no model, no
Chroma; the real server on a small filesystem is tests/integration/test_disk_full.py."""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.api.jobs import Job, JobBook, JobRunner
from app.api.readiness import StoreProbe
from app.settings import Settings
from app.store import ChromaStore, InsufficientStorage, SpaceGuard, StoreFailedError, storage_exhausted
from app.store.record import RecordError, failing_as
from app.store.space import MIB
from tests.fixtures.fake_api import FakeSieve, FakeStore, api_settings, serve_fake  # noqa: F401

WAIT_S = 10.0
RESERVE = 4 * MIB


class Disk:
    """The free bytes a fake filesystem reports; `free` is what `SpaceGuard` measures."""

    def __init__(self, free: int) -> None:
        self.bytes = free
        self.measured: list[Path] = []

    def free(self, folder: Path) -> int:
        self.measured.append(folder)
        return self.bytes


def full(kind: int = errno.ENOSPC) -> OSError:
    return OSError(kind, os.strerror(kind), "/data/jobs/.job-x.tmp")


def record_error_from(exc: Exception) -> RecordError:
    with pytest.raises(RecordError) as info, failing_as("document record /data/documents.sqlite3", "put"):
        raise exc
    return info.value


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


# -- what counts as a full disk ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [
        full(errno.ENOSPC),
        full(errno.EDQUOT),
        sqlite3.OperationalError("database or disk is full"),
        InsufficientStorage("insufficient storage: ..."),
    ],
    ids=["ENOSPC", "EDQUOT", "sqlite-full", "guard"],
)
def test_a_full_disk_or_quota_is_told_wherever_it_is_in_the_chain(exc: Exception) -> None:
    assert storage_exhausted(exc)
    if not isinstance(exc, InsufficientStorage):  # (a StoreError: the record passes it on unwrapped)
        assert storage_exhausted(record_error_from(exc))  # wrapped once, at the record's boundary
    try:
        try:
            raise exc
        except Exception:
            raise ValueError("while handling it") from None  # no __cause__, only __context__ hidden
    except ValueError as during:
        assert not storage_exhausted(during)  # `from None`: the full disk was not its cause
    try:
        try:
            raise exc
        except Exception:
            raise ValueError("while handling it")  # noqa: B904 (the implicit context is the point)
    except ValueError as during:
        assert storage_exhausted(during)


@pytest.mark.parametrize(
    "exc",
    [
        OSError(errno.EACCES, "Permission denied"),
        sqlite3.OperationalError("database is locked"),
        ValueError(),
    ],
)
def test_other_failures_are_not_a_full_disk(exc: Exception) -> None:
    assert not storage_exhausted(exc)
    assert not storage_exhausted(None)


# -- the guard -----------------------------------------------------------------------------------------------


def test_the_guard_refuses_what_would_leave_less_than_the_reserve_and_names_the_folder() -> None:
    disk = Disk(RESERVE + MIB)
    guard = SpaceGuard(["/data/store", "/data/jobs", "/data/store"], RESERVE, free=disk.free)
    assert guard.problem() is None
    assert disk.measured == [Path("/data/store"), Path("/data/jobs")]  # each folder once
    assert guard.problem(need=MIB) is None  # exactly the reserve left
    small = SpaceGuard(["/data"], RESERVE, free=Disk(RESERVE + 1000).free).problem(need=1536)
    assert small is not None and "and 1.5 KiB for this write" in small
    assert guard.problem(need=MIB + 1) == (
        "insufficient storage: 5.0 MiB free on the filesystem of /data/store, less than "
        "rag.store.min_free_mb=4 MiB and 1.0 MiB for this write; writes are refused until space is freed "
        "there"
    )
    disk.bytes = RESERVE - 1
    with pytest.raises(InsufficientStorage, match=r"^insufficient storage: 4\.0 MiB free .* less than "):
        guard.check()


def test_a_reserve_of_zero_guards_nothing_and_an_unreadable_folder_is_not_judged() -> None:
    assert SpaceGuard(["/data"], 0, free=Disk(0).free).problem(need=10**12) is None

    def unreadable(folder: Path) -> int:
        raise OSError(errno.EIO, "I/O error")

    assert SpaceGuard(["/data"], RESERVE, free=unreadable).problem() is None


def test_the_real_measure_reads_the_nearest_existing_folder(tmp_path: Path) -> None:
    guard = SpaceGuard([tmp_path / "not" / "made" / "yet"], 1)
    assert guard.problem() is None  # tmp_path's filesystem has a byte free


# -- the API: 507 --------------------------------------------------------------------------------------------


class FailingSieve(FakeSieve):
    """Its writes fail with `error`."""

    def __init__(self, settings: Settings, error: Exception) -> None:
        super().__init__(settings)
        self.error = error

    def ingest_documents(self, documents: list[Any], **_: Any) -> Any:
        raise self.error


def documents(n: int) -> dict[str, Any]:
    return {"documents": [{"id": f"d{i}", "title": f"t{i}", "text": f"text {i}"} for i in range(n)]}


def assert_507(response: Any, reason: str) -> dict[str, Any]:
    assert response.status_code == 507, response.text
    body = response.json()
    assert set(body) == {"error", "requestId"}
    assert body["error"].startswith("insufficient storage: ") and reason in body["error"]
    assert response.headers["X-Request-Id"] == body["requestId"]
    return body


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (full(errno.ENOSPC), "No space left on device"),
        (full(errno.EDQUOT), "Disk quota exceeded"),
        (record_error_from(sqlite3.OperationalError("database or disk is full")), "disk is full"),
        (InsufficientStorage("insufficient storage: 1.0 MiB free on /data"), "1.0 MiB free"),
    ],
    ids=["ENOSPC", "EDQUOT", "record-full", "guard"],
)
def test_a_write_that_runs_out_of_space_is_a_507_with_the_reason(
    settings: Settings, error: Exception, reason: str
) -> None:
    with serve_fake(FailingSieve(settings, error)) as client:
        assert_507(client.post("/api/documents", json=documents(1)), reason)
        assert client.get("/health").json() == {"status": "alive"}


def test_a_write_is_refused_before_anything_is_kept_while_the_disk_is_below_the_reserve(
    settings: Settings,
) -> None:
    fake = FakeSieve(settings)
    with serve_fake(fake) as client:
        state = client.app.state.sieve_state  # type: ignore[attr-defined]
        disk = Disk(RESERVE - 1)
        state.space.measure, state.space.min_free_bytes = disk.free, RESERVE
        assert_507(client.post("/api/documents", json=documents(2)), "rag.store.min_free_mb=4 MiB")
        assert_507(client.delete("/api/documents/d0"), "writes are refused until space is freed")
        assert fake.ingested == [] and state.jobs.all() == []
        ready = client.get("/ready")
        assert ready.status_code == 503 and "insufficient storage" in ready.json()["reason"]

        disk.bytes = RESERVE + MIB  # space is back: no restart needed
        answer = client.post("/api/documents", json=documents(1))
        assert answer.status_code == 200, answer.text
        assert [[d.doc_id for d in docs] for docs in fake.ingested] == [["d0"]]


def test_a_job_whose_record_cannot_be_saved_is_a_507_and_keeps_none_of_its_documents(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings.model_copy(deep=True)
    settings.rag.server.sync_write_chunks = 1  # two documents make a job
    with serve_fake(FakeSieve(settings)) as client:
        state = client.app.state.sieve_state  # type: ignore[attr-defined]

        def no_space(job: Job) -> None:
            raise full()

        monkeypatch.setattr(state.jobs, "_save", no_space)
        assert_507(client.post("/api/documents", json=documents(2)), "No space left on device")
        assert state.jobs.all() == [] and state.jobs.held.get(["d0", "d1"]) == []
        assert list(Path(settings.rag.server.jobs_dir).glob("*")) == []


def test_a_job_whose_documents_cannot_be_kept_leaves_no_job_record(tmp_path: Path) -> None:
    book = JobBook(tmp_path)

    def record_full() -> None:
        raise record_error_from(sqlite3.OperationalError("database or disk is full"))

    with pytest.raises(RecordError):
        book.accept("ingest", ["a"], 10, 1, before=record_full)
    assert book.all() == [] and list(tmp_path.glob("j-*.json")) == []


# -- the runner ----------------------------------------------------------------------------------------------


class FlakyDisk:
    """Makes `book`'s record saves fail while `full` is set."""

    def __init__(self, book: JobBook) -> None:
        self.full = threading.Event()
        self._save = book._save
        book._save = self.save  # type: ignore[method-assign]

    def save(self, job: Job) -> None:
        if self.full.is_set():
            raise full()
        self._save(job)


def on_disk(book: JobBook, job: Job) -> dict[str, Any]:
    return json.loads((book.directory / f"{job.id}.json").read_text(encoding="utf-8"))


def test_the_runner_survives_job_records_that_cannot_be_saved_and_saves_them_once_it_can(
    tmp_path: Path,
) -> None:
    book = JobBook(tmp_path)
    disk = FlakyDisk(book)
    first, second = (book.accept("ingest", [i], 1, 1, before=lambda: None) for i in ("a", "b"))
    runner = JobRunner(book)
    disk.full.set()
    ran: list[str] = []

    def work(job: Job) -> dict[str, Any]:
        book.update(job, embedded=1)  # a progress save on the full disk
        ran.append(job.id)
        return {"added": 1}

    runner.submit(first, work)
    runner.submit(second, work)
    wait_until(lambda: second.state == "done", "the second job never ran")
    assert ran == [first.id, second.id] and first.state == "done" and first.report == {"added": 1}
    assert runner._thread.is_alive()
    assert on_disk(book, first)["state"] == "queued"  # the last state saved before the disk filled

    disk.full.clear()
    assert book.save_unsaved() == 0
    assert on_disk(book, first)["state"] == on_disk(book, second)["state"] == "done"
    assert runner.stop(timeout=WAIT_S)


def test_a_job_stopped_for_lack_of_space_waits_queued_and_runs_again_once_there_is(tmp_path: Path) -> None:
    book = JobBook(tmp_path)
    job = book.accept("ingest", ["a"], 1, 1, before=lambda: None)
    guard = SpaceGuard([tmp_path], RESERVE, free=Disk(RESERVE + MIB).free)
    disk = guard.measure.__self__  # type: ignore[attr-defined]
    runner = JobRunner(book, space=guard.problem)
    attempts: list[str] = []

    def work(job: Job) -> dict[str, Any]:
        attempts.append(job.state)
        if len(attempts) == 1:
            disk.bytes = RESERVE - 1  # the disk filled under it
            guard.check()
        return {"added": 1}

    runner.submit(job, work)
    wait_until(lambda: job.state == "queued" and job.error is not None, "the job did not go back to queued")
    assert job.error.startswith("waiting for disk space (it runs once there is): insufficient storage: ")
    assert on_disk(book, job)["state"] == "queued"
    time.sleep(0.2)
    assert attempts == ["running"]  # it waits while the disk is full

    disk.bytes = RESERVE + MIB
    wait_until(lambda: job.state == "done", "the job did not run again once there was space")
    assert attempts == ["running", "running"] and job.error is None
    assert on_disk(book, job)["state"] == "done"
    assert runner.stop(timeout=WAIT_S)


def test_a_runner_waiting_for_space_stops_at_once_and_leaves_the_job_queued(tmp_path: Path) -> None:
    book = JobBook(tmp_path)
    job = book.accept("ingest", ["a"], 1, 1, before=lambda: None)
    runner = JobRunner(book, space=SpaceGuard([tmp_path], RESERVE, free=Disk(0).free).problem)
    runner.submit(job, lambda job: {"added": 1})
    wait_until(lambda: job.error is not None, "the job never said it waits")
    started = time.monotonic()
    assert runner.stop(timeout=WAIT_S)
    assert time.monotonic() - started < 2.0
    assert job.state == "queued" and on_disk(book, job)["state"] == "queued"


# -- the embedded store and /ready ---------------------------------------------------------------------------


class CountingCollection:
    name = "sieve"
    metadata = {"embedder_dimension": 3}

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fill: Disk | None = None  # an upsert fills this disk and fails

    def count(self) -> int:
        self.calls.append("count")
        return 0

    def upsert(self, **_: Any) -> None:
        self.calls.append("upsert")
        if self.fill is not None:
            self.fill.bytes = 0
            raise RuntimeError("Error in compaction: Failed to apply logs to the metadata segment")


@pytest.fixture
def guarded() -> Iterator[tuple[ChromaStore, CountingCollection, Disk]]:
    collection, disk = CountingCollection(), Disk(RESERVE + MIB)
    store = ChromaStore(
        None, collection, "embedded Chroma at /data", space=SpaceGuard(["/data"], RESERVE, free=disk.free)
    )
    yield store, collection, disk


def test_an_embedded_store_is_not_written_on_a_disk_below_the_reserve(
    guarded: tuple[ChromaStore, CountingCollection, Disk],
) -> None:
    store, collection, disk = guarded
    disk.bytes = RESERVE - 1
    with pytest.raises(InsufficientStorage):
        store._call(collection.upsert, ids=["c_1"])
    assert collection.calls == [] and store.failures() == []  # refused, not failed
    assert store.count() == 0  # reads go on
    disk.bytes = RESERVE + MIB
    store._call(collection.upsert, ids=["c_1"])
    assert collection.calls == ["count", "upsert"]


def test_an_embedded_store_that_failed_on_a_full_disk_is_never_called_again(
    guarded: tuple[ChromaStore, CountingCollection, Disk],
) -> None:
    store, collection, disk = guarded
    collection.fill = disk  # another program fills the disk after the guard let the write through
    with pytest.raises(StoreFailedError):
        store._call(collection.upsert, ids=["c_1"])
    calls = list(collection.calls)
    disk.bytes = RESERVE + MIB  # space is back: Chroma's next call would hang; it is not made
    with pytest.raises(StoreFailedError, match="restart the server"):
        store.count()
    assert collection.calls == calls
    assert "restart the server" in store.failures()[0].message


def test_a_failure_on_a_nearly_full_disk_breaks_the_store_even_with_the_guard_off() -> None:
    collection, disk = CountingCollection(), Disk(0)
    guard = SpaceGuard(["/data"], 0, free=disk.free)
    assert guard.problem(need=10**9) is None and guard.nearly_full()
    store = ChromaStore(None, collection, "embedded Chroma at /data", space=guard)
    collection.fill = disk
    with pytest.raises(StoreFailedError):
        store._call(collection.upsert, ids=["c_1"])
    disk.bytes = 10 * MIB
    assert not guard.nearly_full()
    said = r"with the disk full \(0\.0 KiB free on the filesystem of /data\); this process no longer calls"
    with pytest.raises(StoreFailedError, match=said):
        store.count()
    assert collection.calls == ["upsert"]


def test_ready_says_the_disk_is_full_without_calling_the_store() -> None:
    store = FakeStore()
    probe = StoreProbe()
    probe.space = SpaceGuard(["/data"], RESERVE, free=Disk(MIB).free).problem
    assert probe.problem(store).startswith("insufficient storage: 1.0 MiB free")  # type: ignore[union-attr]
    assert store.heartbeats == 0


# -- the BM25 files ------------------------------------------------------------------------------------------


def test_a_bm25_snapshot_that_runs_out_of_space_leaves_none_of_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.lexical import files
    from app.lexical.index import Analyzer, Bm25Index

    state, tags = Bm25Index.build(["a"], ["vpn"], Analyzer()).export_state()
    first = files.save_snapshot(tmp_path, state, tags, {})
    kept = sorted(p.name for p in tmp_path.iterdir())
    written = files._write_synced

    def fills_up(path: Path, text: str) -> None:
        if path.name == "journal-2.log":
            raise full()
        written(path, text)

    monkeypatch.setattr(files, "_write_synced", fills_up)
    with pytest.raises(OSError) as info:
        files.save_snapshot(tmp_path, state, tags, first)
    assert storage_exhausted(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == kept  # snap-2.* taken away again
    assert files.read_manifest(tmp_path) == first


def test_a_bm25_snapshot_waits_for_room_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from app.lexical.index import Analyzer
    from app.lexical.sync import LexicalSync

    disk = Disk(RESERVE + MIB)
    store = ChromaStore(
        None, CountingCollection(), "embedded Chroma", space=SpaceGuard([tmp_path], RESERVE, free=disk.free)
    )
    lexical = LexicalSync(store, tmp_path, Analyzer(), 1.2, 0.75, 1.0, lambda chunk: "")
    lexical._snapshot_bytes = MIB // 2  # a snapshot and its successor need 1 MiB: room
    assert lexical._room_for_snapshot()
    disk.bytes = RESERVE + MIB // 2
    with caplog.at_level("WARNING", logger="app.lexical.sync"):
        assert not lexical._room_for_snapshot()
        assert not lexical._room_for_snapshot()
    [said] = [r.getMessage() for r in caplog.records]
    assert said.startswith("BM25 snapshot put off until there is room, the journal goes on: insufficient")
    disk.bytes = RESERVE + MIB
    assert lexical._room_for_snapshot()
