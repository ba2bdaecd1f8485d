"""The exact dense search alone (app/store/exact.py): its answers against its written definition (cosine of
the unit vectors, best first, ties by chunk id, the tag as Chroma's `where` matches it), the rows it reuses,
and when it refuses to answer (stale, off, another dimension) so that the store's HNSW search decides."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.access.scope import Principal, may_read
from app.store import StoredChunk
from app.store.exact import ExactSearch


def chunk(chunk_id: str, vector: list[float] | None, knowledge: object = None) -> StoredChunk:
    meta = {} if knowledge is None else {"knowledge": knowledge}
    return StoredChunk(chunk_id, "", meta, None if vector is None else np.array(vector, dtype=np.float32))


def loaded(chunks: list[StoredChunk], max_chunks: int = 100) -> ExactSearch:
    exact = ExactSearch(max_chunks)
    assert exact.load(chunks, len(chunks))
    return exact


def test_the_nearest_by_cosine_best_first_with_the_cosine_as_similarity() -> None:
    # lengths differ on purpose: the cosine is that of the unit vectors
    exact = loaded([chunk("a", [3, 4]), chunk("b", [0, 2]), chunk("c", [-1, 0]), chunk("d", [1, 0])])
    (hits,) = exact.search(np.array([[2.0, 0.0]]), 3, None)
    assert [cid for cid, _ in hits] == ["d", "a", "b"]
    assert [s for _, s in hits] == pytest.approx([1.0, 3 / 5, 0.0], abs=1e-7)


def test_ties_are_broken_by_chunk_id_whichever_row_holds_them() -> None:
    exact = loaded([chunk("z", [1, 1]), chunk("m", [1, 1]), chunk("b", [1, 1]), chunk("x", [1, 0])])
    (hits,) = exact.search(np.array([[1.0, 1.0]]), 2, None)
    assert [cid for cid, _ in hits] == ["b", "m"]  # all three tied at cosine 1; the cut keeps the first ids
    assert hits[0][1] == pytest.approx(1.0, abs=1e-7)


def test_a_knowledge_tag_keeps_only_the_chunks_whose_knowledge_is_that_string() -> None:
    exact = loaded(
        [
            chunk("a", [1, 0], "hr"),
            chunk("b", [0.9, 0.1], "it"),
            chunk("c", [0.5, 0.5], "hr"),
            chunk("d", [1, 0], 7),  # not a string: Chroma's where={"knowledge": "7"} does not match it either
            chunk("e", [1, 0]),
        ]
    )
    (hits,) = exact.search(np.array([[1.0, 0.0]]), 5, "hr")
    assert [cid for cid, _ in hits] == ["a", "c"]
    assert exact.search(np.array([[1.0, 0.0]]), 5, "7") == [[]]
    assert exact.search(np.array([[1.0, 0.0]]), 5, "unknown") == [[]]


def test_several_queries_each_get_their_own_answer() -> None:
    exact = loaded([chunk("a", [1, 0]), chunk("b", [0, 1])])
    got = exact.search(np.array([[1.0, 0.1], [0.1, 1.0]]), 1, None)
    assert [[cid for cid, _ in hits] for hits in got] == [["a"], ["b"]]


def test_a_query_alone_gets_the_very_bits_it_gets_in_a_batch() -> None:
    """Batching changes no score: a query searched alone, or with 1, 7 or 31 others, gets the same ids and
    the same float32 similarities, bit for bit, on every BLAS thread count (a collection large enough for
    BLAS's blocked kernels, with 384 dimensions as the packaged model's)."""
    from app.retrieval.blas import one_thread

    rng = np.random.default_rng(11)
    exact = loaded(
        [chunk(f"c{i:04d}", v.tolist()) for i, v in enumerate(rng.standard_normal((3000, 384)))], 4000
    )
    queries = rng.standard_normal((32, 384)).astype(np.float32)
    alone = [exact.search(queries[j : j + 1], 50, None)[0] for j in range(32)]  # type: ignore[index]
    for size in (2, 8, 32):
        batched = exact.search(queries[:size], 50, None)
        assert batched == alone[:size]
    with one_thread():
        assert exact.search(queries[:8], 50, None) == alone[:8]
        assert exact.search(queries[3:4], 50, None) == [alone[3]]


def test_a_zero_vector_has_similarity_0_with_everything() -> None:
    exact = loaded([chunk("zero", [0, 0]), chunk("a", [-1, 0])])
    (hits,) = exact.search(np.array([[1.0, 0.0]]), 2, None)
    assert hits == [("zero", 0.0), ("a", pytest.approx(-1.0, abs=1e-7))]


def test_random_collections_match_the_definition_computed_in_float64() -> None:
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((500, 16))
    tags = rng.choice(["a", "b", "c"], size=500)
    exact = loaded(
        [chunk(f"c{i:03d}", v.tolist(), t) for i, (v, t) in enumerate(zip(vectors, tags, strict=True))], 1000
    )
    units = vectors / np.linalg.norm(vectors, axis=1)[:, None]
    for query in rng.standard_normal((20, 16)):
        cosines = units @ (query / np.linalg.norm(query))
        for tag in (None, "b"):
            rows = [i for i in range(500) if tag is None or tags[i] == tag]
            expected = sorted(rows, key=lambda i: (-cosines[i], i))[:10]
            (hits,) = exact.search(query[None, :], 10, tag)
            assert [cid for cid, _ in hits] == [f"c{i:03d}" for i in expected]
            assert [s for _, s in hits] == pytest.approx([cosines[i] for i in expected], abs=1e-6)


def test_applied_writes_replace_delete_and_reuse_rows() -> None:
    exact = loaded([chunk("a", [1, 0], "hr"), chunk("b", [0, 1], "hr")])
    exact.apply([chunk("a", [0, 1], "it"), chunk("c", [1, 0.1])], gone=["b"])
    assert len(exact) == 2
    (hits,) = exact.search(np.array([[1.0, 0.0]]), 5, None)
    assert [cid for cid, _ in hits] == ["c", "a"]
    assert exact.search(np.array([[1.0, 0.0]]), 5, "hr") == [[]]
    assert [cid for cid, _ in exact.search(np.array([[1.0, 0.0]]), 5, "it")[0]] == ["a"]
    exact.apply([chunk("d", [-1, 0])], gone=[])  # takes the row b left
    assert len(exact._ids) == 3
    assert [cid for cid, _ in exact.search(np.array([[1.0, 0.0]]), 5, None)[0]] == ["c", "a", "d"]


def test_stale_ids_make_it_refuse_until_they_are_applied() -> None:
    exact = loaded([chunk("a", [1, 0])])
    exact.stale(["a"])
    assert exact.search(np.array([[1.0, 0.0]]), 1, None) is None
    everything, ids = exact.take_stale()
    assert (everything, ids) == (False, ["a"])
    exact.restale(everything, ids)  # the read failed: still stale
    assert exact.search(np.array([[1.0, 0.0]]), 1, None) is None
    exact.take_stale()
    exact.apply([chunk("a", [0, 1])], gone=[])
    assert exact.search(np.array([[1.0, 0.0]]), 1, None) == [[("a", pytest.approx(0.0, abs=1e-7))]]
    exact.stale_all()
    assert exact.search(np.array([[1.0, 0.0]]), 1, None) is None
    assert exact.take_stale() == (True, [])


def test_a_collection_over_the_limit_is_not_loaded_and_growing_past_it_turns_the_search_off() -> None:
    exact = ExactSearch(2)
    assert not exact.load([chunk("a", [1, 0])], count=3)
    assert exact.why_not == "3 chunks > rag.store.exact_search_max_chunks 2"

    exact = loaded([chunk("a", [1, 0]), chunk("b", [0, 1])], max_chunks=2)
    exact.apply([chunk("c", [1, 1])], gone=[])
    assert not exact.active and exact.retired
    assert exact.why_not == "the collection grew to 3 chunks > rag.store.exact_search_max_chunks 2"
    assert exact.search(np.array([[1.0, 0.0]]), 1, None) is None
    exact.stale(["a"])  # off for good: marks are not kept
    assert exact.take_stale() == (False, [])


@pytest.mark.parametrize(
    ("chunks", "why"),
    [
        ([chunk("a", [1, 0]), chunk("b", None)], "chunk 'b' has no vector"),
        ([chunk("a", [1, 0]), chunk("b", [1, 0, 0])], "chunk 'b' has a vector of 3 dimensions"),
    ],
)
def test_a_chunk_without_a_usable_vector_turns_it_off_with_the_reason(chunks, why) -> None:
    exact = ExactSearch(10)
    assert not exact.load(chunks, len(chunks))
    assert exact.why_not == why


def test_a_query_it_cannot_answer_is_left_to_the_store() -> None:
    exact = loaded([chunk("a", [1, 0])])
    assert exact.search(np.array([[1.0, 0.0, 0.0]]), 1, None) is None  # another dimension: Chroma's error
    assert exact.search(np.array([[math.nan, 0.0]]), 1, None) is None
    assert ExactSearch(10).search(np.array([[1.0, 0.0]]), 1, None) is None  # never loaded


def test_a_failed_read_leaves_the_loaded_search_as_it_was() -> None:
    exact = loaded([chunk("a", [1, 0])])

    def failing():
        yield chunk("b", [0, 1])
        raise ConnectionError("store gone")

    with pytest.raises(ConnectionError):
        exact.load(failing(), 2)
    assert exact.search(np.array([[1.0, 0.0]]), 5, None) == [[("a", pytest.approx(1.0, abs=1e-7))]]


# -- held for filtered queries only (filtered_max_chunks) -----------------------------------------------


def scoped_chunks(count: int, seed: int) -> list[StoredChunk]:
    """Random 8-dimensional chunks over 3 tenants, each with 1-2 of 4 groups, some public, 3 tags."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        tenant = ["t0", "t1", "t2"][int(rng.integers(3))]
        access = [f"group:g{g}" for g in sorted(set(rng.integers(4, size=int(rng.integers(1, 3))).tolist()))]
        if rng.random() < 0.2:
            access.append("public")
        meta = {"tenant": tenant, "access": access, "knowledge": ["hr", "it", "ops"][int(rng.integers(3))]}
        out.append(StoredChunk(f"c{i:03d}", "", meta, rng.standard_normal(8).astype(np.float32)))
    return out


