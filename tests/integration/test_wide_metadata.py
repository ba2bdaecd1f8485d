"""The fault of issue 33 on the real thing: a document with 6,000 scalar metadata keys, which Chroma cannot
take on one record (its breaking point is between 5,000 and 5,500 keys: every later write, and after a restart
the start itself, fails), sent through a real `sieve serve`, and as a line of a JSONL file and as a Markdown
page's front matter given to `sieve ingest`. On an embedded Chroma and on a real `chroma run`: the document is
refused before anything of it is written (422 naming `documents.0` and the bound; exit 2 naming the file and
line), and the store still reads, writes, restarts and ingests.

What was written is read here once the `sieve` process is done with the store: the doc ids of its chunks and
of its document record."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.settings import StoreSettings
from app.store import ChromaStore
from app.store.record import open_record
from tests.fixtures.processes import chroma_run, stop_process
from tests.fixtures.sieve_serve import EXIT_TIMEOUT_S, clean_env, wait_ready

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SIEVE = Path(sys.executable).with_name("sieve")
ADMIN_TOKEN = "wide-metadata-admin-token-0123"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
COMMAND_TIMEOUT_S = 300
WIDE_KEYS = 6000
MAX_METADATA_KEYS = 64  # rag.ingest.max_metadata_keys by default: the API's bound and every loader's

WIDE = {
    "id": "wide",
    "title": "Wide",
    "text": "A document with too many fields.",
    **{f"k{i}": i for i in range(WIDE_KEYS)},
}
JUST_PAST = {
    "id": "just-past",
    "text": "One field too many.",
    **{f"k{i}": "v" for i in range(MAX_METADATA_KEYS + 1)},
}
COMPANION = {
    "id": "companion",
    "title": "Lighthouse",
    "text": "The lighthouse keeper winds the lamp at dusk.",
}
FERRY = {"id": "ferry", "title": "Harbour ferry", "text": "The harbour ferry leaves the north pier at seven."}
AT_BOUND = {
    "id": "at-bound",
    "title": "Orchard",
    "text": "The orchard's apricots are picked in the first week of July.",
    **{f"k{i}": f"value {i}" for i in range(MAX_METADATA_KEYS)},
}


@dataclass
class Target:
    """A store under test: the settings a `sieve` process gets for it and the same, to open it here."""

    env: dict[str, str]
    store: StoreSettings


@pytest.fixture(params=["embedded", "chroma-run"])
def target(request: pytest.FixtureRequest, tmp_path: Path, free_port: Callable[[], int]) -> Iterator[Target]:
    """An empty store: an embedded Chroma folder, or a collection on a `chroma run` of its own (the fault
    spreads to every collection of a server, so no other test's server is used)."""
    if request.param == "embedded":
        path = tmp_path / "store"
        yield Target({"RAG__STORE__PATH": str(path)}, StoreSettings(path=str(path)))
        return
    port = free_port()
    (tmp_path / "chroma").mkdir()
    with chroma_run(tmp_path / "chroma", port):
        env = {
            "RAG__STORE__MODE": "http",
            "RAG__STORE__PORT": str(port),
            "RAG__STORE__COLLECTION": "wide",
            "RAG__LEXICAL__PATH": str(tmp_path / "lexical"),
        }
        yield Target(env, StoreSettings(mode="http", port=port, collection="wide"))


def sieve_env(target: Target, tmp_path: Path) -> dict[str, str]:
    return clean_env(
        **target.env,
        RAG__INGEST__ON_STARTUP="false",
        RAG__EVALUATE__ENABLED="false",
        RAG__EVALUATE__OUTPUT_DIR=str(tmp_path / "eval"),
        RAG__SERVER__ADMIN_TOKEN=ADMIN_TOKEN,
        RAG__SERVER__JOBS_DIR=str(tmp_path / "jobs"),
    )


@contextmanager
def serving(env: dict[str, str], port: int, log_path: Path) -> Iterator[tuple[subprocess.Popen, str]]:
    """`sieve serve` on `port`, ready (/ready 200); stopped on exit if the test has not stopped it."""
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [str(SIEVE), "serve", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(proc, url, log_path)
        yield proc, url
    finally:
        stop_process(proc, EXIT_TIMEOUT_S)


def stop(proc: subprocess.Popen, log_path: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=EXIT_TIMEOUT_S)
    assert code == 0, log_path.read_text(errors="replace")[-3000:]


def top_doc(client: httpx.Client, query: str) -> str | None:
    answer = client.post("/api/retrieve", json={"query": query, "topK": 3})
    assert answer.status_code == 200, answer.text
    documents = answer.json()["documents"]
    return documents[0]["docId"] if documents else None


@dataclass
class Kept:
    """The doc ids a store holds: in its chunk collection (the index) and in its document record."""

    index: set[str]
    record: set[str]


def kept(target: Target, embedder: Any) -> Kept:
    """What the store holds, read once no `sieve` process holds it."""
    store = ChromaStore.open(target.store, embedder.identity())
    record = open_record(target.store, store.client)
    try:
        return Kept(
            {str(c.metadata["doc_id"]) for c in store.iter_all(include_text=False)},
            {d.doc_id for d in record.iter_documents()},
        )
    finally:
        record.close()
        store.close()


def test_a_6000_key_document_gets_422_and_the_server_still_reads_writes_and_restarts(
    target: Target, tmp_path: Path, free_port: Callable[[], int], real_embedder: Any
) -> None:
    env, log_path = sieve_env(target, tmp_path), tmp_path / "serve.log"
    with (
        serving(env, free_port(), log_path) as (proc, url),
        httpx.Client(base_url=url, timeout=120) as client,
    ):
        refused = client.post("/api/documents", json={"documents": [WIDE, COMPANION]}, headers=ADMIN)
        assert refused.status_code == 422, refused.text
        assert refused.json()["fields"] == [
            {
                "field": "documents.0",
                "message": f"an object of {WIDE_KEYS + 3} keys; no request takes more than "
                f"{MAX_METADATA_KEYS + 3} (a document: id, title, text and "
                f"rag.ingest.max_metadata_keys={MAX_METADATA_KEYS} metadata fields)",
            }
        ]
        # one past the bound passes the shape check and is refused by the document's own bound
        past = client.post("/api/documents", json={"documents": [COMPANION, JUST_PAST]}, headers=ADMIN)
        assert past.status_code == 422, past.text
        assert past.json()["fields"] == [
            {
                "field": "documents.1",
                "message": f"documents[1] (id just-past): has {MAX_METADATA_KEYS + 1} metadata keys, more "
                f"than rag.ingest.max_metadata_keys={MAX_METADATA_KEYS}; nothing of this request was written",
            }
        ]
        assert top_doc(client, "who winds the lighthouse lamp") is None  # the companions were not written

        written = client.post("/api/documents", json={"documents": [FERRY, AT_BOUND]}, headers=ADMIN)
        assert written.status_code == 200, written.text
        assert (written.json()["added"], written.json()["errors"]) == (2, [])
        assert top_doc(client, "when does the harbour ferry leave") == "ferry"
        assert top_doc(client, "when are the apricots picked") == "at-bound"
        stop(proc, log_path)

    assert kept(target, real_embedder) == Kept({"ferry", "at-bound"}, {"ferry", "at-bound"})

    with (
        serving(env, free_port(), log_path) as (proc, url),
        httpx.Client(base_url=url, timeout=120) as client,
    ):
        assert client.get("/ready").status_code == 200
        assert top_doc(client, "when does the harbour ferry leave") == "ferry"
        again = client.post("/api/documents", json={"documents": [COMPANION]}, headers=ADMIN)
        assert again.status_code == 200 and again.json()["added"] == 1, again.text
        assert top_doc(client, "who winds the lighthouse lamp") == "companion"
        stop(proc, log_path)


def narrowed(document: dict[str, Any], fields: int) -> dict[str, Any]:
    """`document` with only its first `fields` metadata fields."""
    metadata = [k for k in document if k not in ("id", "title", "text")][:fields]
    return {k: document[k] for k in ("id", "title", "text", *metadata)}


def jsonl(path: Path, *documents: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(d) + "\n" for d in documents), encoding="utf-8")
    return path


def ingest(env: dict[str, str], folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SIEVE), "ingest", str(folder)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )


