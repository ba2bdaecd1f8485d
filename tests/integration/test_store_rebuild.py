"""`sieve store check` and `sieve store rebuild` in-process (`app.cli.main`) on real Chroma (embedded, and a
`chroma run` server of this module's own) with the packaged e5: API-written documents survive a rebuild under
a new chunk size, a collection broken under Sieve's feet (one record of 6,000 metadata keys written through
chromadb) is named by the check and restored by the rebuild with the same retrieval results, documents the
record lacks make the rebuild refuse, and `sieve ingest --rebuild` keeps what the API wrote."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import chromadb
import numpy as np
import pytest
from chromadb.config import Settings as ChromaClientSettings

from app.cli import main
from app.ingest.check import expected_chunk_ids
from app.ingest.loaders import load_paths
from app.service import Sieve
from app.settings import load_settings
from app.store import StoredChunk
from app.store.types import Document
from tests.fixtures.processes import chroma_run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
KB = REPO / "golden_set" / "knowledge-base"
MODELS_CACHE = REPO / "target" / "models"
QUERIES = ["工资什么时候发", "annual leave days", "corporate card limit", "VPN access", "会议室预订"]
EXIT_OK, EXIT_STORE_DAMAGED = 0, 4


@pytest.fixture(scope="module")
def api_documents() -> list[Document]:
    """The sample base's documents as if written through POST /api/documents (origin "api")."""
    loaded = load_paths([str(KB)])
    assert not loaded.errors
    return [dataclasses.replace(d, origin="api", line=None) for d in loaded.documents]


