"""The HTML report, rendered from the report JSON: escaped, self-contained, with the JSON's figures."""

from __future__ import annotations

import re

import pytest

from app.evaluation.render.files import prune_reports, write_reports
from app.evaluation.render.html import render_html
from app.evaluation.report.model import Report
from app.settings import EvaluateSettings
from tests.fixtures.reports import SWEEP_PARAM, sample_report, sample_sweep


def page(report: dict) -> str:
    """The HTML of a report JSON, validated as a `Report` first."""
    return render_html(Report.model_validate(report))


def test_untrusted_query_and_snippet_render_as_text() -> None:
    html = page(
        sample_report(query="<script>alert(1)</script>", snippet='<img src=x onerror="alert(2)"> & more')
    )
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<img" not in html
    assert "&lt;img src=x onerror=&#34;alert(2)&#34;&gt; &amp; more" in html


def test_the_page_is_self_contained() -> None:
    html = page({**sample_report(), "sweep": sample_sweep()})
    assert not re.search(r"""\b(src|href|action)\s*=""", html), "nothing may be loaded from elsewhere"
    assert "http://" not in html and "https://" not in html
    assert "default-src 'none'" in html  # the CSP forbids any fetch should a later edit add one


def test_tiles_show_the_summary_and_the_counts() -> None:
    html = page(sample_report())
    tile = re.search(r'data-metric="recall">(.*?)</div>\s*</div>', html, re.S)
    assert tile is not None
    assert '<div class="value">0.750</div>' in tile.group(1)
    assert "2 of 3 relevant found" in tile.group(1)
    assert "2 of 2 cases hit" in html
    assert "0 of 1 no-answer cases returned nothing" in html
    assert "No baseline comparison: no previous report (first run)." in html


def test_tiles_show_the_baseline_delta_with_ci_and_p() -> None:
    report = sample_report()
    report["comparison"] = {
        "baseline": {"path": "base.json", "evaluatedAt": "2026-11-30T00:00:00+00:00", "run": {}},
        "pairedCases": 2,
        "comparable": True,
        "differences": [],
        "cases": {},
        "stages": [],
        "metrics": {
            "ndcg": {
                "baseline": 0.9,
                "current": 0.80655,
                "delta": 0.80655 - 0.9,
                "ci95": [-0.2, 0.01],
                "pValue": 0.0004,
                "pHolm": 0.0016,
                "significant": True,
            }
        },
    }
    html = page(report)
    tile = re.search(r'data-metric="ndcg">(.*?)</div>\s*</div>', html, re.S)
    assert tile is not None
    text = " ".join(tile.group(1).split())
    assert 'class="delta down"' in text
    assert "Δ -0.093 [-0.200, 0.010] p &lt; 0.001 · significant" in text


def test_funnel_counts_follow_the_stages_section() -> None:
    html = page(sample_report())
    bars = re.findall(
        r'class="funnel-bar" data-stage="([^"]+)" data-kept="(\d+)" data-relevant-kept="(\d+)"', html
    )
    # 10 + 10 + 8 candidates; the threshold removes 20 (1 relevant); the fallback adds 1 back
    assert bars == [
        ("candidates", "28", "3"),
        ("similarity_threshold", str(28 - 20), str(3 - 1)),
        ("fallback", str(28 - 20 + 1), str(3 - 1)),
    ]


def test_sweep_curve_has_a_point_per_row_and_marks_the_recommendation() -> None:
    sweep = sample_sweep()
    html = page({**sample_report(), "sweep": sweep})
    for series in ("recall", "correctAbstention", "meanResults"):
        block = re.search(rf'data-series="{series}">(.*?)</g>', html, re.S)
        assert block is not None and block.group(1).count('class="sweep-point"') == 21
    assert re.search(r'class="sweep-mark" data-mark="abstention" data-value="0.85"', html)
    assert re.search(r'class="sweep-mark" data-mark="best" data-value="0.7"', html)
    assert f"Recommended for abstention: {SWEEP_PARAM} = 0.85</b>" in html


def test_without_a_sweep_the_section_says_so() -> None:
    html = page(sample_report())
    assert 'id="sweep-none"' in html and '<svg id="sweep"' not in html


def test_worst_cases_expand_to_ranked_documents_and_where_lost() -> None:
    html = page(sample_report())
    ids = re.findall(r'<details class="case" data-case-id="([^"]+)"', html)
    assert ids == ["weather", "payday"]  # a no-answer case that answered first, then by nDCG
    payday = html[html.index('data-case-id="payday"') :]
    assert (
        '<b>REMOVED_BY_similarity_threshold</b> at <span class="ranks">dense #9, bm25 #3</span> — '
        "dense=0.71 &lt; 0.80" in payday
    )
    # each ranked document with its fused score (the order), then its dense score
    assert '<td class="mono">hr-payroll</td><td class="num">0.900</td><td class="num">0.890</td>' in payday
    # and its ranks in the candidate lists: dense, BM25, after fusion, after rerank (not made: "-")
    it_vpn = payday[payday.index('<td class="mono">it-vpn</td>') :]
    assert re.findall(r'<td class="num rank">([^<]*)</td>', it_vpn)[:4] == ["2", "4", "2", "-"]
    assert 'trace id <span class="mono trace-id">3f9c2a7b1d4e8a60</span>' in payday