def front_matter_page(path: Path, keys: int) -> Path:
    """A Markdown page whose front matter has `keys` keys."""
    front = "".join(f"k{i}: {i}\n" for i in range(keys))
    path.write_text(f"---\n{front}---\n# Wide notes\n\nThe tide tables hang by the harbour door.\n", "utf-8")
    return path


def test_a_6000_key_jsonl_line_or_front_matter_is_exit_2_naming_the_file_and_the_rest_is_ingested(
    target: Target, tmp_path: Path, real_embedder: Any
) -> None:
    env, kb = sieve_env(target, tmp_path), tmp_path / "kb"
    kb.mkdir()
    jsonl(kb / "a-good.jsonl", FERRY, COMPANION)
    wide_file = jsonl(kb / "b-wide.jsonl", AT_BOUND, WIDE)
    wide_page = front_matter_page(kb / "c-wide.md", WIDE_KEYS)

    done = ingest(env, kb)
    assert done.returncode == 2, done.stderr[-3000:]
    assert (
        f"error: {wide_file}:2: document 'wide' has {WIDE_KEYS} metadata keys, more than "
        f"rag.ingest.max_metadata_keys={MAX_METADATA_KEYS}\n"
    ) in done.stderr
    # the page's front matter and the `source` its loader adds
    assert (
        f"error: {wide_page}: document 'c-wide' has {WIDE_KEYS + 1} metadata keys, more than "
        f"rag.ingest.max_metadata_keys={MAX_METADATA_KEYS}\n"
    ) in done.stderr
    assert "Traceback" not in done.stderr
    good = {"ferry", "companion", "at-bound"}
    assert kept(target, real_embedder) == Kept(good, good)

    # the next ingest of that store works: the wide line and the wide front matter narrowed
    jsonl(wide_file, AT_BOUND, narrowed(WIDE, 10))
    front_matter_page(wide_page, 10)
    again = ingest(env, kb)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "added=2 " in again.stdout
    everything = good | {"wide", "c-wide"}
    assert kept(target, real_embedder) == Kept(everything, everything)
