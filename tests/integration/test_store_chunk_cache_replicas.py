"""The chunk cache of one replica follows another replica's writes through the change log, as its BM25 index
does: two stores on one `chroma run`, the reader's candidates read through the real candidate generator."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from app.lexical.index import Analyzer
from app.lexical.sync import LexicalSync
from app.retrieval.candidates import CandidateGenerator
from app.settings import RetrievalSettings, StoreSettings
from app.store import ChromaStore, StoredChunk

pytestmark = pytest.mark.integration

DIM = 4
IDENTITY = {"name": "test-embedder", "dimension": DIM, "checksum": "0123456789abcdef"}
VECTORS = np.eye(DIM, dtype=np.float32)[:3]


def text_of(chunk: StoredChunk) -> str:
    return chunk.text


VPN = [
    StoredChunk("c1", "vpn client setup", {"doc_id": "d1", "knowledge": "it"}),
    StoredChunk("c2", "vpn password reset", {"doc_id": "d2", "knowledge": "it"}),
]


def synced_writer(writer: ChromaStore, chunks: list[StoredChunk]) -> LexicalSync:
    """The writer's opened index sync, after `chunks` (with the first of VECTORS) were written and logged."""
    sync = LexicalSync(writer, None, Analyzer(), 1.2, 0.75, 0.0, text_of)
    sync.open()
    writer.upsert(chunks, VECTORS[: len(chunks)])
    sync.apply_commit(chunks, [])
    return sync


@pytest.fixture
def replicas(chroma_server):
    host, port = chroma_server
    settings = StoreSettings(
        mode="http", host=host, port=port, collection=f"test-{uuid.uuid4().hex[:12]}", cache_chunks=100
    )
    writer, reader = ChromaStore.open(settings, IDENTITY), ChromaStore.open(settings, IDENTITY)
    yield writer, reader
    writer.close()
    reader.close()


def test_another_replicas_retag_delete_and_rewrite_reach_the_cache_with_the_change_log(replicas) -> None:
    writer, reader = replicas
    writer_sync = synced_writer(
        writer, [*VPN, StoredChunk("c3", "lunch menu", {"doc_id": "d3", "knowledge": "hr"})]
    )

    # the reader checks the change log before every query (refresh_seconds 0)
    reader_sync = LexicalSync(reader, None, Analyzer(), 1.2, 0.75, 0.0, text_of)
    index = reader_sync.open()
    index.refresher = reader_sync.catch_up
    generator = CandidateGenerator(reader, RetrievalSettings(candidate_k=3, bm25_candidate_k=3), index)

    def candidates(query: str) -> dict[str, tuple[str, dict]]:
        (cset,) = generator.generate_many([query], VECTORS[:1], [None])
        return {c.chunk_id: (c.text, c.metadata) for c in cset.candidates}

    assert candidates("vpn") == {
        "c1": ("vpn client setup", {"doc_id": "d1", "knowledge": "it"}),
        "c2": ("vpn password reset", {"doc_id": "d2", "knowledge": "it"}),
        "c3": ("lunch menu", {"doc_id": "d3", "knowledge": "hr"}),
    }
    assert set(reader.cache.lookup(["c1", "c2", "c3"])[0]) == {"c1", "c2", "c3"}

    # a metadata-only update (a retag: same id, same text, same vector), a delete, a rewrite of one id
    writer.update_metadata(["c1"], [{"doc_id": "d1", "knowledge": "finance"}])
    writer_sync.apply_commit(
        [StoredChunk("c1", "vpn client setup", {"doc_id": "d1", "knowledge": "finance"})], []
    )
    writer.delete(["c2"])
    writer_sync.apply_commit([], ["c2"])
    rewritten = StoredChunk("c3", "lunch menu and vpn", {"doc_id": "d3", "knowledge": "hr", "v": 2})
    writer.upsert([rewritten], VECTORS[1:2] * -1)
    writer_sync.apply_commit([rewritten], [])

    got = candidates("vpn")
    assert got == {
        "c1": ("vpn client setup", {"doc_id": "d1", "knowledge": "finance"}),
        "c3": ("lunch menu and vpn", {"doc_id": "d3", "knowledge": "hr", "v": 2}),
    }
    assert index.tag_of("c1") == "finance" and "c2" not in index.ids
    np.testing.assert_array_equal(reader.chunks(["c3"])["c3"].embedding, VECTORS[1] * -1)


