"""Adding a measure is one registry entry: a measure registered in one place (`measures.registered`) is
computed per case and shows in the summary, the comparison, the Markdown and the JSON of a report built from
fake cases; once the block ends it is gone again."""

from __future__ import annotations

from datetime import date

import pytest

from app.evaluation.compare.comparison import compare_reports
from app.evaluation.golden.cases import GoldenCase, GoldenSet
from app.evaluation.render.markdown import render_markdown
from app.evaluation.report.model import Report
from app.evaluation.run.build import measure_report
from app.evaluation.run.runner import KnownIds, evaluate
from app.evaluation.scoring import measures, metrics
from app.evaluation.scoring.measures import Measure, Ranking
from app.retrieval.types import Candidate, RetrievalResult, RetrievalTrace


def half_recall(r: Ranking) -> float:
    """A made-up measure: half the case's Recall@K."""
    return 0.5 * metrics.best_alternative(metrics.recall_at_k, r.ranks, r.relevance, r.k)


HALF_RECALL = Measure(
    "halfRecall",
    "HalfRecall",
    None,
    True,
    3,
    "higher",
    "Recall@K / 2",
    score=half_recall,
    roles=frozenset({"headline", "compared"}),
)

# query -> the documents the chain returns, best first; every case expects document B
BEFORE = {"q1": ["A", "B", "C"], "q2": ["A", "C", "D"], "q3": ["B", "A", "C"]}
AFTER = {"q1": ["B", "A", "C"], "q2": ["B", "C", "D"], "q3": ["A", "C", "D"]}
KNOWN = KnownIds(doc={"A", "B", "C", "D"}, chunk={"cA", "cB", "cC", "cD"}, source=set())


class ListChain:
    """Returns, for each query, the documents `finals` names (one chunk each), with no stage."""

    stage_names: list[str] = []

    def __init__(self, finals: dict[str, list[str]]) -> None:
        self.finals = finals

    def retrieve_many(self, requests, today=None, on_result=None):
        out = []
        for i, request in enumerate(requests):
            docs = [
                Candidate(chunk_id=f"c{d}", doc_id=d, text=f"text of {d}", metadata={})
                for d in self.finals[request.query]
            ]
            trace = RetrievalTrace(ranked_after={"candidates": [d.chunk_id for d in docs]})
            result = RetrievalResult(request.query, docs[: request.top_k], len(docs), False, trace, 1.0, docs)
            out.append(result)
            if on_result:
                on_result(i, result)
        return out


def report_of(finals: dict[str, list[str]], baseline: Report | None = None) -> Report:
    golden = GoldenSet(
        dataset_version="t",
        cases=[
            GoldenCase.model_validate({"id": query, "query": query, "expectedDocIds": ["B"]})
            for query in finals
        ],
        path="golden.json",
    )
    evaluation = evaluate(ListChain(finals), golden, 3, KNOWN, today=date(2030, 1, 2))
    return measure_report(evaluation, {"evaluatedAt": "2030-01-02T00:00:00+00:00"}, baseline)


def test_a_measure_registered_once_is_in_the_summary_the_comparison_the_markdown_and_the_json() -> None:
    with measures.registered(HALF_RECALL):
        before = report_of(BEFORE)
        after = report_of(AFTER, baseline=before)
        comparison = compare_reports(before, after, "baseline.json")
        report = after.model_copy(update={"comparison": comparison})
        markdown = render_markdown(report, case_detail=True)
        view = report.to_json()

    # per case: Recall@3 is 1 where B is in the top 3, else 0
    assert [c["metrics"]["halfRecall"] for c in view["cases"]] == [0.5, 0.5, 0.0]
    assert view["summary"]["halfRecall"] == pytest.approx((0.5 + 0.5 + 0.0) / 3)
    assert report.summary is not None and report.summary.figure("halfRecall") == pytest.approx(1 / 3)
    # before: q1 and q3 found B, q2 did not
    row = view["comparison"]["metrics"]["halfRecall"]
    assert (row["baseline"], row["current"]) == (pytest.approx(1 / 3), pytest.approx(1 / 3))
    assert row["delta"] == pytest.approx(((0.5 - 0.5) + (0.5 - 0.0) + (0.0 - 0.5)) / 3)
    assert "| HalfRecall@3 | 0.333 |" in markdown
    assert "| HalfRecall@3 | 0.333 | 0.333 | +0.000 |" in markdown
    assert [(s["kind"], s["metrics"]["halfRecall"]) for s in view["segments"]] == [
        ("language", pytest.approx(1 / 3)),
        ("origin", pytest.approx(1 / 3)),
    ]


def test_the_registration_ends_with_its_block() -> None:
    with measures.registered(HALF_RECALL):
        assert measures.HEADLINE[-1] == measures.COMPARED[-1] == "halfRecall"
        with pytest.raises(ValueError, match="registered already"):
            with measures.registered(HALF_RECALL):
                pass
    assert "halfRecall" not in measures.BY_KEY
    assert "halfRecall" not in (*measures.HEADLINE, *measures.COMPARED)
    assert "halfRecall" not in report_of(BEFORE).to_json()["summary"]
