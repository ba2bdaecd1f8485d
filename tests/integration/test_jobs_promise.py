"""A 202 is a promise, against a real `sieve serve` (embedded Chroma, the tiny random embedder, one passage
per model call so indexing is slower than the writes): writers past the queue's bound get 429 with
Retry-After; a SIGTERM (or kill -9) with 202 jobs queued, a restart, and every job ends `done` with every
accepted document stored whole (each of its chunks, no other) and kept in the document record; then
DELETE /api/documents/{id} takes one out of both."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.ingest.chunker import chunk_document
from app.ingest.types import Document
from app.models import load_embedder
from app.settings import ModelsSettings, StoreSettings
from app.store import ChromaStore
from app.store.record import RECORD_FILE, SqliteRecord
from tests.fixtures.processes import stop_process
from tests.fixtures.sieve_serve import EXIT_TIMEOUT_S, clean_env, spawn_serve, wait_ready
from tests.fixtures.tiny_models import TINY_WORDS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "jobs-promise-it-admin-token-01"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
CHUNK_SIZE = 200
BOUND = 40  # rag.server.max_queued_documents
BATCH = 5  # documents a write
WRITE_FOR_S = 15.0
DONE_WITHIN_S = 90.0


def env_for(tmp: Path, embedder_dir: Path) -> dict[str, str]:
    return clean_env(
        PYTHONPATH=str(REPO),
        RAG__STORE__PATH=str(tmp / "store"),
        RAG__SERVER__JOBS_DIR=str(tmp / "jobs"),
        RAG__SERVER__ADMIN_TOKEN=ADMIN_TOKEN,
        RAG__SERVER__SYNC_WRITE_CHUNKS="1",
        RAG__SERVER__MAX_QUEUED_DOCUMENTS=str(BOUND),
        RAG__EVALUATE__ENABLED="false",
        RAG__INGEST__ON_STARTUP="false",
        RAG__INGEST__CHUNK_SIZE=str(CHUNK_SIZE),
        RAG__INGEST__CHUNK_OVERLAP="0",
        RAG__INGEST__COMMIT_CHUNKS="8",
        RAG__MODELS__EMBEDDER=str(embedder_dir),
        RAG__MODELS__BATCH_SIZE="1",
    )


def start(env: dict[str, str], port: int, log_path: Path) -> subprocess.Popen:
    proc = spawn_serve(env, port, log_path)
    wait_ready(proc, f"http://127.0.0.1:{port}", log_path)
    return proc


def batch(rng: random.Random, start_at: int) -> list[dict[str, Any]]:
    return [
        {
            "id": f"d{i}",
            "title": f"doc {i}",
            "text": " ".join(rng.choice(TINY_WORDS) for _ in range(300)),
            "topic": "load",
        }
        for i in range(start_at, start_at + BATCH)
    ]


def write_past_the_bound(client: httpx.Client) -> tuple[dict[str, str], list[dict[str, Any]], int]:
    """Send 5-document writes back to back; (job id -> its first doc id, accepted documents, 429s)."""
    rng = random.Random(7)
    jobs: dict[str, str] = {}
    accepted: list[dict[str, Any]] = []
    refused = 0
    next_id = 0
    end = time.monotonic() + WRITE_FOR_S
    while time.monotonic() < end and (refused < 5 or len(jobs) < 3):
        documents = batch(rng, next_id)
        answer = client.post("/api/documents", json={"documents": documents}, headers=ADMIN)
        if answer.status_code == 429:
            refused += 1
            assert 1 <= int(answer.headers["Retry-After"]) <= 120
            assert f"rag.server.max_queued_documents={BOUND}" in answer.json()["error"]
            time.sleep(0.05)
            continue
        assert answer.status_code == 202, answer.text
        jobs[answer.json()["job"]] = documents[0]["id"]
        accepted.extend(documents)
        next_id += BATCH
    return jobs, accepted, refused


def unfinished(client: httpx.Client) -> int:
    listed = client.get("/api/jobs", headers=ADMIN).json()["jobs"]
    return sum(j["state"] in ("queued", "running") for j in listed)


def unfinished_on_disk(jobs_dir: Path) -> set[str]:
    records = [json.loads(p.read_text(encoding="utf-8")) for p in jobs_dir.glob("j-*.json")]
    return {r["id"] for r in records if r["state"] in ("queued", "running")}


def wait_done(client: httpx.Client, job_ids: list[str]) -> list[dict[str, Any]]:
    deadline = time.monotonic() + DONE_WITHIN_S
    views = []
    for job_id in job_ids:
        while (view := client.get(f"/api/jobs/{job_id}", headers=ADMIN).json())["state"] != "done":
            assert view["state"] in ("queued", "running"), view
            assert time.monotonic() < deadline, view
            time.sleep(0.2)
        views.append(view)
    return views


def as_documents(accepted: list[dict[str, Any]]) -> list[Document]:
    return [
        Document(d["id"], d["text"], d["title"], metadata={"topic": d["topic"]}, origin="api")
        for d in accepted
    ]


def chunks_of(accepted: list[dict[str, Any]]) -> set[str]:
    return {c.chunk_id for d in as_documents(accepted) for c in chunk_document(d, CHUNK_SIZE, 0, 1)}


def assert_every_document_whole(
    tmp: Path, embedder_dir: Path, accepted: list[dict[str, Any]], deleted: dict[str, Any]
) -> None:
    """Every accepted document has each of its chunks in the store and no other, and is in the record;
    the deleted one is in neither."""
    ids = [d["id"] for d in accepted]
    embedder = load_embedder(ModelsSettings(embedder=str(embedder_dir)))
    store = ChromaStore.open(StoreSettings(path=str(tmp / "store")), embedder.identity())
    try:
        assert set(store.metadata_of([], ids)) == chunks_of(accepted)
        assert store.metadata_of([], [deleted["id"]]) == {}
    finally:
        store.close()
    record = SqliteRecord(tmp / "store" / RECORD_FILE)
    try:
        assert [d.doc_id for d in record.get(ids)] == ids
        assert record.get([deleted["id"]]) == []
    finally:
        record.close()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_writers_past_the_bound_get_429_and_every_202_job_ends_done_after_a_restart(
    tmp_path: Path, tiny_embedder_dir: Path, free_port: Callable[[], int], stop: signal.Signals
) -> None:
    env = env_for(tmp_path, tiny_embedder_dir)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "serve.log"
    proc = start(env, port, log_path)
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            jobs, accepted, refused = write_past_the_bound(client)
            assert refused >= 1, "no write was refused: indexing kept up with the writers"
            waiting = unfinished(client)
        assert waiting >= 2, f"only {waiting} jobs were waiting at the stop"
        proc.send_signal(stop)
        code = proc.wait(timeout=EXIT_TIMEOUT_S)
        assert code == (0 if stop == signal.SIGTERM else -signal.SIGKILL)

        stopped = unfinished_on_disk(tmp_path / "jobs")
        assert stopped, "every job had finished before the stop"

        proc = start(env, port, log_path)
        with httpx.Client(base_url=url, timeout=30) as client:
            views = wait_done(client, list(jobs))
            assert sum(v["report"]["documents"] for v in views) == len(accepted)
            assert {v["id"] for v in views if v["resumed"] == 1} == stopped
            gone = accepted.pop(0)
            deleted = client.delete(f"/api/documents/{gone['id']}", headers=ADMIN)
            assert deleted.status_code == 200, deleted.text
            assert deleted.json() == {"id": gone["id"], "documents": 1, "chunks": len(chunks_of([gone]))}
            assert client.delete(f"/api/documents/{gone['id']}", headers=ADMIN).status_code == 404
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=EXIT_TIMEOUT_S) == 0
    finally:
        stop_process(proc, EXIT_TIMEOUT_S)
    assert_every_document_whole(tmp_path, tiny_embedder_dir, accepted, gone)
