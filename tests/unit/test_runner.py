"""The runner's scoring and where-lost logic, on a fake chain with a hand-made trace."""

from __future__ import annotations

from datetime import date

import pytest

from app.evaluation.golden.cases import GoldenCase, GoldenSet
from app.evaluation.run.runner import (
    NOT_IN_INDEX,
    NOT_RETRIEVED,
    RANKED_OUT,
    KnownIds,
    evaluate,
    latency_sample_indices,
)
from app.retrieval.types import Candidate, Removal, RetrievalResult, RetrievalTrace, StageTrace


def cand(chunk: str, doc: str, text: str | None = None) -> Candidate:
    return Candidate(
        chunk_id=chunk, doc_id=doc, text=text or f"text of {chunk}", metadata={"source": f"{doc}.md"}
    )


class FakeChain:
    """Candidates c1..c4 (docs A, B, C, D); `threshold` removes c3 (doc C); `diversity` removes c5, a
    second chunk of doc A; the final list is [c1, c2, c4], cut to the request's top K."""

    stage_names = ["threshold", "diversity"]

    def __init__(self) -> None:
        self.todays: list[date | None] = []
        self.calls: list[int] = []

    def retrieve_many(self, requests, today=None, on_result=None):
        self.todays.append(today)
        self.calls.append(len(requests))
        out = []
        for i, request in enumerate(requests):
            raw = [cand("c1", "A"), cand("c2", "B"), cand("c3", "C"), cand("c4", "D"), cand("c5", "A")]
            trace = RetrievalTrace(
                stages=[
                    StageTrace("threshold", 5, 4, [Removal("c3", "C", "dense=0.10 < 0.30")], [], 1.0),
                    StageTrace("diversity", 4, 3, [Removal("c5", "A", "max_per_document=1")], [], 1.0),
                ],
                ranked_after={
                    "candidates": ["c1", "c2", "c3", "c4", "c5"],
                    "threshold": ["c1", "c2", "c4", "c5"],
                    "diversity": ["c1", "c2", "c4"],
                },
            )
            final = [raw[0], raw[1], raw[3]]
            result = RetrievalResult(request.query, final[: request.top_k], 5, False, trace, 3.0, raw)
            out.append(result)
            if on_result:
                on_result(i, result)
        return out


def golden(**fields) -> GoldenSet:
    case = GoldenCase.model_validate({"id": "q1", "query": "where is A", **fields})
    return GoldenSet(dataset_version="t", cases=[case], path="golden.json")


KNOWN = KnownIds(doc={"A", "B", "C", "D", "F"}, chunk={"c1", "c2", "c3", "c4", "c5"}, source=set())


def test_scoring_counts_and_where_each_missing_id_was_lost() -> None:
    chain = FakeChain()
    ev = evaluate(
        chain,
        golden(expectedDocIds=["A", "B", "C", "E", "F"], topK=1),
        5,
        KNOWN,
        today=date(2030, 1, 2),
        k_values=[3],
    )
    (c,) = ev.cases
    assert chain.todays == [date(2030, 1, 2)]  # the as-of date reaches the hard filter's clock
    assert ev.as_of == date(2030, 1, 2)
    assert c.metrics is not None
    assert c.metrics["recall"] == pytest.approx(1 / 5)
    assert c.metrics["hitRate"] == 1.0
    assert c.counts == {"expectedCount": 5, "hitCount": 1, "firstHitRank": 1}
    # the same ranking cut at 3: A, B, D -> 2 of 5 relevant; nDCG = (1 + 1/log2(3)) / IDCG@3
    assert c.at_k[3]["recall"] == pytest.approx(2 / 5)
    lost = {x.id: (x.where, x.reason) for x in c.lost}
    assert lost == {
        "B": (RANKED_OUT, "survived every stage but ranked below K=1"),
        "C": ("REMOVED_BY_threshold", "dense=0.10 < 0.30"),
        "E": (NOT_IN_INDEX, "not in the index"),
        "F": (NOT_RETRIEVED, "not among the vector or BM25 candidates"),
    }
    threshold, diversity = c.stage_stats
    assert (threshold.removed, threshold.removed_relevant) == (1, 1)
    # diversity dropped a second chunk of A while A stays: no relevant id lost
    assert (diversity.removed, diversity.removed_relevant, diversity.removed_relevant_chunks) == (1, 0, 1)
    assert diversity.removed_items[0].relevant and diversity.removed_items[0].reason == "max_per_document=1"
    assert c.after_stage["candidates"]["recall"] == pytest.approx(1 / 5)  # cut at K=1: c1 (A)
    assert ev.warnings == [
        "case q1: expected doc id(s) not in the index: E (stale golden set after re-chunking or re-ingest?)"
    ]
    assert ev.k_mixed  # the case's topK 1 differs from the default 5


def test_forbidden_documents_in_the_top_k_are_found() -> None:
    ev = evaluate(FakeChain(), golden(expectedDocIds=["B"], forbiddenDocIds=["A", "D"], topK=2), 5, KNOWN)
    (c,) = ev.cases
    assert c.forbidden_found == ["A"]  # D is at rank 3, outside the top 2
    assert ev.cases[0].k == 2


def test_a_case_whose_retrieval_raises_is_a_failed_case() -> None:
    class Broken(FakeChain):
        def retrieve_many(self, requests, today=None, on_result=None):
            raise RuntimeError("store down")

    ev = evaluate(Broken(), golden(expectedDocIds=["A"]), 5, KNOWN)
    assert ev.cases[0].status == "failed"
    assert ev.cases[0].error == "RuntimeError: store down"


def test_single_query_latency_is_measured_on_the_sample() -> None:
    chain = FakeChain()
    ev = evaluate(chain, golden(expectedDocIds=["A"]), 5, KNOWN, latency_sample=1)
    assert chain.calls == [1, 1]  # the batch, then one single-query call
    assert ev.cases[0].single_latency_ms is not None


@pytest.mark.parametrize(
    ("total", "sample", "expected"),
    [(10, 0, []), (10, 4, [0, 10 // 4, 2 * 10 // 4, 3 * 10 // 4]), (3, 20, [0, 1, 2]), (0, 5, [])],
)
def test_latency_sample_indices_spread_evenly(total, sample, expected) -> None:
    assert latency_sample_indices(total, sample) == expected
