"""A real `sieve serve` under hostile load, over HTTP: a burst of long, wide debug retrievals against a small
admission limit, and what a reader's debug trace may name.

The server runs with the default access (no api_token: anyone who reaches the port is a reader) plus an admin
token, and admits 2 retrievals at once with 2 waiting, so the burst is cheap and most of it is refused."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.fixtures.processes import stop_process
from tests.fixtures.seeded_store import seeded_store

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
MODELS_CACHE = REPO / "target" / "models"
SIEVE = Path(sys.executable).with_name("sieve")
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 20.0
ADMIN_TOKEN = "hostile-load-admin-token-0123456789"
BURST = 60
MAX_RUNNING, MAX_QUEUED = 2, 2
PROBE_EVERY_S = 0.05
# documents of the sample base no reader may see named: a draft, a retired one and one not yet effective
HIDDEN = ["hr-remote-work-draft", "travel-expense-2022", "security-password-policy-v3-zh"]
QUERIES = [
    "hybrid work policy: how many days a week may I work from home, and who approves it?",
    "国内差旅住宿费用标准是多少？",
    "密码策略：密码最少多少位，多久必须更换？",
]


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    log_path: Path

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, free_port: Callable[[], int]) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("hostile-load")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG__") and k != "SIEVE_CONFIG"}
    env |= {
        "RAG__STORE__PATH": str(seeded_store(tmp / "store")),
        "RAG__MODELS__CACHE_DIR": str(MODELS_CACHE),
        "RAG__SERVER__JOBS_DIR": str(tmp / "jobs"),
        "RAG__SERVER__ADMIN_TOKEN": ADMIN_TOKEN,
        "RAG__EVALUATE__ENABLED": "false",
        "RAG__SERVER__MAX_CONCURRENT_RETRIEVALS": str(MAX_RUNNING),
        "RAG__SERVER__MAX_QUEUED_RETRIEVALS": str(MAX_QUEUED),
        "RAG__SERVER__QUEUE_TIMEOUT_MS": "500",
    }
    log_path = tmp / "serve.log"
    with log_path.open("wb") as log:  # a file, not a pipe: nobody drains a pipe while we poll
        proc = subprocess.Popen(
            [str(SIEVE), "serve", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    running = Server(proc, f"http://127.0.0.1:{port}", log_path)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"sieve serve exited with {proc.returncode} before ready:\n{running.tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"sieve serve not ready after {READY_TIMEOUT_S:.0f}s:\n{running.tail()}")
            try:
                if httpx.get(f"{running.url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        yield running
    finally:
        stop_process(proc, STOP_TIMEOUT_S)


def long_query(i: int) -> str:
    base = f"{QUERIES[i % len(QUERIES)]} expense reimbursement annual leave payroll VPN visitor {i} "
    return (base * (1000 // len(base) + 1))[:1000]


def test_a_burst_is_admitted_up_to_the_limit_refused_past_it_and_health_and_ready_keep_answering(
    server: Server,
) -> None:
    probes: dict[str, list[float]] = {"/health": [], "/ready": []}
    probe_failures: list[str] = []
    stop = threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            while not stop.is_set():
                for path, expected in (("/health", {"status": "alive"}), ("/ready", {"status": "ready"})):
                    started = time.perf_counter()
                    try:
                        answer = client.get(path)
                        ok = answer.status_code == 200 and answer.json() == expected
                    except httpx.HTTPError as exc:
                        ok, answer = False, exc  # type: ignore[assignment]
                    probes[path].append(time.perf_counter() - started)
                    if not ok:
                        probe_failures.append(f"{path}: {answer!r}")
                time.sleep(PROBE_EVERY_S)

    outcomes: list[tuple[int, str | None, float]] = []
    errors: list[str] = []
    barrier = threading.Barrier(BURST)

    def retrieve(i: int) -> None:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            barrier.wait()
            started = time.perf_counter()
            try:
                answer = client.post(
                    "/api/retrieve", json={"query": long_query(i), "topK": 100, "debug": True}
                )
            except httpx.HTTPError as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                return
            outcomes.append(
                (answer.status_code, answer.headers.get("retry-after"), time.perf_counter() - started)
            )

    prober = threading.Thread(target=probe)
    prober.start()
    time.sleep(0.3)  # a few probes before the burst
    started = time.perf_counter()
    threads = [threading.Thread(target=retrieve, args=(i,)) for i in range(BURST)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    burst_s = time.perf_counter() - started
    time.sleep(0.3)
    stop.set()
    prober.join(30)

    statuses = sorted({status for status, _, _ in outcomes})
    admitted = [s for s, _, _ in outcomes if s == 200]
    refused = [(s, retry) for s, retry, _ in outcomes if s in (429, 503)]
    for path, seconds in probes.items():
        ms = sorted(1000 * s for s in seconds)
        print(
            f"{path}: {len(ms)} probes during a {BURST}-request burst ({burst_s:.1f} s): p50 "
            f"{statistics.median(ms):.1f} ms, max {ms[-1]:.1f} ms"
        )
    print(f"retrievals: {len(admitted)} admitted (200), {len(refused)} refused, statuses {statuses}")
    assert errors == [], errors
    assert len(outcomes) == BURST
    assert set(statuses) <= {200, 429, 503}, f"unexpected statuses {statuses}:\n{server.tail()}"
    assert len(admitted) >= MAX_RUNNING
    assert refused, "a burst of 60 against 2 running + 2 waiting refused nothing"
    assert all(retry is not None and int(retry) >= 1 for _, retry in refused)
    assert probe_failures == []
    for path, seconds in probes.items():
        assert len(seconds) >= 3
        assert max(seconds) < 1.0, f"{path} took {max(seconds):.2f} s during the burst"
    assert "admission: refused" in server.log_path.read_text(errors="replace")


def debug_answers(server: Server, headers: dict[str, str]) -> list[httpx.Response]:
    with httpx.Client(base_url=server.url, timeout=60, headers=headers) as client:
        answers = []
        for query in QUERIES:
            answer = client.post("/api/retrieve", json={"query": query, "topK": 100, "debug": True})
            for _ in range(50):  # the burst test may still be draining: a 429 says when to come back
                if answer.status_code != 429:
                    break
                time.sleep(float(answer.headers["retry-after"]))
                answer = client.post("/api/retrieve", json={"query": query, "topK": 100, "debug": True})
            assert answer.status_code == 200, answer.text
            answers.append(answer)
        return answers


def test_a_readers_debug_trace_names_no_hidden_document_and_the_admins_names_them(server: Server) -> None:
    readers = debug_answers(server, {})
    for answer in readers:
        for doc_id in HIDDEN:
            assert doc_id not in answer.text
    withheld = {
        group["reason"]: group["count"]
        for answer in readers
        for stage in answer.json()["stages"]
        for group in stage["withheld"]
    }
    print(f"reader: withheld removals by reason {withheld}")
    assert {"status=draft", "status=retired", "not yet effective"} <= set(withheld)

    admins = debug_answers(server, {"Authorization": f"Bearer {ADMIN_TOKEN}"})
    named = {
        item["docId"]
        for answer in admins
        for stage in answer.json()["stages"]
        for item in stage["removedItems"]
    }
    assert set(HIDDEN) <= named
    assert all(stage["withheld"] == [] for answer in admins for stage in answer.json()["stages"])
