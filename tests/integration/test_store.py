"""The vector store against a real Chroma: embedded (a tmp path) and a `chroma run` server."""

from __future__ import annotations

import os
import time
import uuid

import numpy as np
import pytest

from app.settings import StoreSettings
from app.store import (
    ChromaStore,
    EmbedderMismatchError,
    StoredChunk,
    StoreLockedError,
    StoreUnavailableError,
    check_not_locked,
)

pytestmark = pytest.mark.integration

DIM = 16
IDENTITY = {"name": "test-embedder", "dimension": DIM, "checksum": "0123456789abcdef"}


def unit(rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def random_unit(n: int, dim: int, seed: int) -> np.ndarray:
    return unit(np.random.default_rng(seed).standard_normal((n, dim)))


@pytest.fixture(params=["embedded", "http"])
def store_settings(request, tmp_path) -> StoreSettings:
    """A fresh collection in each mode: a tmp path, or a unique collection on the shared server."""
    collection = f"test-{uuid.uuid4().hex[:12]}"
    if request.param == "embedded":
        return StoreSettings(mode="embedded", path=str(tmp_path / "chroma"), collection=collection)
    host, port = request.getfixturevalue("chroma_server")
    return StoreSettings(mode="http", host=host, port=port, collection=collection)


@pytest.fixture
def store(store_settings):
    opened = ChromaStore.open(store_settings, IDENTITY)
    yield opened
    opened.close()


def test_round_trip_upsert_query_get_delete_iter_all(store):
    vectors = random_unit(3, DIM, seed=1)
    chunks = [
        StoredChunk("c_a", "alpha text", {"doc_id": "doc-a", "knowledge": "hr", "position": 0}),
        StoredChunk("c_b", "beta text", {"doc_id": "doc-b", "knowledge": "finance", "position": 0}),
        StoredChunk("c_c", "gamma text", {"doc_id": "doc-b", "knowledge": "finance", "position": 1}),
    ]
    store.upsert(chunks, vectors)
    assert store.count() == 3

    (hits,) = store.query(vectors[1:2], n=3)
    assert hits[0].chunk_id == "c_b"
    assert hits[0].similarity == pytest.approx(1.0, abs=1e-5)  # cosine of a vector with itself
    assert [h.chunk_id for h in hits] == sorted(
        ["c_a", "c_b", "c_c"], key=lambda cid: -float(vectors[["c_a", "c_b", "c_c"].index(cid)] @ vectors[1])
    )
    for hit in hits:
        expected = float(vectors[["c_a", "c_b", "c_c"].index(hit.chunk_id)] @ vectors[1])
        assert hit.similarity == pytest.approx(expected, abs=1e-4)
    assert (hits[0].text, hits[0].metadata) == ("beta text", chunks[1].metadata)
    np.testing.assert_allclose(hits[0].embedding, vectors[1], atol=1e-6)

    (finance,) = store.query(vectors[0:1], n=3, where={"knowledge": "finance"})
    assert sorted(h.chunk_id for h in finance) == ["c_b", "c_c"]

    got = store.get(["c_c", "missing", "c_a"])
    assert [g.chunk_id for g in got] == ["c_c", "c_a"]  # the order asked; unknown ids left out
    assert got[0].text == "gamma text" and got[0].metadata["position"] == 1
    np.testing.assert_allclose(got[1].embedding, vectors[0], atol=1e-6)
    assert store.get(["c_a"], include_embeddings=False)[0].embedding is None

    store.upsert([StoredChunk("c_a", "alpha v2", {"doc_id": "doc-a"})], vectors[2:3])  # replace in place
    assert store.count() == 3
    assert store.get(["c_a"])[0].text == "alpha v2"

    store.delete(["c_b"])
    everything = {c.chunk_id: c for c in store.iter_all()}
    assert set(everything) == {"c_a", "c_c"}
    assert everything["c_c"].text == "gamma text"
    assert {c.text for c in store.iter_all(include_text=False)} == {""}


def test_collection_is_cosine_with_hnsw_parameters_from_settings(tmp_path):
    settings = StoreSettings(
        path=str(tmp_path / "chroma"),
        collection="hnsw-check",
        hnsw_m=24,
        hnsw_construction_ef=150,
        hnsw_search_ef=120,
    )
    store = ChromaStore.open(settings, IDENTITY)
    try:
        hnsw = store._collection.configuration["hnsw"]
        assert (hnsw["space"], hnsw["max_neighbors"], hnsw["ef_construction"], hnsw["ef_search"]) == (
            "cosine",
            24,
            150,
            120,
        )
        assert store.metadata() == {
            "embedder_name": "test-embedder",
            "embedder_dimension": DIM,
            "embedder_checksum": "0123456789abcdef",
        }
    finally:
        store.close()


def test_hnsw_top10_matches_exact_cosine_top10(tmp_path):
    # 2,050 random unit vectors (more than one iter_all page of 2,000) in 32 dimensions, 50 queries, the
    # default settings (M=32, ef_construction=ef_search=200). Measured on Chroma 1.5.9: 50/50 queries get
    # exactly the brute-force top-10 (mean recall@10 1.000); with M=16, ef_search=10 the same data gives
    # 3/50 (0.752), so the test does tell good parameters from poor ones. The floors leave room for
    # HNSW's randomness: >= 95% of queries exact and mean recall@10 >= 0.99.
    corpus = random_unit(2050, 32, seed=7)
    queries = random_unit(50, 32, seed=8)
    ids = [f"c_{i:05d}" for i in range(len(corpus))]
    store = ChromaStore.open(StoreSettings(path=str(tmp_path / "chroma"), collection="recall"), IDENTITY)
    try:
        store.upsert([StoredChunk(cid, "", {"i": i}) for i, cid in enumerate(ids)], corpus)
        assert sum(1 for _ in store.iter_all(include_text=False)) == len(ids)  # paged past 2,000
        hits = store.query(queries, n=10)
    finally:
        store.close()
    exact = np.argsort(-(queries @ corpus.T), axis=1)[:, :10]
    found = [{h.chunk_id for h in row} for row in hits]
    truth = [{ids[j] for j in row} for row in exact]
    exact_queries = sum(f == t for f, t in zip(found, truth, strict=True))
    recall = float(np.mean([len(f & t) / 10 for f, t in zip(found, truth, strict=True)]))
    assert exact_queries >= 0.95 * len(queries), f"{exact_queries}/50 exact, mean recall@10 {recall:.3f}"
    assert recall >= 0.99


def test_a_second_open_of_an_embedded_path_is_refused_while_the_first_holds_it(tmp_path):
    settings = StoreSettings(path=str(tmp_path / "chroma"), collection="locked")
    first = ChromaStore.open(settings, IDENTITY)
    try:
        with pytest.raises(StoreLockedError) as info:
            ChromaStore.open(settings, IDENTITY)
        assert str(tmp_path / "chroma") in str(info.value)
        assert f"pid {os.getpid()}" in str(info.value)  # names who holds it
    finally:
        first.close()
    ChromaStore.open(settings, IDENTITY).close()  # closing released the lock


def test_check_not_locked_refuses_a_held_path_and_takes_nothing(tmp_path):
    settings = StoreSettings(path=str(tmp_path / "chroma"), collection="locked")
    check_not_locked(settings)  # never opened: no lock file, nothing made
    assert not (tmp_path / "chroma").exists()
    first = ChromaStore.open(settings, IDENTITY)
    try:
        with pytest.raises(StoreLockedError) as info:
            check_not_locked(settings)
        assert (info.value.path, info.value.holder) == (tmp_path / "chroma", str(os.getpid()))
        assert (tmp_path / "chroma" / "sieve.lock").read_text() == str(os.getpid())
    finally:
        first.close()
    check_not_locked(settings)
    ChromaStore.open(settings, IDENTITY).close()  # the check left no lock behind
    check_not_locked(StoreSettings(mode="http", host="127.0.0.1", port=1))  # a server is shared: no check


def test_opening_with_another_embedder_is_refused_and_names_both(store_settings):
    ChromaStore.open(store_settings, IDENTITY).close()
    other = {"name": "other-embedder", "dimension": 384, "checksum": "fedcba9876543210"}
    with pytest.raises(EmbedderMismatchError) as info:
        ChromaStore.open(store_settings, other)
    message = str(info.value)
    assert "test-embedder" in message and "other-embedder" in message
    assert "sieve store rebuild" in message
    ChromaStore.open(store_settings, IDENTITY).close()  # the failed open left no lock behind


def test_an_unreachable_server_is_store_unavailable_quickly(free_port):
    port = free_port()
    started = time.perf_counter()
    with pytest.raises(StoreUnavailableError, match=f"http://127.0.0.1:{port}"):
        ChromaStore.open(StoreSettings(mode="http", host="127.0.0.1", port=port), IDENTITY)
    assert time.perf_counter() - started < 5.0


def test_metadata_of_finds_chunks_by_id_and_by_doc_id_only(store):
    chunks = [
        StoredChunk("a-0", "alpha zero", {"doc_id": "a", "position": 0}),
        StoredChunk("a-1", "alpha one", {"doc_id": "a", "position": 1}),
        StoredChunk("b-0", "beta zero", {"doc_id": "b", "position": 0}),
        StoredChunk("c-0", "gamma zero", {"doc_id": "c", "position": 0}),
    ]
    store.upsert(chunks, random_unit(4, DIM, seed=3))
    assert store.metadata_of(["c-0", "missing"], ["a", "nobody"]) == {
        "c-0": {"doc_id": "c", "position": 0},
        "a-0": {"doc_id": "a", "position": 0},
        "a-1": {"doc_id": "a", "position": 1},
    }
    assert store.metadata_of([], []) == {}


def test_warm_up_queries_a_filled_collection_once_and_leaves_an_empty_one_alone(store):
    calls = []
    real_query = store._collection.query

    def counting_query(*args, **kwargs):
        calls.append(kwargs)
        return real_query(*args, **kwargs)

    store._collection.query = counting_query
    assert store.warm_up(DIM) >= 0.0
    assert calls == []  # nothing stored: nothing to load, and no query on an empty collection

    vectors = random_unit(2, DIM, seed=7)
    store.upsert(
        [StoredChunk("c_x", "x", {"doc_id": "d"}), StoredChunk("c_y", "y", {"doc_id": "d"})], vectors
    )
    store.warm_up(DIM)
    assert len(calls) == 1 and calls[0]["n_results"] == 1 and calls[0]["include"] == []
    # the store answers real queries as before
    assert [c.chunk_id for c in store.query(vectors[:1], 1)[0]] == ["c_x"]


def test_two_replicas_creating_the_collection_together_both_open_it(chroma_server, monkeypatch):
    """Both find the collection missing; the second one's create then fails on the server (the first one's
    landed in between), and it opens that collection instead of failing its start."""
    import chromadb.api.client as chroma_client

    host, port = chroma_server
    settings = StoreSettings(mode="http", host=host, port=port, collection=f"test-{uuid.uuid4().hex[:12]}")
    first = ChromaStore.open(settings, IDENTITY)
    listed, calls = chroma_client.Client.list_collections, []

    def listed_before_the_first_create(self, *args, **kwargs):  # the check before the create misses it
        calls.append(1)
        found = listed(self, *args, **kwargs)
        return [c for c in found if c.name != settings.collection] if len(calls) == 1 else found

    monkeypatch.setattr(chroma_client.Client, "list_collections", listed_before_the_first_create)
    second = ChromaStore.open(settings, IDENTITY)
    first.upsert([StoredChunk("c1", "one", {})], random_unit(1, DIM, seed=3))
    assert second.count() == 1 and second.collection_id == first.collection_id
