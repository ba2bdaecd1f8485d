"""Render a report JSON as the HTML page and screenshot it in headless Chromium (docs/report.png).

    python scripts/report_screenshot.py target/retrieval-eval/retrieval-eval-latest.json docs/report.png

Needs Debian's `chromium` and Playwright's Python package (the `test` extra); no `playwright install`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.evaluation.render.html import render_html  # noqa: E402
from app.evaluation.report.model import Report  # noqa: E402

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="a report JSON (<prefix>-latest.json)")
    parser.add_argument("output", type=Path, help="the PNG to write")
    parser.add_argument("--width", type=int, default=1240)
    parser.add_argument("--height", type=int, default=0, help="clip to this many pixels (0 = the whole page)")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    report = Report.model_validate_json(args.report.read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        page_path = Path(tmp) / "report.html"
        page_path.write_text(render_html(report), encoding="utf-8")
        browser = p.chromium.launch(executable_path=args.chromium, args=ARGS)
        page = browser.new_page(viewport={"width": args.width, "height": args.height or 900})
        page.goto(page_path.as_uri())
        clip = {"x": 0, "y": 0, "width": args.width, "height": args.height} if args.height else None
        page.screenshot(path=str(args.output), full_page=True, clip=clip)
        browser.close()
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
