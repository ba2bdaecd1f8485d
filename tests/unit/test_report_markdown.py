"""The Markdown "Compared with baseline" section, rendered from the comparison JSON; how the report says which
cases are unscorable, which ids are stale and which cases carry their own date; and that text from the golden
set or the index (ids, queries, titles, snippets, ...) stays text: no link, image or HTML is made of it."""

from __future__ import annotations

from datetime import date
from typing import Any

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

from app.evaluation.compare.comparison import compare_reports
from app.evaluation.golden.cases import GoldenCase, GoldenSet
from app.evaluation.render.html import render_html
from app.evaluation.render.markdown import comparison_markdown, md_text, render_markdown
from app.evaluation.report.model import Audit, DuplicateQuery, Report
from app.evaluation.run.build import measure_report
from app.evaluation.run.runner import evaluate
from tests.fixtures.reports import golden_report
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
    assert md_text("hr\x1b[31m<i>") == "hr\\u001b\\[31m&lt;i&gt;"  # a tag goes through the same escape
    assert not any(c in md for c in "\x00\x1b\u2028\u2029\x85")  # grep and a terminal see plain text
    row = next(line for line in md.splitlines() if line.startswith("| &lt;script&gt;"))
    assert "pay\\|day" in row  # a | in a cell is escaped


# What a hostile golden-set author (or document) could write to make the report's Markdown live: links,
# images, raw HTML, autolinks and email autolinks, an escape that tries to undo ours.
PAYLOAD = (
    "[x](javascript:alert(1)) ![img](http://evil.example/p.png) <script>alert(2)</script> "
    "<http://evil.example/a> <javascript:alert(3)> <1x@evil.example> \\[y](javascript:alert(4)) "
    "<!-- hidden --> <?pi?> <![CDATA[x]]> [ref][] [ref]"
)
# the report's user-supplied texts: case ids, queries, notes, groups, doc ids, titles, sources, snippets,
# reasons, segment names, warnings
USER_TEXTS = (
    "payday",
    "vpn",
    "weather",
    "when is payday",
    "how do I set up the VPN",
    "what is the weather on Mars",
    "no answer in the base",
    "pay",
    "hr-payroll",
    "hr-bonus",
    "it-vpn",
    "Hr-Payroll",
    "It-Vpn",
    "kb/hr-payroll.md",
    "kb/it-vpn.md",
    "Salaries are paid on the 25th.",
    "VPN setup.",
    "relevant (grade 1)",
    "dense=0.71 < 0.80",
    "paraphrase",
    "en",
    "1 case names a knowledge tag no chunk carries",
)


def hostile(text: str) -> str:
    return f"{text} {PAYLOAD}"


def with_payloads(value: Any) -> Any:
    """`value` (a report's JSON) with every user-supplied text, as a value or a key, carrying `PAYLOAD`."""
    if isinstance(value, dict):
        return {with_payloads(k): with_payloads(v) for k, v in value.items()}
    if isinstance(value, list):
        return [with_payloads(v) for v in value]
    return hostile(value) if value in USER_TEXTS else value


def hostile_report() -> Report:
    data = with_payloads(golden_report().to_json())
    data["cases"][0] |= {"risk": "high", "owner": hostile("owner"), "rationale": hostile("rationale")}
    report = Report.model_validate(data)
    report.gate.notes.append(hostile("a gate note naming case payday"))
    report.audit = Audit(
        ran=True,
        cases=3,
        findings={"duplicateQueries": 1},
        duplicate_queries=[DuplicateQuery(hostile("when is payday"), [hostile("payday"), hostile("vpn")])],
    )
    return report


def tokens(markdown: str) -> list[Token]:
    """Every token of `markdown` parsed as CommonMark with GFM tables, inline ones included."""
    out = []
    for token in MarkdownIt("commonmark").enable("table").parse(markdown):
        out += [token, *(token.children or [])]
    return out


def read_as(inline: Token) -> str:
    """What a reader sees of an inline token: its text, escapes resolved."""
    return "".join(child.content for child in inline.children or [] if child.type in ("text", "code_inline"))


@pytest.mark.parametrize("case_detail", [True, False])
def test_links_images_and_html_from_the_golden_set_or_the_index_stay_text(case_detail: bool) -> None:
    report = hostile_report()
    markdown = render_markdown(report, case_detail=case_detail)
    parsed = tokens(markdown)
    live = [t for t in parsed if t.type in ("link_open", "image", "html_inline", "html_block")]
    assert live == [], [(t.type, t.content, t.attrs) for t in live]
    html = MarkdownIt("commonmark").enable("table").render(markdown)
    assert "<a " not in html and "<img" not in html and "<script" not in html and "<!--" not in html
    # every payload is there, as text a reader sees: in the table cells, lists and paragraphs
    seen = "\n".join(read_as(t) for t in parsed if t.type == "inline")
    assert seen.count(PAYLOAD) == (53 if case_detail else 29)
    if case_detail:
        headings = [
            read_as(parsed[i + 1]) for i, t in enumerate(parsed) if t.type == "heading_open" and t.tag == "h3"
        ]
        assert headings == [hostile("payday"), hostile("vpn"), hostile("weather")]
        assert f"Query: {hostile('when is payday')}" in seen
        cells = [read_as(parsed[i + 1]) for i, t in enumerate(parsed) if t.type == "td_open"]
        assert hostile("hr-payroll") in cells  # an id whole; a title or snippet cut at 120 or 200 characters
        assert hostile("Hr-Payroll")[:120].strip() in cells
        assert hostile("Salaries are paid on the 25th.")[:200].strip() in cells
    # a worst case's owner and rationale (prose, cut at 120 characters), the audit's findings
    assert f"{hostile('payday')}: risk high; owner owner [x](javascript:alert(1)) ![img](http" in seen
    assert f"{hostile('payday')}, {hostile('vpn')}: {hostile('when is payday')!r}" in seen


def test_ordinary_text_reads_as_it_is() -> None:
    for prose in (
        "when is payday",
        "relevant (grade 1)",
        "dense=0.71 < 0.80",
        "recall 0.500 -> 0.750, p >= 0.7",
        "kb/hr-payroll.md",
        "C:\\docs\\a.md",
        "工资什么时候发 (月底)",
    ):
        assert md_text(prose) == prose
    assert render_markdown(golden_report(), case_detail=True).count("\\") == 0  # nothing to escape there


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("[x](javascript:alert(1))", "\\[x\\]\\(javascript:alert(1))"),
        ("![img](http://e/p.png)", "!\\[img\\]\\(http://e/p.png)"),
        ("<http://e>", "&lt;http://e&gt;"),
        ("<1x@e.example>", "&lt;1x@e.example&gt;"),
        ("\\[x](y)", "\\\\\\[x\\]\\(y)"),  # a backslash cannot undo the escape
        ("ends with \\", "ends with \\\\"),  # nor take the next character of the line
    ],
)
def test_md_text_escapes_what_makes_markdown_live(text: str, escaped: str) -> None:
    assert md_text(text) == escaped
