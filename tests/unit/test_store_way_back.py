"""The pure parts of "every collection and file Sieve owns is checked and has a way back": the registry
against docs/recovery.md, the record's integrity check, backup and restore on SQLite files, a document made
again from its chunks, the BM25 files' and the jobs folder's probes, and an unreadable change-log entry in
the BM25 catch-up (a fake store)."""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from app.ingest.chunker import chunk_document
from app.ingest.ids import text_sha256
from app.ingest.owned_checks import jobs_problems, move_jobs_aside, unreadable_jobs
from app.ingest.record_from_index import document_from_chunks, merge_pieces, recover_record
from app.lexical.files import _line, files_problems
from app.store import StoredChunk
from app.store.owned import OWNED, RECORD_FROM_INDEX
from app.store.record import (
    RecordDamagedError,
    SqliteRecord,
    Tombstone,
    backup_sqlite,
    checked_backup,
    copy_documents,
    moved_aside,
    quick_check,
    record_way_back,
)
from app.store.types import Document

REPO = Path(__file__).resolve().parents[2]


def doc(doc_id: str, text: str = "text", **kw) -> Document:
    return Document(doc_id=doc_id, text=text, title=kw.pop("title", doc_id.title()), **kw)


def test_every_owned_collection_and_file_is_a_row_of_the_table_in_recovery_md() -> None:
    text = (REPO / "docs" / "recovery.md").read_text(encoding="utf-8")
    table = text.split("## What Sieve owns, and the way back", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    keys = [line.split("`")[1] for line in rows]
    assert keys == [o.key for o in OWNED]
    assert [o.key for o in OWNED if not o.derived] == ["record"]  # the one truth; the rest is made from it


# -- the record's integrity --------------------------------------------------------------------------------


def kept(path: Path, *documents: Document) -> Path:
    record = SqliteRecord(path)
    record.put(list(documents))
    record.close()
    return path


def test_the_record_is_wal_with_full_sync_and_an_intact_one_passes_its_probe(tmp_path: Path) -> None:
    record = SqliteRecord(kept(tmp_path / "r.sqlite3", doc("a"), doc("b")))
    try:
        assert record._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert record._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert record.damage is None and record.probe() == []
        assert quick_check(record._db) is None
    finally:
        record.close()


def garbled(path: Path, pages: range) -> None:
    with open(path, "r+b") as f:
        for page in pages:
            f.seek(page * 4096)
            f.write(np.random.default_rng(page).bytes(4096))


def test_a_record_with_garbled_pages_opens_damaged_and_refuses_writes_naming_the_way_back(
    tmp_path: Path,
) -> None:
    path = kept(tmp_path / "r.sqlite3", *[doc(f"d{i}", "x" * 3000) for i in range(40)])
    garbled(path, range(2, 10))
    backups = tmp_path / "backups"
    record = SqliteRecord(path, backup_dir=backups)
    try:
        assert record.damage is not None and record.damage.startswith("PRAGMA quick_check: ")
        with pytest.raises(RecordDamagedError) as refused:
            record.put([doc("new")])
        assert str(refused.value) == (
            f"writes are refused: document record {path} is damaged ({record.damage}). Way back (with "
            f"`sieve serve` stopped): no backup in {backups}: `{RECORD_FROM_INDEX}` (keeps what the record "
            "still reads, rebuilds the rest of each document from its chunks in the collection)"
        )
        with pytest.raises(RecordDamagedError):
            record.delete(["d1"], tombstone=True)
        assert record.probe()[0] == f"document record {path} is damaged ({record.damage})"
    finally:
        record.close()


def test_the_way_back_names_the_newest_backup_first(tmp_path: Path) -> None:
    import os

    (tmp_path / "documents-sieve-20261201T000000Z.sqlite3").write_bytes(b"")
    newest = tmp_path / "documents-sieve-20261202T000000Z.sqlite3"
    newest.write_bytes(b"")
    os.utime(tmp_path / "documents-sieve-20261201T000000Z.sqlite3", (1, 1))
    assert record_way_back(tmp_path).startswith(f"`sieve store restore {newest}` (the newest backup in ")
    assert RECORD_FROM_INDEX in record_way_back(tmp_path)


def test_a_backup_is_an_intact_copy_and_a_restore_puts_it_back_with_its_tombstones(tmp_path: Path) -> None:
    source = kept(tmp_path / "r.sqlite3", doc("a"), doc("b"), doc("c"))
    record = SqliteRecord(source)
    record.delete(["c"], tombstone=True)
    record.close()
    backup_sqlite(source, tmp_path / "b" / "backup.sqlite3")
    copy = checked_backup(tmp_path / "b" / "backup.sqlite3")
    try:
        assert sorted(copy.hashes()) == ["a", "b"] and list(copy.tombstones()) == ["c"]
        target = SqliteRecord(tmp_path / "restored.sqlite3")
        assert copy_documents(copy, target) == (2, 1)
        assert target.tombstones() == copy.tombstones()
        target.close()
    finally:
        copy.close()


def test_a_damaged_file_is_no_backup(tmp_path: Path) -> None:
    (tmp_path / "bad.sqlite3").write_bytes(b"not a database" * 400)
    with pytest.raises(Exception, match="is not a usable record backup"):
        checked_backup(tmp_path / "bad.sqlite3")
    with pytest.raises(Exception, match="no backup file"):
        checked_backup(tmp_path / "missing.sqlite3")


def test_moved_aside_takes_the_wal_files_with_it(tmp_path: Path) -> None:
    path = tmp_path / "documents.sqlite3"
    for suffix in ("", "-wal", "-shm"):
        path.with_name(path.name + suffix).write_text(suffix)
    aside = moved_aside(path)
    assert not path.exists() and aside.name.startswith("documents.sqlite3.broken-")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [aside.name, f"{aside.name}-wal", f"{aside.name}-shm"]
    )


