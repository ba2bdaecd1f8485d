"""The report's typed records and their model dumps: the per-case fields and the summary a reader sees, on the
runner's fake chain (tests/unit/test_runner.py), and the report file read back equal to the report written."""

from __future__ import annotations

from datetime import date

import pytest

from app.evaluation.compare.comparison import load_report
from app.evaluation.report.model import SCHEMA_VERSION, CaseRecord, Report, Summary, report_text
from app.evaluation.run.build import case_record, measure_report, summary_record
from app.evaluation.run.runner import evaluate
from tests.fixtures.traced_chain import KNOWN, FakeChain, golden


def one_case(**fields):
    ev = evaluate(FakeChain(), golden(**fields), 3, KNOWN, today=date(2030, 1, 2), k_values=[1, 3])
    return ev, ev.cases[0]


def test_a_case_record_carries_its_counts_and_ranked_documents_with_snippets() -> None:
    ev, c = one_case(expectedDocIds=["B", "C"], forbiddenDocIds=["D"])
    record = case_record(c)
    assert isinstance(record, CaseRecord)
    view = record.to_json()
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
    # the fake chain's trace records no search hits and has no bm25 or rerank stage: no ranks
    no_ranks = {"dense": None, "bm25": None, "fused": None, "rerank": None}
    assert view["lost"] == [
        {
            "id": "C",
            "where": "REMOVED_BY_threshold",
            "stage": "threshold",
            "reason": "dense=0.10 < 0.30",
            "ranks": no_ranks,
        }
    ]
    assert view["metrics"]["recall"] == pytest.approx(1 / 2)
    assert set(view["atK"]) == {"1", "3"}


def test_the_report_json_is_the_records_serialised() -> None:
    ev, c = one_case(expectedDocIds=["A"])
    typed = measure_report(ev, {"evaluatedAt": "2030-01-02T00:00:00+00:00"})
    assert isinstance(typed, Report)
    report = typed.to_json()
    assert report["schemaVersion"] == SCHEMA_VERSION == 3
    assert report["cases"] == [case_record(c).to_json()]
    summary = summary_record(ev)
    assert isinstance(summary, Summary)
    assert report["summary"] == summary.to_json()
    assert report["summary"]["counts"] == {
        "scoredCases": 1,
        "hits": 1,
        "relevantFound": 1,
        "relevantTotal": 1,
    }
    assert report["summary"]["hitRate"] == 1.0 and report["summary"]["top1Accuracy"] == 1.0


def test_a_report_written_and_read_back_is_the_same_report(tmp_path) -> None:
    ev, _ = one_case(expectedDocIds=["B", "C"], forbiddenDocIds=["D"])
    built = measure_report(ev, {"evaluatedAt": "2030-01-02T00:00:00+00:00", "collection": "kb-sample"})
    text = report_text(built)
    assert Report.model_validate_json(text) == built
    path = tmp_path / "report.json"
    path.write_text(text, encoding="utf-8")
    loaded = load_report(path)
    assert loaded == built
    # keys of the run description the model does not name are kept as they came
    assert loaded.run.model_extra == {"collection": "kb-sample"}
    assert loaded.to_json()["run"]["collection"] == "kb-sample"


def test_a_case_record_is_written_and_read_as_one_flat_object_of_its_parts() -> None:
    flat = {
        "id": "a",
        "query": "pay day",
        "topK": 3,
        "status": "ok",
        "metrics": {"ndcg": 0.5},
        "unjudged": ["x"],
        "lost": [{"id": "b", "where": "RANKED_OUT", "stage": "", "reason": ""}],
        "set": "incremental",
    }
    record = CaseRecord.model_validate(flat)
    assert (record.case.id, record.case.case_set, record.resolved.top_k) == ("a", "incremental", 3)
    assert (record.outcome.status, record.scores.metrics, record.analysis.lost[0].id) == (
        "ok",
        {"ndcg": 0.5},
        "b",
    )
    assert "unjudged" in record.scores.model_fields_set and "judged" not in record.scores.model_fields_set
    dumped = record.to_json()
    assert list(dumped)[:4] == ["id", "query", "knowledgeTag", "topK"]
    assert list(dumped)[-5:] == ["budget", "expectedContent", "asOf", "unscorable", "alternatives"]
    assert CaseRecord.model_validate(dumped) == record
