"""What the candidate generator computes once per candidate set so that no stage recomputes it: each
candidate's unit vector (bit for bit `unit_vector`) and its nearest cosine in its set, and the diversity
stage's use of that bound (it may skip only cosines that cannot decide anything)."""

from __future__ import annotations

import math
import threading

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from app.retrieval.candidates import _geometry
from app.retrieval.stages.diversity import DiversityStage
from app.retrieval.types import (
    Candidate,
    QueryContext,
    cosine_slack,
    nearest_slack,
    unit_rows,
    unit_vector,
)
from app.settings import DiversitySettings
from app.store.types import unit_of

finite = st.floats(-1, 1, allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=200, deadline=None)
@given(arrays(np.float32, st.tuples(st.integers(1, 12), st.integers(1, 40)), elements=finite))
def test_unit_rows_is_unit_vector_bit_for_bit(matrix: np.ndarray) -> None:
    rows = unit_rows(matrix)
    for row, vector in zip(rows, matrix, strict=True):
        expected = unit_vector(vector)
        if expected is None:  # no length: unit_rows marks it NaN
            assert np.isnan(row).all()
        else:
            assert row.dtype == np.float64 and row.tobytes() == expected.tobytes()


@settings(max_examples=200, deadline=None)
@given(arrays(np.float32, st.tuples(st.integers(1, 12), st.integers(1, 40)), elements=finite))
def test_geometry_with_the_chunk_caches_units_gives_the_same_units_and_bounds(matrix: np.ndarray) -> None:
    vectors = list(matrix)
    every = [unit_of(v) for v in vectors]  # what the store's chunk cache keeps (StoredChunk.unit)
    for v, unit in zip(vectors, every, strict=True):
        expected = unit_vector(v)
        assert unit is None or (expected is not None and unit.tobytes() == expected.tobytes())
    units, nearest = _geometry(vectors)
    for known in (every, [None, *every[1:]]):  # all known, and one not known (computed)
        given_units, given_nearest = _geometry(vectors, known)
        assert given_nearest == nearest
        for a, b in zip(units, given_units, strict=True):
            assert (a is None) == (b is None) and (a is None or a.tobytes() == b.tobytes())  # type: ignore[union-attr]


def test_a_candidate_without_a_given_unit_vector_gets_unit_vector_of_its_embedding() -> None:
    c = Candidate("c", "d", "t", embedding=np.array([0.0, 3.0, 4.0], dtype=np.float32))
    assert c.unit is not None and c.unit.tolist() == [0.0, 3.0 / 5.0, 4.0 / 5.0]
    assert Candidate("z", "d", "t", embedding=np.zeros(3)).unit is None
    assert Candidate("n", "d", "t").unit is None and Candidate("n", "d", "t").nearest is None


def test_with_scores_is_a_copy_that_shares_everything_but_its_scores() -> None:
    c = Candidate("c", "d", "text", {"source": "s"}, np.ones(2, dtype=np.float32), {"dense": 0.5})
    copy = c.with_scores({**c.scores, "bm25": 2.0})
    assert copy is not c and copy.scores == {"dense": 0.5, "bm25": 2.0} and c.scores == {"dense": 0.5}
    assert (copy.chunk_id, copy.doc_id, copy.text, copy.origin) == (c.chunk_id, c.doc_id, c.text, c.origin)
    assert copy.metadata is c.metadata and copy.embedding is c.embedding and copy.unit is c.unit


def test_geometry_gives_each_vector_its_largest_cosine_with_another() -> None:
    a, b, c = [1.0, 0.0], [0.6, 0.8], [0.0, 2.0]  # cos(a,b) = 0.6, cos(b,c) = 0.8, cos(a,c) = 0
    units, nearest = _geometry([np.array(a), np.array(b), None, np.array(c)])
    assert units[2] is None and nearest[2] is None
    assert units[3] is not None and units[3].tolist() == [0.0, 1.0]
    # a float32 product: within nearest_slack of the cosine, and a float32 value
    for i, expected in ((0, 0.6), (1, 0.8), (3, 0.8)):
        value = nearest[i]
        assert value is not None and abs(value - expected) <= nearest_slack(2)
        assert float(np.float32(value)) == value


