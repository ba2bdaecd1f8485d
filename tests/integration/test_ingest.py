"""Ingest into a real embedded Chroma: counts, idempotence, replacement, deletions, bad input, stable ids.

The tiny random embedder stands in for e5 (its vectors mean nothing; only the plumbing is under test). Its
identity is {"name": <its tmp folder>, "dimension": 32, "checksum": <sha256 of its weights>}, so a store
written here can never be opened with the real e5 by mistake.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from app.ingest.pipeline import IngestInterrupted, Ingestor
from app.ingest.types import Document
from app.models import load_embedder
from app.settings import IngestSettings, ModelsSettings, StoreSettings
from app.store import ChromaStore
from tests.fixtures.embedders import CountingEmbedder

pytestmark = pytest.mark.integration

DOC_A = """---
id: doc-a
title: Returns handbook
knowledge: support
status: active
---

# Returns handbook

## Refunds

A refund is paid to the card used for the order within 5 days.

## Shipping

Return shipping is free for orders over 50.
"""

DOC_B = """---
id: doc-b
title: Account help
knowledge: it
---

## Password

To reset a password, open the account page and ask for a reset email.
"""

JSONL = [
    {
        "id": "j1",
        "title": "Leave",
        "text": "Annual leave needs a request to your manager.",
        "knowledge": "hr",
    },
    {
        "id": "j2",
        "title": "Invoice",
        "text": "An invoice is sent by email after payment.",
        "knowledge": "finance",
    },
    {"id": "j3", "title": "Weather", "text": "The weather is not a support topic.", "knowledge": "misc"},
]


@pytest.fixture(scope="module")
def tiny_embedder(tiny_embedder_dir):
    return load_embedder(ModelsSettings(embedder=str(tiny_embedder_dir)))


def write_kb(root: Path) -> Path:
    kb = root / "kb"
    (kb / "sub").mkdir(parents=True)
    (kb / "a.md").write_text(DOC_A, encoding="utf-8")
    (kb / "sub" / "b.md").write_text(DOC_B, encoding="utf-8")
    (kb / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in JSONL), encoding="utf-8")
    return kb


class Harness:
    """A store in `root/chroma-<name>` and an Ingestor over it with a counting embedder."""

    def __init__(self, root: Path, embedder, name: str = "store"):
        self.store = ChromaStore.open(StoreSettings(path=str(root / f"chroma-{name}")), embedder.identity())
        self.embedder = CountingEmbedder(embedder)
        self.ingestor = Ingestor(self.store, self.embedder, IngestSettings(paths=[]))

    def ingest(self, *paths: Path):
        self.embedder.embedded.clear()
        return self.ingestor.ingest(list(paths))

    def ids_by_doc(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for chunk in self.store.iter_all(include_text=False):
            out.setdefault(chunk.metadata["doc_id"], set()).add(chunk.chunk_id)
        return out

    def close(self) -> None:
        self.store.close()


@pytest.fixture
def harness(tmp_path, tiny_embedder):
    opened = Harness(tmp_path, tiny_embedder)
    yield opened
    opened.close()


def test_tiny_embedder_identity(tiny_embedder, tiny_embedder_dir):
    identity = tiny_embedder.identity()
    assert (identity["name"], identity["dimension"]) == (str(tiny_embedder_dir), 32)
    assert len(identity["checksum"]) == 16 and int(identity["checksum"], 16) >= 0


def test_ingest_a_knowledge_base_counts_files_documents_and_chunks(tmp_path, harness):
    kb = write_kb(tmp_path)
    report = harness.ingest(kb)
    assert (
        report.files,
        report.documents,
        report.chunks,
        report.added,
        report.unchanged,
        report.deleted,
    ) == (
        3,
        5,
        6,  # doc-a has two sections, every other document one
        6,
        0,
        0,
    )
    assert report.errors == []
    assert harness.store.count() == 6
    assert len(harness.embedder.embedded) == 6
    per_doc = Counter(c.metadata["doc_id"] for c in harness.store.iter_all(include_text=False))
    assert per_doc == {"doc-a": 2, "doc-b": 1, "j1": 1, "j2": 1, "j3": 1}
    shipping = next(c for c in harness.store.iter_all() if "shipping" in c.text)
    assert shipping.text == "Return shipping is free for orders over 50."
    assert {k: shipping.metadata[k] for k in ("doc_id", "title", "knowledge", "status", "heading_path")} == {
        "doc_id": "doc-a",
        "title": "Returns handbook",
        "knowledge": "support",
        "status": "active",
        "heading_path": "Returns handbook > Shipping",
    }
    assert shipping.metadata["origin"] == str(kb / "a.md")


def test_reingest_is_idempotent_and_embeds_nothing(tmp_path, harness):
    kb = write_kb(tmp_path)
    harness.ingest(kb)
    before = harness.ids_by_doc()
    again = harness.ingest(kb)
    assert (again.chunks, again.added, again.unchanged, again.deleted) == (6, 0, 6, 0)
    assert harness.embedder.embedded == []
    assert harness.ids_by_doc() == before


def test_changing_one_document_replaces_only_its_changed_chunks(tmp_path, harness):
    kb = write_kb(tmp_path)
    harness.ingest(kb)
    before = harness.ids_by_doc()
    (kb / "a.md").write_text(DOC_A.replace("orders over 50", "orders over 80"), encoding="utf-8")

    report = harness.ingest(kb)
    after = harness.ids_by_doc()
    assert (report.added, report.deleted) == (1, 1)
    assert harness.embedder.embedded == [
        "Returns handbook › Shipping\n\nReturn shipping is free for orders over 80."
    ]
    (old,) = before["doc-a"] - after["doc-a"]
    (new,) = after["doc-a"] - before["doc-a"]
    assert harness.store.get([old]) == []
    assert harness.store.get([new])[0].text == "Return shipping is free for orders over 80."
    assert len(before["doc-a"] & after["doc-a"]) == 1  # the unchanged Refunds section kept its id
    assert {d: ids for d, ids in after.items() if d != "doc-a"} == {
        d: i for d, i in before.items() if d != "doc-a"
    }


def test_changing_only_front_matter_updates_the_stored_metadata(tmp_path, harness):
    kb = write_kb(tmp_path)
    harness.ingest(kb)
    before = harness.ids_by_doc()
    (kb / "a.md").write_text(DOC_A.replace("status: active", "status: retired"), encoding="utf-8")

    report = harness.ingest(kb)
    assert (report.added, report.updated, report.unchanged, report.deleted) == (0, 2, 4, 0)
    assert harness.embedder.embedded == []  # same text, same ids: only the metadata is rewritten
    assert harness.ids_by_doc() == before
    statuses = {c.metadata.get("status") for c in harness.store.iter_all() if c.metadata["doc_id"] == "doc-a"}
    assert statuses == {"retired"}


def test_a_key_removed_from_front_matter_is_removed_from_the_stored_metadata(tmp_path, harness):
    kb = write_kb(tmp_path)
    harness.ingest(kb)
    (kb / "a.md").write_text(DOC_A.replace("status: active\n", ""), encoding="utf-8")

    report = harness.ingest(kb)
    assert report.updated == 2
    stored = [c.metadata for c in harness.store.iter_all() if c.metadata["doc_id"] == "doc-a"]
    assert [m.get("status") for m in stored] == [None, None]


def test_a_line_removed_from_a_jsonl_file_removes_that_document(tmp_path, harness):
    kb = write_kb(tmp_path)
    harness.ingest(kb)
    before = harness.ids_by_doc()
    (kb / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in JSONL if r["id"] != "j2"))

    report = harness.ingest(kb)
    assert (report.documents, report.added, report.deleted) == (4, 0, 1)
    assert harness.ids_by_doc() == {d: ids for d, ids in before.items() if d != "j2"}


def test_a_file_deleted_from_an_ingested_directory_removes_its_chunks(tmp_path, harness):
    kb = write_kb(tmp_path)
    harness.ingest(kb)
    before = harness.ids_by_doc()
    (kb / "sub" / "b.md").unlink()

    report = harness.ingest(kb)
    assert (report.files, report.added, report.deleted) == (2, 0, 1)
    assert harness.ids_by_doc() == {d: ids for d, ids in before.items() if d != "doc-b"}


def test_a_bad_jsonl_line_is_reported_with_file_and_line_and_the_rest_is_ingested(tmp_path, harness):
    kb = write_kb(tmp_path)
    lines = [json.dumps(JSONL[0]), '{"id": "j2", "text": broken', json.dumps(JSONL[2])]
    (kb / "docs.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")

    report = harness.ingest(kb)
    (error,) = report.errors
    assert (error.path, error.line) == (str(kb / "docs.jsonl"), 2)
    assert str(error).startswith(f"{kb / 'docs.jsonl'}:2: invalid JSON")
    assert set(harness.ids_by_doc()) == {"doc-a", "doc-b", "j1", "j3"}


def test_a_bad_line_never_deletes_what_that_document_had_in_the_index(tmp_path, harness):
    kb = write_kb(tmp_path)
    harness.ingest(kb)
    before = harness.ids_by_doc()
    lines = [json.dumps(JSONL[0]), '{"id": "j2", "text": broken', json.dumps(JSONL[2])]
    (kb / "docs.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")

    report = harness.ingest(kb)
    assert [(e.line, e.message.split(":")[0]) for e in report.errors] == [(2, "invalid JSON")]
    assert (report.added, report.deleted) == (0, 0)
    assert harness.ids_by_doc() == before  # j2 keeps its chunk until its line is fixed or removed


def test_chunk_ids_are_the_same_in_two_fresh_stores(tmp_path, tiny_embedder):
    kb = write_kb(tmp_path)
    first, second = Harness(tmp_path, tiny_embedder, "one"), Harness(tmp_path, tiny_embedder, "two")
    try:
        first.ingest(kb)
        second.ingest(kb)
        assert first.ids_by_doc() == second.ids_by_doc()
        assert sum(len(ids) for ids in first.ids_by_doc().values()) == 6
    finally:
        first.close()
        second.close()


def test_a_document_over_max_document_chars_is_an_error_naming_its_line_and_keeps_what_it_had(
    tmp_path, harness
):
    kb = write_kb(tmp_path)
    harness.ingest(kb)
    before = harness.ids_by_doc()
    limit = max(len(r["text"]) for r in JSONL)
    harness.ingestor.settings = IngestSettings(paths=[], max_document_chars=limit)
    long_j2 = {**JSONL[1], "text": "x" * (limit + 1)}
    (kb / "docs.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in [JSONL[0], long_j2, JSONL[2]]), encoding="utf-8"
    )

    report = harness.ingest(kb / "docs.jsonl")
    (error,) = report.errors
    assert str(error) == (
        f"{kb / 'docs.jsonl'}:2: document 'j2' has {limit + 1} characters, more than "
        f"rag.ingest.max_document_chars={limit}"
    )
    assert harness.ids_by_doc()["j2"] == before["j2"]  # the file had an error: j2 keeps its old chunk


# An interrupted ingest keeps the batches it committed (rag.ingest.commit_chunks), and the rerun embeds
# only the rest.
def test_an_ingest_stopped_before_its_first_commit_writes_nothing(
    tmp_path, harness, tiny_embedder, monkeypatch
):
    kb = write_kb(tmp_path)
    monkeypatch.setattr(tiny_embedder, "slice_ms", 1e-9)  # one passage a slice
    asked = {"n": 0}

    def stop_after_first_slice() -> bool:
        asked["n"] += 1
        return asked["n"] > 1

    with pytest.raises(IngestInterrupted) as info:
        harness.ingestor.ingest([kb], should_stop=stop_after_first_slice)
    assert (info.value.done, info.value.total, info.value.committed) == (1, 6, 0)
    assert harness.store.count() == 0
    assert harness.ingest(kb).added == 6  # and the next run does all of it


# The kb's new chunks in order: doc-a (2 chunks), j1, j2, j3, doc-b. A batch holds whole documents: with
# commit_chunks=1, doc-a's two chunks are one batch, committed after the second slice, never one alone.
@pytest.mark.parametrize(
    ("commit_chunks", "stop_after_slices", "committed"),
    [(1, 1, 0), (1, 2, 2), (1, 3, 2 + 1), (2, 3, 2), (4, 5, 2 + 2)],
)
def test_an_ingest_stopped_after_commits_keeps_them_and_the_rerun_embeds_only_the_rest(
    tmp_path, tiny_embedder, monkeypatch, commit_chunks, stop_after_slices, committed
):
    kb = write_kb(tmp_path)
    opened = Harness(tmp_path, tiny_embedder)
    try:
        opened.ingestor.settings = IngestSettings(paths=[], commit_chunks=commit_chunks)
        monkeypatch.setattr(tiny_embedder, "slice_ms", 1e-9)  # one passage a slice
        asked = {"n": 0}

        def stop() -> bool:
            asked["n"] += 1
            return asked["n"] > stop_after_slices

        with pytest.raises(IngestInterrupted) as info:
            opened.ingestor.ingest([kb], should_stop=stop)
        assert (info.value.done, info.value.committed) == (stop_after_slices, committed)
        assert opened.store.count() == committed
        whole = {"doc-a": 2, "j1": 1, "j2": 1, "j3": 1, "doc-b": 1}
        assert all(len(ids) == whole[doc] for doc, ids in opened.ids_by_doc().items())
        report = opened.ingest(kb)
        assert (report.added, report.unchanged) == (6 - committed, committed)
        assert len(opened.embedder.embedded) == 6 - committed
        assert opened.store.count() == 6
    finally:
        opened.close()


def test_on_commit_sees_every_committed_batch_then_the_deletions_in_order(tmp_path, tiny_embedder):
    kb = write_kb(tmp_path)
    calls: list[tuple[list[str], list[str]]] = []
    opened = Harness(tmp_path, tiny_embedder)
    try:
        opened.ingestor = Ingestor(
            opened.store,
            opened.embedder,
            IngestSettings(paths=[], commit_chunks=4),
            on_commit=lambda up, deleted: calls.append(([c.chunk_id for c in up], list(deleted))),
        )
        first = opened.ingest(kb)
        assert [(len(up), len(deleted)) for up, deleted in calls] == [(4, 0), (2, 0)]
        assert {cid for up, _ in calls for cid in up} == {c.chunk_id for c in opened.store.iter_all(False)}
        assert first.added == 6
        # the StoredChunks carry the text and metadata the store holds
        calls.clear()
        (kb / "docs.jsonl").write_text(json.dumps(JSONL[0]) + "\n", encoding="utf-8")  # j2, j3 removed
        second = opened.ingest(kb)
        assert second.deleted == 2 and calls == [([], calls[-1][1])] and len(calls[-1][1]) == 2
    finally:
        opened.close()


def test_a_copy_under_another_id_gets_the_very_same_vector_and_is_embedded_once(tmp_path, harness):
    # Identical texts must tie exactly, so the documented tie-break (doc id) decides which copy ranks first,
    # not float noise from being embedded in different slices or thread counts.
    kb = tmp_path / "copies"
    kb.mkdir()
    body = "# VPN\n\nInstall the client, then sign in with your badge number."
    (kb / "guide.md").write_text("---\nid: guide\ntitle: VPN guide\n---\n" + body, encoding="utf-8")
    (kb / "mirror.md").write_text("---\nid: mirror\ntitle: VPN guide\n---\n" + body, encoding="utf-8")
    report = harness.ingest(kb)
    assert report.added == 2
    assert len(harness.embedder.embedded) == 1  # one text for the model
    ids = [c.chunk_id for c in harness.store.iter_all(include_text=False)]
    stored = {c.metadata["doc_id"]: c.embedding for c in harness.store.get(ids, include_embeddings=True)}
    assert np.array_equal(stored["guide"], stored["mirror"])


def test_a_documents_only_write_reads_only_its_own_documents_chunks_not_the_whole_store(tmp_path, harness):
    """An API write (documents, no files) finds what it replaces with two indexed lookups (its chunk ids,
    its doc ids): its cost follows the write, not the collection (no read of every chunk's metadata)."""
    kb = write_kb(tmp_path)
    harness.ingest(kb)
    before = harness.ids_by_doc()
    listed: list[bool] = []
    real_iter_all = harness.store.iter_all

    def spying_iter_all(include_text: bool = True):
        listed.append(include_text)
        return real_iter_all(include_text)

    harness.store.iter_all = spying_iter_all
    try:
        report = harness.ingestor.ingest_documents(
            [Document(doc_id="j1", text="Annual leave needs two weeks' notice.", title="Leave", origin="api")]
        )
    finally:
        del harness.store.iter_all
    assert listed == []
    # j1 had one chunk: one new chunk added, the old one deleted, every other document untouched
    assert (report.documents, report.added, report.deleted) == (1, 1, 1)
    after = harness.ids_by_doc()
    assert {d: ids for d, ids in after.items() if d != "j1"} == {d: i for d, i in before.items() if d != "j1"}
    assert len(after["j1"]) == 1 and after["j1"] != before["j1"]
    (new,) = after["j1"]
    assert harness.store.get([new])[0].text == "Annual leave needs two weeks' notice."

    # the same write again: unchanged, nothing embedded, nothing deleted
    harness.embedder.embedded.clear()
    again = harness.ingestor.ingest_documents(
        [Document(doc_id="j1", text="Annual leave needs two weeks' notice.", title="Leave", origin="api")]
    )
    assert (again.added, again.unchanged, again.deleted) == (0, 1, 0)
    assert harness.embedder.embedded == []
