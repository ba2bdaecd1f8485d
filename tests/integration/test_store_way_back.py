"""Every collection and file Sieve owns (app/store/owned.py), broken one at a time on a real embedded store
(the packaged e5, four tiny documents written as the API writes them): `sieve store check` names it (exit 4,
the problem's `part`), the way back its message names is run as written and succeeds, the store then serves
every recorded document and `sieve store check` exits 0. The commands run in-process (`app.cli.main`), in a
folder of the test's own (backups and jobs land there), with the repository's settings file.

The breakages: the change log (one record of 6,000 metadata keys, which breaks Chroma's compactor for it;
one entry whose body is not JSON), the record (pages garbled, the header garbled; with a backup and
without), Chroma's `chroma.sqlite3` (pages, header), a staging collection a killed rebuild left (intact, and
broken), the BM25 snapshot, a job record. The chunk collection itself: tests/integration/
test_store_rebuild.py.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import chromadb
import numpy as np
import pytest
from chromadb.config import Settings as ChromaClientSettings
from fastapi.testclient import TestClient

from app.cli import main
from app.main import create_app
from app.service import Sieve
from app.settings import load_settings
from app.store import StoreError
from app.store.owned import BM25, CHANGE_LOG, CHROMA_FILES, JOBS, RECORD, STAGING
from app.store.record import RecordError
from app.store.types import Document
from tests.conftest import find_free_port
from tests.fixtures.api_server import installs
from tests.fixtures.processes import chroma_run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
MODELS_CACHE = REPO / "target" / "models"
EXIT_OK, EXIT_STORE_DAMAGED = 0, 4
COLLECTION = "sieve"
WIDE_KEYS = 6000
TOKEN = "way-back-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}

DOCS = [
    Document(
        doc_id="wifi",
        title="Guest Wi-Fi",
        text="# Guest Wi-Fi\n\nThe guest network is Visitors. Its password is on the board in reception.",
        origin="api",
    ),
    Document(
        doc_id="leave",
        title="Annual leave",
        text="Annual leave is requested through the HR portal at least two weeks ahead.",
        metadata={"knowledge": "hr"},
        origin="api",
    ),
    Document(doc_id="vpn", title="VPN", text="Connect to the VPN before opening the intranet.", origin="api"),
    Document(doc_id="payroll", title="工资", text="工资在每月10日发放，遇节假日提前。", origin="api"),
]


def _shell(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, real_embedder) -> None:
    """A user's shell in `tmp_path` (RAG__STORE__* as set before), with DOCS written as the API writes them
    (the record, then the index). The session's embedder stands in for `load_embedder` (the same model,
    loaded once)."""
    monkeypatch.chdir(tmp_path)
    for name in ("SIEVE_SERVER", "SIEVE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SIEVE_CONFIG", str(REPO / "config" / "application.yml"))
    monkeypatch.setenv("RAG__MODELS__CACHE_DIR", str(MODELS_CACHE))
    monkeypatch.setenv("RAG__SERVER__JOBS_DIR", str(tmp_path / "jobs"))
    for where in ("app.service.load_embedder", "app.models.load_embedder"):
        monkeypatch.setattr(where, lambda settings: real_embedder)
    sieve = Sieve.open(load_settings({}))
    try:
        sieve.ingest_documents(DOCS)
    finally:
        sieve.close()


@pytest.fixture(autouse=True)
def _no_outside_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("RAG__")]:
        monkeypatch.delenv(name)


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, real_embedder) -> Path:
    """A fresh embedded store holding DOCS, in a shell of the test's own (`_shell`); the store's folder."""
    monkeypatch.setenv("RAG__STORE__PATH", str(tmp_path / "store"))
    _shell(monkeypatch, tmp_path, real_embedder)
    return tmp_path / "store"


@pytest.fixture(scope="module")
def own_chroma(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A `chroma run` of this module alone: broken collections must not reach other modules' server."""
    host, port = "127.0.0.1", find_free_port()
    with chroma_run(tmp_path_factory.mktemp("way-back-chroma"), port, host):
        yield host, port


