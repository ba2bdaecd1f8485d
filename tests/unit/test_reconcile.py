"""The reconciliation of the index with the document record (app/ingest/reconcile.py), on a fake record and
a fake index: what a full pass finds, what it looks up, and that an incremental pass looks only at what
changed since the last one (nothing at all when nothing did)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from app.ingest.check import expected_chunk_ids
from app.ingest.reconcile import ReconcilePlan, Reconciler, ReconcileReport, log_outcome, log_plan
from app.ingest.types import Document
from app.settings import IngestSettings
from app.store.record import Tombstone, content_hash

SETTINGS = IngestSettings(chunk_size=200, chunk_overlap=0, min_chunk_chars=1)


def doc(doc_id: str, words: int = 30, version: str = "") -> Document:
    text = " ".join(f"{doc_id}{version}w{i}" for i in range(words))
    return Document(doc_id=doc_id, text=text, title=f"title {doc_id}", origin="api")


def chunk_ids(document: Document) -> list[str]:
    return sorted(expected_chunk_ids([document], SETTINGS)[document.doc_id])


class FakeRecord:
    def __init__(self, *documents: Document) -> None:
        self.kept = {d.doc_id: d for d in documents}
        self.buried: dict[str, Tombstone] = {}
        self.texts_read = 0  # documents read whole (iter_documents, get)

    def iter_documents(self) -> Iterator[Document]:
        for doc_id in sorted(self.kept):
            self.texts_read += 1
            yield self.kept[doc_id]

    def get(self, doc_ids: Sequence[str]) -> list[Document]:
        found = [self.kept[i] for i in doc_ids if i in self.kept]
        self.texts_read += len(found)
        return found

    def hashes(self) -> dict[str, str]:
        return {i: content_hash(d) for i, d in self.kept.items()}

    def tombstones(self, doc_ids: Sequence[str] | None = None) -> dict[str, Tombstone]:
        return {i: t for i, t in self.buried.items() if doc_ids is None or i in doc_ids}

    def delete_through_api(self, doc_id: str) -> None:
        gone = self.kept.pop(doc_id)
        self.buried[doc_id] = Tombstone(doc_id, "then", gone.origin, content_hash(gone))


class FakeIndex:
    """Chunk id -> metadata; counts the calls that read it."""

    def __init__(self) -> None:
        self.chunks: dict[str, dict[str, Any]] = {}
        self.listed = 0
        self.looked_up: list[tuple[list[str], list[str]]] = []

    def index(self, document: Document, only: int | None = None) -> None:
        for chunk_id in chunk_ids(document)[:only]:
            self.chunks[chunk_id] = {"doc_id": document.doc_id}

    def iter_ids(self) -> Iterator[str]:
        self.listed += 1
        yield from list(self.chunks)

    def metadata_of(self, chunk_ids: Sequence[str], doc_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        self.looked_up.append((list(chunk_ids), list(doc_ids)))
        return {
            i: m for i, m in self.chunks.items() if i in set(chunk_ids) or m.get("doc_id") in set(doc_ids)
        }


def every_difference() -> tuple[FakeRecord, FakeIndex]:
    """`ok` indexed as recorded, `lost` not indexed, `half` partly, `old` in an older version, `gone`
    deleted through the API with its chunks left, `stray` indexed and never recorded, one orphan chunk."""
    ok, lost, half, old, gone = doc("ok"), doc("lost"), doc("half", 120), doc("old"), doc("gone")
    record = FakeRecord(ok, lost, half, old, gone)
    index = FakeIndex()
    for indexed in (ok, gone, doc("stray")):
        index.index(indexed)
    index.index(half, only=1)
    index.index(doc("old", version="v1"))
    index.chunks["c_orphan"] = {}
    index.chunks["sieve-probe-0123abcd"] = {}  # another process's write probe: no chunk
    record.delete_through_api("gone")
    return record, index


def test_a_full_pass_names_every_difference_and_looks_up_only_the_ids_no_recorded_document_makes() -> None:
    record, index = every_difference()
    assert len(chunk_ids(record.kept["half"])) > 1
    plan = Reconciler(SETTINGS).plan(record, index)
    c = plan.comparison
    assert plan.full
    assert (c.missing, c.outdated, c.deleted, c.unrecorded, c.orphans) == (
        ["lost"],
        ["half", "old"],
        ["gone"],
        ["stray"],
        1,
    )
    assert plan.to_index == ["half", "lost", "old"]
    assert plan.matching == ["ok"]
    assert plan.deleted_chunks == chunk_ids(doc("gone"))
    made = {i for d in record.kept.values() for i in chunk_ids(d)}
    [(looked_up, by_doc)] = index.looked_up
    assert by_doc == []
    assert set(looked_up) == set(index.chunks) - made - {"sieve-probe-0123abcd"}


def test_an_index_that_matches_the_record_is_listed_once_and_nothing_else_is_read() -> None:
    a, b = doc("a"), doc("b")
    index = FakeIndex()
    index.index(a)
    index.index(b)
    plan = Reconciler(SETTINGS).plan(FakeRecord(a, b), index)
    assert plan.comparison.matches and plan.to_index == [] and plan.deleted_chunks == []
    assert (plan.recorded, plan.comparison.expected_chunks) == (2, len(chunk_ids(a)) + len(chunk_ids(b)))
    assert index.listed == 1
    assert index.looked_up == [([], [])]


def test_an_incremental_pass_after_nothing_changed_reads_no_text_and_not_the_index() -> None:
    record, index = every_difference()
    reconciler = Reconciler(SETTINGS)
    plan = reconciler.plan(record, index)
    for unindexed in plan.to_index:  # what the caller does: index them, remove the deleted chunks
        index.index(record.kept[unindexed])
    for chunk_id in plan.deleted_chunks:
        del index.chunks[chunk_id]
    reconciler.settle(plan, {d: content_hash(record.kept[d]) for d in plan.to_index})
    read, listed, looked_up = record.texts_read, index.listed, len(index.looked_up)
    quiet = reconciler.plan(record, index)
    assert (quiet.full, quiet.looked_at, quiet.to_index, quiet.recorded) == (False, (), [], 4)
    assert (record.texts_read, index.listed, len(index.looked_up)) == (read, listed, looked_up)


def test_an_incremental_pass_looks_at_the_documents_new_changed_or_deleted_since_and_no_other() -> None:
    a, b, c = doc("a"), doc("b"), doc("c")
    record, index = FakeRecord(a, b, c), FakeIndex()
    for d in (a, b, c):
        index.index(d)
    reconciler = Reconciler(SETTINGS)
    reconciler.settle(reconciler.plan(record, index), {})
    record.kept["b"] = doc("b", version="v2")  # written again, its job not run
    record.kept["n"] = doc("n")  # kept, its job record lost
    record.delete_through_api("c")  # deleted, its delete job not run
    plan = reconciler.plan(record, index)
    assert not plan.full
    found = plan.comparison
    assert (found.missing, found.outdated, found.deleted) == (["n"], ["b"], ["c"])
    assert plan.deleted_chunks == chunk_ids(c)
    assert sorted(plan.looked_at) == ["b", "c", "n"]
    assert index.looked_up[-1][0] == [] and sorted(index.looked_up[-1][1]) == ["b", "c", "n"]


def test_a_document_left_unindexed_is_looked_at_by_every_pass_until_it_is_indexed() -> None:
    a = doc("a")
    record, index = FakeRecord(a), FakeIndex()
    reconciler = Reconciler(SETTINGS)
    reconciler.settle(reconciler.plan(record, index), {})  # the caller failed to index it
    assert reconciler.plan(record, index).comparison.missing == ["a"]
    index.index(a)
    plan = reconciler.plan(record, index)
    assert (plan.comparison.missing, plan.matching) == ([], ["a"])
    reconciler.settle(plan, {})
    assert reconciler.plan(record, index).looked_at == ()


def test_a_full_pass_asked_for_again_reads_everything_again() -> None:
    a = doc("a")
    record, index = FakeRecord(a), FakeIndex()
    index.index(a)
    reconciler = Reconciler(SETTINGS)
    reconciler.settle(reconciler.plan(record, index), {})
    del index.chunks[chunk_ids(a)[0]]  # lost behind the service's back
    assert reconciler.plan(record, index).to_index == []  # an incremental pass trusts the last one
    assert reconciler.plan(record, index, full=True).to_index == ["a"]


def test_the_log_says_what_was_found_and_what_was_done(caplog: pytest.LogCaptureFixture) -> None:
    record, index = every_difference()
    plan = Reconciler(SETTINGS).plan(record, index)
    with caplog.at_level(logging.INFO, logger="app.ingest.reconcile"):
        log_plan(plan, 0.01)
        log_outcome(ReconcileReport(plan, indexed=["half", "lost", "old"], embedded=5, removed_chunks=2))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "reconcile: 1 document of the document record not in the index, indexing them now: lost",
        "reconcile: 2 documents whose chunks in the index differ from what the record makes (partly "
        "indexed, an older version or another chunking), indexing them again: half, old",
        f"reconcile: 1 document deleted through the API still in the index, removing their "
        f"{len(chunk_ids(doc('gone')))} chunks: gone",
        "reconcile: 1 document in the collection but not in the record (written before the record existed, "
        "or after the backup it was restored from): stray; left as they are (fix: send them again (POST "
        "/api/documents or `sieve ingest PATH`) so the record keeps them; `sieve store rebuild "
        "--record-from-index` takes them into the record from their chunks; `sieve store rebuild "
        "--drop-unrecorded` drops them)",
        "reconcile: 1 chunk(s) in the collection carry no document id; left as they are (fix: sieve store "
        "rebuild)",
        "reconcile: indexed 3 documents (5 new chunks embedded) and removed 2 chunks of deleted documents "
        "in 0.0s; every recorded document is indexed",
    ]


def test_what_a_pass_could_not_index_is_said_with_the_reason() -> None:
    record, index = every_difference()
    plan = Reconciler(SETTINGS).plan(record, index)
    report = ReconcileReport(plan, indexed=["half"], error="OSError: [Errno 28] No space left on device")
    assert report.unindexed == ["lost", "old"]
    assert report.note == (
        "2 documents of the document record not indexed, so not served (lost, old): OSError: [Errno 28] No "
        "space left on device; the service tries again after write jobs, at each start and every few minutes "
        "(`sieve store check` lists them)"
    )
    assert ReconcileReport(plan, indexed=plan.to_index).note is None


def test_a_matching_full_pass_says_so_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    a = doc("a")
    index = FakeIndex()
    index.index(a)
    plan: ReconcilePlan = Reconciler(SETTINGS).plan(FakeRecord(a), index)
    with caplog.at_level(logging.INFO, logger="app.ingest.reconcile"):
        log_plan(plan, 0.25)
        log_outcome(ReconcileReport(plan))
    assert [r.getMessage() for r in caplog.records] == [
        f"reconcile: the index matches the document record (1 documents, {len(chunk_ids(a))} chunks; 0 "
        "deleted through the API), compared in 0.25s"
    ]


# -- the chunk ids kept between starts -------------------------------------------------------------------


@pytest.fixture
def chunkings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the documents the reconciliation chunks, in order."""
    import app.ingest.reconcile as reconcile

    seen: list[str] = []
    real = reconcile.expected_chunk_ids

    def counting(documents: Any, settings: IngestSettings) -> dict[str, frozenset[str]]:
        documents = list(documents)
        seen.extend(d.doc_id for d in documents)
        return real(documents, settings)

    monkeypatch.setattr(reconcile, "expected_chunk_ids", counting)
    return seen


