"""A full disk is refused, never a hang, against a real `sieve serve` whose store and jobs are on a small
tmpfs (embedded Chroma, the tiny random embedder): written until the disk is down to `rag.store.min_free_mb`,
a write gets 507 with the reason and `/ready` says so, `/health` answers within a second throughout, SIGTERM
stops the server within `rag.server.shutdown_seconds` + 5 s while its jobs wait for space, the server starts
again on the full disk, the filesystem is made larger and the waiting jobs run and new writes succeed
without another restart, and every document answered 200 or 202 is in the index and the record.

With the guard off and the jobs folder alone on a full filesystem, a job-sized write is a 507 that keeps
none of its documents, and the same write is a job that ends done once space is freed.

Mounting a tmpfs needs root (or CAP_SYS_ADMIN): elsewhere the test is skipped, saying so. The unit tests
with fakes are tests/unit/test_disk_full.py."""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.models import load_embedder
from app.settings import ModelsSettings, StoreSettings
from app.store import ChromaStore
from app.store.record import RECORD_FILE, SqliteRecord
from tests.fixtures.processes import stop_process
from tests.fixtures.sieve_serve import clean_env, spawn_serve, wait_ready
from tests.fixtures.tiny_models import TINY_WORDS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "disk-full-it-admin-token-0001"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
DISK_MB = 12
MIN_FREE_MB = 3
SHUTDOWN_S = 5
BATCHES = (1, 4)  # documents a write, in turn: one is written at once (200), four become a job (202)
WORDS = 1500  # a document's words (about 9 KB)
HEALTH_WITHIN_S = 1.0
FILL_FOR_S = 120.0
DONE_WITHIN_S = 120.0


@contextmanager
def tmpfs(folder: Path, megabytes: int) -> Iterator[Path]:
    """A tmpfs of `megabytes` at `folder`, unmounted afterwards; skipped where mounting is not permitted."""
    folder.mkdir()
    command = ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(folder)]
    mounted = subprocess.run(command, capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(
            f"cannot mount a {megabytes} MiB tmpfs here (needs root or CAP_SYS_ADMIN): "
            f"{mounted.stderr.strip() or mounted.returncode}"
        )
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "disk", DISK_MB) as disk:
        yield disk


