"""The document record on the real stores: a Chroma server's record collection; what ingest keeps there; the
tombstones of documents deleted through the API, in both kinds of record."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import chromadb
import pytest

from app.service import Sieve
from app.settings import StoreSettings
from app.store.record import (
    RECORD_FILE,
    ChromaRecord,
    DocumentRecord,
    SqliteRecord,
    content_hash,
    open_record,
    record_collection_name,
)
from app.store.types import Document
from tests.fixtures.api_app import make_settings


def doc(doc_id: str, text: str, **metadata: object) -> Document:
    return Document(doc_id=doc_id, text=text, title=f"title {doc_id}", metadata=metadata, origin="api")


@pytest.fixture
def server_record(chroma_server: tuple[str, int], tmp_path: Path) -> Iterator[ChromaRecord]:
    host, port = chroma_server
    settings = StoreSettings(mode="http", host=host, port=port, collection=f"rec{tmp_path.name[-8:]}")
    client = chromadb.HttpClient(host=host, port=port)
    record = open_record(settings, client)
    assert isinstance(record, ChromaRecord)
    yield record
    client.delete_collection(record_collection_name(settings.collection))


def test_a_chroma_server_record_keeps_documents_whole(server_record: ChromaRecord) -> None:
    wide = doc("zh", "检索增强生成" * 500, n=1, f=0.5, b=True, s="值")
    assert server_record.put([wide, doc("b", "bee")]) == 2
    assert server_record.put([wide, doc("b", "bee")]) == 0  # unchanged: nothing written
    assert server_record.get(["b", "nope", "zh"]) == [doc("b", "bee"), wide]
    assert server_record.count() == 2
    assert [d.doc_id for d in server_record.iter_documents(batch=1)] == ["b", "zh"]
    assert server_record.delete(["b", "nope"]) == 1
    assert sorted(server_record.hashes()) == ["zh"]


@pytest.fixture(params=["sqlite", "chroma-server"])
def any_record(request, tmp_path: Path) -> Iterator[DocumentRecord]:
    """Both kinds of record: the embedded store's SQLite file, and a collection on `chroma run`."""
    if request.param == "sqlite":
        record: DocumentRecord = SqliteRecord(tmp_path / RECORD_FILE)
        yield record
        record.close()
    else:
        yield request.getfixturevalue("server_record")


def filed(doc_id: str, text: str = "from a file") -> Document:
    return Document(doc_id=doc_id, text=text, title=f"title {doc_id}", origin=f"kb/{doc_id}.md")


def test_a_delete_through_the_api_leaves_a_tombstone_that_a_put_lifts(any_record: DocumentRecord) -> None:
    record = any_record
    record.put([filed("a"), filed("b"), filed("c"), doc("d", "api")])
    assert record.delete(["a", "b", "never"], tombstone=True) == 2
    assert record.delete(["c"]) == 1  # gone from its file: no tombstone

    stones = record.tombstones()
    assert sorted(stones) == ["a", "b"]
    assert (stones["a"].origin, stones["a"].content_hash) == ("kb/a.md", content_hash(filed("a")))
    assert stones["a"].deleted_at.endswith("Z")
    assert record.tombstones(["b", "c", "d"]) == {"b": stones["b"]}
    # a tombstone is no document
    assert record.get(["a", "b", "c", "d"]) == [doc("d", "api")]
    assert record.count() == 1
    assert sorted(record.hashes()) == ["d"]
    assert [d.doc_id for d in record.iter_documents()] == ["d"]
    assert record.delete(["a"], tombstone=True) == 0 and record.delete(["b"]) == 0
    assert record.tombstones(["a", "b"]) == stones

    # written again, the same content or not: kept again, its tombstone lifted
    assert record.put([filed("a"), doc("b", "through the api")]) == 2
    assert record.get(["a", "b"]) == [filed("a"), doc("b", "through the api")]
    assert record.tombstones() == {}
    assert record.count() == 3


def test_ingest_keeps_what_it_indexes_and_forgets_what_left_its_file(tmp_path: Path) -> None:
    kb = tmp_path / "kb"
    kb.mkdir()
    (kb / "a.jsonl").write_text(
        '{"id": "a1", "title": "A1", "text": "alpha one"}\n'
        '{"id": "a2", "title": "A2", "text": "alpha two"}\n',
        encoding="utf-8",
    )
    sieve = Sieve.open(make_settings(tmp_path / "store", tmp_path / "eval"))
    try:
        sieve.ingest([kb])
        sieve.ingest_documents([doc("api-1", "written through the api", source="x")])
        assert sieve.record is not None
        assert sorted(sieve.record.hashes()) == ["a1", "a2", "api-1"]
        (kb / "a.jsonl").write_text('{"id": "a1", "title": "A1", "text": "alpha one"}\n', encoding="utf-8")
        sieve.ingest([kb])
        assert sorted(sieve.record.hashes()) == ["a1", "api-1"]
        assert sieve.delete_documents(["api-1"]) == (1, 1)
        assert sorted(sieve.record.hashes()) == ["a1"]
        assert {m["doc_id"] for m in sieve.store.metadata_of([], ["a1", "a2", "api-1"]).values()} == {"a1"}
    finally:
        sieve.close()