@pytest.fixture
def server_store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, real_embedder, own_chroma) -> str:
    """As `store`, on a Chroma server (a collection of the test's own); the collection's name."""
    host, port = own_chroma
    collection = f"way-back-{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("RAG__STORE__MODE", "http")
    monkeypatch.setenv("RAG__STORE__HOST", host)
    monkeypatch.setenv("RAG__STORE__PORT", str(port))
    monkeypatch.setenv("RAG__STORE__COLLECTION", collection)
    monkeypatch.setenv("RAG__LEXICAL__PATH", str(tmp_path / "lexical"))
    _shell(monkeypatch, tmp_path, real_embedder)
    return collection


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def check(capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code, out, _ = run(capsys, "store", "check", "--json")
    return code, json.loads(out)


QUOTED = re.compile(r"`(sieve store [^`]+)`")  # not "with `sieve serve` stopped"
LEADING = re.compile(r"^(sieve store [a-z]+(?: --[a-z-]+)*)")


def commands_in(message: str) -> list[str]:
    """Every `sieve ...` command a message names in backquotes, else the one its first words are (a fix
    such as "sieve store rebuild (it makes the change log anew)"), without the leading `sieve`."""
    found = QUOTED.findall(message) or [m[1] for m in [LEADING.search(message)] if m is not None]
    assert found, f"the message names no sieve command: {message}"
    return [command.split(" ", 1)[1] for command in found]


def served_documents() -> dict[str, Document]:
    """What a freshly opened Sieve serves: every recorded document (by id), each retrievable by its title."""
    sieve = Sieve.open(load_settings({}))
    try:
        assert sieve.record is not None and sieve.record.damage is None
        recorded = {d.doc_id: d for d in sieve.record.iter_documents()}
        for doc in recorded.values():
            found = [c.doc_id for c in sieve.retrieve(doc.title, top_k=4).documents]
            assert doc.doc_id in found, (doc.doc_id, found)
        return recorded
    finally:
        sieve.close()


def follow_the_way_back(capsys: pytest.CaptureFixture[str], part: str, *messages: str) -> list[str]:
    """`sieve store check` names `part` (exit 4). Every command its problems' fixes name, and every command
    `messages` name (what serving said of the same breakage), is run as written: each exits 0, but for
    `store check`, which may exit 4 naming a problem and its next step. Then the check exits 0 and every
    document of DOCS is served. The commands run, in order."""
    code, report = check(capsys)
    assert code == EXIT_STORE_DAMAGED, report
    assert [p for p in report["problems"] if p["part"] == part], report["problems"]
    named = [c for message in messages for c in commands_in(message)]
    named += [c for p in report["problems"] for c in commands_in(p["fix"])]
    commands = list(dict.fromkeys(named))
    for command in commands:
        code, out, err = run(capsys, *command.split())
        allowed = (EXIT_OK, EXIT_STORE_DAMAGED) if command.startswith("store check") else (EXIT_OK,)
        assert code in allowed, f"`sieve {command}` failed ({code}): {out}\n{err}"
    code, report = check(capsys)
    assert code == EXIT_OK, report["problems"]
    assert sorted(served_documents()) == sorted(d.doc_id for d in DOCS)
    return commands


def chroma_client(store: Path) -> chromadb.ClientAPI:
    return chromadb.PersistentClient(
        path=str(store), settings=ChromaClientSettings(anonymized_telemetry=False, allow_reset=False)
    )


def add_wide_record(collection: chromadb.Collection, dimension: int) -> None:
    """One record of WIDE_KEYS metadata keys: Chroma 1.5's compactor fails on it for good."""
    vector = np.zeros((1, dimension), dtype=np.float32)
    vector[0, 0] = 1.0
    try:
        collection.add(ids=["wide"], embeddings=vector, metadatas=[{f"k{i}": i for i in range(WIDE_KEYS)}])
    except Exception:  # embedded Chroma raises at once ("Error in compaction")
        pass


def garble(path: Path, pages: range | None) -> None:
    """Random bytes over `pages` (4 KiB pages) of the SQLite file `path`, or over its 100-byte header."""
    rng = np.random.default_rng(7)
    with open(path, "r+b") as f:
        if pages is None:
            f.write(rng.bytes(100))
            return
        size = path.stat().st_size
        for page in pages:
            if page * 4096 < size:
                f.seek(page * 4096)
                f.write(rng.bytes(4096))


def checkpointed(record: Path) -> None:
    """The record's WAL written into the main file (as a clean close leaves it), so garbling the file
    garbles the documents."""
    import sqlite3

    db = sqlite3.connect(record)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


# -- the change log --------------------------------------------------------------------------------------


def test_a_change_log_broken_by_a_wide_record_is_named_and_rebuilt(store, capsys) -> None:
    add_wide_record(chroma_client(store).get_collection(f"{COLLECTION}-changes"), 1)
    assert follow_the_way_back(capsys, CHANGE_LOG) == ["store rebuild"]


def test_a_change_log_entry_that_is_not_json_is_named_serve_reads_the_store_and_rebuild_remakes_it(
    store, capsys, caplog
) -> None:
    changes = chroma_client(store).get_collection(f"{COLLECTION}-changes")
    changes.add(
        ids=["garbage"], embeddings=[[1.0]], documents=["{not json"], metadatas=[{"stamp": time.time_ns()}]
    )
    sieve = Sieve.open(load_settings({}))  # the start of `sieve serve`: no traceback
    try:
        assert sieve.retrieve("VPN").documents
    finally:
        sieve.close()
    said = next(line for line in caplog.text.splitlines() if "is not a JSON object" in line)
    assert f"change log '{COLLECTION}-changes'" in said and "entry 'garbage' is not a JSON object" in said
    assert "every chunk's metadata re-read" in said and "`sieve store rebuild`" in said
    assert follow_the_way_back(capsys, CHANGE_LOG, said) == ["store rebuild"]


# -- the record --------------------------------------------------------------------------------------------


def test_a_record_with_garbled_pages_refuses_writes_and_comes_back_from_its_backup(
    store, capsys, monkeypatch
) -> None:
    code, out, err = run(capsys, "store", "backup")
    assert code == EXIT_OK, err
    backup = Path(out.split(" to ")[-1].strip())
    assert out.startswith("backed up: 4 documents, 0 tombstone(s) to ") and backup.is_file()
    record = store / "documents.sqlite3"
    checkpointed(record)
    garble(record, range(1, 9))

    monkeypatch.setenv("RAG__SERVER__ADMIN_TOKEN", TOKEN)
    settings = load_settings({})
    sieve = Sieve.open(settings)  # `sieve serve`: serves the index, refuses writes, /ready says why
    try:
        assert sieve.record is not None and sieve.record.damage is not None
        with TestClient(create_app(settings, start=installs(sieve))) as client:
            ready = client.get("/ready")
            said = [ready.json()["reason"]]
            assert ready.status_code == 503
            assert f"document record {record} is damaged (PRAGMA quick_check: " in ready.json()["reason"]
            assert f"`sieve store restore {backup}`" in ready.json()["reason"]
            new = {"id": "new", "title": "New", "text": "A new document."}
            write = client.post("/api/documents", json={"documents": [new]}, headers=ADMIN)
            assert write.status_code == 503, write.text
            assert f"document record {record} is damaged (" in write.json()["error"]
            assert f"`sieve store restore {backup}`" in write.json()["error"]
            said.append(write.json()["error"])
            assert client.post("/api/retrieve", json={"query": "VPN"}).status_code == 200
    finally:
        sieve.close()
    code, report = check(capsys)
    assert code == EXIT_STORE_DAMAGED
    assert report["problems"][0]["part"] == RECORD
    assert f"`sieve store restore {backup}`" in report["problems"][0]["fix"]
    both = [f"store restore {backup}", "store rebuild --record-from-index"]  # alternatives: each works
    assert follow_the_way_back(capsys, RECORD, *said) == both


@pytest.mark.parametrize("pages", [None, range(1, 9)], ids=["header", "pages"])
def test_a_damaged_record_without_a_backup_is_rebuilt_from_the_index(store, capsys, pages) -> None:
    record = store / "documents.sqlite3"
    checkpointed(record)
    garble(record, pages)
    said = []
    if pages is None:  # SQLite cannot open it: `sieve serve` stops, naming the way back
        with pytest.raises(RecordError, match="--record-from-index") as failed:
            Sieve.open(load_settings({}))
        code, _, err = run(capsys, "store", "rebuild")
        assert code == EXIT_STORE_DAMAGED and "--record-from-index" in err, err
        said = [str(failed.value), err]
    assert follow_the_way_back(capsys, RECORD, *said) == ["store rebuild --record-from-index"]
    texts = {d.doc_id: d.text for d in served_documents().values()}
    assert texts["vpn"] == "Connect to the VPN before opening the intranet."  # a plain text comes back whole


# -- Chroma's own files -----------------------------------------------------------------------------------


@pytest.mark.parametrize("pages", [None, range(2, 40)], ids=["header", "pages"])
def test_chroma_files_garbled_under_an_intact_record_are_moved_aside_by_the_rebuild(
    store, capsys, pages
) -> None:
    garble(store / "chroma.sqlite3", pages)
    with pytest.raises(StoreError, match="sieve store rebuild") as failed:  # the start of `sieve serve`
        Sieve.open(load_settings({}))
    said = str(failed.value)
    assert follow_the_way_back(capsys, CHROMA_FILES, said) == ["store check", "store rebuild"]
    assert list(store.parent.glob("store.chroma-broken-*/chroma.sqlite3"))


# -- a staging collection a rebuild left -------------------------------------------------------------------


@pytest.mark.parametrize("broken", [False, True], ids=["intact", "broken"])
def test_a_staging_collection_a_killed_rebuild_left_is_named_and_resumed_or_dropped(
    store, capsys, real_embedder, broken
) -> None:
    settings = load_settings({})
    sieve = Sieve.open(settings)
    try:
        staging = sieve.store.staging(settings.rag.store, real_embedder.identity())
        if broken:
            add_wide_record(staging._collection, real_embedder.dimension)
    finally:
        sieve.close()
    assert follow_the_way_back(capsys, STAGING) == ["store rebuild"]


# -- the BM25 files and the jobs folder ---------------------------------------------------------------------


def test_a_garbled_bm25_snapshot_is_named_serve_builds_it_again_and_rebuild_remakes_it(
    store, capsys, caplog
) -> None:
    snapshot = next((store / "lexical" / COLLECTION).glob("snap-*.npz"))
    snapshot.write_bytes(b"PK\x03\x04 not a zip any more")
    code, report = check(capsys)
    assert code == EXIT_STORE_DAMAGED and report["problems"][0]["part"] == BM25
    assert str(snapshot.parent) in report["problems"][0]["what"]
    sieve = Sieve.open(load_settings({}))  # the start of `sieve serve`: built from the store again
    try:
        assert sieve.retrieve("VPN").documents
    finally:
        sieve.close()
    assert "is unusable" in caplog.text and str(snapshot.parent) in caplog.text
    assert check(capsys)[0] == EXIT_OK
    snapshot = next((store / "lexical" / COLLECTION).glob("snap-*.npz"))
    snapshot.write_bytes(b"garbage")
    assert follow_the_way_back(capsys, BM25) == ["store rebuild"]


def test_an_unreadable_job_record_is_named_and_moved_aside_by_the_rebuild(store, capsys) -> None:
    jobs = store.parent / "jobs"
    jobs.mkdir()
    (jobs / "j-broken.json").write_text('{"id": "j-broken", "state": "queu', encoding="utf-8")
    assert follow_the_way_back(capsys, JOBS) == ["store rebuild"]
    assert list(jobs.glob("j-broken.json.broken-*"))


# -- on a Chroma server: the change log and the record ------------------------------------------------------


def server_client() -> chromadb.ClientAPI:
    store = load_settings({}).rag.store
    return chromadb.HttpClient(
        host=store.host,
        port=store.port,
        settings=ChromaClientSettings(anonymized_telemetry=False, allow_reset=False),
    )


def test_a_change_log_on_a_chroma_server_broken_by_a_wide_record_is_named_and_rebuilt(
    server_store, capsys
) -> None:
    add_wide_record(server_client().get_collection(f"{server_store}-changes"), 1)
    assert follow_the_way_back(capsys, CHANGE_LOG) == ["store rebuild"]


@pytest.mark.parametrize("with_backup", [True, False], ids=["backup", "no-backup"])
def test_a_record_on_a_chroma_server_broken_by_a_wide_record_comes_back(
    server_store, capsys, with_backup
) -> None:
    if with_backup:
        code, out, err = run(capsys, "store", "backup")
        assert code == EXIT_OK and out.startswith("backed up: 4 documents, 0 tombstone(s) to "), err
    add_wide_record(server_client().get_collection(f"{server_store}-documents"), 1)
    commands = follow_the_way_back(capsys, RECORD)  # each alternative it names is run, and works
    if with_backup:
        assert [c.split()[:2] for c in commands] == [["store", "restore"], ["store", "rebuild"]]
        assert commands[0].startswith("store restore target/backups/")
    assert commands[-1] == "store rebuild --record-from-index"