def fill(folder: Path) -> Path:
    """Write a file into `folder` until its filesystem is full; the file."""
    filler = folder / "filler"
    with filler.open("wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    return filler


def grow(disk: Path, megabytes: int) -> None:
    """Make the tmpfs larger: space is freed, the way an operator would free it."""
    subprocess.run(["mount", "-o", f"remount,size={megabytes}m", str(disk)], check=True)


class HealthWatch:
    """Asks /health every 0.1 s in a thread of its own; `slowest` and `failures` say how it answered."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.slowest = 0.0
        self.failures: list[str] = []
        self.asked = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        with httpx.Client(timeout=5 * HEALTH_WITHIN_S) as client:
            while not self._stop.wait(0.1):
                started = time.monotonic()
                try:
                    answer = client.get(f"{self.url}/health")
                    if answer.status_code != 200:
                        self.failures.append(f"{answer.status_code} {answer.text}")
                except httpx.HTTPError as exc:
                    self.failures.append(f"{type(exc).__name__}: {exc}")
                self.slowest = max(self.slowest, time.monotonic() - started)
                self.asked += 1


def documents(rng: random.Random, first: int, count: int) -> list[dict[str, Any]]:
    return [
        {"id": f"d{i}", "title": f"doc {i}", "text": " ".join(rng.choice(TINY_WORDS) for _ in range(WORDS))}
        for i in range(first, first + count)
    ]


def write_until_refused(client: httpx.Client) -> tuple[list[str], list[dict[str, Any]]]:
    """Writes until several are refused with 507 and the disk is below its reserve (a write is refused
    sooner, when it would take the disk below it): (ids answered 200 or 202, the 507 bodies)."""
    rng = random.Random(11)
    accepted: list[str] = []
    refused: list[dict[str, Any]] = []
    first = writes = 0
    end = time.monotonic() + FILL_FOR_S
    while len(refused) < 3 or client.get("/ready").status_code != 503:
        assert time.monotonic() < end, f"no write refused within {FILL_FOR_S:.0f}s ({len(accepted)} kept)"
        batch = documents(rng, first, BATCHES[writes % len(BATCHES)])
        first, writes = first + len(batch), writes + 1
        answer = client.post("/api/documents", json={"documents": batch}, headers=ADMIN)
        if answer.status_code == 429:  # the queue is full: the worker makes room
            time.sleep(0.2)
            continue
        if answer.status_code == 507:
            refused.append(answer.json())
            continue
        assert answer.status_code in (200, 202), answer.text
        accepted.extend(d["id"] for d in batch)
    return accepted, refused


def unfinished(client: httpx.Client) -> list[dict[str, Any]]:
    return [j for j in client.get("/api/jobs", headers=ADMIN).json()["jobs"] if j["state"] not in ("done",)]


def waiting_for_space(client: httpx.Client) -> bool:
    errors = [str(j["error"]) for j in unfinished(client) if j["error"]]
    return any(e.startswith("waiting for disk space (it runs once there is): ") for e in errors)


def wait_for(check: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def start(env: dict[str, str], port: int, log_path: Path, disk_full: bool = False) -> subprocess.Popen:
    """`sieve serve`, once ready; on a full disk (`disk_full`), once started (/ready then says the disk is
    full, or is 200 while a restart freed a little)."""
    proc = spawn_serve(env, port, log_path)
    url = f"http://127.0.0.1:{port}"
    if not disk_full:
        wait_ready(proc, url, log_path)
        return proc

    def started() -> bool:
        assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
        try:
            return httpx.get(f"{url}/ready", timeout=2).json()["status"] in ("ready", "unavailable")
        except httpx.HTTPError:
            return False

    wait_for(started, 180.0, "sieve serve did not start on the full disk")
    return proc


def sigterm_within(proc: subprocess.Popen, seconds: float) -> None:
    stopped_at = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=seconds) == 0
    assert time.monotonic() - stopped_at < seconds


def assert_answered_throughout(health: HealthWatch) -> None:
    assert health.asked >= 3
    assert health.failures == [], health.failures[:5]
    assert health.slowest < HEALTH_WITHIN_S, f"/health took {health.slowest:.2f}s"


def test_a_full_disk_is_refused_with_507_and_the_server_answers_throughout(
    small_disk: Path, tiny_embedder_dir: Path, free_port: Callable[[], int], tmp_path: Path
) -> None:
    env = clean_env(
        PYTHONPATH=str(REPO),
        RAG__STORE__PATH=str(small_disk / "store"),
        RAG__STORE__MIN_FREE_MB=str(MIN_FREE_MB),
        RAG__SERVER__JOBS_DIR=str(small_disk / "jobs"),
        RAG__SERVER__ADMIN_TOKEN=ADMIN_TOKEN,
        RAG__SERVER__SYNC_WRITE_CHUNKS="8",
        RAG__SERVER__SHUTDOWN_SECONDS=str(SHUTDOWN_S),
        RAG__EVALUATE__ENABLED="false",
        RAG__INGEST__ON_STARTUP="false",
        RAG__INGEST__CHUNK_SIZE="2000",
        RAG__INGEST__CHUNK_OVERLAP="0",
        RAG__INGEST__COMMIT_CHUNKS="16",
        RAG__MODELS__EMBEDDER=str(tiny_embedder_dir),
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "serve.log"
    proc = start(env, port, log_path)
    try:
        with HealthWatch(url) as health, httpx.Client(base_url=url, timeout=30) as client:
            accepted, refused = write_until_refused(client)
            for body in refused:
                assert set(body) == {"error", "requestId"}
                assert body["error"].startswith("insufficient storage: ")
                assert f"rag.store.min_free_mb={MIN_FREE_MB} MiB" in body["error"]
                assert str(small_disk) in body["error"]
            ready = client.get("/ready")
            assert ready.status_code == 503 and ready.json()["reason"].startswith("insufficient storage: ")
            # with jobs left unfinished (whether any are depends on which write filled the disk), the one
            # the worker holds waits for space; the others wait their turn behind it
            if unfinished(client):
                wait_for(lambda: waiting_for_space(client), 10.0, "no unfinished job waits for space")
        assert_answered_throughout(health)
        sigterm_within(proc, SHUTDOWN_S + 5)  # with jobs waiting for space

        proc = start(env, port, log_path, disk_full=True)  # it starts, and its jobs wait
        with HealthWatch(url) as health, httpx.Client(base_url=url, timeout=30) as client:
            wait_for(lambda: client.get("/ready").status_code == 503, 10.0, "/ready never said so")
            grow(small_disk, 4 * DISK_MB)  # space is back; the server is not restarted
            wait_for(lambda: client.get("/ready").status_code == 200, 10.0, "/ready stayed 503")
            later = documents(random.Random(5), 10**6, 4)
            again = client.post("/api/documents", json={"documents": later}, headers=ADMIN)
            assert again.status_code in (200, 202), again.text
            accepted.extend(d["id"] for d in later)
            wait_for(lambda: not unfinished(client), DONE_WITHIN_S, "jobs unfinished after space came back")
            jobs = client.get("/api/jobs", headers=ADMIN).json()["jobs"]
            assert {j["state"] for j in jobs} == {"done"}, jobs
        assert_answered_throughout(health)
        sigterm_within(proc, SHUTDOWN_S + 5)
        log = log_path.read_text(errors="replace")
        assert "Traceback" not in log and "vector store: write" not in log, log[-3000:]
    finally:
        stop_process(proc)

    embedder = load_embedder(ModelsSettings(embedder=str(tiny_embedder_dir)))
    store = ChromaStore.open(StoreSettings(path=str(small_disk / "store")), embedder.identity())
    try:
        indexed = {m["doc_id"] for m in store.metadata_of([], accepted).values()}
    finally:
        store.close()
    assert sorted(set(accepted) - indexed) == []
    record = SqliteRecord(small_disk / "store" / RECORD_FILE)
    try:
        assert [d.doc_id for d in record.get(accepted)] == accepted
    finally:
        record.close()


def test_a_job_sized_write_with_the_jobs_folder_full_is_a_507_that_keeps_none_of_its_documents(
    tmp_path: Path, tiny_embedder_dir: Path, free_port: Callable[[], int]
) -> None:
    """The guard off (`min_free_mb: 0`) and the jobs folder on a full filesystem of its own: the job record
    cannot be saved, so the write is refused whole, its documents not kept; once space is freed the same
    write is a job that ends done."""
    with tmpfs(tmp_path / "jobs", 1) as jobs:
        env = clean_env(
            PYTHONPATH=str(REPO),
            RAG__STORE__PATH=str(tmp_path / "store"),
            RAG__STORE__MIN_FREE_MB="0",
            RAG__SERVER__JOBS_DIR=str(jobs),
            RAG__SERVER__ADMIN_TOKEN=ADMIN_TOKEN,
            RAG__SERVER__SYNC_WRITE_CHUNKS="1",  # every write of more than one chunk is a job
            RAG__EVALUATE__ENABLED="false",
            RAG__INGEST__ON_STARTUP="false",
            RAG__MODELS__EMBEDDER=str(tiny_embedder_dir),
        )
        port = free_port()
        proc = start(env, port, tmp_path / "serve.log")
        try:
            filler = fill(jobs)
            batch = documents(random.Random(3), 0, 4)
            ids = [d["id"] for d in batch]
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
                refused = client.post("/api/documents", json={"documents": batch}, headers=ADMIN)
                assert refused.status_code == 507, refused.text
                assert refused.json()["error"].startswith("insufficient storage: [Errno 28] No space left")
                assert client.get("/api/jobs", headers=ADMIN).json()["jobs"] == []
                record = SqliteRecord(tmp_path / "store" / RECORD_FILE)
                try:
                    assert record.get(ids) == []  # nothing of the refused write was kept
                finally:
                    record.close()

                filler.unlink()  # space is back: no restart
                accepted = client.post("/api/documents", json={"documents": batch}, headers=ADMIN)
                assert accepted.status_code == 202, accepted.text
                job = accepted.json()["job"]
                wait_for(
                    lambda: client.get(f"/api/jobs/{job}", headers=ADMIN).json()["state"] == "done",
                    DONE_WITHIN_S,
                    "the job did not end done",
                )
                assert client.get("/health").json() == {"status": "alive"}
            sigterm_within(proc, 10 + 5)
        finally:
            stop_process(proc)
