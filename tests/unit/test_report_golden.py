"""The Markdown report of a fixed `Report` (tests/fixtures/reports.golden_report) is
tests/fixtures/report.golden.md, byte for byte; and the sections come in reading order: verdict, gate,
comparison, worst cases, then the rest.

After a deliberate change of the Markdown, regenerate the golden file and review its diff:

    SIEVE_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_report_golden.py

Without SIEVE_UPDATE_GOLDEN the test never writes the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from app.evaluation.render.markdown import render_markdown
from app.evaluation.report.model import Report, report_text
from tests.fixtures.reports import golden_report, sample_sweep

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "report.golden.md"


def test_the_markdown_matches_the_golden_file() -> None:
    text = render_markdown(golden_report(), case_detail=True)
    if os.environ.get("SIEVE_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text, encoding="utf-8")
    assert text == GOLDEN.read_text(encoding="utf-8")


def test_a_report_read_back_from_its_json_renders_the_same() -> None:
    report = golden_report()
    again = Report.model_validate_json(report_text(report))
    assert again == report
    assert render_markdown(again, case_detail=True) == render_markdown(report, case_detail=True)


def test_the_typed_sweep_writes_the_json_of_the_sweep_it_was_read_from() -> None:
    assert json.dumps(golden_report().to_json()["sweep"]) == json.dumps(sample_sweep())


def test_sections_come_verdict_gate_comparison_worst_cases_first() -> None:
    lines = render_markdown(golden_report()).splitlines()
    headings = [line for line in lines if line.startswith("## ")]
    assert headings == [
        "## Gate: PASSED (1 warning)",
        "## Compared with baseline",
        "## Worst cases",
        "## Summary",
        "## Run",
        "## Per-stage filter statistics",
        "## Segments",
        "## Paraphrase groups",
        "## Threshold sweep",
        "## Golden-set audit",
        "## Warnings",
        "## Cases",
        "## Conventions",
    ]
    assert lines[2] == (
        "**Gate PASSED with 1 warning.** nDCG@5 0.807, Recall@5 0.750, MRR@5 1.000 over 2 scored cases "
        "(3 in all, 1 no-answer, 0 failed); nDCG@5 +0.307 against the baseline "
        "(p 1, adjusted 1: not significant); 1 fixed, 0 broken."
    )


def test_case_detail_is_off_by_default_and_the_cases_stay_in_the_json() -> None:
    report = golden_report()
    brief = render_markdown(report)
    assert "### payday" not in brief
    assert (
        "Every case's ranking, trace and judgments (3 cases) are in the JSON report's `cases`; "
        "`rag.evaluate.report.case_detail: true` lists them here."
    ) in brief
    assert [c["id"] for c in report.to_json()["cases"]] == ["payday", "vpn", "weather"]
    detailed = render_markdown(report, case_detail=True)
    assert [line for line in detailed.splitlines() if line.startswith("### ")] == [
        "### payday",
        "### vpn",
        "### weather",
    ]


def test_small_segments_fold_into_one_line() -> None:
    text = render_markdown(golden_report())
    assert "| tag | paraphrase | 12 | 0.900 | 1.000 | 0.950 | 0.900 |" in text
    assert (
        "Small segments (fewer than 10 cases, nDCG): language en 0.807 (2), origin manual 0.807 (3)." in text
    )
    assert "| language | en |" not in text


def test_every_ranked_list_shows_the_fused_score_and_full_ids() -> None:
    text = render_markdown(golden_report(), case_detail=True)
    # worst cases, the comparison's before/now lists and each case's ranking
    assert (
        "| payday | when is payday | 0.613 | hr-payroll, hr-bonus | hr-payroll (0.900; dense #1, bm25 #1, "
        "fused #1), it-vpn (0.850; dense #2, bm25 #4, fused #2) |" in text
    )
    assert (
        "| vpn | how do I set up the VPN | hr-payroll (0.900) | it-vpn (0.900) | 1 (0 unjudged) | - |" in text
    )
    assert (
        "| 1 | hr-payroll | kb/hr-payroll.md | Hr-Payroll | 0.900 | 0.890 | 4.00 | n/a "
        "| 1 | 1 | 1 | - | yes |" in text
    )
    assert "…" not in text
