"""Report files: ordinary permissions, atomic, and only the newest timestamped sets kept."""

from __future__ import annotations

import os
import stat

from app import files
from app.evaluation.render.files import prune_reports, write_reports
from app.evaluation.report.model import Report, RunInfo
from app.settings import EvaluateSettings

REPORT = Report(run=RunInfo(k=5))


def test_reports_get_the_ordinary_mode_honouring_the_umask(tmp_path) -> None:
    old = os.umask(0o027)
    try:
        paths = write_reports(REPORT, EvaluateSettings(output_dir=str(tmp_path)), "# md\n")
    finally:
        os.umask(old)
    assert paths
    for path in paths:
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~0o027
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_prune_keeps_the_newest_sets_and_never_the_latest_files(tmp_path) -> None:
    stamps = [f"20261201T0000{i:02d}Z" for i in range(5)]
    for s in stamps:
        (tmp_path / f"retrieval-eval-{s}.json").write_text("{}")
        (tmp_path / f"retrieval-eval-{s}.md").write_text("")
    for name in (
        "retrieval-eval-latest.json",
        "retrieval-eval-latest.md",
        "other-20260101T000000Z.json",
        "notes.txt",
    ):
        (tmp_path / name).write_text("")
    removed = prune_reports(tmp_path, "retrieval-eval", 2)
    assert sorted(p.name for p in removed) == sorted(
        f"retrieval-eval-{s}.{ext}" for s in stamps[:3] for ext in ("json", "md")
    )
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(
        [f"retrieval-eval-{s}.{ext}" for s in stamps[3:] for ext in ("json", "md")]
        + [
            "retrieval-eval-latest.json",
            "retrieval-eval-latest.md",
            "other-20260101T000000Z.json",
            "notes.txt",
        ]
    )


def test_write_reports_prunes_to_keep_reports(tmp_path, monkeypatch) -> None:
    for i in range(3):
        (tmp_path / f"retrieval-eval-2026010{i + 1}T000000Z.json").write_text("{}")
    write_reports(
        REPORT,
        EvaluateSettings(output_dir=str(tmp_path), keep_reports=2, write_markdown=False, write_html=False),
        None,
    )
    stamped = sorted(p.name for p in tmp_path.iterdir() if "latest" not in p.name)
    assert len(stamped) == 2 and stamped[0] == "retrieval-eval-20260103T000000Z.json"
    assert files.ordinary_file_mode() == 0o666 & ~_umask()


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
