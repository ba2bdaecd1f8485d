"""The gate: levels, regressions against the baseline, safety; failures as {check, actual, limit, message}."""

from __future__ import annotations

from typing import Any

import pytest

from app.evaluation.compare.gate import GateCheck, GateResult, check_gate
from app.evaluation.report.model import (
    BaselineRef,
    CaseChanges,
    CaseDetail,
    CaseRecord,
    Comparison,
    MetricComparison,
    Report,
    RunInfo,
    Summary,
    UnjudgedAccount,
)
from app.settings import EvaluateThresholds

SUMMARY = {
    "scoredCases": 20,
    "recall": 0.9,
    "hitRate": 0.95,
    "mrr": 0.8,
    "ndcg": 0.85,
    "duplicateRate": 0.0,
    "latencyMs": {"p50": 10.0, "p95": 20.0, "max": 30.0},
    "noAnswer": {"cases": 4, "correctAbstentionRate": 0.25, "falseAnswerRate": 0.75},
    "forbidden": {"hits": 0, "cases": 0},
}


def report(
    summary: dict[str, Any] = SUMMARY,
    comparison: Comparison | None = None,
    cases: list[CaseRecord] | None = None,
) -> Report:
    """A report of `summary` (its JSON form), `comparison` and `cases`, for the gate to check."""
    return Report(
        run=RunInfo(), summary=Summary.model_validate(summary), comparison=comparison, cases=cases or []
    )


def case(case_id: str, forbidden_found: list[str]) -> CaseRecord:
    return CaseRecord(id=case_id, query="q", top_k=5, forbidden_found=forbidden_found)


def row(baseline: float, current: float, p_adj: float = 0.4, significant: bool = False) -> MetricComparison:
    return MetricComparison(
        baseline=baseline,
        current=current,
        delta=current - baseline,
        ci95=None,
        p_value=p_adj,
        p_adjusted=p_adj,
        significant=significant,
    )


def comparison(
    baseline: float, current: float, significant: bool, broken: list[str] | None = None
) -> Comparison:
    return Comparison(
        baseline=BaselineRef(path="baseline.json", evaluated_at=None, run={}),
        comparable=True,
        differences=[],
        paired_cases=10,
        metrics={"ndcg": row(baseline, current, 0.01 if significant else 0.4, significant)},
        cases=CaseChanges(broken=broken or []),
        stages=[],
    )


def test_defaults_check_forbidden_hits_with_zero_tolerance_and_the_no_answer_policy() -> None:
    result = check_gate(report(), EvaluateThresholds())
    assert [c.name for c in result.checks] == ["scored_cases", "max_forbidden_hits", "no_answer_policy"]
    assert result.passed and result.warnings == []


def test_one_forbidden_document_fails_and_names_the_case_and_document() -> None:
    summary = {**SUMMARY, "forbidden": {"hits": 1, "cases": 1}}
    cases = [case("zh-travel-001", ["travel-expense-2022"]), case("x", [])]
    result = check_gate(report(summary, cases=cases), EvaluateThresholds())
    assert not result.passed
    (failure,) = result.failures
    assert (failure.check, failure.actual, failure.limit) == ("max_forbidden_hits", 1.0, 0.0)
    assert "travel-expense-2022 in case zh-travel-001" in failure.message


@pytest.mark.parametrize(
    ("field", "limit", "passed"),
    [
        ("min_correct_abstention", 0.25, True),
        ("min_correct_abstention", 0.5, False),
        ("max_false_answer_rate", 0.75, True),
        ("max_false_answer_rate", 0.5, False),
        ("min_ndcg", 0.9, False),
        ("max_p95_ms", 20.0, True),
    ],
)
def test_level_and_no_answer_checks(field, limit, passed) -> None:
    result = check_gate(report(), EvaluateThresholds(**{field: limit}))
    check = next(c for c in result.checks if c.name == field)
    assert check.passed is passed


def test_a_missing_figure_fails_its_check() -> None:
    summary = {**SUMMARY, "noAnswer": {"cases": 0, "correctAbstentionRate": None, "falseAnswerRate": None}}
    result = check_gate(report(summary), EvaluateThresholds(min_correct_abstention=0.5))
    assert not result.passed


