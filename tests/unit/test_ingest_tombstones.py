"""Documents loaded from files held against the record's tombstones (app/ingest/tombstones.py): a document
deleted through the API stays out while unchanged, comes back changed, and the log says which, once."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from app.ingest.tombstones import without_deleted
from app.store.record import RECORD_FILE, SqliteRecord
from app.store.types import Document


def filed(doc_id: str, text: str = "text", origin: str = "kb/many.jsonl") -> Document:
    return Document(doc_id=doc_id, text=text, title=f"title {doc_id}", origin=origin)


@pytest.fixture
def record(tmp_path: Path) -> SqliteRecord:
    made = SqliteRecord(tmp_path / RECORD_FILE)
    made.put([filed("a"), filed("b"), filed("c")])
    made.delete(["a", "b"], tombstone=True)
    return made


def test_without_tombstones_every_document_is_kept(tmp_path: Path) -> None:
    docs = [filed("a"), filed("b")]
    assert without_deleted(docs, SqliteRecord(tmp_path / RECORD_FILE)) == docs


def test_an_unchanged_deleted_document_is_left_out_and_said_once(
    record: SqliteRecord, caplog: pytest.LogCaptureFixture
) -> None:
    loaded = [filed("a"), filed("b"), filed("c"), filed("new")]
    with caplog.at_level(logging.INFO, logger="app.ingest.tombstones"):
        assert without_deleted(loaded, record) == [filed("c"), filed("new")]
    assert [r.getMessage() for r in caplog.records] == [
        "ingest: 2 document(s) deleted through the API left out, unchanged in their files since (tombstones "
        "in the document record): a (kb/many.jsonl), b (kb/many.jsonl). A change to the document in its "
        "file, or writing it again (POST /api/documents), brings it back"
    ]
    assert sorted(record.tombstones()) == ["a", "b"]  # nothing is written


def test_a_changed_deleted_document_is_kept_and_the_lift_is_said(
    record: SqliteRecord, caplog: pytest.LogCaptureFixture
) -> None:
    """Another line of the same file changing brings back only what changed (the hash is the document's)."""
    changed = filed("a", "a new version")
    with caplog.at_level(logging.INFO, logger="app.ingest.tombstones"):
        assert without_deleted([changed, filed("b")], record) == [changed]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith(
        "ingest: 'a' changed in kb/many.jsonl since it was deleted through the API at "
    )
    assert lines[0].endswith(": its tombstone is lifted and the new version indexed")
    assert lines[1].startswith("ingest: 1 document(s) deleted through the API left out")
    record.put([changed])  # what the ingest does next: the tombstone goes
    assert sorted(record.tombstones()) == ["b"]


def test_quiet_it_says_nothing_and_leaves_out_the_same(
    record: SqliteRecord, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="app.ingest.tombstones"):
        assert without_deleted([filed("a", "changed"), filed("b")], record, say=False) == [
            filed("a", "changed")
        ]
    assert caplog.records == []
