"""A delete stays deleted (issue 41): a knowledge-base document deleted through `DELETE /api/documents/{id}`
is not added again by the start-up ingest of its unchanged file, across two restarts, a `sieve store rebuild`
and a `sieve ingest` of its folder, and `sieve store check` stays healthy; when its file changes, the next
start brings the new version in and the log says the tombstone was lifted. A write through the API lifts a
tombstone too; chunks a delete left behind are named by the check and dropped by a plain rebuild. On both
kinds of store (embedded, and a `chroma run` server with its record collection), in-process: the real app
with its own start-up sequence, the packaged e5 (the session's, standing in for `load_embedder`)."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.cli import main
from app.main import create_app
from app.service import Sieve
from app.settings import load_settings
from tests.fixtures.api_app import wait_ready

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
MODELS_CACHE = REPO / "target" / "models"
ADMIN_TOKEN = "delete-stays-deleted-admin-01"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
EXIT_OK, EXIT_STORE_DAMAGED = 0, 4

WIFI = """---
id: wifi
title: Guest Wi-Fi
knowledge: it
---

The guest Wi-Fi network is called Visitors. Its password is printed on the board by the reception desk and
changes every Monday morning.
"""
LEAVE = """---
id: leave
title: Annual leave
knowledge: hr
---

Annual leave is requested through the HR portal at least two weeks ahead; a manager approves it.
"""
PARKING = """---
id: parking
title: Parking
knowledge: facilities
---

Staff parking is on level B2; a visitor's car is registered at the reception desk the day before.
"""
WIFI_QUERY = "guest Wi-Fi password"
SKIPPED = "ingest: 1 document(s) deleted through the API left out, unchanged in their files since"
LIFTED = "ingest: 'wifi' changed in"


@pytest.fixture(params=["embedded", "http"])
def kb(request, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, real_embedder) -> Path:
    """A knowledge base of three files, ingested at every start (no evaluation), on a fresh store of this
    mode; the environment of a user's shell."""
    kb = tmp_path / "kb"
    kb.mkdir()
    for name, text in (("wifi.md", WIFI), ("leave.md", LEAVE), ("parking.md", PARKING)):
        (kb / name).write_text(text, encoding="utf-8")
    monkeypatch.chdir(REPO)
    for name in [n for n in os.environ if n.startswith("RAG__")]:
        monkeypatch.delenv(name)
    for name in ("SIEVE_CONFIG", "SIEVE_SERVER", "SIEVE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    env = {
        "RAG__MODELS__CACHE_DIR": str(MODELS_CACHE),
        "RAG__LEXICAL__PATH": str(tmp_path / "lexical"),
        "RAG__INGEST__PATHS": f'["{kb}"]',
        "RAG__INGEST__ON_STARTUP": "true",
        "RAG__EVALUATE__ENABLED": "false",
        "RAG__SERVER__JOBS_DIR": str(tmp_path / "jobs"),
        "RAG__SERVER__ADMIN_TOKEN": ADMIN_TOKEN,
        "RAG__STORE__PATH": str(tmp_path / "store"),
    }
    if request.param == "http":
        host, port = request.getfixturevalue("chroma_server")
        env |= {
            "RAG__STORE__MODE": "http",
            "RAG__STORE__HOST": host,
            "RAG__STORE__PORT": str(port),
            "RAG__STORE__COLLECTION": f"deleted-{uuid.uuid4().hex[:10]}",
        }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for where in ("app.service.load_embedder", "app.models.load_embedder"):
        monkeypatch.setattr(where, lambda settings: real_embedder)
    return kb


@pytest.fixture
def log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.INFO):
        yield caplog


def started() -> TestClient:
    """The server started as `sieve serve` starts it (models, store, the start-up ingest), once ready."""
    client = TestClient(create_app(load_settings({})))
    client.__enter__()
    wait_ready(client)
    return client


def served_ids(client: TestClient, query: str) -> list[str]:
    answer = client.post("/api/retrieve", json={"query": query, "topK": 3}, headers=ADMIN)
    assert answer.status_code == 200, answer.text
    return [d["docId"] for d in answer.json()["documents"]]


def lines(log: pytest.LogCaptureFixture, start: str) -> list[str]:
    said = [r.getMessage() for r in log.records if r.getMessage().startswith(start)]
    log.clear()
    return said


def kept() -> tuple[list[str], list[str], list[str]]:
    """(the record's document ids, its tombstones' ids, the document ids the index holds), each sorted."""
    sieve = Sieve.open(load_settings({}))
    try:
        assert sieve.record is not None
        indexed = {
            str(m["doc_id"]) for m in sieve.store.metadata_of([], ["wifi", "leave", "parking"]).values()
        }
        return sorted(sieve.record.hashes()), sorted(sieve.record.tombstones()), sorted(indexed)
    finally:
        sieve.close()


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out + err