def brute_force(
    chunks: list[StoredChunk], query: np.ndarray, n: int, tag: str | None, principal: Principal | None
) -> list[str]:
    """The definition: the n of largest float64 cosine among the chunks with the tag that `may_read`
    allows, ties by id."""
    q = query / np.linalg.norm(query)
    scored = [
        (-float(np.dot(q, c.embedding / np.linalg.norm(c.embedding))), c.chunk_id)
        for c in chunks
        if (tag is None or c.metadata["knowledge"] == tag)
        and (principal is None or may_read(principal, c.metadata))
    ]
    return [cid for _, cid in sorted(scored)[:n]]


FILTERS = [
    ("hr", None),
    (None, Principal("p", tenant="t1", groups=("g0",))),
    ("it", Principal("p", tenant="t2", groups=("g1", "g3"))),
    (None, Principal("nobody", tenant="t9", groups=("g0",))),
]


@pytest.mark.parametrize(("tag", "principal"), FILTERS)
def test_a_held_collection_answers_a_selective_filter_as_the_definition(tag, principal) -> None:
    chunks = scoped_chunks(300, seed=5)
    exact = ExactSearch(max_chunks=120, filtered_max_chunks=1000)  # each filter matches fewer than 120
    assert exact.load(chunks, len(chunks)) and not exact.serves_all
    assert exact.covers(tag, principal)
    queries = np.random.default_rng(6).standard_normal((20, 8)).astype(np.float32)
    got = exact.search(queries, 10, tag, principal)
    assert got is not None
    for query, hits in zip(queries, got, strict=True):
        assert [cid for cid, _ in hits] == brute_force(chunks, query, 10, tag, principal)


