"""Write jobs over HTTP, around a fake Sieve with a fake document record: a 202 write is in the record
before its job exists, a full queue is a 429 that writes nothing, a restart resumes the unfinished jobs,
and DELETE /api/documents/{id}."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.api.documents import resume_jobs
from app.api.jobs import RETRY_AFTER_MAX_S, RETRY_AFTER_MIN_S, JobBook
from app.ingest.pipeline import IngestReport
from app.ingest.types import Document
from app.main import AppState, create_app
from app.settings import Settings
from app.store.record import Tombstone, content_hash
from tests.fixtures.fake_api import ADMIN_TOKEN, FakeSieve, FakeStore, api_settings  # noqa: F401

WAIT_S = 10.0


class FakeRecord:
    description = "fake record"

    def __init__(self) -> None:
        self.kept: dict[str, Document] = {}
        self.buried: dict[str, Tombstone] = {}

    def put(self, documents: Sequence[Document]) -> int:
        self.kept.update((d.doc_id, d) for d in documents)
        for d in documents:
            self.buried.pop(d.doc_id, None)
        return len(documents)

    def get(self, doc_ids: Sequence[str]) -> list[Document]:
        return [self.kept[i] for i in doc_ids if i in self.kept]

    def delete(self, doc_ids: Sequence[str], tombstone: bool = False) -> int:
        gone = [self.kept.pop(i) for i in doc_ids if i in self.kept]
        if tombstone:
            self.buried.update(
                (d.doc_id, Tombstone(d.doc_id, "then", d.origin, content_hash(d))) for d in gone
            )
        return len(gone)

    def tombstones(self, doc_ids: Sequence[str] | None = None) -> dict[str, Tombstone]:
        return {i: t for i, t in self.buried.items() if doc_ids is None or i in doc_ids}


class IndexedStore(FakeStore):
    """The fake store of a RecordingSieve: one chunk a document it indexed."""

    def __init__(self, indexed: dict[str, str]) -> None:
        super().__init__()
        self.indexed = indexed

    def metadata_of(self, chunk_ids: Sequence[str], doc_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        return {f"{i}#0": {"doc_id": i} for i in doc_ids if i in self.indexed}


class RecordingSieve(FakeSieve):
    """Ingests into `indexed` (doc id -> text) after `gate` opens; `record` is a FakeRecord."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.record: FakeRecord | None = FakeRecord()
        self.indexed: dict[str, str] = {}
        self.store = IndexedStore(self.indexed)
        self.gate = threading.Event()
        self.gate.set()
        self.record_at_ingest: list[list[str]] = []

    def ingest_documents(self, documents: list[Any], **_: Any) -> IngestReport:
        assert self.gate.wait(WAIT_S)
        if self.record is not None:
            self.record_at_ingest.append(sorted(self.record.kept))
        self.indexed.update((d.doc_id, d.text) for d in documents)
        return IngestReport(documents=len(documents), chunks=len(documents), added=len(documents))

    def delete_documents(self, doc_ids: Sequence[str]) -> tuple[int, int]:
        chunks = sum(self.indexed.pop(i, None) is not None for i in doc_ids)
        return self.record.delete(doc_ids, tombstone=True), chunks


def with_server(settings: Settings, **server: Any) -> Settings:
    rag = settings.rag
    return settings.model_copy(
        update={"rag": rag.model_copy(update={"server": rag.server.model_copy(update=server)})}
    )


@pytest.fixture
def fake(settings: Settings) -> RecordingSieve:
    # every write of more than one chunk (one a document here) is a job; room for 4 queued documents
    return RecordingSieve(with_server(settings, sync_write_chunks=1, max_queued_documents=4))


def serve(fake: RecordingSieve) -> TestClient:
    def start(state: AppState) -> None:
        state.sieve = fake
        resume_jobs(state, fake)  # as startup_sequence does once the Sieve is open
        state.phase = "ready"
        state.ready = True

    return TestClient(
        create_app(fake.settings, start=start), headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )


@pytest.fixture
def client(fake: RecordingSieve) -> Iterator[TestClient]:
    with serve(fake) as c:
        wait_ready(c)
        yield c
    fake.gate.set()


def wait_ready(client: TestClient) -> None:
    deadline = time.monotonic() + WAIT_S
    while client.get("/ready").status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def docs(*ids: str) -> dict[str, Any]:
    return {"documents": [{"id": i, "title": f"t {i}", "text": f"text of {i}"} for i in ids]}


