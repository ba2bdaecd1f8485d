"""The store's exact dense search against a real Chroma (embedded and `chroma run`): what `query_ids` answers
with it is the definition's answer and Chroma's own, the store's writes reach it before they return, and past
`exact_search_max_chunks` Chroma's HNSW index answers instead."""

from __future__ import annotations

import logging
import uuid

import numpy as np
import pytest

from app.settings import StoreSettings
from app.store import ChromaStore, StoredChunk

pytestmark = pytest.mark.integration

DIM = 16
IDENTITY = {"name": "test-embedder", "dimension": DIM, "checksum": "0123456789abcdef"}
N = 400
TAGS = ("hr", "it", "finance")


@pytest.fixture(params=["embedded", "http"])
def store(request, tmp_path):
    collection = f"test-{uuid.uuid4().hex[:12]}"
    if request.param == "embedded":
        settings = StoreSettings(mode="embedded", path=str(tmp_path / "chroma"), collection=collection)
    else:
        host, port = request.getfixturevalue("chroma_server")
        settings = StoreSettings(mode="http", host=host, port=port, collection=collection)
    opened = ChromaStore.open(settings, IDENTITY)
    yield opened
    opened.close()


def fill(store: ChromaStore, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((N, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    chunks = [StoredChunk(f"c{i:03d}", f"text {i}", {"knowledge": TAGS[i % 3]}) for i in range(N)]
    store.upsert(chunks, vectors)
    return vectors


def definition(vectors: np.ndarray, query: np.ndarray, n: int, tag: str | None) -> list[str]:
    """The n chunks of largest cosine, ties by id, among those tagged `tag`: computed in float64."""
    cosines = vectors.astype(float) @ (query / np.linalg.norm(query)).astype(float)
    rows = [i for i in range(len(vectors)) if tag is None or TAGS[i % 3] == tag]
    return [f"c{i:03d}" for i in sorted(rows, key=lambda i: (-cosines[i], i))[:n]]


def test_exact_answers_are_the_definitions_and_chromas_own(store) -> None:
    vectors = fill(store)
    said = store.load_exact(1000)
    assert said.startswith(f"dense search: exact, over {N} vectors held in memory (read in ")
    assert store.exact_search_active
    queries = np.random.default_rng(11).standard_normal((10, DIM)).astype(np.float32)
    for tag in (None, "it"):
        where = None if tag is None else {"knowledge": tag}
        exact = store.query_ids(queries, 20, where)
        chroma = store._nearest(queries, 20, where, ["distances"])  # HNSW at 400 chunks, ef 200: exact too
        for query, hits, ids, distances in zip(
            queries, exact, chroma["ids"], chroma["distances"], strict=True
        ):
            assert [cid for cid, _ in hits] == definition(vectors, query, 20, tag)
            assert {cid for cid, _ in hits} == set(ids)
            by_id = dict(hits)
            for cid, distance in zip(ids, distances, strict=True):
                assert by_id[cid] == pytest.approx(1.0 - distance, abs=1e-5)


def test_the_stores_writes_reach_the_exact_search_before_they_return(store) -> None:
    vectors = fill(store)
    store.load_exact(1000)
    probe = -vectors[:1]  # far from c000, near nothing in particular

    store.upsert([StoredChunk("new", "new text", {"knowledge": "hr"})], probe)
    assert store.query_ids(probe, 1)[0] == [("new", pytest.approx(1.0, abs=1e-6))]
    store.update_metadata(["new"], [{"knowledge": "legal"}])  # a retag: Chroma rewrites the metadata
    assert store.query_ids(probe, 1, {"knowledge": "legal"})[0][0][0] == "new"
    assert "new" not in [cid for cid, _ in store.query_ids(probe, 5, {"knowledge": "hr"})[0]]
    store.delete(["new", "c000"])
    got = [cid for cid, _ in store.query_ids(vectors[:1], 5)[0]]
    assert "new" not in got and "c000" not in got
    assert store.exact_search_active and len(store.exact) == N - 1


def test_past_the_limit_the_hnsw_index_answers(store, caplog) -> None:
    vectors = fill(store)
    said = store.load_exact(N - 1)
    assert (
        said
        == f"dense search: the store's HNSW index ({N} chunks > rag.store.exact_search_max_chunks {N - 1})"
    )
    assert not store.exact_search_active
    assert [cid for cid, _ in store.query_ids(vectors[:1], 1)[0]] == ["c000"]

    store.load_exact(N + 1)
    assert store.exact_search_active
    caplog.set_level(logging.WARNING, logger="app.store.chroma")
    extra = [StoredChunk(f"x{i}", "extra", {}) for i in range(2)]
    store.upsert(extra, vectors[:2])
    assert not store.exact_search_active
    assert f"the collection grew to {N + 2} chunks > rag.store.exact_search_max_chunks {N + 1}" in caplog.text
    assert {cid for cid, _ in store.query_ids(vectors[:1], 2)[0]} == {"c000", "x0"}  # Chroma's answer


def test_held_for_filtered_queries_a_selective_scope_or_tag_is_exact_and_the_rest_is_hnsw(store) -> None:
    from app.access.scope import Principal

    rng = np.random.default_rng(4)
    vectors = rng.standard_normal((N, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    tenants = [("t0" if i % 10 == 0 else "t1") for i in range(N)]  # t0: 40 chunks
    chunks = [
        StoredChunk(
            f"c{i:03d}", f"text {i}", {"knowledge": TAGS[i % 3], "tenant": tenants[i], "access": ["public"]}
        )
        for i in range(N)
    ]
    store.upsert(chunks, vectors)
    said = store.load_exact(100, 1000)  # 400 chunks: held, but only a filter matching <= 100 is exact
    assert said.startswith("dense search: the store's HNSW index, and exact for a filter that at most 100")
    assert not store.exact_search_active
    small = Principal("p", tenant="t0")
    assert store.exact_search_covers(None, small) and not store.exact_search_covers(
        None, Principal("q", tenant="t1")
    )
    assert not store.exact_search_covers(None, None) and not store.exact_search_covers(
        "it", None
    )  # ~133 match
    query = np.random.default_rng(12).standard_normal((1, DIM)).astype(np.float32)
    cosines = vectors.astype(float) @ (query[0] / np.linalg.norm(query[0])).astype(float)
    readable = [i for i in range(N) if tenants[i] == "t0"]
    expected = [f"c{i:03d}" for i in sorted(readable, key=lambda i: (-cosines[i], i))[:10]]
    assert [cid for cid, _ in store.query_ids(query, 10, None, small)[0]] == expected
    # a write that moves a chunk into the scope is seen by the next query
    store.upsert(
        [StoredChunk("c001", "text 1", {"knowledge": "it", "tenant": "t0", "access": ["public"]})],
        vectors[[1]],
    )
    readable.append(1)
    expected = [f"c{i:03d}" for i in sorted(readable, key=lambda i: (-cosines[i], i))[:10]]
    assert [cid for cid, _ in store.query_ids(query, 10, None, small)[0]] == expected
