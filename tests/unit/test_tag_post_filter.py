"""A tagged query's dense search: an unfiltered search for more chunks, filtered by the index's tags, gives
the candidates Chroma's `where` gives; rare tags, and queries the wide search leaves short, go to `where`.

The store is a fake with an exact search (so "the candidates `where` gives" has one meaning); the index is
the real `Bm25Index`."""

from __future__ import annotations

import numpy as np
import pytest

from app.lexical.index import Bm25Index
from app.retrieval.candidates import CandidateGenerator
from app.settings import RetrievalSettings
from app.store import StoredChunk
from tests.fixtures.indexes import index_of

K = 10  # candidate_k
# 1,000 chunks: tag a 500, b 250, c 50, d 5, untagged 195
SHARES = {"a": 500, "b": 250, "c": 50, "d": 5, None: 195}
DIM = 8


class ExactStore:
    """Chunks in memory; `query_ids` is an exact cosine search that honours `n` and `where` as Chroma's
    does, and records each call's (where, n, queries)."""

    def __init__(self, chunks: list[StoredChunk]):
        self.by_id = {c.chunk_id: c for c in chunks}
        self.calls: list[tuple[dict | None, int, int]] = []

    def query_ids(self, embeddings, n, where=None):
        self.calls.append((where, n, len(embeddings)))
        pool = [
            c
            for c in self.by_id.values()
            if where is None or c.metadata.get("knowledge") == where["knowledge"]
        ]
        out = []
        for q in embeddings:
            scored = sorted(
                ((float(np.dot(c.embedding, q)), c.chunk_id) for c in pool), key=lambda p: (-p[0], p[1])
            )
            out.append([(cid, sim) for sim, cid in scored[:n]])
        return out

    def chunks(self, ids):
        return {i: self.by_id[i] for i in ids if i in self.by_id}


def unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


def collection(clustered: bool = False) -> tuple[list[StoredChunk], Bm25Index]:
    """Random unit vectors; `clustered`: each tag's chunks lie around a direction of their own."""
    rng = np.random.default_rng(11)
    centres = {tag: unit(rng.normal(size=DIM)) for tag in SHARES}
    chunks = []
    for tag, count in SHARES.items():
        for i in range(count):
            noise = rng.normal(size=DIM)
            vec = unit(centres[tag] * 4 + noise) if clustered else unit(noise)
            meta = {"doc_id": f"{tag}-{i}"} | ({"knowledge": tag} if tag else {})
            chunks.append(StoredChunk(f"{tag}-{i:03d}", f"text {tag} {i}", meta, vec.astype(np.float32)))
    index = index_of(chunks)
    return chunks, index


def dense_ids(generator: CandidateGenerator, queries: np.ndarray, tags: list[str | None]) -> list[list[str]]:
    sets = generator.generate_many(["q"] * len(queries), queries, tags)
    return [[c.chunk_id for c in s.candidates] for s in sets]


def settings(post_filter_max: int) -> RetrievalSettings:
    return RetrievalSettings(candidate_k=K, hybrid=False, tag_post_filter_max=post_filter_max)


@pytest.mark.parametrize("tag", ["a", "b", "c", "d"])
@pytest.mark.parametrize("post_filter_max", [200, 4000])
def test_post_filtered_candidates_are_the_filtered_searchs(tag: str, post_filter_max: int) -> None:
    chunks, index = collection()
    queries = np.stack([unit(v) for v in np.random.default_rng(5).normal(size=(12, DIM))]).astype(np.float32)
    filtered = dense_ids(CandidateGenerator(ExactStore(chunks), settings(0), index), queries, [tag] * 12)
    store = ExactStore(chunks)
    post = dense_ids(CandidateGenerator(store, settings(post_filter_max), index), queries, [tag] * 12)
    assert post == filtered
    assert all(len(ids) == min(K, SHARES[tag]) for ids in post)
    assert all(chunk_id.startswith(f"{tag}-") for ids in post for chunk_id in ids)


