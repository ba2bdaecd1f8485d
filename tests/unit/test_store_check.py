"""`sieve store check`'s comparison of the index with the document record (app/ingest/check.py), on plain
maps and fake chunks: what each difference is called, the fix it names, and the JSON."""

from __future__ import annotations

import pytest

from app.ingest.check import (
    REBUILD,
    CheckReport,
    compare,
    expected_chunk_ids,
    stored_chunk_ids,
)
from app.ingest.types import Document
from app.settings import IngestSettings
from app.store import StoredChunk


def ids(*chunk_ids: str) -> frozenset[str]:
    return frozenset(chunk_ids)


def test_an_index_equal_to_the_record_matches() -> None:
    expected = {"a": ids("c1", "c2"), "b": ids("c3")}
    comparison = compare(expected, dict(expected))
    assert comparison.matches
    assert (comparison.recorded, comparison.indexed) == (2, 2)
    assert (comparison.expected_chunks, comparison.stored_chunks) == (3, 3)
    assert CheckReport("s", comparison).healthy


@pytest.mark.parametrize(
    ("stored", "missing", "outdated", "unrecorded"),
    [
        ({"b": ids("c3")}, ["a"], [], []),  # a document lost entirely
        ({"a": ids("c1"), "b": ids("c3")}, [], ["a"], []),  # one chunk of two
        ({"a": ids("c1", "c2", "old"), "b": ids("c3")}, [], ["a"], []),  # an older version's chunk left
        ({"a": ids("x1", "x2"), "b": ids("c3")}, [], ["a"], []),  # another chunking or content
        ({"a": ids("c1", "c2"), "b": ids("c3"), "z": ids("c9")}, [], [], ["z"]),  # not in the record
    ],
)
def test_each_difference_is_named_per_document(stored, missing, outdated, unrecorded) -> None:
    comparison = compare({"a": ids("c1", "c2"), "b": ids("c3")}, stored)
    assert (comparison.missing, comparison.outdated, comparison.unrecorded) == (missing, outdated, unrecorded)
    assert not comparison.matches


def test_a_document_that_makes_no_chunk_is_not_missing() -> None:
    assert compare({"empty": ids()}, {}).matches


def test_chunks_without_a_document_id_are_counted_and_need_a_rebuild() -> None:
    stored, orphans = stored_chunk_ids(
        [
            StoredChunk("c1", "", {"doc_id": "a"}),
            StoredChunk("c2", "", {}),
            StoredChunk("c3", "", {}),
            StoredChunk("sieve-probe-0123abcd", "", {}),  # another process's write probe: no chunk
        ]
    )
    assert (stored, orphans) == ({"a": ids("c1")}, 2)
    comparison = compare({"a": ids("c1")}, stored, orphans)
    assert comparison.stored_chunks == 3
    problems = CheckReport("s", comparison).problems()
    assert [(p.what, p.fix) for p in problems] == [
        ("2 chunk(s) in the collection carry no document id", REBUILD)
    ]


def test_problems_name_the_first_ids_and_their_fix() -> None:
    expected = {f"d{i}": ids(f"c{i}") for i in range(8)}
    comparison = compare(expected, {"extra": ids("cx")})
    problems = CheckReport("s", comparison).problems()
    assert problems[0].what == (
        "8 documents of the record not in the collection: d0, d1, d2, d3, d4 (and 3 more)"
    )
    assert problems[0].fix == REBUILD
    assert problems[1].what.startswith("1 document in the collection but not in the record")
    assert "extra" in problems[1].what
    assert "--drop-unrecorded" in problems[1].fix and "POST /api/documents" in problems[1].fix


def test_an_unreadable_store_a_failed_probe_and_another_embedder_are_each_a_problem() -> None:
    report = CheckReport(
        "s",
        read_error="InternalError: Error in compaction",
        embedder_mismatch="collection 'sieve' was built with embedder other",
        probe_failures=["write probe failed: InternalError"],
    )
    assert not report.healthy
    assert [p.fix for p in report.problems()] == [REBUILD, REBUILD, REBUILD]
    assert report.problems()[0].what == "the collection cannot be read: InternalError: Error in compaction"
    out = report.as_json()
    assert out["healthy"] is False and out["counts"] is None and len(out["problems"]) == 3


def test_the_json_lists_every_id() -> None:
    comparison = compare({f"d{i}": ids(f"c{i}") for i in range(8)}, {})
    out = CheckReport("s", comparison).as_json()
    assert out["missing"] == [f"d{i}" for i in range(8)]
    assert out["counts"] == {
        "recordedDocuments": 8,
        "indexedDocuments": 0,
        "expectedChunks": 8,
        "storedChunks": 0,
        "tombstones": 0,
    }


def test_a_document_deleted_through_the_api_is_neither_missing_nor_unrecorded() -> None:
    """Its tombstone is in the record, its chunks left the collection: healthy. Chunks of it left behind are
    named as deleted, fixed by a rebuild."""
    expected = {"a": ids("c1")}
    gone = compare(expected, {"a": ids("c1")}, tombstoned=frozenset({"x"}))
    assert gone.matches and gone.tombstones == 1
    assert CheckReport("s", gone).as_json()["counts"]["tombstones"] == 1

    left = compare(expected, {"a": ids("c1"), "x": ids("c7"), "z": ids("c9")}, tombstoned=frozenset({"x"}))
    assert (left.deleted, left.unrecorded, left.missing) == (["x"], ["z"], [])
    problems = CheckReport("s", left).problems()
    assert (problems[1].what, problems[1].fix) == (
        "1 document deleted through the API still in the collection (the record keeps their tombstones): x",
        REBUILD,
    )
    assert CheckReport("s", left).as_json()["deleted"] == ["x"]


def test_expected_ids_are_the_chunkers_and_follow_the_chunk_size() -> None:
    doc = Document("a", "word " * 400, title="A")
    small = expected_chunk_ids([doc], IngestSettings(chunk_size=300, chunk_overlap=50))["a"]
    large = expected_chunk_ids([doc], IngestSettings(chunk_size=1500, chunk_overlap=50))["a"]
    assert len(small) > len(large) >= 1
    assert small.isdisjoint(large)
    assert expected_chunk_ids([doc], IngestSettings(chunk_size=300, chunk_overlap=50))["a"] == small


def test_notes_are_printed_and_in_the_json_without_making_the_store_unhealthy() -> None:
    from app.cli.store import render_check

    comparison = compare({"a": ids("c1")}, {"a": ids("c1")})
    note = "experiment collections: 1 (1 complete; ~10 bytes estimated)"
    report = CheckReport("s", comparison, notes=[note])
    assert report.healthy
    assert report.as_json()["notes"] == [note]
    assert f"note: {note}" in render_check(report).splitlines()