def job_ends(client: TestClient, job_id: str, state: str = "done") -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while (job := client.get(f"/api/jobs/{job_id}").json())["state"] != state:
        assert time.monotonic() < deadline, job
        time.sleep(0.01)
    return job


def test_a_202_write_is_in_the_record_before_its_job_runs(client: TestClient, fake: RecordingSieve) -> None:
    accepted = client.post("/api/documents", json=docs("a", "b", "c"))
    assert accepted.status_code == 202, accepted.text
    job = job_ends(client, accepted.json()["job"])
    assert job["documentIds"] == ["a", "b", "c"]
    assert job["bytes"] > len("text of a") * 3
    assert job["report"]["documents"] == 3 and job["report"]["skipped"] == 0
    assert fake.record_at_ingest == [["a", "b", "c"]]
    assert fake.indexed == {"a": "text of a", "b": "text of b", "c": "text of c"}
    assert "documentIds" not in client.get("/api/jobs").json()["jobs"][0]


def test_a_write_past_the_queue_bound_is_429_and_nothing_of_it_is_kept(
    client: TestClient, fake: RecordingSieve
) -> None:
    fake.gate.clear()  # the worker holds the first job
    first = client.post("/api/documents", json=docs("a", "b", "c"))
    assert first.status_code == 202
    refused = client.post("/api/documents", json=docs("d", "e"))
    assert refused.status_code == 429, refused.text
    assert RETRY_AFTER_MIN_S <= int(refused.headers["Retry-After"]) <= RETRY_AFTER_MAX_S
    message = refused.json()["error"]
    assert "rag.server.max_queued_documents=4" in message
    assert "holds 1 jobs (3 documents" in message
    assert sorted(fake.record.kept) == ["a", "b", "c"]
    assert len(client.get("/api/jobs").json()["jobs"]) == 1
    room = client.post("/api/documents", json=docs("d"))  # exactly at the bound
    assert room.status_code == 202
    fake.gate.set()
    job_ends(client, room.json()["job"])
    assert sorted(fake.indexed) == ["a", "b", "c", "d"]
    again = client.post("/api/documents", json=docs("d", "e"))  # the queue drained: room again
    assert again.status_code == 202


def test_a_document_deleted_after_its_job_was_accepted_is_skipped_and_counted(
    client: TestClient, fake: RecordingSieve
) -> None:
    fake.gate.clear()
    client.post("/api/documents", json=docs("a", "b"))
    second = client.post("/api/documents", json=docs("c", "d")).json()["job"]
    fake.record.delete(["c"])
    fake.gate.set()
    report = job_ends(client, second)["report"]
    assert (report["documents"], report["skipped"]) == (1, 1)
    assert "c" not in fake.indexed and "d" in fake.indexed


def test_jobs_unfinished_at_the_last_stop_resume_and_end_done(settings: Settings, tmp_path: Path) -> None:
    fake = RecordingSieve(with_server(settings, sync_write_chunks=1))
    book = JobBook(Path(fake.settings.rag.server.jobs_dir))
    fake.record.put([Document(i, f"text of {i}") for i in ("a", "b", "c")])
    running = book.accept("ingest", ["a", "b"], 10, 2, before=lambda: None)
    book.update(running, state="running", embedded=1)
    queued = book.accept("ingest", ["c"], 5, 1, before=lambda: None)
    with serve(fake) as client:
        wait_ready(client)
        for job_id in (running.id, queued.id):
            job = job_ends(client, job_id)
            assert (job["resumed"], job["createdAt"], job["error"]) == (1, book.get(job_id).createdAt, None)  # type: ignore[union-attr]
    assert fake.indexed == {"a": "text of a", "b": "text of b", "c": "text of c"}


def test_delete_a_document_from_the_record_and_the_index(client: TestClient, fake: RecordingSieve) -> None:
    assert client.post("/api/documents", json=docs("a")).status_code == 200  # one chunk: synchronous
    fake.record.put([Document("a", "text of a")])  # the real Sieve's ingest puts it itself
    deleted = client.delete("/api/documents/a")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"id": "a", "documents": 1, "chunks": 1}
    assert fake.record.kept == {} and fake.indexed == {}
    missing = client.delete("/api/documents/a")
    assert missing.status_code == 404
    assert missing.json()["error"] == "no document 'a' in the record or the index"
    assert client.delete("/api/documents/a", headers={"Authorization": ""}).status_code == 401


