"""Two `sieve serve` processes on one real `chroma run`: a document written through one is found by the
other's BM25 within rag.lexical.refresh_seconds, and a replaced one disappears from it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.fixtures.processes import chroma_run, stop_process
from tests.fixtures.sieve_serve import wait_ready

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
MODELS_CACHE = REPO / "target" / "models"
SIEVE = Path(sys.executable).with_name("sieve")
ADMIN_TOKEN = "replica-admin-token-0123456789"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
REFRESH_S = 1.0

FILLER = [
    {
        "id": f"filler-{i}",
        "title": f"Note {i}",
        "text": f"Lunch menu number {i}: soup, bread and a salad of the day.",
    }
    for i in range(4)
]


def _start(tmp_path: Path, name: str, chroma_port: int, port: int) -> tuple[subprocess.Popen, str, Path]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG__") and k != "SIEVE_CONFIG"}
    env |= {
        "PYTHONPATH": str(REPO),
        "RAG__STORE__MODE": "http",
        "RAG__STORE__PORT": str(chroma_port),
        "RAG__STORE__COLLECTION": "replicas",
        "RAG__LEXICAL__PATH": str(tmp_path / f"lexical-{name}"),
        "RAG__LEXICAL__REFRESH_SECONDS": str(REFRESH_S),
        "RAG__INGEST__ON_STARTUP": "false",
        "RAG__MODELS__CACHE_DIR": str(MODELS_CACHE),
        "RAG__SERVER__JOBS_DIR": str(tmp_path / f"jobs-{name}"),
        "RAG__SERVER__ADMIN_TOKEN": ADMIN_TOKEN,
        "RAG__EVALUATE__OUTPUT_DIR": str(tmp_path / f"eval-{name}"),
    }
    log_path = tmp_path / f"serve-{name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(SIEVE), "serve", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return proc, f"http://127.0.0.1:{port}", log_path


def _bm25_hits(url: str, query: str) -> dict[str, float]:
    """docId -> bm25 score of the documents whose candidates BM25 found (origin has "bm25", score > 0)."""
    response = httpx.post(f"{url}/api/retrieve", json={"query": query, "topK": 10}, timeout=30)
    assert response.status_code == 200, response.text
    return {
        d["docId"]: d["scores"]["bm25"]
        for d in response.json()["documents"]
        if "bm25" in d["origin"] and (d["scores"]["bm25"] or 0) > 0
    }


def _within(seconds: float, check: Callable[[], bool]) -> float:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if check():
            return time.monotonic() - start
        time.sleep(0.1)
    return -1.0


def test_a_write_through_one_replica_reaches_the_other_replicas_bm25(
    tmp_path: Path, free_port: Callable[[], int]
) -> None:
    chroma_port = free_port()
    (tmp_path / "chroma").mkdir()
    with chroma_run(tmp_path / "chroma", chroma_port):
        a = _start(tmp_path, "a", chroma_port, free_port())
        b = _start(tmp_path, "b", chroma_port, free_port())
        try:
            for proc, url, log_path in (a, b):
                wait_ready(proc, url, log_path)
            a_url, b_url = a[1], b[1]
            written = httpx.post(
                f"{a_url}/api/documents",
                json={
                    "documents": [
                        *FILLER,
                        {
                            "id": "quasar",
                            "title": "Zorblatt",
                            "text": "The zorblatt quasar manual: calibrate it.",
                        },
                    ]
                },
                headers=ADMIN,
                timeout=120,
            )
            assert written.status_code == 200, written.text
            assert "quasar" in _bm25_hits(a_url, "zorblatt quasar")
            # B never saw the write; its BM25 finds the document within the refresh interval (+ request time)
            took = _within(REFRESH_S + 5, lambda: "quasar" in _bm25_hits(b_url, "zorblatt quasar"))
            assert took >= 0, "replica B's BM25 never found the document written through A"

            replaced = httpx.post(
                f"{a_url}/api/documents",
                json={
                    "documents": [
                        {"id": "quasar", "title": "Manual", "text": "The flimwobble pulsar manual."}
                    ]
                },
                headers=ADMIN,
                timeout=120,
            )
            assert replaced.status_code == 200 and replaced.json()["deleted"] >= 1, replaced.text
            assert _within(REFRESH_S + 5, lambda: not _bm25_hits(b_url, "zorblatt")) >= 0
            assert _within(REFRESH_S + 5, lambda: "quasar" in _bm25_hits(b_url, "flimwobble pulsar")) >= 0
        finally:
            for proc, _, _ in (a, b):
                stop_process(proc)

        # B restarts from its persisted index: still in step with the store, nothing rebuilt
        b2 = _start(tmp_path, "b", chroma_port, free_port())
        try:
            wait_ready(*b2)
            assert "quasar" in _bm25_hits(b2[1], "flimwobble pulsar")
            assert not _bm25_hits(b2[1], "zorblatt")
            log = b2[2].read_text()
            assert "BM25 index loaded from" in log, log[-3000:]
        finally:
            stop_process(b2[0])
