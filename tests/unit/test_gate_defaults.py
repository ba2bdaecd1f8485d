"""The gate's defaults against a baseline: significant drops fail and others warn, broken core and
high-risk cases fail, a hard case removed without a retired reason fails, segments and p95 growth."""

from __future__ import annotations

import pytest

from app.evaluation.compare.gate import check_gate
from app.evaluation.report.model import (
    BaselineRef,
    BeforeAfter,
    CaseChanges,
    CaseFigures,
    CaseRecord,
    Comparison,
    MetricComparison,
    Report,
    RunInfo,
    SegmentComparison,
    Summary,
)
from app.settings import EvaluateThresholds

SUMMARY = {"scoredCases": 20, "ndcg": 0.8, "noAnswer": {"cases": 0}, "forbidden": {"hits": 0, "cases": 0}}


def row(baseline: float, current: float, significant: bool = False) -> MetricComparison:
    p = 0.001 if significant else 0.4
    return MetricComparison(
        baseline=baseline,
        current=current,
        delta=current - baseline,
        ci95=None,
        p_value=p,
        p_adjusted=p,
        significant=significant,
    )


def comparison(**fields) -> Comparison:
    base = {
        "baseline": BaselineRef(path="b.json", evaluated_at=None, run={}),
        "comparable": True,
        "differences": [],
        "paired_cases": 20,
        "metrics": {"ndcg": row(0.9, 0.9)},
        "cases": CaseChanges(),
        "stages": [],
    }
    return Comparison(**{**base, **fields})


def case(case_id: str, ndcg: float = 1.0, **fields) -> CaseRecord:
    metrics = {"recall": 1.0, "hitRate": 1.0, "mrr": 1.0, "ndcg": ndcg}
    return CaseRecord(id=case_id, query="q", top_k=5, metrics=metrics, **fields)


def gate(comp: Comparison, cases: list[CaseRecord] | None = None, summary: dict = SUMMARY, **thresholds):
    report = Report(
        run=RunInfo(), summary=Summary.model_validate(summary), comparison=comp, cases=cases or []
    )
    return check_gate(report, EvaluateThresholds(**thresholds))


def named(result, name: str):
    (check,) = [c for c in result.checks if c.name == name]
    return check


@pytest.mark.parametrize(
    ("current", "significant", "status"),
    [(0.80, True, "FAILED"), (0.80, False, "WARN"), (0.90, False, "ok"), (0.95, True, "ok")],
)
def test_with_no_thresholds_a_significant_drop_fails_and_any_other_drop_warns(current, significant, status):
    result = gate(comparison(metrics={"ndcg": row(0.90, current, significant)}))
    check = named(result, "significant_drop.ndcg")
    assert check.status == status
    assert check.value == pytest.approx(0.90 - current)
    assert result.passed is (status != "FAILED")


def test_regression_policy_off_leaves_the_default_drop_check_out():
    result = gate(comparison(metrics={"ndcg": row(0.9, 0.5, True)}), regression_policy="off")
    assert not [c for c in result.checks if c.name.startswith("significant_drop")] and result.passed


def test_the_drop_checks_read_the_core_set_when_the_golden_set_has_an_incremental_part():
    comp = comparison(
        metrics={"ndcg": row(0.9, 0.7, True)},  # every case: a significant drop...
        by_set={"core": {"ndcg": row(0.9, 0.9)}, "incremental": {"ndcg": row(0.9, 0.3, True)}},
    )
    result = gate(comp)
    assert named(result, "significant_drop.ndcg").status == "ok"  # ...which lives in the incremental set


def test_broken_core_cases_fail_by_default_relabelled_and_incremental_ones_are_named_not_counted():
    changes = CaseChanges(broken=["a", "inc", "relabel"], broken_by_relabelling=["relabel"])
    cases = [case("a"), case("inc", case_set="incremental"), case("relabel")]
    check = named(gate(comparison(cases=changes), cases), "max_broken_cases")
    assert (check.status, check.value, check.threshold) == ("FAILED", 1.0, 0.0)
    assert "1 incremental, reported apart: inc" in check.message
    assert "1 broken by relabelling" in check.message and "relabel" in check.message
    only_incremental = CaseChanges(broken=["inc"])
    assert named(gate(comparison(cases=only_incremental), cases), "max_broken_cases").passed