# -- the record made again from the index --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pieces", "overlap", "text"),
    [
        (["one two three", "three four"], 10, "one two three four"),  # "three" overlaps
        (["abc", "xyz"], 10, "abc\n\nxyz"),  # no overlap: a paragraph break
        (["aaaa", "aab"], 2, "aaaab"),  # the longest overlap within `overlap`
        ([], 5, ""),
    ],
)
def test_merge_pieces_drops_each_overlap(pieces: list[str], overlap: int, text: str) -> None:
    assert merge_pieces(pieces, overlap) == text


def stored(chunks) -> list[StoredChunk]:
    return [StoredChunk(c.chunk_id, c.text, {**c.metadata, "origin": "api"}) for c in chunks]


def test_a_plain_document_comes_back_exactly_from_its_overlapping_chunks() -> None:
    text = " ".join(f"Sentence number {i} of the payroll policy." for i in range(40))
    original = doc("p", text, origin="notes.txt", metadata={"knowledge": "hr"})
    chunks = stored(chunk_document(original, 200, 40))
    assert len(chunks) > 3
    again, exact = document_from_chunks(reversed(chunks), overlap=40)
    assert exact and text_sha256(again.text) == text_sha256(text)
    assert (again.doc_id, again.title, again.metadata) == ("p", "P", {"knowledge": "hr"})


def test_a_markdown_document_comes_back_with_its_headings() -> None:
    text = "# Leave\n\nIntro.\n\n## Annual\n\nTen days a year.\n\n## Sick\n\nWith a note."
    again, exact = document_from_chunks(stored(chunk_document(doc("m", text), 600, 60)), 60)
    assert exact and again.text == text


def test_recover_keeps_what_the_damaged_record_reads_and_rebuilds_the_rest() -> None:
    kept_doc = doc("a", "Kept exactly, with  its   spacing.")
    chunks = stored(chunk_document(kept_doc, 600, 60)) + stored(
        chunk_document(doc("b", "From chunks."), 600, 60)
    )

    class Damaged:
        def iter_documents(self):
            yield kept_doc
            raise sqlite3.DatabaseError("database disk image is malformed")

        def get(self, doc_ids):
            raise sqlite3.DatabaseError("database disk image is malformed")

        def tombstones(self, doc_ids=None):
            return {"z": Tombstone("z", "2026-12-01T00:00:00Z", "api", "h")}

    found = recover_record(chunks, Damaged(), overlap=60)
    assert [d.doc_id for d in found.documents] == ["a", "b"]
    assert found.documents[0] == kept_doc
    assert (found.salvaged, found.exact, found.approximate) == (1, 1, [])
    assert [t.doc_id for t in found.tombstones] == ["z"]
    assert found.summary().startswith(
        "record rebuilt: 2 documents: 1 read from the damaged record, 1 rebuilt"
    )


