"""The store's chunk cache: what a query reads instead of Chroma's documents, metadata and vectors.

`ChunkCache` alone (hits, misses, the LRU bound, invalidation and the race guard), then `ChromaStore.chunks`
over a fake collection that counts its calls (one `get` for every miss of a batch; local writes, including a
metadata-only update, drop their ids), then the candidate generator reading a batch's candidates through it.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.lexical.index import Analyzer, Bm25Index
from app.retrieval.candidates import CandidateGenerator
from app.retrieval.types import unit_vector
from app.settings import RetrievalSettings
from app.store import ChromaStore, ChunkCache, StoredChunk


def stored(chunk_id: str, text: str = "", **meta: object) -> StoredChunk:
    return StoredChunk(chunk_id, text or f"text of {chunk_id}", dict(meta))


# -- ChunkCache --------------------------------------------------------------------------------------


def test_a_miss_then_a_fill_then_a_hit() -> None:
    cache = ChunkCache(10)
    found, missing = cache.lookup(["a", "b"])
    assert (found, missing) == ({}, ["a", "b"])
    a, b = stored("a"), stored("b")
    cache.fill([a, b], cache.epoch)
    found, missing = cache.lookup(["b", "x", "a"])
    assert found == {"b": b, "a": a} and found["a"] is a
    assert missing == ["x"]
    assert (cache.stats.hits, cache.stats.misses, cache.stats.evictions) == (2, 3, 0)


def test_the_bound_drops_the_least_recently_used_first() -> None:
    cache = ChunkCache(3)
    cache.fill([stored(i) for i in "abc"], cache.epoch)
    cache.lookup(["a"])  # a is now the most recently used: b is the oldest
    cache.fill([stored("d"), stored("e")], cache.epoch)
    assert len(cache) == 3
    assert [i for i in "abcde" if i in cache] == ["a", "d", "e"]
    assert cache.stats.evictions == 2
    cache.fill([stored(i) for i in "vwxyz"], cache.epoch)  # more than the bound in one fill
    assert len(cache) == 3 and [i for i in "vwxyz" if i in cache] == ["x", "y", "z"]
    assert cache.stats.evictions == 2 + 5


def test_no_cache_keeps_nothing() -> None:
    cache = ChunkCache(0)
    cache.fill([stored("a")], cache.epoch)
    assert len(cache) == 0 and cache.lookup(["a"]) == ({}, ["a"])
    with pytest.raises(ValueError, match="max_chunks must be >= 0"):
        ChunkCache(-1)


def test_invalidate_drops_the_ids_and_a_read_from_before_it_is_not_kept() -> None:
    cache = ChunkCache(10)
    cache.fill([stored("a"), stored("b")], cache.epoch)
    before = cache.epoch  # a reader takes the epoch, then reads "c" from the store ...
    cache.invalidate(["a", "never-cached"])  # ... while a write of "c" lands and is announced
    assert "a" not in cache and "b" in cache
    cache.fill([stored("c")], before)  # the reader's (possibly old) "c" must not be kept
    assert "c" not in cache
    cache.fill([stored("c")], cache.epoch)
    assert "c" in cache and cache.stats.invalidations == 1


# -- ChromaStore.chunks ----------------------------------------------------------------------------


class FakeCollection:
    """The part of a Chroma collection the store's reads and writes use; records every call."""

    name = "fake"
    id = "fake-id"

    def __init__(self) -> None:
        self.rows: dict[str, tuple[str, dict, np.ndarray]] = {}
        self.gets: list[tuple[list[str], list[str]]] = []

    def get(self, ids, include):
        self.gets.append((list(ids), list(include)))
        found = [i for i in ids if i in self.rows]
        return {
            "ids": found,
            "documents": [self.rows[i][0] for i in found],
            "metadatas": [dict(self.rows[i][1]) for i in found],
            "embeddings": [self.rows[i][2].copy() for i in found] if "embeddings" in include else None,
        }

    def upsert(self, ids, embeddings, documents, metadatas):
        for i, e, d, m in zip(ids, embeddings, documents, metadatas, strict=True):
            self.rows[i] = (d, dict(m or {}), np.asarray(e, dtype=np.float32))

    def update(self, ids, metadatas):
        for i, m in zip(ids, metadatas, strict=True):
            text, _, vec = self.rows[i]
            self.rows[i] = (text, dict(m), vec)

    def delete(self, ids):
        for i in ids:
            self.rows.pop(i, None)