def test_a_broken_high_risk_case_fails_in_any_set():
    cases = [
        case("risky", risk="high", owner="payroll-team", case_set="incremental"),
        case("calm", risk="low"),
    ]
    result = gate(comparison(cases=CaseChanges(broken=["risky"])), cases, broken_case_policy="off")
    check = named(result, "high_risk_broken")
    assert (check.status, check.value) == ("FAILED", 1.0)
    assert "risky (owner payroll-team)" in check.message and "1 of 1" in check.message


@pytest.mark.parametrize(
    ("removed", "status"),
    [
        ([CaseFigures(id="hard", hard=True)], "FAILED"),
        ([CaseFigures(id="easy", hard=False)], "WARN"),
        ([CaseFigures(id="hard", hard=True, retired_reason="duplicate of zh-pay-002")], "ok"),
    ],
)
def test_a_hard_case_removed_without_a_retired_reason_fails(removed, status):
    check = named(gate(comparison(removed_cases=removed)), "removed_cases")
    assert check.status == status
    assert removed[0].id in check.message


def test_a_significant_segment_drop_warns_and_configured_segments_are_checked():
    segments = [
        SegmentComparison(
            kind="tag",
            name="refund",
            metric="ndcg",
            paired_cases=12,
            baseline=0.9,
            current=0.6,
            delta=-0.3,
            p_value=0.001,
            p_holm=0.004,
            significant=True,
        ),
        SegmentComparison(
            kind="tag",
            name="invoice",
            metric="ndcg",
            paired_cases=4,
            baseline=1.0,
            current=0.9,
            delta=-0.1,
            p_value=0.5,
        ),
    ]
    cases = [
        case("r1", 0.5, tags=["refund"]),
        case("r2", 0.75, tags=["refund"]),
        case("i1", 1.0, tags=["invoice"]),
    ]
    result = gate(
        comparison(segments=segments),
        cases,
        segments={
            "tag:refund": {"min_ndcg": 0.7},
            "tag:invoice": {"max_drop": {"ndcg": 0.05}},
            "risk:high": {"min_ndcg": 0.5},
        },
    )
    assert named(result, "segment_drop").status == "WARN"
    level = named(result, "segments.tag:refund.min_ndcg")
    assert level.value == pytest.approx((0.5 + 0.75) / 2) and level.status == "FAILED"
    drop = named(result, "segments.tag:invoice.max_drop.ndcg")
    assert drop.value == pytest.approx(1.0 - 0.9) and drop.status == "FAILED"  # no significance asked
    missing = named(result, "segments.risk:high.min_ndcg")
    assert missing.value is None and missing.status == "FAILED", "a segment with no case is not a pass"


def test_a_segment_key_must_name_its_kind():
    with pytest.raises(ValueError, match="segment key 'refund' must be <kind>:<name>"):
        EvaluateThresholds(segments={"refund": {"min_ndcg": 0.5}})


@pytest.mark.parametrize(
    ("before", "now", "status"), [(20.0, 24.0, "ok"), (20.0, 25.0, "FAILED"), (None, 25.0, "FAILED")]
)
def test_max_p95_increase_is_a_ratio_of_the_baseline(before, now, status):
    comp = comparison(budget={"p95Ms": BeforeAfter(baseline=before, current=now)})
    check = named(gate(comp, max_p95_increase=0.2), "max_p95_increase")
    assert check.status == status
    if before is not None:
        assert check.value == pytest.approx(now / before - 1)  # 24/20 - 1 = 0.2 holds, 25/20 - 1 = 0.25 fails


def test_without_a_baseline_the_defaults_note_why():
    report = Report(run=RunInfo(), summary=Summary.model_validate(SUMMARY))
    result = check_gate(report, EvaluateThresholds(), "first run")
    assert result.passed and result.notes == [
        "regression gate passed without checking: no baseline (first run)"
    ]


def test_each_check_says_what_it_holds():
    result = gate(comparison(metrics={"ndcg": row(0.9, 0.8, True)}))
    means = {c.name: c.means for c in result.record().checks}
    assert means["max_forbidden_hits"] == "forbidden documents in any top K (a count), at most"
    assert means["significant_drop.ndcg"].startswith("the drop against the baseline (core set)")
