"""The labelling loop as a rater runs it, in headless Chromium (Debian's `chromium`, driven by Playwright):
`sieve label` (a real process, the packaged e5, an embedded Chroma holding a copy of the sample base, a copy
of the golden set) prints its URL with a one-time token; the page judges three documents by keyboard; a
reload shows them kept; `sieve golden export` merges them; `sieve eval` then reports Judged@K risen by
exactly those three documents.

Without Chromium the test is skipped with how to install it; with CI=true it fails instead (CI installs it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.cli import main
from tests.fixtures.browser import CHROMIUM_ARGS, chromium
from tests.fixtures.processes import stop_process
from tests.fixtures.seeded_store import seeded_store

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
MODELS_CACHE = REPO / "target" / "models"
SIEVE = Path(sys.executable).with_name("sieve")
SCREENSHOTS = REPO / "target" / "label-browser"
START_TIMEOUT_S = 240.0
GRADES = ["0", "2", "1"]  # the keys pressed, one per judged document


def sieve_env(tmp: Path) -> dict[str, str]:
    return {
        "RAG__STORE__PATH": str(tmp / "store"),
        "RAG__EVALUATE__OUTPUT_DIR": str(tmp / "eval"),
        "RAG__EVALUATE__RESOURCE_LOCATION": str(tmp / "golden.json"),
        "RAG__MODELS__CACHE_DIR": str(MODELS_CACHE),
        "RAG__LABEL__JUDGMENTS": str(tmp / "judgments.jsonl"),
        "RAG__LABEL__DRAFTS": str(tmp / "drafts.jsonl"),
        "RAG__LABEL__QUEUE": str(tmp / "label-queue.jsonl"),
    }


def run_cli(tmp: Path, real_embedder: Any, *argv: str) -> int:
    """`sieve <argv>` in this process, with the test's files and the session's loaded e5."""
    mp = pytest.MonkeyPatch()
    try:
        mp.chdir(REPO)
        for name in [n for n in os.environ if n.startswith("RAG__")]:
            mp.delenv(name)
        mp.delenv("SIEVE_CONFIG", raising=False)
        for name, value in sieve_env(tmp).items():
            mp.setenv(name, value)
        mp.setattr("app.service.load_embedder", lambda settings: real_embedder)
        return main(list(argv))
    finally:
        mp.undo()


def evaluate(tmp: Path, real_embedder: Any) -> dict[str, Any]:
    assert run_cli(tmp, real_embedder, "eval", "--baseline", "none") in (
        0,
        1,
    )  # a gate may fail; figures count
    return json.loads((tmp / "eval" / "retrieval-eval-latest.json").read_text(encoding="utf-8"))


@contextmanager
def label_server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """`sieve label --port 0` on the test's files, ready; yields (base URL, token), then stops it (the
    embedded store is one process's at a time)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG__") and k != "SIEVE_CONFIG"}
    env |= sieve_env(tmp_path)
    out, log = tmp_path / "label.out", tmp_path / "label.log"
    with out.open("wb") as stdout, log.open("wb") as stderr:
        proc = subprocess.Popen(
            [str(SIEVE), "label", "--port", "0", "--who", "alice"],
            cwd=REPO,
            env=env,
            stdout=stdout,
            stderr=stderr,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        found = None
        while found is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"sieve label did not print its URL:\n{log.read_text(errors='replace')[-3000:]}")
            found = re.search(r"labelling page: (http://127\.0\.0\.1:\d+)/label#token=(\S+)", out.read_text())
            time.sleep(0.2)
        base, token = found.group(1), found.group(2)
        while not httpx.get(f"{base}/api/label/status", headers=auth(token), timeout=10).json()["ready"]:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"sieve label not ready:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)
        yield base, token
    finally:
        stop_process(proc, 20.0)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def pick_case(base: str, token: str, report: dict[str, Any]) -> tuple[str, list[str]]:
    """A scored case of the queue with at least three chunks of the current chain's top K that the golden set
    does not judge; returns its id and those chunks, in page order."""
    scored = {c["id"] for c in report["cases"] if c["metrics"] is not None and c["judged"] is not None}
    with httpx.Client(base_url=base, headers=auth(token), timeout=120) as client:
        for row in client.get("/api/label/queue").json()["cases"]:
            if row["caseId"] not in scored:
                continue
            view = client.get(f"/api/label/cases/{row['caseId']}").json()
            open_current = [
                i["id"] for i in view["items"] if "current" in i["variants"] and not i["golden"]["judged"]
            ]
            if view["matchOn"] == "doc" and len(open_current) >= len(GRADES):
                return view["caseId"], open_current[: len(GRADES)]
    pytest.fail("no case of the sample set has three unjudged documents in its top K")


def test_judge_by_keyboard_reload_export_and_judged_at_k_rises(tmp_path: Path, real_embedder: Any) -> None:
    executable = chromium()
    seeded_store(tmp_path / "store")
    golden = tmp_path / "golden.json"
    golden.write_text((REPO / "golden_set" / "golden-set.json").read_text(encoding="utf-8"), encoding="utf-8")
    before = evaluate(tmp_path, real_embedder)

    with label_server(tmp_path) as (base, token):
        case_id, targets = pick_case(base, token, before)
        errors, foreign = judge_in_browser(executable, base, token, case_id, targets)
    assert errors == [], f"console errors: {errors}"
    assert foreign == [], f"requests to anything but the server: {foreign}"
    lines = [json.loads(x) for x in (tmp_path / "judgments.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [(x["caseId"], x["id"], x["grade"], x["who"]) for x in lines] == [
        (case_id, chunk, int(key), "alice") for chunk, key in zip(targets, GRADES, strict=True)
    ]

    assert run_cli(tmp_path, real_embedder, "golden", "export") == 0
    merged = next(c for c in json.loads(golden.read_text(encoding="utf-8"))["cases"] if c["id"] == case_id)
    # the page records each judged chunk's text: the export writes passages (judgedQuotes), which resolve on
    # any chunking, not chunk ids
    assert all(x["quote"] for x in lines)
    assert merged["judgedQuotes"][-len(targets) :] == [
        {"docId": x["docId"], "quote": x["quote"], "grade": x["grade"]} for x in lines
    ]

    after = evaluate(tmp_path, real_embedder)
    case_before = next(c for c in before["cases"] if c["id"] == case_id)
    case_after = next(c for c in after["cases"] if c["id"] == case_id)
    k = case_before["topK"]
    assert case_after["judged"] == pytest.approx(case_before["judged"] + len(GRADES) / k)
    assert not set(case_after["unjudged"]) & {
        d["docId"] for d in case_after["rankedDocuments"] if d["chunkId"] in targets
    }
    scored = [c for c in before["cases"] if c["metrics"] is not None and c["judged"] is not None]
    assert after["summary"]["judged"] == pytest.approx(
        before["summary"]["judged"] + (len(GRADES) / k) / len(scored)
    )
    others = {c["id"]: c["judged"] for c in after["cases"] if c["id"] != case_id}
    assert others == {c["id"]: c["judged"] for c in before["cases"] if c["id"] != case_id}


def test_label_says_on_stopping_what_it_added_to_the_judgments_file(tmp_path: Path) -> None:
    seeded_store(tmp_path / "store")
    golden = tmp_path / "golden.json"
    golden.write_text((REPO / "golden_set" / "golden-set.json").read_text(encoding="utf-8"), encoding="utf-8")
    judgments = tmp_path / "judgments.jsonl"
    with label_server(tmp_path) as (base, token):
        with httpx.Client(base_url=base, headers=auth(token), timeout=120) as client:
            case_id = client.get("/api/label/queue").json()["cases"][0]["caseId"]
            chunk = client.get(f"/api/label/cases/{case_id}").json()["items"][0]["id"]
            judged = {"caseId": case_id, "id": chunk, "grade": 2, "who": "alice"}
            assert client.post("/api/label/judgments", json=judged).status_code == 200
    printed = (tmp_path / "label.out").read_text(encoding="utf-8").splitlines()
    assert (
        printed[0]
        == f"golden set {golden}; drafts {tmp_path / 'drafts.jsonl'}; judgments appended to {judgments}"
    )
    assert printed[-1] == f"wrote {judgments} (0 -> 1 judgment)"

    with label_server(tmp_path):
        pass
    printed = (tmp_path / "label.out").read_text(encoding="utf-8").splitlines()
    assert printed[-1] == f"unchanged: {judgments} (1 judgment)"


def judge_in_browser(
    executable: str, base: str, token: str, case_id: str, targets: list[str]
) -> tuple[list[str], list[str]]:
    """Open the page with the token, judge `targets` by keyboard (j/k to each, then its grade key), check
    each is saved, reload and check all three are kept. Returns the console errors and the requests that
    went anywhere but the server."""
    from playwright.sync_api import expect, sync_playwright

    errors: list[str] = []
    foreign: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: None if r.url.startswith(base) else foreign.append(r.url))
            page.goto(f"{base}/label#token={token}", wait_until="load")
            page.locator(f'#queue-list button[data-case-id="{case_id}"]').click(timeout=180_000)
            assert "token" not in page.url  # the token left the address bar at once
            expect(page.locator("#query")).to_have_text(re.compile(".+"))
            expect(page.locator("#who")).to_have_value("alice")
            ids = [a.get_attribute("data-id") for a in page.locator("#case-body article.item").all()]

            selected = 0
            for chunk, key in zip(targets, GRADES, strict=True):
                target = ids.index(chunk)
                for _ in range(target - selected):
                    page.keyboard.press("j")
                for _ in range(selected - target):
                    page.keyboard.press("k")
                page.keyboard.press(key)
                said = page.locator(f'article.item[data-id="{chunk}"] [data-role="said"]')
                expect(said).to_have_text(f"alice: {key}")
                selected = min(target + 1, len(ids) - 1)  # a judgment moves the selection on by one
            expect(page.locator("#status")).to_contain_text(f"saved: grade {GRADES[-1]} for {targets[-1]}")

            page.reload(wait_until="load")
            page.locator(f'#queue-list button[data-case-id="{case_id}"]').click(timeout=180_000)
            expect(page.locator("#query")).to_have_text(re.compile(".+"))
            for chunk, key in zip(targets, GRADES, strict=True):
                item = page.locator(f'article.item[data-id="{chunk}"]')
                expect(item.locator('[data-role="said"]')).to_have_text(f"alice: {key}")
                expect(item.locator(f'button[data-grade="{key}"]')).to_have_class("on")
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "label.png"), full_page=True)
        finally:
            browser.close()
    return errors, foreign