def test_a_held_collection_leaves_unfiltered_and_broad_filters_to_the_store() -> None:
    chunks = scoped_chunks(300, seed=5)
    exact = ExactSearch(max_chunks=50, filtered_max_chunks=1000)
    assert exact.load(chunks, len(chunks))
    query = np.ones((1, 8), dtype=np.float32)
    assert not exact.covers(None, None) and exact.search(query, 5, None) is None
    assert not exact.covers("hr", None) and exact.search(query, 5, "hr") is None  # ~100 match, over 50
    admin = Principal("admin", admin=True)
    assert not exact.covers(None, admin) and exact.search(query, 5, None, admin) is None


def test_a_held_collection_follows_writes_and_turns_to_rows_when_it_crosses_the_limit() -> None:
    chunks = scoped_chunks(300, seed=8)
    exact = ExactSearch(max_chunks=150, filtered_max_chunks=1000)
    assert exact.load(chunks[:100], 100) and exact.serves_all  # within max_chunks: every query
    exact.apply(chunks[100:], [])  # crosses 150: filtered queries only, over the matching rows
    assert not exact.serves_all
    principal = Principal("p", tenant="t0", groups=("g2",))
    query = np.random.default_rng(9).standard_normal((1, 8)).astype(np.float32)
    assert [c for c, _ in exact.search(query, 10, "ops", principal)[0]] == brute_force(
        chunks, query[0], 10, "ops", principal
    )
    # a retag and a delete are seen by the next search (the matching rows are not kept past a change)
    moved = StoredChunk(
        chunks[0].chunk_id,
        "",
        {**chunks[0].metadata, "tenant": "t0", "knowledge": "ops", "access": ["group:g2"]},
        chunks[0].embedding,
    )
    gone = brute_force(chunks, query[0], 1, "ops", principal)[0]
    exact.apply([moved], [gone])
    now = [moved if c.chunk_id == moved.chunk_id else c for c in chunks if c.chunk_id != gone]
    assert [c for c, _ in exact.search(query, 10, "ops", principal)[0]] == brute_force(
        now, query[0], 10, "ops", principal
    )


def test_more_than_filtered_max_chunks_is_not_held() -> None:
    exact = ExactSearch(max_chunks=10, filtered_max_chunks=20)
    assert not exact.load(scoped_chunks(21, seed=1), 21)
    assert "exact_filtered_max_chunks 20" in exact.why_not


def test_filters_in_rotation_past_the_kept_vectors_budget_still_answer_as_the_definition() -> None:
    chunks = scoped_chunks(300, seed=12)
    exact = ExactSearch(max_chunks=60, filtered_max_chunks=1000)  # keeps at most 120 gathered rows
    assert exact.load(chunks, len(chunks))
    filters = [
        (None, Principal("p", tenant=t, groups=(g,))) for t in ("t0", "t1", "t2") for g in ("g0", "g1")
    ]
    assert all(exact.covers(tag, principal) for tag, principal in filters)
    queries = np.random.default_rng(13).standard_normal((3, 8)).astype(np.float32)
    for _ in range(2):  # the second round finds some filters' vectors dropped, some kept
        for tag, principal in filters:
            got = exact.search(queries, 5, tag, principal)
            assert got is not None
            for query, hits in zip(queries, got, strict=True):
                assert [cid for cid, _ in hits] == brute_force(chunks, query, 5, tag, principal)