def test_between_two_checks_the_cache_is_exactly_as_stale_as_the_bm25_index(replicas) -> None:
    writer, reader = replicas
    writer_sync = LexicalSync(writer, None, Analyzer(), 1.2, 0.75, 0.0, text_of)
    writer_sync.open()
    chunk = StoredChunk("c1", "vpn client setup", {"doc_id": "d1", "knowledge": "it"})
    writer.upsert([chunk], VECTORS[:1])
    writer_sync.apply_commit([chunk], [])
    reader_sync = LexicalSync(reader, None, Analyzer(), 1.2, 0.75, 3600.0, text_of)  # next check: an hour
    index = reader_sync.open()
    reader_sync.catch_up()  # the first check: the next is due in an hour
    assert reader.chunks(["c1"])["c1"].metadata["knowledge"] == "it"

    writer.update_metadata(["c1"], [{"doc_id": "d1", "knowledge": "finance"}])
    writer_sync.apply_commit([StoredChunk("c1", chunk.text, {"doc_id": "d1", "knowledge": "finance"})], [])
    reader_sync.catch_up()  # within refresh_seconds of the last check: not due
    assert reader.chunks(["c1"])["c1"].metadata["knowledge"] == "it"
    assert index.tag_of("c1") == "it"

    reader_sync._catch_up_now()  # the check when it is due
    assert reader.chunks(["c1"])["c1"].metadata["knowledge"] == "finance"
    assert index.tag_of("c1") == "finance"


def test_another_replicas_writes_reach_the_exact_dense_search_with_the_change_log(replicas) -> None:
    writer, reader = replicas
    writer_sync = synced_writer(writer, VPN)
    reader_sync = LexicalSync(reader, None, Analyzer(), 1.2, 0.75, 0.0, text_of)
    reader_sync.open()
    assert reader.load_exact(100).startswith("dense search: exact, over 2 vectors")
    assert [cid for cid, _ in reader.query_ids(VECTORS[2:3], 2)[0]] == ["c1", "c2"]  # both at cosine 0

    # the writer adds a chunk at the probe, retags c1 and deletes c2
    near = StoredChunk("c3", "vpn on the road", {"doc_id": "d3", "knowledge": "it"})
    writer.upsert([near], VECTORS[2:3])
    writer_sync.apply_commit([near], [])
    writer.update_metadata(["c1"], [{"doc_id": "d1", "knowledge": "finance"}])
    writer_sync.apply_commit(
        [StoredChunk("c1", "vpn client setup", {"doc_id": "d1", "knowledge": "finance"})], []
    )
    writer.delete(["c2"])
    writer_sync.apply_commit([], ["c2"])
    assert [cid for cid, _ in reader.query_ids(VECTORS[2:3], 3)[0]] == ["c1", "c2"]  # not read yet

    reader_sync.catch_up()
    assert reader.exact_search_active
    assert reader.query_ids(VECTORS[2:3], 3)[0] == [("c3", pytest.approx(1.0, abs=1e-6)), ("c1", 0.0)]
    assert [cid for cid, _ in reader.query_ids(VECTORS[2:3], 3, {"knowledge": "it"})[0]] == ["c3"]


def test_forget_all_reads_every_vector_back_into_the_exact_search(replicas) -> None:
    # what a pruned change log leads to (`LexicalSync._resync`): anything may have changed unseen
    writer, reader = replicas
    writer.upsert([StoredChunk("c1", "one", {"knowledge": "it"})], VECTORS[:1])
    assert reader.load_exact(100).startswith("dense search: exact, over 1 vectors")
    writer.upsert([StoredChunk("c2", "two", {"knowledge": "it"})], VECTORS[1:2])  # no change-log entry
    writer.update_metadata(["c1"], [{"knowledge": "hr"}])
    assert [cid for cid, _ in reader.query_ids(VECTORS[1:2], 2)[0]] == ["c1"]

    reader.forget_all()
    assert reader.query_ids(VECTORS[1:2], 2)[0] == [("c2", pytest.approx(1.0, abs=1e-6)), ("c1", 0.0)]
    assert [cid for cid, _ in reader.query_ids(VECTORS[1:2], 2, {"knowledge": "hr"})[0]] == ["c1"]