def test_a_deleted_knowledge_base_document_stays_deleted_until_its_file_changes(
    kb: Path, log: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    client = started()
    try:
        assert served_ids(client, WIFI_QUERY)[0] == "wifi"
        deleted = client.delete("/api/documents/wifi", headers=ADMIN)
        assert deleted.status_code == 200, deleted.text
        assert deleted.json()["documents"] == 1 and deleted.json()["chunks"] >= 1
        assert "wifi" not in served_ids(client, WIFI_QUERY)
    finally:
        client.__exit__(None, None, None)
    lines(log, "")

    for _ in range(2):  # two restarts: the start-up ingest finds the file unchanged each time
        client = started()
        try:
            assert "wifi" not in served_ids(client, WIFI_QUERY)
            assert client.delete("/api/documents/wifi", headers=ADMIN).status_code == 404
        finally:
            client.__exit__(None, None, None)
        assert len(lines(log, SKIPPED)) == 1  # said once a start
        assert kept() == (["leave", "parking"], ["wifi"], ["leave", "parking"])

    code, out = cli(capsys, "store", "check")
    assert code == EXIT_OK, out
    assert "record: 2 documents" in out and "1 deleted through the API (tombstones)" in out
    code, out = cli(capsys, "store", "rebuild")
    assert code == EXIT_OK, out
    assert "rebuilt: 2 documents" in out
    assert len(lines(log, "rebuild: 1 document(s) deleted through the API stay deleted")) == 1
    code, out = cli(capsys, "ingest", str(kb))
    assert code == EXIT_OK, out
    assert len(lines(log, SKIPPED)) == 1
    assert kept() == (["leave", "parking"], ["wifi"], ["leave", "parking"])
    assert cli(capsys, "store", "check")[0] == EXIT_OK

    (kb / "wifi.md").write_text(WIFI.replace("every Monday morning", "on the first of each month"), "utf-8")
    client = started()
    try:
        assert served_ids(client, WIFI_QUERY)[0] == "wifi"
    finally:
        client.__exit__(None, None, None)
    [lifted] = lines(log, LIFTED)
    assert lifted.endswith(": its tombstone is lifted and the new version indexed")
    assert kept() == (["leave", "parking", "wifi"], [], ["leave", "parking", "wifi"])
    assert cli(capsys, "store", "check")[0] == EXIT_OK


def test_a_deleted_document_written_again_through_the_api_is_back_for_good(
    kb: Path, log: pytest.LogCaptureFixture
) -> None:
    client = started()
    try:
        assert client.delete("/api/documents/leave", headers=ADMIN).status_code == 200
        again = {
            "id": "leave",
            "title": "Annual leave",
            "text": "Annual leave is requested in the HR portal.",
        }
        written = client.post("/api/documents", json={"documents": [again]}, headers=ADMIN)
        assert written.status_code == 200, written.text
    finally:
        client.__exit__(None, None, None)
    assert len(lines(log, "document 'leave' (deleted through the API at ")) == 1
    assert kept()[1] == []

    client = started()  # the start-up ingest puts the file's version back over the API's, as before deletes
    try:
        assert "leave" in served_ids(client, "How do I request annual leave?")
    finally:
        client.__exit__(None, None, None)
    assert lines(log, SKIPPED) == []
    assert kept() == (["leave", "parking", "wifi"], [], ["leave", "parking", "wifi"])


def test_chunks_a_delete_left_behind_are_named_by_the_check_and_dropped_by_the_rebuild(
    kb: Path, log: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """A delete whose job never deleted the chunks: the record holds the tombstone, the index the chunks."""
    sieve = Sieve.open(load_settings({}))
    try:
        sieve.ingest([kb])
        assert sieve.record is not None and sieve.record.delete(["parking"], tombstone=True) == 1
    finally:
        sieve.close()

    code, out = cli(capsys, "store", "check")
    assert code == EXIT_STORE_DAMAGED, out
    assert "problem: 1 document deleted through the API still in the collection" in out
    assert "in the collection but not in the record" not in out
    code, out = cli(capsys, "store", "rebuild")  # no --drop-unrecorded needed
    assert code == EXIT_OK, out
    assert "rebuilt: 2 documents" in out
    assert cli(capsys, "store", "check")[0] == EXIT_OK
    assert kept() == (["leave", "wifi"], ["parking"], ["leave", "wifi"])