def test_the_next_start_chunks_only_the_documents_new_or_changed_since(
    tmp_path: Path, chunkings: list[str]
) -> None:
    a, b, c = doc("a"), doc("b"), doc("c")
    record, index = FakeRecord(a, b, c), FakeIndex()
    for d in (a, b, c):
        index.index(d)
    cache = tmp_path / "lexical" / "chunk-ids.json"
    assert Reconciler(SETTINGS, cache).plan(record, index).comparison.matches
    assert sorted(chunkings) == ["a", "b", "c"] and cache.is_file()

    chunkings.clear()
    record.kept["b"] = doc("b", version="v2")  # changed while the service was down
    record.kept["md"] = Document("md", a.text, a.title, origin="notes.md")
    record.kept["c"] = Document("c", c.text, c.title, origin="c.txt")  # same content, read as plain text
    plan = Reconciler(SETTINGS, cache).plan(record, index)  # the next start
    assert sorted(chunkings) == ["b", "c", "md"]
    assert (plan.comparison.outdated, plan.comparison.missing) == (["b"], ["md"])

    chunkings.clear()
    del record.kept["md"]
    Reconciler(SETTINGS, cache).plan(record, index)
    assert chunkings == []
    assert "md" not in json.loads(cache.read_text())["documents"]  # forgotten with its document


