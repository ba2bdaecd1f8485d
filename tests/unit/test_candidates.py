"""Candidate generation with a fake store and the real BM25 index: a knowledge tag restricts the lexical
candidates before the BM25 cut, as it restricts the dense search."""

from __future__ import annotations

import numpy as np
import pytest

from app.lexical.index import Bm25Index
from app.retrieval.candidates import CandidateGenerator
from app.settings import RetrievalSettings
from app.store import StoredChunk
from tests.fixtures.indexes import index_of

N = 5  # bm25_candidate_k


class FakeStore:
    """Chunks in memory; the dense search honours `where` like Chroma's, and returns nothing here so that
    every candidate below is a lexical one."""

    def __init__(self, chunks: list[StoredChunk]):
        self.by_id = {c.chunk_id: c for c in chunks}
        self.wheres: list[dict | None] = []
        self.ns: list[int] = []

    def query_ids(self, embeddings, n, where=None):
        self.wheres.append(where)
        self.ns.append(n)
        return [[] for _ in range(len(embeddings))]

    def chunks(self, ids):
        return {i: self.by_id[i] for i in ids if i in self.by_id}


def _collection() -> tuple[list[StoredChunk], Bm25Index]:
    chunks = []
    for i in range(3 * N):  # far more than N chunks of other tags (or none) that outrank the it chunks
        tag = ["finance", "hr", None][i % 3]
        meta = {"doc_id": f"other{i}"} | ({"knowledge": tag} if tag else {})
        chunks.append(StoredChunk(f"other{i:02d}", "vpn password reset vpn password", meta, np.ones(4) / 2))
    for i, text in enumerate(["how to install the vpn client", "password rules for staff"]):
        meta = {"doc_id": f"it{i}", "knowledge": "it"}
        chunks.append(StoredChunk(f"it{i}", text, meta, np.ones(4) / 2))
    for i in range(20):
        chunks.append(StoredChunk(f"f{i:02d}", f"lunch menu number {i}", {"doc_id": f"f{i}"}, np.ones(4) / 2))
    index = index_of(chunks)
    return chunks, index


@pytest.mark.parametrize("post_filter_max", [0, 4000])
def test_a_tagged_query_keeps_its_lexical_candidates_when_other_tags_outrank_them(post_filter_max) -> None:
    chunks, index = _collection()
    assert all(i.startswith("other") for i, _ in index.top("vpn password", N))  # the global cut: no it chunk
    store = FakeStore(chunks)
    settings = RetrievalSettings(bm25_candidate_k=N, tag_post_filter_max=post_filter_max)
    generator = CandidateGenerator(store, settings, index)  # type: ignore[arg-type]

    tagged, untagged = generator.generate_many(["vpn password"] * 2, np.ones((2, 4)) / 2, ["it", None])

    assert sorted(c.chunk_id for c in tagged.candidates) == ["it0", "it1"]
    assert all(c.origin == frozenset({"bm25"}) for c in tagged.candidates)
    assert tagged.origins == {"dense": 0, "bm25": 2, "both": 0}
    assert len(untagged.candidates) == N and all(c.chunk_id.startswith("other") for c in untagged.candidates)
    if post_filter_max == 0:  # the dense search is Chroma's filtered one
        assert store.wheres == [{"knowledge": "it"}, None]
    else:  # "it" has 2 of 37 chunks: 2 * 50 * 37 / 2 > 37, so all 37 + 1 are asked for, unfiltered
        assert store.wheres == [None, None] and store.ns == [len(chunks) + 1, 50]


def test_a_tag_no_chunk_has_gets_no_lexical_candidates() -> None:
    chunks, index = _collection()
    generator = CandidateGenerator(FakeStore(chunks), RetrievalSettings(bm25_candidate_k=N), index)  # type: ignore[arg-type]
    (result,) = generator.generate_many(["vpn password"], np.ones((1, 4)) / 2, ["legal"])
    assert result.candidates == []


class ListedStore(FakeStore):
    """A dense search that answers the same hits, best first, for every query."""

    def __init__(self, chunks: list[StoredChunk], hits: list[tuple[str, float]]):
        super().__init__(chunks)
        self.hits = hits

    def query_ids(self, embeddings, n, where=None):
        return [list(self.hits[:n]) for _ in range(len(embeddings))]


class ListedIndex:
    """A lexical index that answers the same top list for every query."""

    def __init__(self, top: list[tuple[str, float]]):
        self.listed = top

    def top(self, query, n, knowledge_tag=None):
        return self.listed[:n]

    def scores(self, query, ids):
        return {i: s for i, s in self.listed if i in ids}


def _chunk(chunk_id: str) -> StoredChunk:
    return StoredChunk(chunk_id, f"text {chunk_id}", {"doc_id": chunk_id.upper()}, np.ones(4) / 2)


@pytest.mark.parametrize(
    ("candidate_k", "hybrid", "expected"),
    [
        # "gone" was deleted after the searches: it is in neither list, and no later hit moves up for it
        (4, True, {"dense": ["c", "a", "d"], "bm25": ["b", "d", "a"]}),
        (0, True, {"bm25": ["b", "d", "a"]}),
        (4, False, {"dense": ["c", "a", "d"]}),
    ],
)
def test_each_search_keeps_its_own_order_of_the_candidates_it_found(candidate_k, hybrid, expected) -> None:
    store = ListedStore([_chunk(i) for i in "abcd"], [("c", 0.9), ("gone", 0.8), ("a", 0.7), ("d", 0.5)])
    index = ListedIndex([("b", 7.0), ("gone", 6.0), ("d", 5.0), ("a", 1.0)])
    settings = RetrievalSettings(candidate_k=candidate_k, hybrid=hybrid, bm25_candidate_k=4)
    generator = CandidateGenerator(store, settings, index)  # type: ignore[arg-type]
    (result,) = generator.generate_many(["q"], np.ones((1, 4)) / 2, [None])
    assert result.search_hits == expected