# -- the BM25 files and the jobs folder ---------------------------------------------------------------------


def test_bm25_files_problems_name_the_file(tmp_path: Path) -> None:
    assert files_problems(tmp_path) == []  # no index yet: built at the next start
    (tmp_path / "manifest.json").write_text("{garbage", encoding="utf-8")
    assert files_problems(tmp_path)[0].startswith(f"BM25 index {tmp_path / 'manifest.json'} is unreadable")
    (tmp_path / "manifest.json").write_text(json.dumps({"format": 1, "generation": 3}), encoding="utf-8")
    (tmp_path / "journal-3.log").write_bytes(_line({"del": ["a"]}) + b"00000000 {}\n" + b"0a1b")
    problems = files_problems(tmp_path)
    assert problems[0].startswith("BM25 index: lexical snapshot 3 in ")
    assert problems[1] == f"BM25 index journal {tmp_path / 'journal-3.log'}: line 2 fails its checksum"


def test_unreadable_job_records_are_named_and_moved_aside(tmp_path: Path) -> None:
    (tmp_path / "j-good.json").write_text('{"id": "j-good"}', encoding="utf-8")
    (tmp_path / "j-bad.json").write_text('{"id": ', encoding="utf-8")
    (tmp_path / "j-list.json").write_text("[]", encoding="utf-8")
    assert sorted(p.name for p in unreadable_jobs(tmp_path)) == ["j-bad.json", "j-list.json"]
    problems = jobs_problems(tmp_path)
    assert [p.part for p in problems] == ["jobs", "jobs"]
    assert problems[0].what.startswith(f"job record {tmp_path / 'j-bad.json'} is unreadable (JSONDecodeError")
    moved = move_jobs_aside(tmp_path)
    assert len(moved) == 2 and jobs_problems(tmp_path) == []
    assert (tmp_path / "j-good.json").exists()


# -- an unreadable change-log entry in the BM25 catch-up ---------------------------------------------------


def test_an_unreadable_change_log_entry_makes_the_index_reread_the_store(caplog) -> None:
    from app.lexical.index import Analyzer
    from app.lexical.sync import LexicalSync
    from app.store import ChangeEntry
    from app.store.chroma import ChangeLogError

    chunks = [StoredChunk("c1", "guest wifi password", {}), StoredChunk("c2", "annual leave", {})]

    class Store:
        collection_id = "id-1"

        def __init__(self):
            self.log = [ChangeEntry("e1", 10)]

        def changes_since(self, stamp):
            return list(self.log)

        def change_ids(self, entries):
            raise ChangeLogError("change log 'sieve-changes' (s): entry 'e2' is not a JSON object (x)")

        def iter_all(self, include_text=True, **kw):
            return iter(chunks)

        def iter_ids(self):
            return iter(c.chunk_id for c in chunks)

        def count(self):
            return len(chunks)

        def get(self, ids, include_embeddings=False):
            return [c for c in chunks if c.chunk_id in ids]

        def forget(self, ids):
            pass

        def forget_all(self):
            pass

    store = Store()
    sync = LexicalSync(store, None, Analyzer(None), 1.2, 0.75, 0.0, lambda c: c.text)  # type: ignore[arg-type]
    sync.open()
    chunks.append(StoredChunk("c3", "vpn access", {}))
    store.log.append(ChangeEntry("e2", 20))
    with caplog.at_level(logging.WARNING):
        sync.catch_up()
    assert sorted(sync.index.ids) == ["c1", "c2", "c3"]
    assert "entry 'e2' is not a JSON object" in caplog.text
    assert "`sieve store rebuild` makes the change log anew: every chunk's metadata re-read" in caplog.text
