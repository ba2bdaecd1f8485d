"""The report's files: `<output_dir>/<prefix>-<UTC timestamp>.{md,json,html}` plus
`<prefix>-latest.{md,json,html}`, each written with `app.files.atomic_write_text` (a reader never sees half a
report, files get the ordinary mode). Only the newest `keep_reports` timestamped sets are kept (the `-latest`
files are never pruned)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from app.evaluation.report.model import Report, report_text
from app.files import atomic_write_text, file_stamp
from app.settings import EvaluateSettings

log = logging.getLogger("sieve.evaluation")


def report_stamp() -> str:
    """The UTC timestamp in a report's file name (`<prefix>-<stamp>.json`)."""
    return file_stamp()


def write_reports(
    report: Report, settings: EvaluateSettings, markdown: str | None, stamp: str | None = None
) -> list[Path]:
    """Write the timestamped and the `-latest` files, then prune old timestamped sets down to
    `settings.keep_reports`; returns the paths written."""
    out = Path(settings.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = stamp or report_stamp()
    written: list[Path] = []
    payloads: list[tuple[str, str]] = []
    if settings.write_json:
        payloads.append(("json", report_text(report)))
    if settings.write_markdown and markdown is not None:
        payloads.append(("md", markdown))
    if settings.write_html:
        from app.evaluation.render.html import render_html  # Jinja2 is loaded only when a page is written

        try:
            payloads.append(("html", render_html(report)))
        except Exception:  # a rendering bug must not cost the JSON and Markdown reports
            log.exception("[RetrievalEval] the HTML report could not be rendered; JSON and Markdown written")
    for suffix, text in payloads:
        for name in (
            f"{settings.report_prefix}-{stamp}.{suffix}",
            f"{settings.report_prefix}-latest.{suffix}",
        ):
            path = out / name
            atomic_write_text(path, text)
            written.append(path)
    if settings.keep_reports is not None:
        for path in prune_reports(out, settings.report_prefix, settings.keep_reports):
            log.info("[RetrievalEval] pruned old report %s", path)
    return written


def prune_reports(directory: Path, prefix: str, keep: int) -> list[Path]:
    """Delete the timestamped report sets (`<prefix>-<YYYYmmddTHHMMSSZ>.json/.md/.html`) beyond the newest
    `keep` timestamps; the `-latest` files and anything else in the folder are never touched. Returns the
    paths deleted."""
    pattern = re.compile(rf"^{re.escape(prefix)}-(\d{{8}}T\d{{6}}Z)\.(json|md|html)$")
    by_stamp: dict[str, list[Path]] = {}
    for path in directory.iterdir():
        match = pattern.match(path.name)
        if match and path.is_file():
            by_stamp.setdefault(match.group(1), []).append(path)
    removed = []
    for stamp in sorted(by_stamp, reverse=True)[keep:]:
        for path in sorted(by_stamp[stamp]):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed
