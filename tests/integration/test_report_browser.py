"""The HTML report in a real browser: headless Chromium (Debian's `chromium`) driven by Playwright opens the
page that a real `sieve eval` on the sample base wrote, and checks what a reader sees against the report JSON.

Without Chromium the test is skipped with how to install it; with CI=true it fails instead (CI installs it).
A screenshot lands in target/report-browser/ for a developer to look at.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from app.evaluation.render.html import render_html
from app.evaluation.report.model import Report
from tests.fixtures.browser import CHROMIUM_ARGS, chromium
from tests.fixtures.reports import sample_sweep
from tests.fixtures.seeded_store import seeded_store

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
MODELS_CACHE = REPO / "target" / "models"
SCREENSHOTS = REPO / "target" / "report-browser"


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory, real_embedder) -> Path:
    """Two real `sieve eval` runs on the sample base (the second with BM25 off, against the first), so
    the report has a comparison; returns the report folder."""
    store = seeded_store(tmp_path_factory.mktemp("report-browser") / "store")
    out = tmp_path_factory.mktemp("report-browser-eval")
    mp = pytest.MonkeyPatch()
    try:
        mp.chdir(REPO)
        for name in [n for n in os.environ if n.startswith("RAG__")]:
            mp.delenv(name)
        mp.delenv("SIEVE_CONFIG", raising=False)
        mp.setenv("RAG__STORE__PATH", str(store))
        mp.setenv("RAG__EVALUATE__OUTPUT_DIR", str(out))
        mp.setenv("RAG__MODELS__CACHE_DIR", str(MODELS_CACHE))
        mp.setattr("app.service.load_embedder", lambda settings: real_embedder)
        assert main(["eval", "--baseline", "none"]) == 0
        mp.setenv("RAG__CHAIN__BM25__ENABLED", "false")
        assert main(["eval", "--baseline", "previous"]) == 0
    finally:
        mp.undo()
    return out


@pytest.fixture(scope="module")
def page_and_report(evaluated: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The -latest page and its JSON. Until the startup evaluation sweeps by itself, a sweep section of the
    documented shape is put into the JSON and the page rendered again from it."""
    report = json.loads((evaluated / "retrieval-eval-latest.json").read_text(encoding="utf-8"))
    page = evaluated / "retrieval-eval-latest.html"
    assert page.exists(), "sieve eval writes the HTML next to the JSON"
    if not report.get("sweep"):
        report["sweep"] = sample_sweep()
        page = tmp_path_factory.mktemp("report-browser-page") / "retrieval-eval-latest.html"
        page.write_text(render_html(Report.model_validate(report)), encoding="utf-8")
    return page, report


def funnel_kept(report: dict[str, Any]) -> list[int]:
    """Candidates kept after each stage, from the stages section: the candidates, then − removed + added."""
    kept = [sum(c["originalCount"] or 0 for c in report["cases"])]
    for st in report["stages"][1:]:
        kept.append(kept[-1] - st["removed"] + st["added"])
    return kept


def test_the_report_in_a_real_browser(page_and_report: tuple[Path, dict[str, Any]]) -> None:
    executable = chromium()
    from playwright.sync_api import sync_playwright

    path, report = page_and_report
    url = path.resolve().as_uri()
    summary, comparison, sweep = report["summary"], report["comparison"], report["sweep"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            requests: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(url, wait_until="load")

            # tiles: the JSON's numbers, and the baseline delta with its CI and p-value
            for key in ("recall", "hitRate", "mrr", "ndcg", "precision", "top1Accuracy", "duplicateRate"):
                tile = page.locator(f'.tile[data-metric="{key}"]')
                assert tile.locator(".value").inner_text() == f"{summary[key]:.3f}", key
                row = comparison["metrics"].get(key)
                if row:
                    delta = " ".join(tile.locator(".delta").inner_text().split())
                    assert delta.startswith(
                        f"Δ {row['delta']:+.3f} [{row['ci95'][0]:.3f}, {row['ci95'][1]:.3f}]"
                    )
                    assert "p " in delta
            hits = summary["counts"]
            assert (
                f"{hits['hits']} of {hits['scoredCases']} cases hit"
                in page.locator('.tile[data-metric="hitRate"]').inner_text()
            )

            # the funnel: one bar per stage, with the stages section's counts; they agree with the cases'
            # own per-stage output counts
            bars = page.locator("#funnel .funnel-bar")
            assert bars.count() == len(report["stages"])
            expected = funnel_kept(report)
            for i, st in enumerate(report["stages"]):
                bar = bars.nth(i)
                assert bar.get_attribute("data-stage") == st["name"]
                assert bar.locator(".kept").text_content() == str(expected[i])
                assert bar.locator(".recall").text_content() == f"{st['afterStage']['recall']:.3f}"
                if i:
                    outputs = sum(
                        c["filterStats"][i - 1]["output"] for c in report["cases"] if c["filterStats"]
                    )
                    assert expected[i] == outputs, st["name"]

            # the sweep: a point per row on each curve (21 from the startup sweep) and the recommendation
            assert len(sweep["rows"]) == 21
            for series in ("recall", "correctAbstention", "meanResults"):
                assert (
                    page.locator(f'#sweep .sweep-series[data-series="{series}"] .sweep-point').count() == 21
                )
            if sweep["recommendation"]["abstention"]:
                assert page.locator('#sweep .sweep-mark[data-mark="abstention"]').count() == 1
                assert page.locator("#recommendation-abstention").is_visible()

            # a worst case expands to its ranked documents
            worst = page.locator("details.case").first
            case_id = worst.get_attribute("data-case-id")
            case = next(c for c in report["cases"] if c["id"] == case_id)
            ranked = worst.locator("table.ranked")
            assert not ranked.is_visible()
            worst.locator("summary").click()
            assert ranked.is_visible()
            shown = [cell.inner_text() for cell in ranked.locator("td.mono").all()]
            assert shown == [d["docId"] for d in case["rankedDocuments"]]

            # sortable columns: sorting the all-cases table by nDCG puts the lowest first
            page.locator("#all-cases > summary").click()
            page.locator("#all-cases th", has_text="nDCG").click()
            first = page.locator("#all-cases tbody tr").first.locator("td").first.inner_text()
            lowest = min(
                (c for c in report["cases"] if c["metrics"]), key=lambda c: (c["metrics"]["ndcg"], 0)
            )["metrics"]["ndcg"]
            assert next(c for c in report["cases"] if c["id"] == first)["metrics"]["ndcg"] == lowest

            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "report.png"), full_page=True)
        finally:
            browser.close()
    assert errors == [], f"console errors: {errors}"
    assert requests == [url], f"requests beyond the file itself: {[r for r in requests if r != url]}"