@pytest.mark.parametrize(
    ("baseline", "current", "significant", "requires", "status"),
    [
        (0.90, 0.80, True, True, "FAILED"),  # drop 0.10 > 0.05 and significant: fails
        (0.90, 0.80, False, True, "WARN"),  # drop beyond the limit but not significant: warns
        (0.90, 0.80, False, False, "FAILED"),  # ... fails when significance is not required
        (0.90, 0.87, True, True, "ok"),  # drop 0.03 within 0.05
        (0.80, 0.90, True, True, "ok"),  # an improvement
    ],
)
def test_regression_gate(baseline, current, significant, requires, status) -> None:
    thresholds = EvaluateThresholds(max_drop={"ndcg": 0.05}, regression_requires_significance=requires)
    result = check_gate(report(comparison=comparison(baseline, current, significant)), thresholds)
    check = next(c for c in result.checks if c.name == "max_drop.ndcg")
    assert check.status == status
    assert result.passed is (status != "FAILED")
    assert check.value == pytest.approx(baseline - current)
    if status == "FAILED":
        assert result.failures[0].check == "max_drop.ndcg"
        assert result.failures[0].limit == 0.05


def test_broken_cases_gate_names_the_cases() -> None:
    result = check_gate(
        report(comparison=comparison(0.9, 0.9, False, ["q7"])), EvaluateThresholds(max_broken_cases=0)
    )
    (failure,) = result.failures
    assert (failure.check, failure.actual, failure.limit) == ("max_broken_cases", 1.0, 0.0)
    assert "q7" in failure.message


def test_without_a_baseline_the_regression_gate_passes_and_says_why() -> None:
    thresholds = EvaluateThresholds(max_drop={"ndcg": 0.01}, max_broken_cases=0)
    result = check_gate(report(), thresholds, no_baseline_reason="first run")
    assert result.passed
    assert result.notes == ["regression gate passed without checking: no baseline (first run)"]
    different_k = comparison(0.9, 0.9, False).model_copy(
        update={"comparable": False, "metrics": {}, "cases": CaseChanges()}
    )
    not_checked = check_gate(report(comparison=different_k), thresholds, report_path="target/r.json")
    (failure,) = not_checked.failures
    assert failure.check == "not_checked" and not_checked.notes == []
    assert "sieve baseline accept target/r.json" in failure.message and "--baseline none" in failure.message


def test_an_unusable_baseline_fails_as_not_checked() -> None:
    result = check_gate(report(), EvaluateThresholds(), not_checked="p.json: metrics.ndcg must be a number")
    (failure,) = result.failures
    assert failure.check == "not_checked" and "p.json: metrics.ndcg must be a number" in failure.message