def test_chunk_ids_made_under_other_settings_are_not_used(tmp_path: Path, chunkings: list[str]) -> None:
    record, index = FakeRecord(doc("a")), FakeIndex()
    cache = tmp_path / "chunk-ids.json"
    Reconciler(SETTINGS, cache).plan(record, index)
    chunkings.clear()
    other = IngestSettings(chunk_size=100, chunk_overlap=0, min_chunk_chars=1)
    Reconciler(other, cache).plan(record, index)
    assert chunkings == ["a"]


def test_a_cache_that_cannot_be_read_or_written_costs_a_chunking_and_a_warning(
    tmp_path: Path, chunkings: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    record, index = FakeRecord(doc("a")), FakeIndex()
    torn = tmp_path / "chunk-ids.json"
    torn.write_text('{"settings": [')
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with caplog.at_level(logging.WARNING, logger="app.ingest.reconcile"):
        assert Reconciler(SETTINGS, torn).plan(record, index).comparison.missing == ["a"]
        unwritable = Reconciler(SETTINGS, blocked / "chunk-ids.json")
        assert unwritable.plan(record, index).comparison.missing == ["a"]
    assert chunkings == ["a", "a"]
    said = [r.getMessage() for r in caplog.records]
    assert said[0].startswith(f"reconcile: chunk-id cache {torn} unreadable (")
    assert said[1].startswith(f"reconcile: chunk-id cache {blocked / 'chunk-ids.json'} not written (")
    assert json.loads(torn.read_text())["documents"]["a"][0] == content_hash(doc("a"))  # written anew


def test_documents_ingested_or_deleted_by_the_service_leave_nothing_pending() -> None:
    a, b = doc("a"), doc("b")
    record, index = FakeRecord(a, b), FakeIndex()
    index.index(a)
    index.index(b)
    reconciler = Reconciler(SETTINGS)
    assert reconciler.pending(record)  # no full pass yet
    reconciler.settle(reconciler.plan(record, index), {})
    assert not reconciler.pending(record)
    record.kept["n"] = doc("n")  # a job's write: kept, then ingested
    assert reconciler.pending(record)
    reconciler.indexed([record.kept["n"]])
    assert not reconciler.pending(record)
    record.delete_through_api("a")
    assert reconciler.pending(record)
    reconciler.forget(["a"])
    assert not reconciler.pending(record)
    record.kept["b"] = doc("b", version="v2")  # kept, its job failed: pending until indexed
    assert reconciler.pending(record)