def test_geometry_of_a_lone_vector_and_of_mixed_lengths() -> None:
    assert _geometry([np.array([1.0, 1.0])])[1] == [-math.inf]  # no other candidate to come near
    units, nearest = _geometry([np.array([1.0, 0.0]), np.array([1.0, 0.0, 0.0])])
    assert nearest == [None, None]  # no bound: diversity computes every cosine exactly
    assert [u.tolist() for u in units] == [[1.0, 0.0], [1.0, 0.0, 0.0]]  # type: ignore[union-attr]


def test_cosine_slack_covers_two_roundings_of_a_dot_product() -> None:
    assert cosine_slack(384) == 1e-9  # the floor: 4 * 384 * 2**-53 is about 1.7e-13
    assert cosine_slack(10**8) == 4 * 10**8 * 2.0**-53


def test_nearest_slack_is_the_float32_bound_and_the_float64_one() -> None:
    u = 2.0**-24
    gamma = 384 * u / (1 - 384 * u)
    assert nearest_slack(384) == 2 * ((2 * u + u * u) + gamma * (1 + u) ** 2) + 1e-9  # about 4.6e-5
    assert nearest_slack(2**23) == math.inf  # d·u = 1/2: no bound, every cosine is computed


@settings(max_examples=60, deadline=None)
@given(arrays(np.float32, st.tuples(st.integers(2, 30), st.sampled_from([3, 64, 384])), elements=finite))
def test_nearest_is_within_its_slack_of_the_float64_largest_cosine(matrix: np.ndarray) -> None:
    units, nearest = _geometry(list(matrix))
    rows = [i for i, u in enumerate(units) if u is not None and np.isfinite(u).all()]
    for i in rows:
        others = [float(units[j] @ units[i]) for j in rows if j != i]  # type: ignore[operator]
        if nearest[i] is None or not others:
            continue
        assert abs(nearest[i] - max(others)) <= nearest_slack(matrix.shape[1])  # type: ignore[operator]


# -- diversity with the bound: the same removals, the same reasons ------------------------------------


def _with_bounds(vectors: list[list[float] | None], texts: list[str] | None = None) -> list[Candidate]:
    """Candidates as the generator makes them: unit vectors and nearest cosines from one `_geometry`."""
    arrays_ = [None if v is None else np.asarray(v, dtype=np.float32) for v in vectors]
    units, nearest = _geometry(arrays_)
    return [
        Candidate(
            f"c{i}",
            f"doc{i}",
            texts[i] if texts else f"text {i}",
            {},
            arrays_[i],
            {"dense": 1.0 - i / 100},
            unit=units[i],
            nearest=nearest[i],
        )
        for i in range(len(vectors))
    ]


def _without_bounds(candidates: list[Candidate]) -> list[Candidate]:
    return [
        Candidate(c.chunk_id, c.doc_id, c.text, c.metadata, c.embedding, dict(c.scores), c.origin, c.unit)
        for c in candidates
    ]


def _outcome(stage: DiversityStage, candidates: list[Candidate]) -> tuple[list[str], list[tuple[str, str]]]:
    out = stage.run(QueryContext("q"), candidates)
    return [c.chunk_id for c in out.kept], [(r.chunk_id, r.reason) for r in out.removed]


def _exact_cosine(a: list[float], b: list[float]) -> float:
    ua, ub = unit_vector(np.asarray(a, dtype=np.float32)), unit_vector(np.asarray(b, dtype=np.float32))
    return float((np.stack([ua]) @ ub)[0])  # type: ignore[list-item]  # as the stage computes it


def test_a_cosine_exactly_at_max_cosine_is_kept_and_one_ulp_below_it_is_removed() -> None:
    vectors = [[1.0, 0.0], [0.6, 0.8], [0.0, -1.0]]  # c2 is far from both
    at = _exact_cosine(vectors[0], vectors[1])  # 0.6 up to the float32 rounding of 0.6 and 0.8
    for max_cosine, removed in ((at, []), (math.nextafter(at, -1), ["c1"])):
        stage = DiversityStage(DiversitySettings(max_cosine=max_cosine, max_per_document=None))
        kept, reasons = _outcome(stage, _with_bounds(vectors))
        assert (kept, reasons) == _outcome(stage, _without_bounds(_with_bounds(vectors)))
        assert [i for i, _ in reasons] == removed
        assert all(r.startswith("cosine=") and r.endswith(" with c0") for _, r in reasons)