def test_an_invalid_report_says_why_nothing_ran() -> None:
    html = page({"status": "invalid", "error": "golden-set.json line 3: 'query' is missing", "run": {}})
    assert "Nothing ran" in html and "golden-set.json line 3: &#39;query&#39; is missing" in html


def test_a_thousand_cases_collapse_into_one_section() -> None:
    report = sample_report()
    base = report["cases"][1]
    report["cases"] = [{**base, "id": f"c{i:04d}"} for i in range(1000)]
    html = page(report)
    # one collapsed section holds every case; none is a worst case, so nothing else is per case
    assert '<details class="all" id="all-cases">' in html and '<details class="case"' not in html
    assert html.count('<td class="mono">c') == 1000


@pytest.mark.parametrize("write_html", [True, False])
def test_write_reports_writes_the_html_next_to_the_json(tmp_path, write_html: bool) -> None:
    settings = EvaluateSettings(output_dir=str(tmp_path), write_html=write_html)
    paths = write_reports(
        Report.model_validate(sample_report()), settings, "# md\n", stamp="20261201T050000Z"
    )
    names = sorted(p.name for p in paths)
    html = ["retrieval-eval-20261201T050000Z.html", "retrieval-eval-latest.html"] if write_html else []
    assert names == sorted(
        [
            "retrieval-eval-20261201T050000Z.json",
            "retrieval-eval-latest.json",
            "retrieval-eval-20261201T050000Z.md",
            "retrieval-eval-latest.md",
            *html,
        ]
    )
    if write_html:
        assert (tmp_path / "retrieval-eval-latest.html").read_text(encoding="utf-8") == page(sample_report())


def test_prune_removes_old_html_with_its_set(tmp_path) -> None:
    for s in ("20261201T000000Z", "20261201T000001Z"):
        for ext in ("json", "md", "html"):
            (tmp_path / f"retrieval-eval-{s}.{ext}").write_text("")
    (tmp_path / "retrieval-eval-latest.html").write_text("")
    removed = prune_reports(tmp_path, "retrieval-eval", 1)
    assert sorted(p.name for p in removed) == [
        f"retrieval-eval-20261201T000000Z.{e}" for e in ("html", "json", "md")
    ]
    assert (tmp_path / "retrieval-eval-latest.html").exists()


def test_a_sweep_without_no_answer_cases_draws_no_abstention_curve() -> None:
    sweep = sample_sweep()
    for row in sweep["rows"]:
        row["metrics"]["correctAbstention"] = None
    sweep["recommendation"]["abstention"] = None
    html = page({**sample_report(), "sweep": sweep})
    block = re.search(r'data-series="correctAbstention">(.*?)</g>', html, re.S)
    assert block is not None and 'class="sweep-point"' not in block.group(1)
    assert (
        re.search(r'data-series="recall">(.*?)</g>', html, re.S).group(1).count('class="sweep-point"') == 21
    )
    assert 'data-mark="abstention"' not in html and 'data-mark="best"' in html


def test_the_comparison_shows_the_budget_the_removed_cases_and_whether_the_run_became_the_baseline() -> None:
    report = sample_report()
    report["comparison"] = {
        "baseline": {"path": "base.json", "evaluatedAt": "2026-11-30T00:00:00+00:00", "run": {}},
        "pairedCases": 2,
        "comparable": True,
        "differences": [],
        "cases": {},
        "stages": [],
        "metrics": {},
        "budget": {"p95Ms": {"baseline": 20.0, "current": 31.5}},
        "removedCases": [{"id": "<hard-1>", "hard": True, "metrics": {"ndcg": 0.5}}],
    }
    report["baselineUpdate"] = {"promoted": False, "reason": "the gate failed"}
    html = page(report)
    budget = re.search(r'<table id="budget">(.*?)</table>', html, re.S)
    assert (
        budget is not None
        and '<td>p95 latency (ms)</td><td class="num">20.0</td><td class="num">31.5</td>' in budget.group(1)
    )
    removed = re.search(r'<table id="removed-added">(.*?)</table>', html, re.S)
    assert removed is not None
    assert "&lt;hard-1&gt;" in removed.group(1) and "(no retired reason given)" in removed.group(1)
    assert "The baseline stays: the gate failed." in html


def test_a_tile_shows_the_evidence_characters_with_char_precision_and_context() -> None:
    report = sample_report()
    report["summary"]["evidence"] = {
        "cases": 2,
        "evidenceHit": 0.5,
        "charCases": 2,
        "evidenceCharRecall": 0.75,
    }
    report["summary"]["evidence"]["charPrecision"] = 0.125
    report["summary"]["budget"] = {"contextChars": 2249.4}
    html = page(report)
    tile = re.search(r'data-metric="evidenceCharRecall">(.*?)</div>\s*</div>', html, re.S)
    assert tile is not None
    assert '<div class="value">0.750</div>' in tile.group(1)
    assert "CharPrecision 0.125; 2249 context characters a case" in tile.group(1)
