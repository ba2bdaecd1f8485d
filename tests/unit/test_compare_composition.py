"""What the comparison says beyond the paired statistics: removed and added cases with their figures, the
share of the change they explain, the core and incremental sets apart, the budget, segments with Holm over
segments, and breaks that come from relabelling."""

from __future__ import annotations

from statistics import fmean

import pytest

from app.evaluation.compare.comparison import compare_reports
from app.evaluation.report.model import Report
from app.evaluation.scoring.stats import holm, sign_flip_p_value


def figures(ndcg: float, hit: float = 1.0) -> dict:
    return {
        "recall": hit,
        "hitRate": hit,
        "mrr": ndcg,
        "ndcg": ndcg,
        "precision": hit / 5,
        "top1Accuracy": hit,
    }


def report(cases: dict[str, dict], retired: list | None = None, summary: dict | None = None) -> Report:
    """A report of `cases` ({id: {"ndcg", "hit", "set", "tags", "expected", "matched"}})."""
    records = []
    for case_id, c in cases.items():
        matched = c.get("matched", "doc-" + case_id)
        records.append(
            {
                "id": case_id,
                "query": f"q {case_id}",
                "topK": 5,
                "matchOn": "doc",
                "set": c.get("set", "core"),
                "tags": c.get("tags", []),
                "risk": c.get("risk"),
                "expected": c.get("expected", {"doc-" + case_id: 1.0}),
                "metrics": figures(c["ndcg"], c.get("hit", 1.0)),
                "rankedDocuments": [{"docId": matched, "matched": c.get("hit", 1.0) == 1.0}],
            }
        )
    scored = [c["ndcg"] for c in cases.values()]
    return Report.model_validate(
        {
            "run": {"k": 5, "evaluatedAt": "2026-12-01T00:00:00+00:00", "retired": retired or []},
            "summary": summary
            or {"ndcg": fmean(scored), "recall": 1.0, "hitRate": 1.0, "mrr": fmean(scored)},
            "cases": records,
        }
    )


def test_removed_and_added_cases_and_what_they_explain() -> None:
    base = report({"a": {"ndcg": 1.0}, "b": {"ndcg": 0.8}, "hard": {"ndcg": 0.2}, "gone": {"ndcg": 1.0}})
    now = report(
        {"a": {"ndcg": 1.0}, "b": {"ndcg": 0.6}, "new": {"ndcg": 1.0}},
        retired=[{"id": "gone", "reason": "the policy was withdrawn"}],
    )
    comp = compare_reports(base, now, "b.json")
    removed = {c.id: c for c in comp.removed_cases}
    assert (removed["hard"].hard, removed["hard"].failed, removed["hard"].retired_reason) == (
        True,
        False,
        None,
    )
    assert (removed["gone"].hard, removed["gone"].retired_reason) == (False, "the policy was withdrawn")
    assert removed["hard"].metrics["ndcg"] == 0.2
    assert [c.id for c in comp.added_cases] == ["new"]
    row = comp.composition["ndcg"]
    all_before, all_now = (1.0 + 0.8 + 0.2 + 1.0) / 4, (1.0 + 0.6 + 1.0) / 3
    common_before, common_now = (1.0 + 0.8) / 2, (1.0 + 0.6) / 2
    assert (row.baseline_all, row.current_all) == (pytest.approx(all_before), pytest.approx(all_now))
    assert (row.baseline_common, row.current_common) == (
        pytest.approx(common_before),
        pytest.approx(common_now),
    )
    assert row.composition == pytest.approx((all_now - all_before) - (common_now - common_before))


def test_the_core_and_incremental_sets_are_compared_apart() -> None:
    base = report({"c1": {"ndcg": 1.0}, "c2": {"ndcg": 1.0}, "i1": {"ndcg": 1.0, "set": "incremental"}})
    now = report({"c1": {"ndcg": 1.0}, "c2": {"ndcg": 0.5}, "i1": {"ndcg": 0.0, "set": "incremental"}})
    comp = compare_reports(base, now, "b.json")
    assert set(comp.by_set) == {"core", "incremental"}
    assert comp.by_set["core"]["ndcg"].delta == pytest.approx(((1.0 - 1.0) + (0.5 - 1.0)) / 2)
    assert comp.by_set["incremental"]["ndcg"].delta == pytest.approx(0.0 - 1.0)
    one_part = compare_reports(base, base, "b.json")
    assert compare_reports(report({"a": {"ndcg": 1.0}}), report({"a": {"ndcg": 1.0}}), "b").by_set == {}
    assert one_part.by_set["core"]["ndcg"].delta == 0.0


def test_segments_are_tested_from_ten_cases_with_holm_over_segments() -> None:
    tags = {f"r{i}": {"tags": ["refund"]} for i in range(10)} | {
        f"v{i}": {"tags": ["invoice"]} for i in range(3)
    }
    base = report({i: {"ndcg": 1.0, **c} for i, c in tags.items()})
    now = report({i: {"ndcg": 0.5 if i.startswith("r") else 1.0, **c} for i, c in tags.items()})
    comp = compare_reports(base, now, "b.json")
    rows = {(r.name, r.metric): r for r in comp.segments}
    refund, invoice = rows[("refund", "ndcg")], rows[("invoice", "ndcg")]
    assert refund.delta == pytest.approx(-0.5) and refund.paired_cases == 10
    assert refund.p_value == sign_flip_p_value([-0.5] * 10)  # exact: 2 of 2^10 sign patterns
    assert invoice.p_holm is None, "a segment under 10 cases is shown, not tested"
    tested = [r for r in comp.segments if r.metric == "ndcg" and r.p_holm is not None]
    assert [r.p_holm for r in tested] == holm([r.p_value for r in tested])
    assert refund.significant is (refund.p_holm < 0.05)


def test_a_break_that_comes_from_relabelling_is_named() -> None:
    base = report({"a": {"ndcg": 1.0}, "b": {"ndcg": 1.0}})
    # a: the document that answered it is no longer judged relevant; b: the chain lost it
    now = report(
        {
            "a": {"ndcg": 0.0, "hit": 0.0, "expected": {"doc-a": 0.0, "doc-a2": 1.0}, "matched": "doc-a"},
            "b": {"ndcg": 0.0, "hit": 0.0, "matched": "other"},
        }
    )
    comp = compare_reports(base, now, "b.json")
    assert comp.cases.broken == ["a", "b"]
    assert comp.cases.broken_by_relabelling == ["a"]


def test_the_budget_sits_beside_the_quality() -> None:
    summary = {
        "ndcg": 1.0,
        "latencyMs": {"p95": 20.0},
        "duplicateRate": 0.0,
        "budget": {"contextChars": 900.0, "candidates": 50.0, "modelCalls": 1.0},
    }
    later = {
        **summary,
        "latencyMs": {"p95": 30.0},
        "budget": {"contextChars": 1200.0, "candidates": 50.0, "modelCalls": 21.0},
    }
    comp = compare_reports(
        report({"a": {"ndcg": 1.0}}, summary=summary), report({"a": {"ndcg": 1.0}}, summary=later), "b"
    )
    assert {k: (v.baseline, v.current) for k, v in comp.budget.items()} == {
        "p95Ms": (20.0, 30.0),
        "duplicateRate": (0.0, 0.0),
        "contextChars": (900.0, 1200.0),
        "candidates": (50.0, 50.0),
        "modelCalls": (1.0, 21.0),
    }