@pytest.fixture(scope="module")
def own_chroma(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A `chroma run` of this module alone: a broken collection must not reach other modules' server."""
    from tests.conftest import find_free_port

    host, port = "127.0.0.1", find_free_port()
    with chroma_run(tmp_path_factory.mktemp("rebuild-chroma"), port, host):
        yield host, port


@pytest.fixture(params=["embedded", "http"])
def mode(request, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, real_embedder) -> str:
    """The environment of a user's shell on a fresh store of this mode; the session's embedder stands in
    for `load_embedder` (the same model, loaded once)."""
    monkeypatch.chdir(REPO)
    for name in [n for n in os.environ if n.startswith("RAG__")]:
        monkeypatch.delenv(name)
    for name in ("SIEVE_CONFIG", "SIEVE_SERVER", "SIEVE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAG__MODELS__CACHE_DIR", str(MODELS_CACHE))
    monkeypatch.setenv("RAG__LEXICAL__PATH", str(tmp_path / "lexical"))
    if request.param == "embedded":
        monkeypatch.setenv("RAG__STORE__PATH", str(tmp_path / "store"))
    else:
        host, port = request.getfixturevalue("own_chroma")
        monkeypatch.setenv("RAG__STORE__MODE", "http")
        monkeypatch.setenv("RAG__STORE__HOST", host)
        monkeypatch.setenv("RAG__STORE__PORT", str(port))
        monkeypatch.setenv("RAG__STORE__COLLECTION", f"rebuild-{uuid.uuid4().hex[:10]}")
    for where in ("app.service.load_embedder", "app.models.load_embedder"):
        monkeypatch.setattr(where, lambda settings: real_embedder)
    return str(request.param)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def opened() -> Sieve:
    return Sieve.open(load_settings({}))


def ranked(sieve: Sieve) -> list[list[str]]:
    return [[c.doc_id for c in sieve.retrieve(q).documents] for q in QUERIES]


def write_through_the_api(documents: list[Document]) -> list[list[str]]:
    """Write `documents` as the API does (Sieve.ingest_documents: the record, then the index); the ranked
    document ids of QUERIES then."""
    sieve = opened()
    try:
        sieve.ingest_documents(documents)
        return ranked(sieve)
    finally:
        sieve.close()


def assert_every_document_indexed(documents: list[Document], chunk_size: int) -> None:
    """Each document's stored chunk ids are those the record's document makes with `chunk_size`."""
    settings = load_settings({})
    assert settings.rag.ingest.chunk_size == chunk_size
    expected = expected_chunk_ids(documents, settings.rag.ingest)
    sieve = opened()
    try:
        assert sieve.record is not None and sieve.record.count() == len(documents)
        stored = sieve.store.metadata_of([], [d.doc_id for d in documents])
        for doc in documents:
            assert {c for c, m in stored.items() if m["doc_id"] == doc.doc_id} == expected[doc.doc_id]
        assert all(len(c.text) <= chunk_size for c in sieve.store.iter_all())
    finally:
        sieve.close()


def test_api_written_documents_survive_a_rebuild_with_chunk_size_300(
    mode, capsys, monkeypatch, api_documents
) -> None:
    before = write_through_the_api(api_documents)
    assert run(capsys, "store", "check")[0] == EXIT_OK

    code, out, err = run(capsys, "store", "rebuild")  # the same settings: the same results
    assert code == EXIT_OK, err
    assert f"rebuilt: {len(api_documents)} documents" in out
    sieve = opened()
    try:
        assert ranked(sieve) == before
    finally:
        sieve.close()

    monkeypatch.setenv("RAG__INGEST__CHUNK_SIZE", "300")
    code, out, _ = run(capsys, "store", "check")
    assert code == EXIT_STORE_DAMAGED
    assert "whose chunks differ from what the record and the current chunking make" in out
    assert "fix: sieve store rebuild" in out
    code, _, err = run(capsys, "store", "rebuild")
    assert code == EXIT_OK, err
    code, out, _ = run(capsys, "store", "check")
    assert code == EXIT_OK, out
    assert_every_document_indexed(api_documents, 300)


def break_the_collection() -> None:
    """Write one record of 6,000 scalar metadata keys straight into the chunk collection through chromadb,
    as no Sieve path can (the store refuses past 1,000): Chroma 1.5's compactor fails on it for good."""
    store = load_settings({}).rag.store
    same = ChromaClientSettings(anonymized_telemetry=False, allow_reset=False)  # as the store's own client
    if store.mode == "embedded":
        client = chromadb.PersistentClient(path=store.path, settings=same)
    else:
        client = chromadb.HttpClient(host=store.host, port=store.port, settings=same)
    vector = np.zeros((1, 384), dtype=np.float32)
    vector[0, 0] = 1.0
    wide = {f"k{i}": i for i in range(6000)}
    try:
        client.get_collection(store.collection).add(
            ids=["wide"], embeddings=vector, documents=["wide"], metadatas=[wide]
        )
    except Exception:  # embedded Chroma raises at once ("Error in compaction"); a server may answer first
        pass


def test_a_collection_broken_under_sieves_feet_is_named_by_the_check_and_restored_by_the_rebuild(
    mode, capsys, api_documents
) -> None:
    before = write_through_the_api(api_documents)
    break_the_collection()

    code, out, _ = run(capsys, "store", "check")
    assert code == EXIT_STORE_DAMAGED, out
    assert "problem:" in out and "fix: sieve store rebuild" in out
    code, out, _ = run(capsys, "store", "check", "--json")
    assert code == EXIT_STORE_DAMAGED and '"healthy": false' in out

    code, out, err = run(capsys, "store", "rebuild")
    assert code == EXIT_OK, err
    assert run(capsys, "store", "check")[0] == EXIT_OK
    assert_every_document_indexed(api_documents, 600)
    sieve = opened()
    try:
        assert ranked(sieve) == before
    finally:
        sieve.close()


def test_documents_the_record_lacks_make_the_rebuild_refuse_unless_dropped(
    mode, capsys, api_documents
) -> None:
    write_through_the_api(api_documents[:3])
    sieve = opened()
    try:  # written before the record existed: in the index only
        legacy = [
            StoredChunk(f"c_legacy{i}", f"legacy text {i}", {"doc_id": f"legacy-{i}"}) for i in range(7)
        ]
        sieve.store.upsert(legacy, np.eye(384, dtype=np.float32)[:7])
    finally:
        sieve.close()

    code, out, _ = run(capsys, "store", "check")
    assert code == EXIT_STORE_DAMAGED
    assert "7 documents in the collection but not in the record" in out
    code, _, err = run(capsys, "store", "rebuild")
    assert code == EXIT_STORE_DAMAGED
    assert "7 document(s) the document record lacks" in err
    assert "legacy-0, legacy-1, legacy-2, legacy-3, legacy-4 (and 2 more)" in err
    assert "--drop-unrecorded" in err
    assert run(capsys, "store", "check")[0] == EXIT_STORE_DAMAGED  # nothing changed

    code, _, err = run(capsys, "store", "rebuild", "--drop-unrecorded")
    assert code == EXIT_OK, err
    assert run(capsys, "store", "check")[0] == EXIT_OK


def test_ingest_rebuild_keeps_the_api_written_documents(
    mode, capsys, monkeypatch, tmp_path, api_documents
) -> None:
    write_through_the_api(api_documents[:4])
    kb = tmp_path / "kb"
    kb.mkdir()
    (kb / "a.jsonl").write_text('{"id": "file-1", "title": "F", "text": "from a file"}\n', encoding="utf-8")
    monkeypatch.setenv("RAG__INGEST__CHUNK_SIZE", "300")
    code, out, err = run(capsys, "ingest", "--rebuild", str(kb))
    assert code == EXIT_OK, err
    assert "nothing recorded is dropped" in err
    assert "rebuilt: 5 documents" in out
    assert run(capsys, "store", "check")[0] == EXIT_OK
    sieve = opened()
    try:
        assert sieve.record is not None
        assert sorted(sieve.record.hashes()) == sorted([d.doc_id for d in api_documents[:4]] + ["file-1"])
    finally:
        sieve.close()


KILL_DEADLINE_S = 300.0


def rebuild_killed_midway(tmp_path: Path) -> None:
    """`sieve store rebuild` in a process of its own, killed (SIGKILL) once its log says it has embedded
    more than 96 chunks (committed in batches of about 32 whole documents' chunks: at least 32 of them are
    committed then), before it could finish."""
    log_path = tmp_path / "rebuild.log"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAG__INGEST__PROGRESS_LOG_SECONDS": "0.2"}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app", "store", "rebuild"], cwd=REPO, env=env, stdout=log, stderr=log
        )
    try:
        deadline = time.monotonic() + KILL_DEADLINE_S
        while time.monotonic() < deadline and proc.poll() is None:
            done = re.findall(r"ingest progress: chunks (\d+)/", log_path.read_text(encoding="utf-8"))
            if done and int(done[-1]) > 96:
                break
            time.sleep(0.1)
        assert proc.poll() is None, f"the rebuild ended before it was killed:\n{log_path.read_text()}"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_rebuild_leaves_the_old_collection_serving_and_a_rerun_resumes(
    mode, capsys, monkeypatch, tmp_path, api_documents
) -> None:
    before = write_through_the_api(api_documents)
    monkeypatch.setenv("RAG__INGEST__CHUNK_SIZE", "300")
    monkeypatch.setenv("RAG__INGEST__COMMIT_CHUNKS", "32")
    rebuild_killed_midway(tmp_path)

    monkeypatch.delenv("RAG__INGEST__CHUNK_SIZE")
    sieve = opened()  # the old collection, under the old settings: as it was
    try:
        assert ranked(sieve) == before
    finally:
        sieve.close()

    monkeypatch.setenv("RAG__INGEST__CHUNK_SIZE", "300")
    code, out, err = run(capsys, "store", "rebuild")
    assert code == EXIT_OK, err
    rebuilt = re.search(r"rebuilt: (\d+) documents, (\d+) chunks \((\d+) embedded by this run", out)
    assert rebuilt is not None, out
    assert int(rebuilt[1]) == len(api_documents)
    assert 0 < int(rebuilt[3]) <= int(rebuilt[2]) - 32  # what the killed run committed was kept
    assert run(capsys, "store", "check")[0] == EXIT_OK
    assert_every_document_indexed(api_documents, 300)


