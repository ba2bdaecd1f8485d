"""Segments (tag, knowledge tag, language) and paraphrase groups over case records."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.evaluation.compare.comparison import scored_figures, segment_comparisons
from app.evaluation.compare.gate import in_segment
from app.evaluation.golden.language import query_language
from app.evaluation.report.model import CaseRecord
from app.evaluation.run.segments import groups, segments, with_deltas


def case(cid, tags=(), tag=None, query="pay day", group=None, ndcg=1.0, hit=1.0, top=None, scored=True):
    metrics = (
        {"recall": hit, "hitRate": hit, "mrr": ndcg, "ndcg": ndcg, "precision": hit / 5, "top1Accuracy": hit}
        if scored
        else None
    )
    docs = [{"docId": top}] if top else []
    return CaseRecord.model_validate(
        {
            "id": cid,
            "topK": 5,
            "tags": list(tags),
            "knowledgeTag": tag,
            "query": query,
            "group": group,
            "metrics": metrics,
            "rankedDocuments": docs,
        }
    )


@pytest.mark.parametrize(
    ("query", "language"),
    [
        ("工资什么时候发", "zh"),
        ("When is payday?", "en"),
        ("VPN 怎么连", "en"),
        ("怎么连VPN网络", "zh"),
        ("12345", "en"),
    ],
)
def test_query_language_is_zh_when_most_letters_are_cjk(query, language) -> None:
    # "VPN 怎么连": 3 Latin letters, 3 CJK -> not more than half: en; "怎么连VPN网络": 5 CJK of 8
    assert query_language(query) == language


def test_segment_means_over_scored_cases_and_small_flag() -> None:
    cases = [
        case("a", ["x"], "hr", ndcg=1.0),
        case("b", ["x"], "hr", ndcg=0.5),
        case("c", ["x", "y"], None, ndcg=0.0, hit=0.0),
        case("d", ["x"], None, scored=False),  # a no-answer case: counted, not averaged
    ]
    segs = {(s.kind, s.name): s for s in segments(cases)}
    x = segs[("tag", "x")]
    assert x.cases == 4 and x.small
    assert x.metrics["ndcg"] == pytest.approx((1.0 + 0.5 + 0.0) / 3)
    assert x.metrics["hitRate"] == pytest.approx((1 + 1 + 0) / 3)
    assert segs[("knowledgeTag", "hr")].metrics["ndcg"] == pytest.approx((1.0 + 0.5) / 2)
    assert segs[("language", "en")].cases == 4
    assert segs[("tag", "y")].delta is None


def test_segment_delta_comes_from_the_comparisons_paired_cases() -> None:
    base = {c.case.id: c for c in [case("a", ["x"], ndcg=0.5), case("b", ["x"], ndcg=1.0)]}
    cur = [case("a", ["x"], ndcg=1.0), case("b", ["x"], ndcg=1.0), case("new", ["x"], ndcg=0.0)]
    before, after = scored_figures(base, {c.case.id: c for c in cur})
    rows = segment_comparisons(before, after, {c.case.id: c for c in cur}, seed=42, alpha=0.05)
    comparison = SimpleNamespace(comparable=True, segments=rows)
    segs = {(s.kind, s.name): s for s in with_deltas(segments(cur), comparison)}  # type: ignore[arg-type]
    x = segs[("tag", "x")]
    assert x.cases == 3  # the segment counts every case; its delta only the paired ones
    assert x.delta is not None and x.delta.paired_cases == 2
    assert x.delta.metrics["ndcg"]["delta"] == pytest.approx((0.5 + 0.0) / 2)
    # exact sign-flip on d = [0.5, 0]: every one of the 4 patterns has |mean| >= 0.25: p = 4/4
    assert x.delta.metrics["ndcg"]["pValue"] == 4 / 4
    assert x.delta.exploratory
    # the same segments as the report's: language and origin too
    assert segs[("language", "en")].delta is not None and segs[("origin", "manual")].delta is not None
    assert with_deltas(segments(cur), None)[0].delta is None


def test_a_configured_segment_is_the_reports_segment() -> None:
    c = case("a", ["x"], "hr", ndcg=1.0)
    assert in_segment(c, "tag:x") and in_segment(c, "knowledgeTag:hr") and in_segment(c, "set:core")
    assert in_segment(c, "language:en") and not in_segment(c, "tag:y")


def test_groups_spread_hit_rate_and_same_top1() -> None:
    cases = [
        case("p1", group="pay", ndcg=1.0, top="hr-payroll"),
        case("p2", group="pay", ndcg=0.63, top="hr-payroll"),
        case("p3", group="pay", ndcg=0.0, hit=0.0, top="hr-offboarding"),
        case("v1", group="vpn", ndcg=1.0, top="it-vpn"),
        case("v2", group="vpn", ndcg=1.0, top="it-vpn"),
        case("solo"),
    ]
    pay, vpn = groups(cases)
    assert pay.name == "pay" and pay.cases == ["p1", "p2", "p3"]
    assert pay.hit_rate == pytest.approx(2 / 3)
    assert (pay.ndcg_min, pay.ndcg_max) == (0.0, 1.0)
    assert pay.spread == pytest.approx(1.0 - 0.0)
    assert not pay.same_top1
    assert vpn.spread == 0.0 and vpn.same_top1


def with_spec(record: CaseRecord, **update: object) -> CaseRecord:
    """`record` with its golden-case part updated."""
    return record.model_copy(update={"case": record.case.model_copy(update=update)})


def test_risk_and_the_golden_set_parts_are_segments() -> None:
    cases = [
        with_spec(case("a", ndcg=1.0), risk="high", case_set="core"),
        with_spec(case("b", ndcg=0.5), risk="high", case_set="incremental"),
        with_spec(case("c", ndcg=0.0, hit=0.0), case_set="core"),
    ]
    segs = {(s.kind, s.name): s for s in segments(cases)}
    assert segs[("risk", "high")].metrics["ndcg"] == pytest.approx((1.0 + 0.5) / 2)
    assert segs[("set", "core")].metrics["ndcg"] == pytest.approx((1.0 + 0.0) / 2)
    assert segs[("set", "incremental")].cases == 1
    one_part = {(s.kind, s.name) for s in segments([case("a"), case("b")])}
    assert not {key for key in one_part if key[0] in ("set", "risk")}, "one part, no risk: no such segment"


def test_every_segment_kind_can_be_configured() -> None:
    from app.evaluation.golden.segments import SEGMENT_KINDS
    from app.settings import SEGMENT_KEY_KINDS

    assert SEGMENT_KEY_KINDS == SEGMENT_KINDS
