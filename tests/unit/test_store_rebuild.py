"""The rebuild's refusal over documents the record lacks (app/ingest/rebuild.py), with a fake store."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.ingest.rebuild import RebuildReport, UnrecordedDocumentsError, check_unrecorded
from app.store import StoredChunk


class FakeLive:
    """The live collection: `iter_all` gives `chunks`, or raises `broken`."""

    name = "sieve"

    def __init__(self, chunks: list[StoredChunk], broken: Exception | None = None):
        self.chunks = chunks
        self.broken = broken

    def iter_all(self, include_text: bool = True) -> Iterator[StoredChunk]:
        if self.broken is not None:
            raise self.broken
        return iter(self.chunks)


def chunks(*doc_ids: str) -> list[StoredChunk]:
    return [StoredChunk(f"c_{d}_{i}", "", {"doc_id": d}) for d in doc_ids for i in range(2)]


def test_documents_only_in_the_index_are_refused_by_count_and_first_ids() -> None:
    live = FakeLive(chunks("a", *[f"old-{i}" for i in range(7)]))
    with pytest.raises(UnrecordedDocumentsError) as info:
        check_unrecorded(live, {"a"}, drop=False, report=RebuildReport())
    assert info.value.doc_ids == [f"old-{i}" for i in range(7)]
    message = str(info.value)
    assert "7 document(s) the document record lacks" in message
    assert "old-0, old-1, old-2, old-3, old-4 (and 2 more)" in message
    assert "--drop-unrecorded" in message and "POST /api/documents" in message


def test_with_drop_they_are_named_in_the_report() -> None:
    report = RebuildReport()
    check_unrecorded(FakeLive(chunks("a", "old")), {"a"}, drop=True, report=report)
    assert report.dropped_unrecorded == ["old"]


def test_an_index_within_the_record_passes() -> None:
    report = RebuildReport()
    check_unrecorded(FakeLive(chunks("a")), {"a", "b"}, drop=False, report=report)
    assert report.dropped_unrecorded == [] and report.unreadable is None


def test_an_unreadable_collection_is_rebuilt_from_the_record_and_said() -> None:
    report = RebuildReport()
    broken = FakeLive([], RuntimeError("Error in compaction"))
    check_unrecorded(broken, {"a"}, drop=False, report=report)
    assert report.unreadable == "RuntimeError: Error in compaction"