FOLLOW_DEADLINE_S = 30.0


def test_a_replica_on_a_chroma_server_follows_the_rebuild_through_the_change_log(
    mode, capsys, monkeypatch, api_documents
) -> None:
    if mode == "embedded":
        pytest.skip("an embedded store has one process: no replica to follow")
    write_through_the_api(api_documents)
    replica = opened()  # a serving replica, on the collection the rebuild replaces
    try:
        old_id = replica.store.collection_id
        monkeypatch.setenv("RAG__INGEST__CHUNK_SIZE", "300")
        code, _, err = run(capsys, "store", "rebuild")
        assert code == EXIT_OK, err
        deadline = time.monotonic() + FOLLOW_DEADLINE_S
        while replica.store.collection_id == old_id and time.monotonic() < deadline:
            time.sleep(0.2)
            replica.retrieve(QUERIES[0])  # a query catches up too
        assert replica.store.collection_id != old_id
        new_ids = set(replica.store.iter_ids())
        for query in QUERIES:
            chunks = replica.retrieve(query).documents
            assert chunks and {c.chunk_id for c in chunks} <= new_ids
            assert all(len(c.text) <= 300 for c in chunks)
    finally:
        replica.close()


def test_a_new_embedder_is_taken_by_a_rebuild_without_opening_the_old_collection_with_it(
    mode, capsys, monkeypatch, tiny_embedder_dir, api_documents
) -> None:
    from app.models.embedder import load_embedder  # the real one (`mode` replaced app.models')
    from app.settings import ModelsSettings

    if mode == "http":
        pytest.skip("the store's mode changes nothing here; the embedded run covers it")
    write_through_the_api(api_documents[:6])
    tiny = load_embedder(ModelsSettings(embedder=str(tiny_embedder_dir), cache_dir=str(MODELS_CACHE)))
    monkeypatch.setenv("RAG__MODELS__EMBEDDER", str(tiny_embedder_dir))
    for where in ("app.service.load_embedder", "app.models.load_embedder"):
        monkeypatch.setattr(where, lambda settings: tiny)

    code, out, _ = run(capsys, "store", "check")
    assert code == EXIT_STORE_DAMAGED, out
    assert "was built with embedder multilingual-e5-small" in out and "fix: sieve store rebuild" in out
    code, _, err = run(capsys, "store", "rebuild")
    assert code == EXIT_OK, err
    assert run(capsys, "store", "check")[0] == EXIT_OK
    assert_every_document_indexed(api_documents[:6], 600)  # opened with the new embedder: no mismatch