class FakeClient:
    def get_max_batch_size(self) -> int:
        return 100


VECTORS = np.array([[3.0, 4.0, 0.0], [0.0, 0.6, 0.8], [1.0, 0.0, 0.0]], dtype=np.float32)


def fake_store(cache_chunks: int = 10) -> tuple[ChromaStore, FakeCollection]:
    collection = FakeCollection()
    store = ChromaStore(FakeClient(), collection, "a fake store", cache_chunks=cache_chunks)
    chunks = [
        stored("a", "alpha", doc_id="d1", knowledge="hr"),
        stored("b", "beta", doc_id="d2"),
        stored("c", "gamma", doc_id="d3"),
    ]
    store.upsert(chunks, VECTORS)
    return store, collection


def test_chunks_reads_every_miss_in_one_get_and_then_reads_nothing() -> None:
    store, collection = fake_store()
    first = store.chunks(["b", "missing", "a"])
    assert list(first) == ["b", "a"]  # unknown ids left out
    assert collection.gets == [(["b", "missing", "a"], ["documents", "metadatas", "embeddings"])]
    assert (first["a"].text, first["a"].metadata) == ("alpha", {"doc_id": "d1", "knowledge": "hr"})
    np.testing.assert_array_equal(first["a"].embedding, VECTORS[0])
    assert first["a"].embedding.dtype == np.float32
    assert first["a"].unit is not None and first["a"].unit.tobytes() == unit_vector(VECTORS[0]).tobytes()
    assert first["b"].unit is not None and first["b"].unit.tobytes() == unit_vector(VECTORS[1]).tobytes()
    assert not first["a"].unit.flags.writeable  # shared with every reader

    again = store.chunks(["a", "b", "c"])
    assert collection.gets[1:] == [(["c"], ["documents", "metadatas", "embeddings"])]  # only the miss
    assert again["a"].text == "alpha" and again["c"].metadata == {"doc_id": "d3"}
    store.chunks(["a", "b", "c"])
    assert len(collection.gets) == 2  # all three cached: the store is not asked
    assert (store.cache.stats.hits, store.cache.stats.misses) == (2 + 3, 3 + 1)


def test_local_writes_drop_their_ids_a_metadata_only_update_included() -> None:
    store, collection = fake_store()
    store.chunks(["a", "b", "c"])
    store.update_metadata(["a"], [{"doc_id": "d1", "knowledge": "finance"}])  # a retag: same id, same text
    assert "a" not in store.cache and "b" in store.cache
    assert store.chunks(["a"])["a"].metadata == {"doc_id": "d1", "knowledge": "finance"}

    store.upsert([stored("b", "beta v2", doc_id="d2")], VECTORS[2:3])
    got = store.chunks(["b"])["b"]
    assert got.text == "beta v2"
    np.testing.assert_array_equal(got.embedding, VECTORS[2])

    store.delete(["c"])
    assert store.chunks(["c"]) == {}
    assert [ids for ids, _ in collection.gets[-3:]] == [["a"], ["b"], ["c"]]


def test_a_failed_write_still_drops_its_ids() -> None:
    store, collection = fake_store()
    store.chunks(["a"])

    def broken(ids, metadatas):
        raise RuntimeError("the server went away mid-write")

    collection.update = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        store.update_metadata(["a"], [{"doc_id": "d1"}])
    assert "a" not in store.cache


