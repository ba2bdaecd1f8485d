"""The filters by scope, each against the rule written apart from them (`may_read`): the BM25 index's `top`
and `tag_count`, the exact search, and the candidate generator, which never yields a chunk `may_read`
refuses by its stored metadata, even when the index's labels or the store's filter are wrong."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from app.access.scope import ADMIN, Principal, may_read
from app.lexical.index import Analyzer, Bm25Index
from app.retrieval.candidates import CandidateGenerator
from app.settings import RetrievalSettings
from app.store import StoredChunk
from app.store.exact import ExactSearch
from app.store.types import index_label_of, knowledge_tag_of

ANALYZER = Analyzer()
WORDS = "salary bonus vpn password lunch menu leave policy travel expense".split()
DIM = 6

scope_metadata = st.fixed_dictionaries(
    {},
    optional={
        "tenant": st.one_of(st.none(), st.sampled_from(["acme", "globex"])),
        "access": st.one_of(
            st.none(),
            st.just("group:hr,group:sales"),
            st.lists(st.sampled_from(["public", "group:hr", "group:sales", "user:ann"]), max_size=3),
        ),
        "knowledge": st.sampled_from(["hr", "it"]),
    },
)
principals = st.one_of(
    st.just(ADMIN),
    st.builds(
        Principal,
        name=st.just("p"),
        tenant=st.one_of(st.none(), st.sampled_from(["acme", "globex"])),
        groups=st.lists(st.sampled_from(["hr", "sales"]), max_size=2, unique=True).map(tuple),
        user=st.one_of(st.none(), st.just("ann")),
    ),
)
tags = st.one_of(st.none(), st.sampled_from(["hr", "it"]))


@st.composite
def collections(draw: st.DrawFn) -> list[StoredChunk]:
    count = draw(st.integers(1, 30))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((count, DIM))
    out = []
    for i in range(count):
        text = " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=6)))
        meta = {"doc_id": f"d{i}", **draw(scope_metadata)}
        out.append(StoredChunk(f"c{i:02d}", text, meta, vectors[i]))
    return out


def matches(chunk: StoredChunk, tag: str | None, principal: Principal | None) -> bool:
    return (tag is None or knowledge_tag_of(chunk.metadata) == tag) and (
        principal is None or may_read(principal, chunk.metadata)
    )


def filler(count: int = 6) -> list[StoredChunk]:
    """Public chunks without the query's words: in a collection of two, a word both hold has a negative
    idf and no chunk scores above 0."""
    return [
        StoredChunk(
            f"f{i}", f"travel expense form {i}", {"doc_id": f"f{i}", "access": ["public"]}, np.ones(DIM)
        )
        for i in range(count)
    ]


def index_of(chunks: list[StoredChunk]) -> Bm25Index:
    return Bm25Index.build(
        [c.chunk_id for c in chunks],
        [c.text for c in chunks],
        ANALYZER,
        knowledge_tags=[index_label_of(c.metadata) for c in chunks],
    )


# -- BM25 ----------------------------------------------------------------------------------------------------


@given(
    collections(),
    principals,
    tags,
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=3),
    st.integers(1, 8),
)
def test_bm25_top_is_the_best_n_of_the_chunks_in_scope(
    chunks: list[StoredChunk], principal: Principal, tag: str | None, words: list[str], n: int
) -> None:
    index = index_of(chunks)
    query = " ".join(words)
    scores = index.scores(query, [c.chunk_id for c in chunks])
    brute = sorted(
        (
            (c.chunk_id, scores[c.chunk_id])
            for c in chunks
            if matches(c, tag, principal) and scores[c.chunk_id] > 0
        ),
        key=lambda pair: (-pair[1], pair[0]),
    )[:n]
    assert index.top(query, n, tag, principal) == brute


@given(collections(), principals, tags)
def test_tag_count_counts_the_chunks_in_scope(
    chunks: list[StoredChunk], principal: Principal, tag: str | None
) -> None:
    index = index_of(chunks)
    assert index.tag_count(tag, principal) == sum(matches(c, tag, principal) for c in chunks)
    ids = [c.chunk_id for c in chunks] + ["unknown"]
    assert index.readable(ids, tag, principal) == [matches(c, tag, principal) for c in chunks] + [False]


def test_a_chunk_whose_scope_changes_moves_in_and_out_of_a_principals_top() -> None:
    hr = Principal("hr", groups=("hr",))
    chunks = [
        StoredChunk("a", "salary bonus", {"access": ["group:hr"]}),
        StoredChunk("b", "salary", {"access": ["group:sales"]}),
        *filler(),
    ]
    index = index_of(chunks)
    assert [i for i, _ in index.top("salary", 5, None, hr)] == ["a"]
    assert index.tag_count(None, hr) == 1 + 6
    # the same texts (only the labels change): the index re-labels without re-indexing
    index.upsert([("a", "salary bonus", index_label_of({"access": ["group:sales"]}))])
    index.upsert([("b", "salary", index_label_of({"access": ["group:hr", "public"]}))])
    assert [i for i, _ in index.top("salary", 5, None, hr)] == ["b"]
    assert index.tag_count(None, hr) == 1 + 6
    index.delete(["b"])
    assert index.top("salary", 5, None, hr) == []
    assert index.tag_count(None, hr) == 6


# -- the exact search ----------------------------------------------------------------------------------------


@given(collections(), principals, tags, st.integers(1, 8), st.integers(0, 2**32 - 1))
def test_the_exact_search_is_the_nearest_n_of_the_chunks_in_scope(
    chunks: list[StoredChunk], principal: Principal, tag: str | None, n: int, seed: int
) -> None:
    exact = ExactSearch(1000)
    assert exact.load(chunks, len(chunks))
    query = np.random.default_rng(seed).standard_normal((1, DIM))
    q = query[0] / np.linalg.norm(query[0])
    cosine = {c.chunk_id: float(np.dot(q, c.embedding / np.linalg.norm(c.embedding))) for c in chunks}
    brute = sorted((c.chunk_id for c in chunks if matches(c, tag, principal)), key=lambda i: (-cosine[i], i))
    got = exact.search(query, n, tag, principal)
    assert got is not None
    assert [i for i, _ in got[0]] == brute[:n]
    assert np.allclose([s for _, s in got[0]], [cosine[i] for i in brute[:n]], atol=1e-5)


def test_the_exact_search_follows_a_chunks_new_scope() -> None:
    hr = Principal("hr", groups=("hr",))
    a = StoredChunk("a", "", {"access": ["group:hr"]}, np.array([1.0, 0.0]))
    b = StoredChunk("b", "", {"access": ["group:sales"]}, np.array([0.9, 0.1]))
    exact = ExactSearch(10)
    assert exact.load([a, b], 2)
    assert [i for i, _ in exact.search(np.array([[1.0, 0.0]]), 5, None, hr)[0]] == ["a"]  # type: ignore[index]
    exact.apply([StoredChunk("a", "", {"access": ["public"], "tenant": "acme"}, a.embedding)], [])
    exact.apply([StoredChunk("b", "", {"access": ["group:hr"]}, b.embedding)], [])
    assert [i for i, _ in exact.search(np.array([[1.0, 0.0]]), 5, None, hr)[0]] == ["b"]  # type: ignore[index]
    assert [i for i, _ in exact.search(np.array([[1.0, 0.0]]), 5, None, ADMIN)[0]] == ["a", "b"]  # type: ignore[index]


# -- the candidate generator ------------------------------------------------------------------------------


class CarelessStore:
    """A store whose dense search ignores `where` and the principal (a filter that went wrong): every chunk,
    nearest first by its stored vector; `chunks` gives the stored chunks as they are now."""

    def __init__(self, chunks: list[StoredChunk]):
        self.by_id = {c.chunk_id: c for c in chunks}
        self.calls: list[tuple[int, Any, Any]] = []

    def query_ids(self, embeddings, n, where=None, principal=None):
        self.calls.append((n, where, principal))
        out = []
        for q in embeddings:
            scored = sorted(
                (
                    (cid, float(np.dot(q, c.embedding) / np.linalg.norm(c.embedding)))
                    for cid, c in self.by_id.items()
                ),
                key=lambda pair: (-pair[1], pair[0]),
            )
            out.append(scored[:n])
        return out

    def chunks(self, ids):
        return {i: self.by_id[i] for i in ids if i in self.by_id}


@given(collections(), collections(), principals, tags, st.sampled_from([0, 4000]), st.sampled_from(WORDS))
def test_candidates_are_only_what_may_read_allows_even_with_stale_labels_and_a_careless_store(
    stored: list[StoredChunk],
    stale: list[StoredChunk],
    principal: Principal,
    tag: str | None,
    post_filter_max: int,
    word: str,
) -> None:
    # the index was built from an older version of the chunks (other scopes, some chunks not yet there)
    current = {c.chunk_id: c for c in stored}
    old = [
        StoredChunk(c.chunk_id, current[c.chunk_id].text, c.metadata) for c in stale if c.chunk_id in current
    ]
    index = index_of(old) if old else index_of(stored)
    settings = RetrievalSettings(candidate_k=10, bm25_candidate_k=10, tag_post_filter_max=post_filter_max)
    generator = CandidateGenerator(CarelessStore(stored), settings, index)  # type: ignore[arg-type]
    (result,) = generator.generate_many([word], np.ones((1, DIM)) / np.sqrt(DIM), [tag], [principal])
    for candidate in result.candidates:
        assert matches(current[candidate.chunk_id], tag, principal), candidate.chunk_id
    for ids in result.search_hits.values():
        assert all(matches(current[i], tag, principal) for i in ids)


def test_a_chunk_labelled_public_in_a_stale_index_but_stored_for_hr_is_no_candidate_for_sales() -> None:
    sales = Principal("sales", tenant="acme", groups=("sales",))
    secret = {"doc_id": "pay", "tenant": "acme", "access": ["group:hr"]}
    stored = [
        StoredChunk("salary", "salary table for every grade", secret, np.array([1.0, 0, 0, 0, 0, 0])),
        StoredChunk(
            "menu",
            "lunch menu and salary day",
            {"doc_id": "m", "tenant": "acme", "access": ["public"]},
            np.array([0.5, 0.5, 0, 0, 0, 0]),
        ),
        *filler(),
    ]
    # the index still has the salary chunk as public (the store changed it since)
    index = index_of(
        [StoredChunk("salary", stored[0].text, {"tenant": "acme", "access": ["public"]}), *stored[1:]]
    )
    for post_filter_max in (0, 4000):
        settings = RetrievalSettings(candidate_k=5, bm25_candidate_k=5, tag_post_filter_max=post_filter_max)
        store = CarelessStore(stored)
        generator = CandidateGenerator(store, settings, index)  # type: ignore[arg-type]
        query = np.array([[1.0, 0, 0, 0, 0, 0]])
        (as_sales,) = generator.generate_many(["salary"], query, [None], [sales])
        # (the filler chunks have no tenant: not the sales principal's either)
        assert [c.chunk_id for c in as_sales.candidates] == ["menu"]
        assert as_sales.search_hits == {"dense": ["menu"], "bm25": ["menu"]}
        (as_admin,) = generator.generate_many(["salary"], query, [None], [ADMIN])
        assert [c.chunk_id for c in as_admin.candidates][:2] == ["salary", "menu"]
        if post_filter_max == 0:  # the store's own filtered search was asked, with the principal
            assert store.calls[0] == (5, None, sales)
