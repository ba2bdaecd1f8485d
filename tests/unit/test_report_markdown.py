"""The Markdown "Compared with baseline" section, rendered from the comparison JSON; and how the report
says which cases are unscorable, which ids are stale and which cases carry their own date."""

from __future__ import annotations

from datetime import date

from app.evaluation.compare.comparison import compare_reports
from app.evaluation.golden.cases import GoldenCase, GoldenSet
from app.evaluation.render.html import render_html
from app.evaluation.render.markdown import comparison_markdown, md_text, render_markdown
from app.evaluation.report.model import Report
from app.evaluation.run.build import measure_report
from app.evaluation.run.runner import evaluate
from tests.fixtures.traced_chain import TAGGED_KNOWN as KNOWN
from tests.fixtures.traced_chain import FakeChain


def report(ndcg: dict[str, float], hit: dict[str, float], enabled: bool) -> dict:
    return {
        "status": "ok",
        "run": {"settings": {"chain": {"bm25": {"enabled": enabled}}}, "k": 5, "evaluatedAt": "T0"},
        "summary": {"kMixed": False},
        "stages": [],
        "cases": [
            {
                "id": i,
                "query": f"q {i}",
                "topK": 5,
                "metrics": {
                    "recall": hit[i],
                    "hitRate": hit[i],
                    "mrr": v,
                    "ndcg": v,
                    "precision": 0.2,
                    "top1Accuracy": hit[i],
                },
                "rankedDocuments": [
                    {
                        "docId": f"{i}-{'new' if not enabled else 'old'}",
                        "scores": {"fused": 0.9 if enabled else 0.8},
                    }
                ],
            }
            for i, v in ndcg.items()
        ],
    }


def test_comparison_section_says_what_changed_lists_fixed_and_broken_and_warns_on_few_cases() -> None:
    base = report({"a": 0.0, "b": 1.0, "c": 0.5}, {"a": 0.0, "b": 1.0, "c": 1.0}, True)
    cur = report({"a": 1.0, "b": 0.0, "c": 0.5}, {"a": 1.0, "b": 0.0, "c": 1.0}, False)
    comparison = compare_reports(Report.model_validate(base), Report.model_validate(cur), "base.json")
    text = "\n".join(comparison_markdown(comparison, None, "@5"))
    assert text.startswith("## Compared with baseline")
    assert "Only 3 paired cases (fewer than 30): small differences cannot be significant" in text
    assert "- `rag.chain.bm25.enabled: true -> false`" in text
    assert "Fixed (hit 0 → 1): 1" in text and "| a | q a | a-old (0.900) | a-new (0.800) |" in text
    assert "Broken (hit 1 → 0): 1" in text and "| b | q b | b-old (0.900) | b-new (0.800) |" in text
    assert "| nDCG@5 | 0.500 | 0.500 | +0.000 |" in text


def test_without_a_baseline_the_section_says_why() -> None:
    text = comparison_markdown(None, "no previous report (first run)", "@5")
    assert text[:3] == ["## Compared with baseline", "", "No comparison: no previous report (first run)."]


def test_unscorable_stale_and_dated_cases_are_said_where_a_reader_looks() -> None:
    golden = GoldenSet(
        "t",
        [
            GoldenCase.model_validate(fields)
            for fields in (
                {"id": "gone", "query": "q", "evidenceChunkIds": ["c9"]},
                {"id": "dated", "query": "q", "expectedDocIds": ["A"], "asOf": "2025-01-01"},
                {"id": "ok", "query": "q", "expectedDocIds": ["A"]},
            )
        ],
        "golden.json",
    )
    report = measure_report(evaluate(FakeChain(), golden, 3, KNOWN, today=date(2026, 1, 1)), {})
    md = render_markdown(report, case_detail=True)
    assert "over 2 scored cases (3 in all, 0 no-answer, 0 failed, 1 unscorable)" in md
    gone_row = next(line for line in md.splitlines() if line.startswith("| gone |"))
    assert "| unscorable |" in gone_row and "c9: NOT_IN_INDEX" in gone_row
    assert (
        "| Expected ids missing from the index | 1 (chunk ids among them are left out of every figure; "
        "unscorable, every expectation stale: gone) |"
    ) in md
    assert (
        "(the date the hard filter's effective dates use; 1 case(s) are judged as of their own asOf) |" in md
    )
    assert "- As of: 2025-01-01 (its own asOf)" in md
    assert "**Not scored:** every expectation it names is a chunk id not in the index: c9." in md
    html = render_html(report)
    assert "1 unscorable" in html
    assert (
        '<b class="warn">unscorable</b>: every expectation it names is a chunk id not in the index: c9'
        in html
    )


def test_ids_queries_and_tags_are_escaped_and_the_file_stays_text() -> None:
    golden = GoldenSet(
        "t",
        [
            GoldenCase.model_validate(
                {
                    "id": "<script>alert(1)</script>",
                    "query": "pay|day\x00 & <b>bold</b>\u2028next",
                    "knowledgeTag": "hr",
                    "expectedDocIds": ["A", "Z\x00<img src=x>"],
                }
            )
        ],
        "golden.json",
    )
    md = render_markdown(measure_report(evaluate(FakeChain(), golden, 3, KNOWN), {}), case_detail=True)
    assert "<script>" not in md and "<b>" not in md and "<img" not in md
    assert "### &lt;script&gt;alert(1)&lt;/script&gt;" in md
    assert "- Query: pay|day\\u0000 & &lt;b&gt;bold&lt;/b&gt;\\u2028next" in md
    assert md_text("hr\x1b[31m<i>") == "hr\\u001b[31m&lt;i&gt;"  # a tag goes through the same escape
    assert not any(c in md for c in "\x00\x1b\u2028\u2029\x85")  # grep and a terminal see plain text
    row = next(line for line in md.splitlines() if line.startswith("| &lt;script&gt;"))
    assert "pay\\|day" in row  # a | in a cell is escaped
