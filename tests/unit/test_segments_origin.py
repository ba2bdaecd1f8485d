"""Segments by origin and literalness band, and the generated-vs-manual comparison of a report."""

from __future__ import annotations

import pytest

from app.evaluation.render.lines import origin_line
from app.evaluation.report.model import CaseRecord
from app.evaluation.run.segments import origin_comparison, segments


def case(cid, ndcg=1.0, origin=None, literalness=None, scored=True, query="pay day"):
    record = {
        "id": cid,
        "topK": 5,
        "tags": [],
        "knowledgeTag": None,
        "query": query,
        "metrics": (
            {
                "recall": ndcg,
                "hitRate": ndcg,
                "mrr": ndcg,
                "ndcg": ndcg,
                "precision": ndcg,
                "top1Accuracy": ndcg,
            }
            if scored
            else None
        ),
        "rankedDocuments": [],
    }
    if origin is not None:
        record["origin"] = origin
    if literalness is not None:
        record["literalness"] = literalness
    return CaseRecord.model_validate(record)


CASES = [
    case("m1", 1.0, "manual"),
    case("m2", 0.5),  # no origin: manual
    case("m3", scored=False, origin="manual"),  # a no-answer case: counted, not averaged
    case("g1", 1.0, "generated", literalness=0.2),
    case("g2", 1.0, "generated", literalness=1 / 3),
    case("g3", 0.8, "generated", literalness=2 / 3),
    case("l1", 0.0, "log"),
]


def test_origin_and_literalness_segments_in_reading_order() -> None:
    segs = [(s.kind, s.name, s.cases) for s in segments(CASES) if s.kind in ("origin", "literalness")]
    assert segs == [
        ("origin", "manual", 3),
        ("origin", "generated", 3),
        ("origin", "log", 1),
        # 0.2 < 1/3: low; 1/3: mid; 2/3: high; cases without literalness are in no band
        ("literalness", "low", 1),
        ("literalness", "mid", 1),
        ("literalness", "high", 1),
    ]
    by = {(s.kind, s.name): s for s in segments(CASES)}
    assert by[("origin", "manual")].metrics["ndcg"] == pytest.approx((1.0 + 0.5) / 2)
    assert by[("origin", "generated")].metrics["ndcg"] == pytest.approx((1.0 + 1.0 + 0.8) / 3)
    assert by[("literalness", "high")].metrics["ndcg"] == 0.8


def test_generated_vs_manual() -> None:
    comparison = origin_comparison(CASES)
    origins = comparison.to_json()
    assert origins["byOrigin"] == {
        "manual": {"cases": 3, "scored": 2, "ndcg": pytest.approx((1.0 + 0.5) / 2)},
        "generated": {"cases": 3, "scored": 3, "ndcg": pytest.approx((1.0 + 1.0 + 0.8) / 3)},
        "log": {"cases": 1, "scored": 1, "ndcg": 0.0},
    }
    versus = origins["generatedVsManual"]
    assert versus["delta"] == pytest.approx((1.0 + 1.0 + 0.8) / 3 - (1.0 + 0.5) / 2)
    assert (versus["metric"], versus["generatedCases"], versus["manualCases"]) == ("ndcg", 3, 2)
    # 0.9333 - 0.75 = +0.183
    assert (
        origin_line(comparison) == "generated vs manual: nDCG +0.183 (0.933 vs 0.750, n=3 vs 2 scored cases)"
    )


def test_no_comparison_without_scored_cases_on_both_sides() -> None:
    only_manual = origin_comparison([case("m1"), case("m2")])
    assert only_manual.to_json()["generatedVsManual"] is None and origin_line(only_manual) is None
    unscored = origin_comparison([case("m1"), case("g1", origin="generated", scored=False)]).to_json()
    assert unscored["byOrigin"]["generated"] == {"cases": 1, "scored": 0, "ndcg": None}
    assert unscored["generatedVsManual"] is None
    assert origin_line(None) is None