def hold_the_write_lock(client: TestClient, fake: RecordingSieve) -> None:
    """Start a job the worker holds (under the write lock) until `fake.gate` opens."""
    fake.gate.clear()
    client.post("/api/documents", json=docs("held-1", "held-2"))
    deadline = time.monotonic() + WAIT_S
    while not client.app.state.sieve_state.write_lock.locked():  # type: ignore[attr-defined]
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_delete_while_another_write_runs_becomes_a_job(client: TestClient, fake: RecordingSieve) -> None:
    fake.record.put([Document("docs/a.md#1", "text")])
    fake.indexed["docs/a.md#1"] = "text"
    hold_the_write_lock(client, fake)
    queued = client.delete("/api/documents/docs/a.md%231")
    assert queued.status_code == 202, queued.text
    assert "docs/a.md#1" not in fake.record.kept  # the record forgets it at once, keeping a tombstone
    assert list(fake.record.buried) == ["docs/a.md#1"]
    assert fake.indexed["docs/a.md#1"] == "text"  # the index, after the write before it
    assert client.delete("/api/documents/never-known").status_code == 404
    fake.gate.set()
    job = job_ends(client, queued.json()["job"])
    assert (job["kind"], job["report"]) == ("delete", {"chunks": 1, "keptAgain": 0})
    assert "docs/a.md#1" not in fake.indexed


def test_a_write_accepted_after_a_queued_delete_keeps_its_version(
    client: TestClient, fake: RecordingSieve
) -> None:
    fake.record.put([Document("a", "old text")])
    fake.indexed["a"] = "old text"
    hold_the_write_lock(client, fake)
    deleted = client.delete("/api/documents/a").json()["job"]
    written = client.post("/api/documents", json={"documents": [{"id": "a", "text": "new text"}]}).json()[
        "job"
    ]
    fake.gate.set()
    assert job_ends(client, deleted)["report"] == {"chunks": 0, "keptAgain": 1}
    job_ends(client, written)
    assert fake.indexed["a"] == "new text" and fake.record.kept["a"].text == "new text"
    assert fake.record.buried == {}  # the write lifted the delete's tombstone


def test_a_write_of_a_deleted_document_lifts_its_tombstone_and_says_so(
    client: TestClient, fake: RecordingSieve, caplog: pytest.LogCaptureFixture
) -> None:
    fake.record.put([Document("a", "text of a", origin="kb/a.md")])
    fake.indexed["a"] = "text of a"
    assert client.delete("/api/documents/a").status_code == 200
    assert list(fake.record.buried) == ["a"]
    with caplog.at_level(logging.INFO, logger="app.api.documents"):
        assert client.post("/api/documents", json=docs("a")).status_code == 200
    fake.record.put([Document("a", "text of a")])  # the real Sieve's ingest puts it itself
    assert fake.record.buried == {}
    assert [r.getMessage() for r in caplog.records] == [
        "document 'a' (deleted through the API at then) was written again: its tombstone is lifted"
    ]


def test_openapi_declares_the_delete_route_and_the_429_of_a_write(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    error_ref = {"$ref": "#/components/schemas/ErrorResponse"}
    delete = paths["/api/documents/{doc_id}"]["delete"]["responses"]
    assert {"200", "202", "401", "403", "404", "429", "503"} <= set(delete)
    assert delete["404"]["content"]["application/json"]["schema"] == error_ref
    write = paths["/api/documents"]["post"]["responses"]
    assert write["429"]["content"]["application/json"]["schema"] == error_ref
    assert "max_queued_documents" in write["429"]["description"]


def test_a_sieve_without_a_record_keeps_its_jobs_documents_in_memory(settings: Settings) -> None:
    fake = RecordingSieve(with_server(settings, sync_write_chunks=1))
    fake.record = None
    with serve(fake) as client:
        wait_ready(client)
        accepted = client.post("/api/documents", json=docs("a", "b"))
        assert accepted.status_code == 202, accepted.text
        assert job_ends(client, accepted.json()["job"])["report"]["skipped"] == 0
    assert fake.indexed == {"a": "text of a", "b": "text of b"}
