"""The report's typed records through the one serialiser: the per-case fields and the summary a reader sees,
on the runner's fake chain (tests/unit/test_runner.py)."""

from __future__ import annotations

from datetime import date

import pytest

from app.evaluation.report.model import CaseRecord, Summary, to_json
from app.evaluation.run.build import build_report, case_record, summary_record
from app.evaluation.run.runner import evaluate
from tests.unit.test_runner import KNOWN, FakeChain, golden


def one_case(**fields):
    ev = evaluate(FakeChain(), golden(**fields), 3, KNOWN, today=date(2030, 1, 2), k_values=[1, 3])
    return ev, ev.cases[0]


def test_a_case_record_carries_its_counts_and_ranked_documents_with_snippets() -> None:
    ev, c = one_case(expectedDocIds=["B", "C"], forbiddenDocIds=["D"])
    record = case_record(c)
    assert isinstance(record, CaseRecord)
    view = to_json(record)
    # final list [c1 (A), c2 (B), c4 (D)] at K=3: B is the one hit, at rank 2; C was removed by the threshold
    assert {
        k: view[k] for k in ("expectedCount", "hitCount", "firstHitRank", "originalCount", "finalCount")
    } == {
        "expectedCount": 2,
        "hitCount": 1,
        "firstHitRank": 2,
        "originalCount": 5,
        "finalCount": 3,
    }
    assert view["fallbackUsed"] is False
    assert [(d["rank"], d["docId"], d["matched"], d["reason"]) for d in view["rankedDocuments"]] == [
        (1, "A", False, "unjudged"),
        (2, "B", True, "relevant (grade 1)"),
        (3, "D", False, "FORBIDDEN"),
    ]
    # judged: B and C (expected) and D (forbidden); A is the one unjudged id of the top 3
    assert view["judged"] == pytest.approx(2 / 3)
    assert view["unjudged"] == ["A"]
    assert view["rankedDocuments"][1]["snippet"] == "text of c2"
    assert view["forbiddenFound"] == ["D"]
    assert view["lost"] == [
        {"id": "C", "where": "REMOVED_BY_threshold", "stage": "threshold", "reason": "dense=0.10 < 0.30"}
    ]
    assert view["metrics"]["recall"] == pytest.approx(1 / 2)
    assert set(view["atK"]) == {"1", "3"}


def test_the_report_json_is_the_records_serialised() -> None:
    ev, c = one_case(expectedDocIds=["A"])
    report = build_report(ev, {"evaluatedAt": "2030-01-02T00:00:00+00:00"})
    assert report["cases"] == [to_json(case_record(c))]
    summary = summary_record(ev)
    assert isinstance(summary, Summary)
    assert report["summary"] == to_json(summary)
    assert report["summary"]["counts"] == {
        "scoredCases": 1,
        "hits": 1,
        "relevantFound": 1,
        "relevantTotal": 1,
    }
    assert report["summary"]["hitRate"] == 1.0 and report["summary"]["top1Accuracy"] == 1.0