def test_the_reason_of_a_near_duplicate_reads_as_before() -> None:
    stage = DiversityStage(DiversitySettings(max_cosine=0.97))
    close = [0.99, math.sqrt(1 - 0.99**2)]
    candidates = _with_bounds([[1.0, 0.0], [0.0, 1.0], close, None, [0.0, 3.0]])
    kept, removed = _outcome(stage, candidates)
    assert kept == ["c0", "c1", "c3"]
    assert removed == [("c2", "cosine=0.99 > 0.97 with c0"), ("c4", "cosine=1.00 > 0.97 with c1")]


vector_lists = st.lists(
    st.one_of(
        st.none(),
        st.sampled_from([[1.0, 0.0, 0.0], [0.6, 0.8, 0.0], [0.0, 1.0, 0.0], [0.999, 0.0447, 0.0]]),
        st.lists(st.floats(-1, 1, allow_nan=False, width=32), min_size=3, max_size=3),
    ),
    max_size=14,
)


@settings(max_examples=300, deadline=None)
@given(
    vectors=vector_lists,
    max_cosine=st.one_of(st.none(), st.floats(-1, 1), st.sampled_from([0.6, 0.97, 0.999, 1.0])),
    mmr=st.booleans(),
    texts=st.lists(st.sampled_from(["same", "Same ", "other", "x"]), min_size=14, max_size=14),
)
def test_diversity_with_the_bound_equals_diversity_without_it(vectors, max_cosine, mmr, texts) -> None:
    stage = DiversityStage(DiversitySettings(max_cosine=max_cosine, max_per_document=None, mmr=mmr))
    bounded = _with_bounds(vectors, texts[: len(vectors)])
    kept, removed = _outcome(stage, bounded)
    assert (kept, removed) == _outcome(stage, _without_bounds(bounded))
    # a stage never invents or loses a candidate
    assert sorted(kept + [i for i, _ in removed]) == sorted(c.chunk_id for c in bounded)


def _numpys_blas_threads() -> dict[str, int]:
    """Thread count of each BLAS library that numpy's wheel carries (the one `one_thread` controls)."""
    from threadpoolctl import threadpool_info

    return {
        i["filepath"]: i["num_threads"]
        for i in threadpool_info()
        if i["user_api"] == "blas" and "numpy" in i["filepath"]
    }


def test_one_thread_limits_numpys_blas_inside_and_restores_it_after() -> None:
    from app.retrieval.blas import one_thread

    before = _numpys_blas_threads()
    assert before  # numpy's wheel carries its OpenBLAS here
    with one_thread():
        assert _numpys_blas_threads() == dict.fromkeys(before, 1)
    assert _numpys_blas_threads() == before


def test_one_thread_holds_while_another_thread_owns_openblas_in_threadpoolctl() -> None:
    """threadpoolctl 3.8 ignores, without a word, the OpenBLAS settings of a thread while another living
    thread "controls" OpenBLAS (it set the count outside a `limit` block), which would make a `one_thread`
    built on threadpoolctl a no-op after the integration tests. `one_thread` sets the count itself."""
    from threadpoolctl import ThreadpoolController

    from app.retrieval.blas import one_thread

    before = _numpys_blas_threads()
    owned, release = threading.Event(), threading.Event()

    def owner() -> None:
        for library in ThreadpoolController().select(user_api="blas").lib_controllers:
            library.set_num_threads(library.get_num_threads())  # takes control, changes nothing
        owned.set()
        release.wait(10)

    thread = threading.Thread(target=owner)
    thread.start()
    try:
        assert owned.wait(10)
        with one_thread():
            assert _numpys_blas_threads() == dict.fromkeys(before, 1)
        assert _numpys_blas_threads() == before
    finally:
        release.set()
        thread.join(10)
        from threadpoolctl import OpenBLASController

        OpenBLASController.clear_controlling_thread(force=True)


@settings(max_examples=100, deadline=None)
@given(arrays(np.float32, st.tuples(st.integers(1, 12), st.integers(1, 40)), elements=finite))
def test_without_nearest_the_units_are_the_same_bits_and_no_bound_is_claimed(matrix: np.ndarray) -> None:
    vectors = list(matrix.astype(np.float32))
    units, nearest = _geometry(vectors)
    units_only, no_bounds = _geometry(vectors, with_nearest=False)
    assert no_bounds == [None] * len(vectors)  # not known: diversity computes the cosines it needs
    for a, b in zip(units, units_only, strict=True):
        assert (a is None and b is None) or (a is not None and b is not None and a.tobytes() == b.tobytes())