@pytest.mark.parametrize(
    ("paired", "baseline_scored", "floor", "passed"),
    [
        (10, 20, 20 // 2, True),  # half the baseline's 20 scored cases: 10 is enough
        (9, 20, 20 // 2, False),
        (10, 19, -(-19 // 2), True),  # ceil(19 / 2) = 10
        (1, 1, 1, True),  # at least 1
    ],
)
def test_fewer_paired_cases_than_the_floor_is_not_checked(paired, baseline_scored, floor, passed) -> None:
    comp = comparison(0.9, 0.9, False).model_copy(
        update={"paired_cases": paired, "baseline_scored": baseline_scored}
    )
    result = check_gate(report(comparison=comp), EvaluateThresholds())
    check = next(c for c in result.checks if c.name == "not_checked")
    assert (check.value, check.threshold, check.passed) == (paired, floor, passed)
    assert result.passed is passed


def test_nothing_scored_fails() -> None:
    summary = {**SUMMARY, "scoredCases": 0, "noAnswer": {"cases": 0}, "unscorableCaseIds": ["a", "b"]}
    result = check_gate(report(summary), EvaluateThresholds())
    (failure,) = result.failures
    assert failure.check == "scored_cases" and (failure.actual, failure.limit) == (0.0, 1.0)
    assert "unscorable: a, b" in failure.message


def test_gate_json_has_failures_with_check_actual_limit_message() -> None:
    result = check_gate(report(), EvaluateThresholds(min_recall=0.95))
    out = result.to_json()
    assert out["passed"] is False
    assert out["failures"] == [
        {
            "check": "min_recall",
            "actual": 0.9,
            "limit": 0.95,
            "message": "min_recall: recall=0.9000, needs >= 0.95",
        }
    ]


def no_answer(cases: int, abstained: int) -> dict:
    rate = abstained / cases if cases else None
    return {
        **SUMMARY,
        "noAnswer": {
            "cases": cases,
            "correctAbstentionRate": rate,
            "falseAnswerRate": None if rate is None else 1 - rate,
        },
    }


@pytest.mark.parametrize(
    ("policy", "cases", "abstained", "passed", "warned", "failed"),
    [
        ("warn", 4, 0, True, True, False),  # 0 of 4: a warning, the gate passes
        ("fail", 4, 0, False, False, True),  # 0 of 4: the gate fails
        ("off", 4, 0, True, False, False),  # not checked
        ("warn", 4, 1, True, False, False),  # 1 of 4 abstained: holds
        ("fail", 4, 1, True, False, False),
        ("fail", 0, 0, True, False, False),  # no no-answer cases: nothing to check
    ],
)
def test_no_answer_policy(policy, cases, abstained, passed, warned, failed) -> None:
    result = check_gate(report(no_answer(cases, abstained)), EvaluateThresholds(no_answer_policy=policy))
    assert result.passed is passed
    assert [w.check for w in result.warnings] == (["no_answer_policy"] if warned else [])
    assert [f.check for f in result.failures] == (["no_answer_policy"] if failed else [])
    checked = [c for c in result.checks if c.name == "no_answer_policy"]
    assert len(checked) == (0 if policy == "off" or cases == 0 else 1)
    if checked:
        assert checked[0].value == float(abstained) and checked[0].threshold == 1.0
        assert checked[0].severity == ("fail" if policy == "fail" else "warn")


def test_no_answer_warning_names_the_count_and_the_json_lists_it_apart_from_failures() -> None:
    result = check_gate(report(no_answer(4, 0)), EvaluateThresholds())
    out = result.to_json()
    assert out["passed"] is True and out["failures"] == []
    (warning,) = out["warnings"]
    assert (warning["check"], warning["actual"], warning["limit"]) == ("no_answer_policy", 0.0, 1.0)
    assert warning["message"].startswith("no_answer_policy: 0 of 4 no-answer cases abstained (")
    row = next(c for c in out["checks"] if c["name"] == "no_answer_policy")
    assert (row["passed"], row["severity"]) == (False, "warn")
    held = check_gate(report(no_answer(4, 3)), EvaluateThresholds()).to_json()
    row = next(c for c in held["checks"] if c["name"] == "no_answer_policy")
    assert (row["passed"], row["message"]) == (True, "no_answer_policy: 3 of 4 no-answer cases abstained")


def test_the_min_correct_abstention_level_still_fails_beside_the_policy() -> None:
    result = check_gate(report(no_answer(4, 0)), EvaluateThresholds(min_correct_abstention=0.25))
    assert [f.check for f in result.failures] == ["min_correct_abstention"]
    assert [w.check for w in result.warnings] == ["no_answer_policy"]


def test_a_warn_check_never_fails_the_gate_and_a_fail_check_always_does() -> None:
    warn = GateCheck("w", "m", ">=", 1.0, 0.0, False, severity="warn")
    fail = GateCheck("f", "m", ">=", 1.0, 0.0, False)
    held = GateCheck("h", "m", ">=", 1.0, 1.0, True, severity="warn")
    assert (warn.status, fail.status, held.status) == ("WARN", "FAILED", "ok")
    assert GateResult([warn, held]).passed
    assert not GateResult([warn, fail]).passed
    assert [w.check for w in GateResult([warn, fail, held]).warnings] == ["w"]
    assert [f.check for f in GateResult([warn, fail, held]).failures] == ["f"]


def unjudged_report(condensed_current: float, new_unjudged: int = 3) -> Report:
    """A report whose comparison has nDCG 0.90 -> 0.80 (significant), one broken case `b` the comparison
    calls unverified; on the condensed lists nDCG 0.90 -> `condensed_current`."""
    comp = comparison(0.90, 0.80, True, broken=["a", "b"])
    comp.cases.unverified = ["b"]
    comp.case_details = {
        "b": CaseDetail(
            query=None,
            before=[],
            now=[],
            new_in_top_k=[],
            new_unjudged=[],
            verified=False,
            why="unverified: 2 unjudged new document(s) in the top K (x, y)",
        )
    }
    comp.unjudged = UnjudgedAccount(
        new_in_top_k=4,
        new_unjudged=new_unjudged,
        headline=f"{new_unjudged} of the 4 new top-K documents are unjudged",
    )
    comp.condensed_metrics = {"ndcg": row(0.90, condensed_current)}
    return report(comparison=comp)


def test_a_drop_that_unjudged_documents_explain_fails_by_default_and_warns_with_policy_warn() -> None:
    warn = check_gate(
        unjudged_report(0.88),
        EvaluateThresholds(max_drop={"ndcg": 0.05}, unjudged_policy="warn", broken_case_policy="off"),
    )
    (check,) = [c for c in warn.checks if c.name == "max_drop.ndcg"]
    assert (check.passed, check.severity) == (False, "warn")
    assert warn.passed
    # drop 0.90 - 0.80 = 0.10 > 0.05, but with unjudged documents removed 0.90 - 0.88 = 0.02 <= 0.05
    assert check.describe().endswith(
        "unverified: 3 of the 4 new top-K documents are unjudged, and with unjudged documents removed "
        "ndcg 0.900 -> 0.880 (drop +0.020) (unjudged_policy: warn)"
    )
    fail = check_gate(unjudged_report(0.88), EvaluateThresholds(max_drop={"ndcg": 0.05}))
    assert not fail.passed
    (failed,) = [c for c in fail.checks if c.name == "max_drop.ndcg"]
    assert "3 of the 4 new top-K documents are unjudged" in failed.describe()


def test_a_drop_the_condensed_lists_confirm_is_a_failure_whatever_the_policy() -> None:
    result = check_gate(unjudged_report(0.80), EvaluateThresholds(max_drop={"ndcg": 0.05}))
    (check,) = [c for c in result.checks if c.name == "max_drop.ndcg"]
    assert (check.passed, check.severity) == (False, "fail")
    assert not result.passed


def test_unverified_broken_cases_are_left_out_of_the_count_and_warned_about_with_policy_warn() -> None:
    lenient = {"max_broken_cases": 1, "unjudged_policy": "warn", "regression_policy": "off"}
    result = check_gate(unjudged_report(0.88), EvaluateThresholds(**lenient))
    broken = {c.name: c for c in result.checks}
    assert broken["max_broken_cases"].value == 2 - 1  # a and b broken, b unverified
    assert broken["max_broken_cases"].passed
    assert broken["unverified_broken_cases"].severity == "warn"
    assert result.passed and [w.check for w in result.warnings] == ["unverified_broken_cases"]
    strict = check_gate(
        unjudged_report(0.88), EvaluateThresholds(max_broken_cases=1, regression_policy="off")
    )
    assert {c.name: c.value for c in strict.checks}["max_broken_cases"] == 2
    assert not strict.passed


def test_a_report_without_a_summary_fails_every_level_it_is_asked_for() -> None:
    invalid = Report(run=RunInfo(), status="invalid", error="golden set unreadable")
    result = check_gate(invalid, EvaluateThresholds(min_recall=0.5, max_p95_ms=100.0))
    assert [(f.check, f.actual, f.limit) for f in result.failures] == [
        ("min_recall", None, 0.5),
        ("max_p95_ms", None, 100.0),
        ("scored_cases", 0.0, 1.0),
    ]
