"""A collection broken under Sieve's feet, the way issue 33 found it: one record with 6,000 scalar metadata
keys written through chromadb directly breaks Chroma 1.5's compactor for that collection. Measured on Chroma
1.5.9 (embedded and `chroma run`): from that write on, every write of the collection raises
`InternalError: Error in compaction: Failed to apply logs to the metadata segment`; its reads (count, get,
query) raise `InternalError: Error executing plan: Error sending backfill request to compactor: ...` as
soon as they must apply the log: at once when it held writes no read had applied yet, else (a server whose
reads had applied everything before the break) only from its next restart, which does not heal it. The
server answers its heartbeat throughout, and its other collections read and write.

On `chroma run` with the Sieve server up: a write answers 503 with the reason and a request id, `/ready`
turns 503 naming the store within seconds, a retrieval answers 200 or 503 (never 500). On an embedded store
broken while the server runs: a write job ends `failed` with the reason, and `/ready` says it. On one
broken while the server is stopped: `sieve serve` fails to start with one message naming `sieve store
check` and `sieve store rebuild`, exit 3, no traceback.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from app import exit_codes
from app.api.readiness import RECHECK_S
from app.ingest.types import Document
from app.main import create_app
from app.service import Sieve
from app.store import ChromaStore
from tests.conftest import find_free_port
from tests.fixtures.api_server import ADMIN_TOKEN, installs, make_settings, uvicorn_server
from tests.fixtures.processes import chroma_run, stop_process
from tests.fixtures.sieve_serve import clean_env

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
WIDE_KEYS = 6000
COLLECTION = "broken-store"
READY_WITHIN_S = 5.0
SERVE_EXIT_TIMEOUT_S = 180.0

# one record with WIDE_KEYS scalar metadata keys, written through chromadb to the collection `name`
# (`client` is a chromadb client expression); Chroma raises for it, and the collection is broken from then on
BREAK = """
import chromadb
from chromadb.config import Settings
client = {client}
collection = client.get_collection({name!r})
dimension = collection.metadata["embedder_dimension"]
try:
    collection.add(
        ids=["wide"],
        embeddings=[[1.0] + [0.0] * (dimension - 1)],
        metadatas=[{{f"k{{i}}": i for i in range({keys})}}],
    )
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def break_collection(client: str, name: str) -> str:
    """Write the wide record in a process of its own (an embedded path is opened by one process at a time);
    returns what Chroma said."""
    code = textwrap.dedent(BREAK.format(client=client, name=name, keys=WIDE_KEYS))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


DOCS = [
    Document(doc_id="wifi", title="Wi-Fi", text="The guest Wi-Fi password is on the board."),
    Document(doc_id="leave", title="Leave", text="Annual leave is requested through the HR portal."),
]


def test_a_collection_broken_on_a_chroma_server_is_said_by_ready_and_every_request(
    real_embedder, tmp_path: Path
) -> None:
    chroma_port = find_free_port()
    data = tmp_path / "chroma"
    data.mkdir()
    store = {"mode": "http", "host": "127.0.0.1", "port": chroma_port, "collection": COLLECTION}
    settings = make_settings(tmp_path / "unused", tmp_path / "eval", {"rag": {"store": store}})
    with chroma_run(data, chroma_port) as chroma:
        sieve = Sieve(
            settings, real_embedder, ChromaStore.open(settings.rag.store, real_embedder.identity()), None
        )
        sieve.ingest_documents(DOCS)
        app = create_app(settings, start=installs(sieve))
        with uvicorn_server(app) as (host, port):
            client = httpx.Client(
                base_url=f"http://{host}:{port}",
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                timeout=60,
            )
            assert _poll_ready(client, 200, READY_WITHIN_S) == {"status": "ready"}
            said = break_collection(f"chromadb.HttpClient(host='127.0.0.1', port={chroma_port})", COLLECTION)
            assert said.startswith("InternalError Error in compaction")
            took = _writes_fail_and_ready_says_so(client, chroma_port)
            _retrievals_answer_200_or_503(client)

            stop_process(chroma)
            with chroma_run(data, chroma_port):  # the restart: now reads must apply the log, and fail
                ready = _poll_ready(client, 503, READY_WITHIN_S, contains="reads fail since")
                assert f"read from collection '{COLLECTION}' failed: InternalError: " in ready["reason"]
                _retrievals_answer_200_or_503(client)
    sieve.close()
    print(f"/ready turned 503 {took:.2f}s after the write failed")


def test_a_collection_broken_on_a_live_embedded_store_fails_the_job_and_ready_says_so(
    real_embedder, tmp_path: Path
) -> None:
    settings = make_settings(
        tmp_path / "store",
        tmp_path / "eval",
        {"rag": {"store": {"collection": COLLECTION}, "server": {"sync_write_chunks": 1}}},
    )
    sieve = Sieve(
        settings, real_embedder, ChromaStore.open(settings.rag.store, real_embedder.identity()), None
    )
    sieve.ingest_documents(DOCS)
    app = create_app(settings, start=installs(sieve))
    with uvicorn_server(app) as (host, port):
        client = httpx.Client(
            base_url=f"http://{host}:{port}", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60
        )
        assert _poll_ready(client, 200, READY_WITHIN_S) == {"status": "ready"}
        # this process holds the embedded path: the record goes through its own Chroma client
        chroma = sieve.store._client.get_collection(COLLECTION)
        dimension = chroma.metadata["embedder_dimension"]
        with pytest.raises(Exception, match="Error in compaction"):
            chroma.add(
                ids=["wide"],
                embeddings=[[1.0] + [0.0] * (dimension - 1)],
                metadatas=[{f"k{i}": i for i in range(WIDE_KEYS)}],
            )
        two = [{"id": f"new-{i}", "title": "New", "text": f"A new document, number {i}."} for i in range(2)]
        accepted = client.post("/api/documents", json={"documents": two})
        assert accepted.status_code == 202, accepted.text
        job = _job_end(client, accepted.json()["job"])
        assert job["state"] == "failed"
        assert job["error"].startswith(
            f"StoreFailedError: write to collection '{COLLECTION}' failed: InternalError: Error in compaction"
        )
        ready = _poll_ready(client, 503, READY_WITHIN_S)
        assert ready["reason"].startswith(f"vector store embedded Chroma at {tmp_path / 'store'}: ")
        assert "writes fail since" in ready["reason"]
        _retrievals_answer_200_or_503(client)
    sieve.close()


