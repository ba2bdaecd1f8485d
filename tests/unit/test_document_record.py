"""The document record (app/store/record.py): what is put is kept whole, durably, and read back as it was."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.ingest.pipeline import _whole_documents
from app.ingest.types import Chunk
from app.store import StoreError
from app.store.record import RECORD_FILE, RecordError, SqliteRecord, content_hash
from app.store.types import Document


def doc(doc_id: str, text: str = "text", **metadata: object) -> Document:
    return Document(doc_id=doc_id, text=text, title=f"title {doc_id}", metadata=metadata, origin="api")


def test_content_hash_is_sha256_of_title_text_and_sorted_metadata() -> None:
    d = Document(doc_id="a", text="körper 文本", title="T", metadata={"b": 2, "a": 1.5, "c": True})
    expected = hashlib.sha256('["T", "körper 文本", {"a": 1.5, "b": 2, "c": true}]'.encode()).hexdigest()
    assert content_hash(d) == expected
    assert (
        content_hash(Document(doc_id="other", text="körper 文本", title="T", metadata=d.metadata)) == expected
    )


def test_put_get_round_trip_keeps_every_field(tmp_path: Path) -> None:
    record = SqliteRecord(tmp_path / RECORD_FILE)
    kept = Document(
        doc_id="zh-1",
        text="检索增强生成\nline two",
        title="标题",
        metadata={"n": 3, "x": 0.25, "ok": False, "s": "v"},
    )
    assert record.put([kept, doc("b")]) == 2
    assert record.get(["b", "missing", "zh-1"]) == [doc("b"), kept]
    assert record.count() == 2
    assert record.hashes() == {"zh-1": content_hash(kept), "b": content_hash(doc("b"))}


def test_unchanged_documents_are_not_written_again(tmp_path: Path) -> None:
    record = SqliteRecord(tmp_path / RECORD_FILE)
    assert record.put([doc("a"), doc("b")]) == 2
    assert record.put([doc("a"), doc("b", text="changed")]) == 1
    assert record.get(["b"])[0].text == "changed"
    moved = Document(doc_id="a", text="text", title="title a", origin="kb/a.md")
    assert record.put([moved]) == 1  # the same content from another origin is a change
    assert record.get(["a"])[0].origin == "kb/a.md"


def test_delete_counts_what_was_kept(tmp_path: Path) -> None:
    record = SqliteRecord(tmp_path / RECORD_FILE)
    record.put([doc("a"), doc("b"), doc("c")])
    assert record.delete(["a", "c", "never"]) == 2
    assert [d.doc_id for d in record.iter_documents()] == ["b"]


def test_iter_documents_pages_in_id_order(tmp_path: Path) -> None:
    record = SqliteRecord(tmp_path / RECORD_FILE)
    ids = [f"d{i:04d}" for i in range(1203)]
    record.put([doc(i) for i in reversed(ids)])
    assert [d.doc_id for d in record.iter_documents(batch=500)] == ids


def test_a_put_survives_the_process_being_killed(tmp_path: Path) -> None:
    """A child process puts a document and is killed (SIGKILL) right after put returned: it is kept."""
    path = tmp_path / RECORD_FILE
    script = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from app.store.record import SqliteRecord\n"
        "from app.store.types import Document\n"
        f"r = SqliteRecord(Path({str(path)!r}))\n"
        "r.put([Document(doc_id='k', text='kept', title='t')])\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], timeout=60, cwd=Path(__file__).parents[2])
    assert done.returncode == -9
    assert SqliteRecord(path).get(["k"]) == [Document(doc_id="k", text="kept", title="t")]


def test_the_record_file_is_plain_sqlite(tmp_path: Path) -> None:
    import sqlite3

    record = SqliteRecord(tmp_path / RECORD_FILE)
    record.put([doc("a", n=1)])
    record.close()
    row = sqlite3.connect(tmp_path / RECORD_FILE).execute("SELECT doc_id, metadata FROM documents").fetchone()
    assert row[0] == "a" and json.loads(row[1]) == {"n": 1}


def test_a_record_that_fails_says_which_and_what(tmp_path: Path) -> None:
    (tmp_path / RECORD_FILE).write_bytes(b"not a database" * 100)
    with pytest.raises(
        RecordError, match=f"document record {tmp_path / RECORD_FILE}: open failed: DatabaseError"
    ):
        SqliteRecord(tmp_path / RECORD_FILE)
    record = SqliteRecord(tmp_path / "other.sqlite3")
    record.close()
    with pytest.raises(StoreError, match="other.sqlite3: put failed: ProgrammingError"):
        record.put([doc("a")])


def chunks(*sizes: int) -> list[Chunk]:
    return [Chunk(f"{d}-{i}", f"d{d}", "t", i) for d, n in enumerate(sizes) for i in range(n)]


@pytest.mark.parametrize(
    ("sizes", "size", "batches"),
    [
        ((3, 3, 3), 4, [3, 3, 3]),  # 3 + 3 would pass 4: one document per batch
        ((2, 2, 2), 4, [4, 2]),
        ((1, 6, 1), 4, [1, 6, 1]),  # a document larger than the batch is a batch of its own
        ((5,), 2, [5]),
        ((1, 1, 1, 1, 1), 2, [2, 2, 1]),
        ((), 3, []),
    ],
)
def test_batches_hold_whole_documents(sizes: tuple[int, ...], size: int, batches: list[int]) -> None:
    made = list(_whole_documents(chunks(*sizes), size))
    assert [len(batch) for _, batch in made] == batches
    assert [offset for offset, _ in made] == [sum(batches[:i]) for i in range(len(batches))]
    for _, batch in made:  # no document is split between batches
        others = [c for _, b in made if b is not batch for c in b]
        assert not {c.doc_id for c in batch} & {c.doc_id for c in others}


def filed(doc_id: str, text: str = "text") -> Document:
    return Document(doc_id=doc_id, text=text, title=f"title {doc_id}", origin=f"kb/{doc_id}.md")


def test_a_delete_through_the_api_leaves_a_tombstone_of_id_time_file_and_hash(tmp_path: Path) -> None:
    record = SqliteRecord(tmp_path / RECORD_FILE)
    record.put([filed("a"), filed("b"), doc("c")])
    assert record.delete(["a", "never"], tombstone=True) == 1
    stones = record.tombstones()
    assert list(stones) == ["a"]
    stone = stones["a"]
    assert (stone.doc_id, stone.origin, stone.content_hash) == ("a", "kb/a.md", content_hash(filed("a")))
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stone.deleted_at)
    assert record.tombstones(["b", "a", "never"]) == {"a": stone}


def test_a_tombstone_is_no_document(tmp_path: Path) -> None:
    record = SqliteRecord(tmp_path / RECORD_FILE)
    record.put([filed("a"), filed("b")])
    record.delete(["a"], tombstone=True)
    assert record.get(["a", "b"]) == [filed("b")]
    assert record.count() == 1
    assert record.hashes() == {"b": content_hash(filed("b"))}
    assert [d.doc_id for d in record.iter_documents()] == ["b"]
    assert record.delete(["a"], tombstone=True) == 0  # deleted already: the tombstone stays as it was
    assert list(record.tombstones()) == ["a"]


def test_a_document_gone_from_its_file_leaves_no_tombstone_and_keeps_those_there_are(tmp_path: Path) -> None:
    record = SqliteRecord(tmp_path / RECORD_FILE)
    record.put([filed("a"), filed("b")])
    record.delete(["a"], tombstone=True)
    assert record.delete(["a", "b"]) == 1
    assert list(record.tombstones()) == ["a"]
    assert record.count() == 0


@pytest.mark.parametrize("again", [filed("a"), filed("a", "changed"), doc("a")])
def test_putting_the_id_again_lifts_its_tombstone(tmp_path: Path, again: Document) -> None:
    """The same content from the same file, a changed one, or a write through the API: each is kept again."""
    record = SqliteRecord(tmp_path / RECORD_FILE)
    record.put([filed("a"), filed("b")])
    record.delete(["a", "b"], tombstone=True)
    assert record.put([again]) == 1
    assert record.get(["a"]) == [again]
    assert list(record.tombstones()) == ["b"]


def test_tombstones_are_kept_across_a_reopen_in_an_older_record_file(tmp_path: Path) -> None:
    """A record file made before tombstones existed (no `tombstones` table) opens and keeps them."""
    import sqlite3

    old = sqlite3.connect(tmp_path / RECORD_FILE)
    old.execute(
        "CREATE TABLE documents (doc_id TEXT PRIMARY KEY, title TEXT NOT NULL, text TEXT NOT NULL, "
        "metadata TEXT NOT NULL, origin TEXT NOT NULL, content_hash TEXT NOT NULL, accepted_at TEXT NOT NULL)"
    )
    old.execute(
        "INSERT INTO documents VALUES ('a', 'title a', 'text', '{}', 'kb/a.md', ?, 'then')",
        (content_hash(filed("a")),),
    )
    old.commit()
    old.close()
    record = SqliteRecord(tmp_path / RECORD_FILE)
    assert record.delete(["a"], tombstone=True) == 1
    record.close()
    assert SqliteRecord(tmp_path / RECORD_FILE).tombstones()["a"].content_hash == content_hash(filed("a"))
