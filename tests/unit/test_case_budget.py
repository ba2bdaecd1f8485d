"""What one case's answer cost (`build.case_budget`): context characters with attached chunks, candidates
before the stages, model calls = the query embedding plus every cross-encoder pair."""

from __future__ import annotations

from app.evaluation.golden.cases import GoldenCase
from app.evaluation.run.build import case_budget
from app.evaluation.run.runner import CaseResult
from app.retrieval.types import Candidate, RetrievalResult, RetrievalTrace, StageTrace


def test_the_budget_of_one_case_is_its_definition() -> None:
    attached = Candidate("c2", "d1", "x" * 40)
    first = Candidate("c1", "d1", "x" * 100).with_attached((attached,))
    second = Candidate("c3", "d2", "y" * 7)
    trace = RetrievalTrace(
        stages=[
            StageTrace("bm25", 30, 30, [], [], 1.0),
            StageTrace("rerank", 30, 30, [], [], 5.0, model_inputs=20),
        ]
    )
    result = RetrievalResult(
        "q", [first, second], original_count=30, fallback_used=False, trace=trace, latency_ms=9.0
    )
    item = CaseResult(
        GoldenCase.model_validate({"id": "a", "query": "q", "expectedDocIds": ["d1"]}), 5, "doc", {}
    )
    item.result = result
    budget = case_budget(item)
    assert budget is not None
    assert (budget.context_chars, budget.candidates, budget.model_calls) == (100 + 40 + 7, 30, 1 + 20)
    item.result = None
    assert case_budget(item) is None