def _job_end(client: httpx.Client, job_id: str) -> Any:
    end = time.monotonic() + 120
    while (job := client.get(f"/api/jobs/{job_id}").json())["state"] not in ("done", "failed", "interrupted"):
        if time.monotonic() > end:
            pytest.fail(f"job {job_id} still {job['state']} after 120 s")
        time.sleep(0.1)
    return job


def _writes_fail_and_ready_says_so(client: httpx.Client, chroma_port: int) -> float:
    """A write answers 503 with the reason and a request id; then /ready says it within READY_WITHIN_S
    (returns how long it took), and still after a recheck (its scratch write fails as the request's did)."""
    new = {"id": "vpn", "title": "VPN", "text": "Connect to the VPN before opening the intranet."}
    write = client.post("/api/documents", json={"documents": [new]})
    failed_at = time.monotonic()
    _assert_store_503(write, f"vector store: write to collection '{COLLECTION}' failed: InternalError: ")
    assert "Error in compaction" in write.json()["error"]
    ready = _poll_ready(client, 503, READY_WITHIN_S)
    took = time.monotonic() - failed_at
    assert ready["status"] == "unavailable"
    assert ready["reason"].startswith(
        f"vector store Chroma server at http://127.0.0.1:{chroma_port}: writes fail since "
    )
    assert f"write to collection '{COLLECTION}' failed: InternalError: Error in compaction" in ready["reason"]
    assert ready["reason"].endswith("; run `sieve store check`")
    time.sleep(RECHECK_S + 1.0)
    assert client.get("/ready").status_code == 503
    return took


def _retrievals_answer_200_or_503(client: httpx.Client) -> None:
    for query in ("guest wifi password", "annual leave"):
        retrieve = client.post("/api/retrieve", json={"query": query})
        assert retrieve.status_code in (200, 503), retrieve.text
        if retrieve.status_code == 503:
            _assert_store_503(retrieve, f"vector store: read from collection '{COLLECTION}' failed: ")
        print(f"retrieval {query!r} on the broken collection: {retrieve.status_code}")


def _assert_store_503(response: httpx.Response, starts: str) -> None:
    assert response.status_code == 503, response.text
    body = response.json()
    assert set(body) == {"error", "requestId"}
    assert body["error"].startswith(starts), body["error"]
    assert response.headers["X-Request-Id"] == body["requestId"]


def _poll_ready(client: httpx.Client, status: int, within_s: float, contains: str = "") -> Any:
    end = time.monotonic() + within_s
    while True:
        response = client.get("/ready")
        if response.status_code == status and contains in response.text:
            return response.json()
        if time.monotonic() > end:
            pytest.fail(f"/ready still {response.status_code} {response.text} after {within_s}s")
        time.sleep(0.1)


def test_a_start_up_on_an_embedded_store_broken_while_stopped_names_check_and_rebuild(tmp_path: Path) -> None:
    store = tmp_path / "store"
    env = clean_env(
        RAG__STORE__PATH=str(store),
        RAG__STORE__COLLECTION=COLLECTION,
        RAG__INGEST__PATHS="[]",
        RAG__EVALUATE__ENABLED="false",
        RAG__EVALUATE__OUTPUT_DIR=str(tmp_path / "eval"),
        RAG__SERVER__JOBS_DIR=str(tmp_path / "jobs"),
        RAG__SERVER__PORT=str(find_free_port()),
        PYTHONPATH=str(REPO),
    )
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "wifi.md").write_text("# Wi-Fi\n\nThe guest Wi-Fi password is on the board.\n", encoding="utf-8")
    ingest = _sieve(["ingest", str(docs)], env)
    assert ingest.returncode == 0, ingest.stderr[-3000:]
    said = break_collection(f"chromadb.PersistentClient(path={str(store)!r})", COLLECTION)
    assert said.startswith("InternalError Error in compaction")

    serve = _sieve(["serve"], env)
    assert serve.returncode == exit_codes.UNAVAILABLE, serve.stderr[-3000:]
    [failed] = [line for line in serve.stderr.splitlines() if "startup failed" in line]
    assert failed.endswith(
        "Run `sieve store check` to see what is wrong, then `sieve store rebuild` to rebuild the index from "
        "the documents Sieve kept"
    )
    assert (
        f"the vector store cannot be used: read from collection '{COLLECTION}' failed: InternalError: "
        in failed
    )
    assert "Traceback" not in serve.stderr
    print(failed)


def _sieve(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=SERVE_EXIT_TIMEOUT_S,
    )
