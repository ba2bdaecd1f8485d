"""The record is the truth, and the index catches up with it at the next start, with no manual command:
the real start-up (`startup_sequence`) of the real app served by a real uvicorn, over an embedded Chroma
holding the sample base and its document record, the packaged e5 (loaded once, shared by every start).

* a 202 write whose job file is damaged before it ran: after a restart its documents are served and
  `GET /api/jobs/{id}` answers `unreadable` (not 404);
* a job that failed (an embedder crash, injected; a full disk only delays a job): `/ready` names its
  documents as unindexed, and after a restart the job is retried and ends `done`, its documents served;
* documents of the record deleted from Chroma behind the service's back: served again after a restart;
* a job-sized write whose record write fails midway (a full disk, injected): a 507, no job, and the
  documents it kept are served without a restart.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.api.state import AppState
from app.main import create_app
from app.settings import Settings, nested
from app.store import ChromaStore
from app.store.record import RECORD_FILE, SqliteRecord
from tests.fixtures.api_server import ADMIN_TOKEN, READY_TIMEOUT_S, make_settings, uvicorn_server
from tests.fixtures.seeded_store import seeded_store

pytestmark = pytest.mark.integration

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
WAIT_S = 60.0

# four documents, each about one made-up thing a query can find it by
DOCUMENTS = [
    {"id": f"recon-{name}", "title": f"The {name} procedure", "text": text, "topic": "reconcile"}
    for name, text in (
        ("quokka", "Quokka badges are issued at the north gate. Bring the quokka form signed by your lead."),
        ("marimba", "The marimba room on floor 9 is booked through the facilities desk, two hours at most."),
        ("zeppelin", "Zeppelin travel claims need the zeppelin receipt and a manager's approval in 30 days."),
        ("origami", "Origami workshops are paid from the training budget; register before the first Monday."),
    )
]
QUERIES = {
    "recon-quokka": "where are quokka badges issued",
    "recon-marimba": "how do I book the marimba room",
    "recon-zeppelin": "what does a zeppelin travel claim need",
    "recon-origami": "who pays for origami workshops",
}


@pytest.fixture
def shared_model(monkeypatch: pytest.MonkeyPatch, real_embedder: Any) -> None:
    """Every start in this module opens its Sieve with the one loaded e5 (a start loads no model)."""
    monkeypatch.setattr("app.service.load_embedder", lambda settings: real_embedder)


@pytest.fixture
def settings(tmp_path: Path, shared_model: None) -> Settings:
    return make_settings(
        seeded_store(tmp_path / "store"),
        tmp_path / "out",
        nested("rag.server.sync_write_chunks", 1),  # every write is a job
        nested("rag.chain.rerank.enabled", False),
        nested("rag.evaluate.enabled", False),
        nested("rag.ingest.on_startup", False),  # only the reconciliation can index what is missing
    )


@contextmanager
def served(settings: Settings) -> Iterator[tuple[httpx.Client, AppState]]:
    """The app with its real start-up, served by uvicorn until /ready says ready; stopped on exit."""
    app = create_app(settings)
    state: AppState = app.state.sieve_state
    with uvicorn_server(app) as (host, port), httpx.Client(base_url=f"http://{host}:{port}", timeout=60) as c:
        wait_for(lambda: c.get("/ready").status_code == 200, lambda: c.get("/ready").text, READY_TIMEOUT_S)
        yield c, state


def wait_for(done: Callable[[], bool], say: Callable[[], object], within: float = WAIT_S) -> None:
    deadline = time.monotonic() + within
    while not done():
        assert time.monotonic() < deadline, say()
        time.sleep(0.05)


def job_state(client: httpx.Client, job_id: str) -> dict[str, Any]:
    answer = client.get(f"/api/jobs/{job_id}", headers=ADMIN)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def served_ids(client: httpx.Client, queries: dict[str, str]) -> set[str]:
    """The documents whose own query finds them in the top 5."""
    found = set()
    for doc_id, query in queries.items():
        answer = client.post("/api/retrieve", json={"query": query, "topK": 5})
        assert answer.status_code == 200, answer.text
        if doc_id in {d["docId"] for d in answer.json()["documents"]}:
            found.add(doc_id)
    return found


def indexed_ids(state: AppState, doc_ids: list[str]) -> set[str]:
    store = state.sieve.store  # type: ignore[attr-defined]
    return {str(meta["doc_id"]) for meta in store.metadata_of([], doc_ids).values()}


def test_a_queued_job_whose_file_is_damaged_across_a_restart_loses_no_document(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    with served(settings) as (client, state):
        state.job_runner.submit = lambda job, work: None  # type: ignore[method-assign]  # it never runs
        answer = client.post("/api/documents", json={"documents": DOCUMENTS}, headers=ADMIN)
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["job"]
        assert served_ids(client, QUERIES) == set()
    path = Path(settings.rag.server.jobs_dir) / f"{job_id}.json"
    path.write_text(path.read_text(encoding="utf-8")[:40], encoding="utf-8")  # torn

    with caplog.at_level(logging.INFO), served(settings) as (client, state):
        assert client.get("/ready").json() == {"status": "ready"}
        assert served_ids(client, QUERIES) == set(QUERIES)
        job = job_state(client, job_id)
        assert (job["state"], job["id"]) == ("unreadable", job_id)
        assert job["error"].startswith(f"the job's record {job_id}.json could not be read at the last start")
    said = [r.getMessage() for r in caplog.records]
    assert any(line.startswith(f"job {job_id}: its record ") for line in said), said
    assert (
        "reconcile: 4 documents of the document record not in the index, indexing them now: recon-marimba, "
        "recon-origami, recon-quokka, recon-zeppelin" in said
    )


def test_a_failed_job_is_retried_at_the_restart_and_its_documents_are_served(settings: Settings) -> None:
    with served(settings) as (client, state):
        sieve: Any = state.sieve

        def embedder_crash(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("the embedder crashed")

        sieve.ingest_documents = embedder_crash  # the job, and the reconciliation after it, fail
        answer = client.post("/api/documents", json={"documents": DOCUMENTS}, headers=ADMIN)
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["job"]
        wait_for(lambda: job_state(client, job_id)["state"] == "failed", lambda: job_state(client, job_id))
        failed = job_state(client, job_id)
        assert failed["error"] == "RuntimeError: the embedder crashed"
        assert [f["error"] for f in failed["failures"]] == [failed["error"]]
        wait_for(lambda: "unindexed" in client.get("/ready").json(), lambda: client.get("/ready").json())
        unindexed = client.get("/ready").json()["unindexed"]
        assert unindexed.startswith(
            "4 documents of the document record not indexed, so not served (recon-marimba, "
            "recon-origami, recon-quokka, recon-zeppelin): RuntimeError: the embedder crashed"
        )
        del sieve.ingest_documents

    with served(settings) as (client, state):
        assert client.get("/ready").json() == {"status": "ready"}
        assert served_ids(client, QUERIES) == set(QUERIES)
        wait_for(lambda: job_state(client, job_id)["state"] == "done", lambda: job_state(client, job_id))
        done = job_state(client, job_id)
        assert (done["resumed"], done["error"], len(done["failures"])) == (1, None, 1)
        # the start-up reconciliation had indexed them: the retried job found nothing left to embed
        assert (done["report"]["documents"], done["report"]["added"]) == (4, 0)


def test_recorded_documents_deleted_from_chroma_behind_the_services_back_are_served_after_a_restart(
    settings: Settings, real_embedder: Any, caplog: pytest.LogCaptureFixture
) -> None:
    lost = ["hr-remote-work-en", "it-helpdesk-en"]
    queries = {
        "hr-remote-work-en": "how many days a week can I work remotely",
        "it-helpdesk-en": "IT helpdesk",
    }
    store = ChromaStore.open(settings.rag.store, real_embedder.identity())
    try:
        chunks = sorted(store.metadata_of([], lost))
        assert {m["doc_id"] for m in store.metadata_of([], lost).values()} == set(lost)
        store.delete(chunks)  # straight from Chroma: the record still holds both
        before = store.count()
    finally:
        store.close()
    record = SqliteRecord(Path(settings.rag.store.path) / RECORD_FILE)
    try:
        assert [d.doc_id for d in record.get(lost)] == lost
    finally:
        record.close()

    with caplog.at_level(logging.INFO), served(settings) as (client, state):
        assert client.get("/ready").json() == {"status": "ready"}
        assert indexed_ids(state, lost) == set(lost)
        assert served_ids(client, queries) == set(lost)
        assert state.sieve.store.count() == before + len(chunks)  # type: ignore[attr-defined]
    said = [r.getMessage() for r in caplog.records]
    assert (
        "reconcile: 2 documents of the document record not in the index, indexing them now: "
        "hr-remote-work-en, it-helpdesk-en" in said
    )
    done = [line for line in said if line.startswith("reconcile: indexed 2 documents (")]
    assert len(done) == 1 and done[0].endswith("; every recorded document is indexed"), said

    caplog.clear()
    with caplog.at_level(logging.INFO), served(settings):  # the next start finds nothing to do
        pass
    said = [r.getMessage() for r in caplog.records]
    assert [line for line in said if line.startswith("reconcile: ")] == [
        next(line for line in said if line.startswith("reconcile: the index matches the document record ("))
    ]


def test_a_job_write_whose_record_write_fails_midway_is_a_507_and_what_it_kept_is_served_without_a_restart(
    settings: Settings,
) -> None:
    with served(settings) as (client, state):
        record = state.sieve.record  # type: ignore[attr-defined]
        keep = record.put

        def two_then_full_disk(documents: list[Any]) -> int:  # once: the disk is freed right after
            record.put = keep
            keep(documents[:2])
            raise OSError(28, "No space left on device")

        record.put = two_then_full_disk
        answer = client.post("/api/documents", json={"documents": DOCUMENTS}, headers=ADMIN)
        assert answer.status_code == 507, answer.text  # the write failed: no job, no 202
        assert client.get("/api/jobs", headers=ADMIN).json()["jobs"] == []
        kept = [str(d["id"]) for d in DOCUMENTS[:2]]
        wait_for(lambda: indexed_ids(state, kept) == set(kept), lambda: indexed_ids(state, kept))
        assert served_ids(client, {i: QUERIES[i] for i in kept}) == set(kept)
        assert client.get("/ready").json() == {"status": "ready"}
