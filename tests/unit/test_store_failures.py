"""A failing store is said, not hidden: `ChromaStore` wraps and records what Chroma raises, `/ready` reports a
recorded failure and heals by re-trying, the API answers 503 with the reason and a request id, a job ends
`failed` with it, and a startup on a store it cannot read names the commands that repair it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import chromadb.errors
import numpy as np
import pytest
from fastapi.testclient import TestClient

from app import exit_codes
from app.api.readiness import StoreProbe
from app.main import AppState, _startup
from app.settings import Settings
from app.store import (
    ChromaStore,
    FailureKind,
    StoreError,
    StoreFailedError,
    StoreFailure,
    StoreUnavailableError,
)
from app.store.chroma import PROBE_ID_PREFIX
from tests.fixtures.fake_api import FakeSieve, api_settings, serve_fake  # noqa: F401

COMPACTION = "Error in compaction: Failed to apply logs to the metadata segment"


class InternalError(Exception):
    """Stands for chromadb.errors.InternalError (the type's name is what the message shows)."""


class FakeCollection:
    """A Chroma collection whose reads and writes fail while `broken` says so."""

    def __init__(self, name: str = "sieve", dimension: int = 3) -> None:
        self.name = name
        self.metadata = {"embedder_dimension": dimension}
        self.broken: set[str] = set()  # "read", "write"
        self.records: dict[str, Any] = {}
        self.calls: list[tuple[str, Any]] = []

    def _fail(self, kind: str) -> None:
        if kind in self.broken:
            raise InternalError(COMPACTION)

    def count(self) -> int:
        self._fail("read")
        return len(self.records)

    def upsert(self, ids: list[str], embeddings: Any, **_: Any) -> None:
        self.calls.append(("upsert", (ids, np.asarray(embeddings).tolist())))
        self._fail("write")
        self.records.update(dict.fromkeys(ids))

    def delete(self, ids: list[str]) -> None:
        self.calls.append(("delete", ids))
        self._fail("write")
        for i in ids:
            self.records.pop(i, None)


def fake_store(collection: FakeCollection) -> ChromaStore:
    return ChromaStore(None, collection, "Chroma server at http://127.0.0.1:1")


# -- the store wraps and records -----------------------------------------------------------------------------


class DroppedCollection(FakeCollection):
    """A collection a rebuild dropped: every call answers Chroma's "does not exist"."""

    id = "old-id"

    def count(self) -> int:
        raise chromadb.errors.NotFoundError(f"Collection [{self.id}] does not exist.")


class RebuiltClient:
    """A client whose collection of the store's name is now the rebuild's (another id)."""

    def __init__(self, current: FakeCollection | None) -> None:
        self.current = current

    def get_collection(self, name: str) -> FakeCollection:
        if self.current is None:
            raise chromadb.errors.NotFoundError(f"Collection [{name}] does not exist.")
        return self.current


def test_a_call_on_a_collection_a_rebuild_replaced_follows_the_switch_and_is_answered() -> None:
    rebuilt = FakeCollection()
    rebuilt.id = "new-id"  # type: ignore[attr-defined]
    rebuilt.records = {"c_1": None, "c_2": None}
    store = ChromaStore(RebuiltClient(rebuilt), DroppedCollection(), "Chroma server at http://127.0.0.1:1")
    assert store.count() == 2  # answered by the new collection, not a failure
    assert store.collection_id == "new-id" and store.failures() == []


def test_a_call_between_the_drop_and_the_rename_is_a_failure() -> None:
    store = ChromaStore(RebuiltClient(None), DroppedCollection(), "Chroma server at http://127.0.0.1:1")
    with pytest.raises(StoreFailedError, match="read from collection 'sieve' failed: NotFoundError"):
        store.count()
    assert store.collection_id == "old-id"


def test_a_chroma_error_is_wrapped_once_naming_what_was_done_and_recorded_until_a_success() -> None:
    collection = FakeCollection()
    store = fake_store(collection)
    collection.broken = {"write"}
    with pytest.raises(StoreFailedError) as info:
        store._call(collection.upsert, ids=["c_1"], embeddings=[[1.0, 0.0, 0.0]])
    assert str(info.value) == f"write to collection 'sieve' failed: InternalError: {COMPACTION}"
    assert (info.value.kind, info.value.collection) == ("write", "sieve")
    [failure] = store.failures()
    assert (failure.kind, failure.collection, failure.message) == ("write", "sieve", str(info.value))
    assert time.time() - failure.since < 5

    assert store.count() == 0  # a read succeeds: the write failure stays
    assert [f.kind for f in store.failures()] == ["write"]
    collection.broken = set()
    store._call(collection.delete, ids=["c_1"])  # a write succeeds: cleared
    assert store.failures() == []


def test_a_failure_keeps_its_first_time_and_takes_the_last_message() -> None:
    collection = FakeCollection()
    store = fake_store(collection)
    collection.broken = {"read"}
    for _ in range(2):
        with pytest.raises(StoreFailedError, match="^read from collection 'sieve' failed: InternalError"):
            store.count()
    first = store.failures()[0].since
    time.sleep(0.01)
    with pytest.raises(StoreFailedError):
        store.count()
    assert store.failures()[0].since == first


def test_a_read_on_another_collection_does_not_clear_the_failure_of_this_one() -> None:
    chunks, changes = FakeCollection("sieve"), FakeCollection("sieve-changes")
    store = fake_store(chunks)
    chunks.broken = {"read"}
    with pytest.raises(StoreFailedError):
        store.count()
    store._call(changes.count)
    assert [(f.kind, f.collection) for f in store.failures()] == [("read", "sieve")]


def test_an_unreachable_server_is_store_unavailable_and_left_to_the_heartbeat() -> None:
    collection = FakeCollection()
    store = fake_store(collection)

    def count() -> int:
        raise ConnectionRefusedError("[Errno 111] Connection refused")

    with pytest.raises(StoreUnavailableError, match="is unreachable: .*Connection refused"):
        store._call(count)
    assert store.failures() == []


def test_the_write_probe_writes_a_unit_vector_under_a_probe_id_and_deletes_it() -> None:
    collection = FakeCollection(dimension=3)
    store = fake_store(collection)
    store.probe_write()
    (upsert, (ids, vectors)), (delete, deleted) = collection.calls
    assert (upsert, delete) == ("upsert", "delete")
    assert ids == deleted and ids[0].startswith(PROBE_ID_PREFIX) and not ids[0].startswith("c_")
    assert vectors == [[1.0, 0.0, 0.0]]
    assert collection.records == {}


def test_recheck_clears_a_failure_once_the_store_heals() -> None:
    collection = FakeCollection()
    store = fake_store(collection)
    collection.broken = {"read", "write"}
    for call in (store.count, store.probe_write):
        with pytest.raises(StoreFailedError):
            call()
    store.recheck("write")  # still broken: recorded again, not raised
    assert [f.kind for f in store.failures()] == ["read", "write"]
    collection.broken = set()
    store.recheck("write")
    assert [f.kind for f in store.failures()] == ["read"]
    store.recheck("read")
    assert store.failures() == []


# -- the readiness probe -------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FailingStore:
    """A store that answers its heartbeat and records failures (`FailureLog`); `recheck` heals it when
    `healed`."""

    description = "Chroma server at http://127.0.0.1:1"

    def __init__(self) -> None:
        self.recorded: list[StoreFailure] = []
        self.rechecks: list[FailureKind] = []
        self.healed = False

    def heartbeat(self) -> None:
        pass

    def failures(self) -> list[StoreFailure]:
        return list(self.recorded)

    def recheck(self, kind: FailureKind) -> None:
        self.rechecks.append(kind)
        if self.healed:
            self.recorded = [f for f in self.recorded if f.kind != kind]


SINCE = datetime(2026, 12, 4, 23, 20, 1, tzinfo=UTC).timestamp()
WRITE_FAILS = StoreFailure("write", "sieve", SINCE, f"write to collection 'sieve' failed: {COMPACTION}")
READ_FAILS = StoreFailure("read", "sieve", SINCE + 1, f"read from collection 'sieve' failed: {COMPACTION}")


def test_a_recorded_failure_is_the_probes_answer_at_once_naming_the_store_and_the_command() -> None:
    clock, store = Clock(), FailingStore()
    probe = StoreProbe(max_age_s=1.0, clock=clock, recheck_s=3.0)
    assert probe.problem(store) is None
    store.recorded = [READ_FAILS, WRITE_FAILS]
    assert probe.problem(store) == (  # the heartbeat's answer is fresh; the recorded failure is said
        "vector store Chroma server at http://127.0.0.1:1: "
        f"reads fail since 2026-12-04T23:20:02Z: read from collection 'sieve' failed: {COMPACTION}; "
        f"writes fail since 2026-12-04T23:20:01Z: write to collection 'sieve' failed: {COMPACTION}; "
        "run `sieve store check`"
    )


def test_the_probe_rechecks_each_failing_kind_at_most_every_recheck_s_and_heals() -> None:
    clock, store = Clock(), FailingStore()
    probe = StoreProbe(max_age_s=1.0, clock=clock, recheck_s=3.0)
    store.recorded = [WRITE_FAILS]
    assert probe.problem(store) is not None
    assert store.rechecks == ["write"]
    for _ in range(2):
        clock.now += 1.0
        assert probe.problem(store) is not None
    assert store.rechecks == ["write"]  # two heartbeats, 1 s and 2 s later: no recheck yet
    store.healed = True
    clock.now += 1.0
    assert probe.problem(store) is None
    assert store.rechecks == ["write", "write"]


def test_problem_soon_says_a_failure_recorded_after_the_last_heartbeat() -> None:
    store = FailingStore()
    probe = StoreProbe(max_age_s=60.0)
    assert asyncio.run(probe.problem_soon(store)) is None
    store.recorded = [WRITE_FAILS]
    assert "writes fail since" in (asyncio.run(probe.problem_soon(store)) or "")


# -- the API -----------------------------------------------------------------------------------------------


class FailingSieve(FakeSieve):
    """Reads and writes fail as a broken collection's do; `chunks` is what `chunk_count` says (above
    `rag.server.sync_write_chunks`, a write becomes a job)."""

    def __init__(self, settings: Settings, chunks: int = 1) -> None:
        super().__init__(
            settings, fail_with=StoreFailedError("read", "sieve", f"InternalError: {COMPACTION}")
        )
        self.chunks = chunks

    def chunk_count(self, documents: list[Any]) -> int:
        return self.chunks

    def ingest_documents(self, documents: list[Any], **_: Any) -> Any:
        raise StoreFailedError("write", "sieve", f"InternalError: {COMPACTION}")

    def evaluation_target(self) -> Any:  # an evaluation starts by reading the ids the store holds
        raise StoreFailedError("read", "sieve", f"InternalError: {COMPACTION}")


@pytest.fixture
def failing(settings: Settings) -> Iterator[tuple[FailingSieve, TestClient]]:
    fake = FailingSieve(settings)
    with serve_fake(fake) as client:
        yield fake, client


DOC = {"documents": [{"id": "d1", "title": "T", "text": "some text"}]}


@pytest.mark.parametrize(
    ("method", "path", "body", "kind"),
    [
        ("post", "/api/retrieve", {"query": "pay"}, "read from"),
        ("post", "/api/documents", DOC, "write to"),
        ("post", "/api/evaluations", None, "read from"),
        ("post", "/api/evaluations/runs", None, "read from"),
    ],
    ids=["retrieve", "write", "evaluation", "evaluation-run"],
)
def test_a_store_failure_in_a_request_is_503_with_the_reason_and_a_request_id(
    failing: tuple[FailingSieve, TestClient],
    caplog: pytest.LogCaptureFixture,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    kind: str,
) -> None:
    _, client = failing
    with caplog.at_level(logging.ERROR):
        response = getattr(client, method)(path, json=body)
    assert response.status_code == 503, response.text
    answer = response.json()
    assert answer == {
        "error": f"vector store: {kind} collection 'sieve' failed: InternalError: {COMPACTION}",
        "requestId": response.headers["X-Request-Id"],
    }
    [record] = [r for r in caplog.records if answer["requestId"] in r.getMessage()]
    assert COMPACTION in record.getMessage() and record.exc_info is None


def test_an_unreachable_store_is_503_with_a_request_id_too(settings: Settings) -> None:
    fake = FakeSieve(settings, fail_with=StoreUnavailableError("fake store is unreachable"))
    with serve_fake(fake) as client:
        response = client.post("/api/retrieve", json={"query": "pay"})
    assert response.status_code == 503
    assert response.json() == {
        "error": "vector store unavailable: fake store is unreachable",
        "requestId": response.headers["X-Request-Id"],
    }


def test_any_other_store_error_in_a_request_is_a_503_too(settings: Settings) -> None:
    fake = FakeSieve(settings, fail_with=StoreError("document record at /data/record.db: get failed: locked"))
    with serve_fake(fake) as client:
        response = client.post("/api/retrieve", json={"query": "pay"})
    assert response.status_code == 503
    assert response.json() == {
        "error": "store: document record at /data/record.db: get failed: locked",
        "requestId": response.headers["X-Request-Id"],
    }


def test_a_job_whose_write_fails_in_the_store_ends_failed_with_the_reason(settings: Settings) -> None:
    fake = FailingSieve(settings, chunks=settings.rag.server.sync_write_chunks + 1)
    with serve_fake(fake) as client:
        accepted = client.post("/api/documents", json=DOC)
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["job"]
        deadline = time.monotonic() + 10
        while (job := client.get(f"/api/jobs/{job_id}").json())["state"] not in ("done", "failed"):
            assert time.monotonic() < deadline, job
            time.sleep(0.05)
    assert job["state"] == "failed"
    assert (
        job["error"] == f"StoreFailedError: write to collection 'sieve' failed: InternalError: {COMPACTION}"
    )


def test_ready_is_503_naming_the_store_while_a_failure_is_recorded(settings: Settings) -> None:
    fake = FakeSieve(settings)
    store = FailingStore()
    fake.store = store  # type: ignore[assignment]
    with serve_fake(fake) as client:
        assert client.get("/ready").json() == {"status": "ready"}
        store.recorded = [WRITE_FAILS]
        response = client.get("/ready")
        assert response.status_code == 503
        assert response.json() == {
            "status": "unavailable",
            "reason": "vector store Chroma server at http://127.0.0.1:1: writes fail since "
            f"2026-12-04T23:20:01Z: write to collection 'sieve' failed: {COMPACTION}; "
            "run `sieve store check`",
        }


# -- startup -----------------------------------------------------------------------------------------------


def test_a_startup_on_a_store_it_cannot_read_fails_naming_check_and_rebuild(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    state = AppState(settings=settings)
    codes: list[int] = []

    def sequence(_: AppState) -> None:
        raise StoreFailedError("read", "sieve", f"InternalError: {COMPACTION}")

    with caplog.at_level(logging.ERROR):
        _startup(state, sequence, codes.append)
    assert codes == [exit_codes.UNAVAILABLE] and state.phase == "failed"
    assert state.error == (
        f"the vector store cannot be used: read from collection 'sieve' failed: InternalError: {COMPACTION}. "
        "Run `sieve store check` to see what is wrong, then `sieve store rebuild` to rebuild the index from "
        "the documents Sieve kept"
    )
    [record] = [r for r in caplog.records if r.getMessage().startswith("startup failed")]
    assert record.exc_info is None or record.exc_info is False


def test_a_command_on_a_failing_store_names_the_commands_that_repair_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli import main
    from app.service import Sieve

    def broken(*_: object, **__: object) -> Sieve:
        raise StoreFailedError("read", "sieve", f"InternalError: {COMPACTION}")

    monkeypatch.setattr(Sieve, "open", broken)
    assert main(["query", "anything"]) == exit_codes.UNAVAILABLE
    assert capsys.readouterr().err == (
        f"error: the vector store cannot be used: read from collection 'sieve' failed: InternalError: "
        f"{COMPACTION}. Run `sieve store check` to see what is wrong, then `sieve store rebuild` to "
        "rebuild the index from the documents Sieve kept\n"
    )
