"""Bearer parsing and token checks, the body-size limit, and the job book, without the model or the store."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from app.api.deps import bearer_token, token_matches
from app.api.jobs import Job, JobBook, JobInterrupted, JobRunner
from app.api.limits import BodySizeLimit


class FakeRequest:
    def __init__(self, authorization: str | None):
        self.headers = {} if authorization is None else {"authorization": authorization}


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("Bearer abc", b"abc"),
        ("bearer abc", b"abc"),
        ("BEARER   abc  ", b"abc"),
        (None, None),
        ("", None),
        ("Bearer", None),
        ("Bearer ", None),
        ("Basic abc", None),
        ("abc", None),
        ("Bearer \u00e9t\u00e9", None),  # Starlette decodes header bytes as latin-1: non-ASCII is no token
    ],
)
def test_bearer_token(header: str | None, expected: bytes | None) -> None:
    assert bearer_token(FakeRequest(header)) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("given", "expected", "ok"),
    [
        (b"0123456789abcdef", "0123456789abcdef", True),
        (b"0123456789abcdeX", "0123456789abcdef", False),
        (b"0123456789abcde", "0123456789abcdef", False),
        (None, "0123456789abcdef", False),
        (b"0123456789abcdef", None, False),
    ],
)
def test_token_matches(given: bytes | None, expected: str | None, ok: bool) -> None:
    assert token_matches(given, expected) is ok


# -- body size -----------------------------------------------------------------------------------------------


def limited_app(max_bytes: int) -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    app.add_middleware(BodySizeLimit, max_bytes=max_bytes)
    return app


def test_a_body_at_the_limit_passes_and_one_byte_more_is_413() -> None:
    client = TestClient(limited_app(1024))
    assert client.post("/echo", content=b"x" * 1024).json() == {"bytes": 1024}
    too_big = client.post("/echo", content=b"x" * 1025)
    assert too_big.status_code == 413
    assert too_big.json() == {
        "error": "request body is 1025 bytes, over the limit rag.server.max_body_bytes=1024",
        "limit": 1024,
    }


def test_a_chunked_body_without_length_is_cut_off_at_the_limit() -> None:
    client = TestClient(limited_app(1024))

    def chunks():
        for _ in range(10):
            yield b"y" * 200

    response = client.post("/echo", content=chunks())
    assert response.status_code == 413
    assert response.json()["limit"] == 1024


# -- jobs ----------------------------------------------------------------------------------------------------


def test_unfinished_jobs_are_reported_interrupted_at_the_next_start(tmp_path: Path) -> None:
    book = JobBook(tmp_path)
    running = book.create("ingest", documents=3, chunks=300)
    book.update(running, state="running", embedded=120)
    queued = book.create("ingest", documents=1, chunks=70)
    done = book.create("ingest", documents=1, chunks=65)
    book.update(done, state="done", report={"added": 65})

    committed = book.create("ingest", documents=9, chunks=1500)
    book.update(committed, state="running", embedded=1100, stored=1024)

    again = JobBook(tmp_path)
    interrupted = again.recover()
    assert sorted(j.id for j in interrupted) == sorted([running.id, queued.id, committed.id])
    for job_id in (running.id, queued.id, committed.id):
        job = again.get(job_id)
        assert job is not None and job.state == "interrupted"
        on_disk = json.loads((tmp_path / f"{job_id}.json").read_text())
        assert on_disk["state"] == "interrupted"
    # Ingest commits in batches, so the record says what of the job is stored ("nothing of it was
    # written" only for a job that committed no batch).
    for job_id in (running.id, queued.id):
        assert "nothing of it was written" in (again.get(job_id).error or "")  # type: ignore[union-attr]
    error = again.get(committed.id).error or ""  # type: ignore[union-attr]
    assert "1024 of its new chunks had been stored in committed batches and stay stored" in error
    assert "not embedded again" in error
    assert again.get(committed.id).view()["progress"] == {"embedded": 1100, "stored": 1024, "chunks": 1500}  # type: ignore[union-attr]
    assert again.get(done.id).state == "done"  # type: ignore[union-attr]
    assert again.get(running.id).embedded == 120  # type: ignore[union-attr]


def test_only_the_newest_finished_jobs_are_kept(tmp_path: Path) -> None:
    book = JobBook(tmp_path, keep=2, keep_hours=0.0)  # no age to wait for (tests/unit/test_jobs.py)
    jobs = []
    for i in range(4):
        job = book.create("ingest", documents=1, chunks=i)
        book.update(job, state="done")
        jobs.append(job)
    book.create("ingest", documents=1, chunks=9)  # creating prunes
    kept = {j.id for j in book.all()}
    assert len(kept) == 3  # two finished + the queued one
    assert sorted(p.stem for p in tmp_path.glob("j-*.json")) == sorted(kept)


@pytest.mark.parametrize("bad", ["../etc/passwd", "j-1", "", "J-20260101T000000-abcdef01"])
def test_job_lookup_accepts_only_job_ids(tmp_path: Path, bad: str) -> None:
    assert JobBook(tmp_path).get(bad) is None


def test_the_runner_runs_jobs_in_order_and_records_each_outcome(tmp_path: Path) -> None:
    book = JobBook(tmp_path)
    book.recover()
    runner = JobRunner(book)
    order: list[str] = []
    ok, bad = book.create("ingest", 1, 1), book.create("ingest", 1, 1)
    stopper = book.create("ingest", 1, 1)
    never = book.create("ingest", 1, 1)
    finished = threading.Event()

    def works(job: Job) -> dict[str, int]:
        order.append(job.id)
        return {"added": 1}

    def fails(job: Job) -> dict[str, int]:
        order.append(job.id)
        raise RuntimeError("disk full")

    def interrupted(job: Job) -> dict[str, int]:
        order.append(job.id)
        finished.set()
        raise JobInterrupted("the server shut down; nothing was written")

    runner.submit(ok, works)
    runner.submit(bad, fails)
    runner.submit(stopper, interrupted)
    runner.submit(never, works)
    assert finished.wait(5)
    assert runner.stop(timeout=5)
    assert order == [ok.id, bad.id, stopper.id]
    assert (ok.state, ok.report) == ("done", {"added": 1})
    assert (bad.state, bad.error) == ("failed", "RuntimeError: disk full")
    assert stopper.state == "interrupted"
    assert never.state == "queued"  # left for the next start to report
    assert ok.startedAt is not None and ok.finishedAt is not None
