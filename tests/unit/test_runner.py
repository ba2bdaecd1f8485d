"""The runner's scoring and where-lost logic, on a fake chain with a hand-made trace."""

from __future__ import annotations

from datetime import date
from math import log2

import pytest

from app.evaluation.golden.cases import GoldenCase, GoldenSet
from app.evaluation.run.build import case_record, measure_report
from app.evaluation.run.runner import (
    NOT_IN_INDEX,
    NOT_RETRIEVED,
    RANKED_OUT,
    evaluate,
    latency_sample_indices,
)
from app.evaluation.session import run_evaluation
from app.settings import EvaluateSettings
from tests.fixtures.traced_chain import KNOWN, FakeChain, cand, golden


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


def cases(*fields: dict) -> GoldenSet:
    return GoldenSet("t", [GoldenCase.model_validate({"query": "q", **f}) for f in fields], "golden.json")


class DatedChain(FakeChain):
    """As FakeChain, and document OLD (chunk c6, effectiveTo 2025-12-31) is in force until 2026: as of an
    earlier day the chain ranks it first, as a hard filter with effective dates would."""

    def retrieve_many(self, requests, today=None, on_result=None):
        results = super().retrieve_many(requests, today)
        for i, result in enumerate(results):
            if today is not None and today <= date(2025, 12, 31):
                result.documents = [cand("c6", "OLD"), *result.documents][: requests[i].top_k]
            if on_result:
                on_result(i, result)
        return results


def test_each_case_is_judged_as_of_its_own_date_in_batches_per_date() -> None:
    chain = DatedChain()
    ev = evaluate(
        chain,
        cases(
            {"id": "now", "expectedDocIds": ["A"], "forbiddenDocIds": ["OLD"]},
            {"id": "then", "expectedDocIds": ["A"], "forbiddenDocIds": ["OLD"], "asOf": "2025-06-30"},
            {"id": "then-too", "expectedDocIds": ["B"], "forbiddenDocIds": ["OLD"], "asOf": "2025-06-30"},
        ),
        3,
        KNOWN,
        today=date(2026, 6, 1),
    )
    now, then, then_too = ev.cases
    assert chain.todays == [date(2026, 6, 1), date(2025, 6, 30)]  # one batch per date
    assert chain.calls == [1, 2]
    assert (now.as_of, then.as_of, then_too.as_of) == (date(2026, 6, 1), date(2025, 6, 30), date(2025, 6, 30))
    # OLD is in force on 2025-06-30: it reaches the top K there, and is a forbidden hit
    assert now.forbidden_found == []
    assert then.forbidden_found == ["OLD"] and then_too.forbidden_found == ["OLD"]
    assert then.metrics is not None and then.metrics["mrr"] == pytest.approx(1 / 2)  # A behind OLD
    assert ev.as_of == date(2026, 6, 1)  # the run's date stays the default
    assert [case_record(c).resolved.as_of for c in ev.cases] == ["2026-06-01", "2025-06-30", "2025-06-30"]


def test_a_single_query_timing_uses_the_cases_own_date() -> None:
    chain = DatedChain()
    evaluate(
        chain,
        cases({"id": "then", "expectedDocIds": ["A"], "asOf": "2025-06-30"}),
        3,
        KNOWN,
        today=date(2026, 6, 1),
        latency_sample=1,
    )
    assert chain.todays == [date(2025, 6, 30), date(2025, 6, 30)]


def test_the_gain_reaches_every_ndcg_of_the_run() -> None:
    graded = cases({"id": "g", "relevance": {"A": 1, "B": 3}})
    ev = evaluate(FakeChain(), graded, 3, KNOWN, k_values=[3], gain="exponential")
    (c,) = ev.cases
    # top 3: A (grade 1), B (grade 3), D
    dcg = (2**1 - 1) / log2(2) + (2**3 - 1) / log2(3)
    idcg = (2**3 - 1) / log2(2) + (2**1 - 1) / log2(3)
    assert c.metrics is not None and c.metrics["ndcg"] == pytest.approx(dcg / idcg)
    assert c.at_k[3]["ndcg"] == pytest.approx(dcg / idcg)
    assert c.condensed is not None and c.condensed["ndcg"] == pytest.approx(dcg / idcg)  # A, B judged
    assert c.after_stage["diversity"]["ndcg"] == pytest.approx(dcg / idcg)
    linear = evaluate(FakeChain(), graded, 3, KNOWN).cases[0]
    assert linear.metrics is not None
    assert linear.metrics["ndcg"] == pytest.approx((1 / log2(2) + 3 / log2(3)) / (3 / log2(2) + 1 / log2(3)))
    report = measure_report(ev, {})
    assert report.run.gain == "exponential"
    assert "gain = 2^grade - 1" in (report.run.conventions or "")
    assert report.summary is not None and report.summary.ndcg == pytest.approx(dcg / idcg)


def test_run_evaluation_takes_the_gain_from_the_settings() -> None:
    graded = cases({"id": "g", "relevance": {"A": 1, "B": 3}})
    ev = run_evaluation(FakeChain(), graded, KNOWN, EvaluateSettings(gain="exponential", latency_sample=0))
    assert ev.gain == "exponential"
    assert (
        ev.cases[0].metrics
        == evaluate(FakeChain(), graded, 5, KNOWN, k_values=[1, 3, 5, 10], gain="exponential")
        .cases[0]
        .metrics
    )