def test_the_number_fetched_follows_the_tags_share() -> None:
    chunks, index = collection()
    queries = np.ones((3, DIM), dtype=np.float32) / np.sqrt(DIM)
    expected = {
        "a": (None, 2 * 10 * 1000 // 500),  # 40
        "b": (None, 2 * 10 * 1000 // 250),  # 80
        "c": ({"knowledge": "c"}, K),  # 2 * 10 * 1000 / 50 = 400 > 200: Chroma's where
        "d": ({"knowledge": "d"}, K),  # 4,000 > 200
    }
    for tag, (where, n) in expected.items():
        store = ExactStore(chunks)
        dense_ids(CandidateGenerator(store, settings(200), index), queries, [tag] * 3)
        assert store.calls == [(where, n, 3)], tag
    store = ExactStore(chunks)
    dense_ids(CandidateGenerator(store, settings(4000), index), queries, ["d"] * 3)
    # 2 * 10 * 1000 / 5 = 4,000 >= the whole collection: all 1,000 + 1 asked for, nothing left to ask
    assert store.calls == [(None, 1001, 3)]
    store = ExactStore(chunks)
    dense_ids(CandidateGenerator(store, settings(4000), index), queries, [None, "a", "zz"])
    # untagged: as before; a tag the index does not know: Chroma's filter decides
    assert store.calls == [(None, K, 1), (None, 40, 1), ({"knowledge": "zz"}, K, 1)]


def test_a_query_far_from_its_tag_falls_back_to_the_filtered_search() -> None:
    chunks, index = collection(clustered=True)
    near_b = np.stack([c.embedding for c in chunks if c.metadata.get("knowledge") == "b"][:2])
    near_a = np.stack([c.embedding for c in chunks if c.metadata.get("knowledge") == "a"][:1])
    queries = np.concatenate([near_b, near_a])  # the nearest 40 of the b queries are all b chunks
    store = ExactStore(chunks)
    got = dense_ids(CandidateGenerator(store, settings(4000), index), queries, ["a"] * 3)
    assert store.calls == [(None, 40, 3), ({"knowledge": "a"}, K, 2)]  # only the two short queries again
    filtered = dense_ids(CandidateGenerator(ExactStore(chunks), settings(0), index), queries, ["a"] * 3)
    assert got == filtered and all(len(ids) == K for ids in got)


def test_a_chunk_retagged_since_the_index_heard_of_it_is_left_out() -> None:
    chunks, index = collection()
    store = ExactStore(chunks)
    queries = np.stack([unit(v) for v in np.random.default_rng(3).normal(size=(1, DIM))]).astype(np.float32)
    (before,) = dense_ids(CandidateGenerator(store, settings(4000), index), queries, ["a"])
    moved = store.by_id[before[0]]
    # another process retagged it; this index has not read the change log yet
    store.by_id[moved.chunk_id] = StoredChunk(
        moved.chunk_id, moved.text, moved.metadata | {"knowledge": "b"}, moved.embedding
    )
    assert index.tag_of(moved.chunk_id) == "a"
    (after,) = dense_ids(CandidateGenerator(store, settings(4000), index), queries, ["a"])
    assert moved.chunk_id not in after and after[: K - 1] == before[1:]


def test_the_index_counts_live_chunks_per_tag_through_writes() -> None:
    _, index = collection()
    assert [index.tag_count(t) for t in ("a", "b", "c", "d", "zz")] == [500, 250, 50, 5, 0]
    index.upsert([("a-000", "text a 0", "b"), ("new", "a new chunk", "d")])  # a retag and an add
    index.delete(["c-000", "c-001", "d-000"])
    assert [index.tag_count(t) for t in ("a", "b", "c", "d")] == [500 - 1, 250 + 1, 50 - 2, 5 + 1 - 1]
    assert index.tags_of(["a-000", "new", "c-000", "None-000", "nowhere"]) == ["b", "d", None, None, None]


def test_a_store_that_searches_exactly_gets_the_where_itself() -> None:
    """With the store's exact search on (`exact_search_active`), its filtered search is exact and cheap:
    no wide unfiltered search is made, whatever the tag's share."""
    chunks, index = collection()
    store = ExactStore(chunks)
    store.exact_search_active = True
    generator = CandidateGenerator(store, settings(4000), index)
    query = np.random.default_rng(5).normal(size=(1, DIM)).astype(np.float32)
    (got,) = dense_ids(generator, query, ["a"])
    assert store.calls == [({"knowledge": "a"}, K, 1)]
    assert len(got) == K and all(cid.startswith("a-") for cid in got)