def test_forget_is_how_the_change_feed_drops_other_processes_writes() -> None:
    store, collection = fake_store()
    store.chunks(["a", "b"])
    collection.update(["a"], [{"doc_id": "d1", "knowledge": "legal"}])  # another process's retag
    assert store.chunks(["a"])["a"].metadata["knowledge"] == "hr"  # not heard of yet: cached state
    store.forget(["a"])
    assert store.chunks(["a"])["a"].metadata["knowledge"] == "legal"
    assert "b" in store.cache


def test_a_store_without_a_cache_reads_every_time() -> None:
    store, collection = fake_store(cache_chunks=0)
    store.chunks(["a"])
    store.chunks(["a"])
    assert [ids for ids, _ in collection.gets] == [["a"], ["a"]]


# -- the candidate generator over it ---------------------------------------------------------------


class DenseFakeStore(ChromaStore):
    """A fake collection behind the real `chunks`; the dense search returns fixed (id, similarity) lists."""

    def __init__(self, dense: list[list[tuple[str, float]]]):
        collection = FakeCollection()
        super().__init__(FakeClient(), collection, "fake", cache_chunks=10)
        self.fake = collection
        self.dense = dense

    def query_ids(self, embeddings, n, where=None):
        return self.dense[: len(embeddings)]


def test_a_batch_reads_its_dense_and_bm25_only_candidates_in_one_get() -> None:
    store = DenseFakeStore([[("a", 0.9)], [("b", 0.8)]])
    store.upsert(
        [
            stored("a", "vpn client", doc_id="d1"),
            stored("b", "lunch menu", doc_id="d2"),
            stored("c", "vpn password", doc_id="d3"),
        ],
        VECTORS,
    )
    index = Bm25Index.build(["a", "b", "c"], ["vpn client", "lunch menu", "vpn password"], Analyzer())
    generator = CandidateGenerator(store, RetrievalSettings(candidate_k=1, bm25_candidate_k=2), index)
    query = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=np.float32)

    first, second = generator.generate_many(["vpn", "lunch"], query, [None, None])

    assert [ids for ids, _ in store.fake.gets] == [["a", "b", "c"]]  # one get: dense a, b and BM25-only c
    assert [(c.chunk_id, c.scores["dense"], sorted(c.origin)) for c in first.candidates] == [
        ("c", 1.0, ["bm25"]),  # its stored vector against the query vector: [1, 0, 0] . [1, 0, 0]
        ("a", 0.9, ["bm25", "dense"]),  # the similarity the dense search gave
    ]
    assert [(c.chunk_id, sorted(c.origin)) for c in second.candidates] == [("b", ["bm25", "dense"])]
    np.testing.assert_array_equal(first.candidates[1].unit, VECTORS[0].astype(float) / 5.0)

    generator.generate_many(["vpn", "lunch"], query, [None, None])
    assert len(store.fake.gets) == 1  # everything cached


def test_a_candidate_cannot_change_what_the_cache_holds() -> None:
    store = DenseFakeStore([[("a", 0.9)]])
    store.upsert([stored("a", "alpha", doc_id="d1", knowledge="hr")], VECTORS[:1])
    generator = CandidateGenerator(store, RetrievalSettings(candidate_k=1, hybrid=False), None)
    query = np.array([[1.0, 0.0, 0.0]], dtype=np.float32)
    (first,) = generator.generate_many(["q"], query, [None])
    (candidate,) = first.candidates
    candidate.metadata["knowledge"] = "finance"  # its own copy
    with pytest.raises(ValueError, match="read-only"):
        candidate.embedding[0] = 9.0  # type: ignore[index]
    (again,) = generator.generate_many(["q"], query, [None])
    assert again.candidates[0].metadata == {"doc_id": "d1", "knowledge": "hr"}
    assert store.chunks(["a"])["a"].metadata == {"doc_id": "d1", "knowledge": "hr"}
    np.testing.assert_array_equal(again.candidates[0].embedding, VECTORS[0])
