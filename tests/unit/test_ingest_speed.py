"""Ingest progress without a model: the progress line and view (ingest workers: test_embed_workers.py)."""

from __future__ import annotations

import logging

import pytest

from app.ingest.pipeline import _ProgressView, progress_line


@pytest.mark.parametrize(
    ("done", "total", "seconds", "expected"),
    [
        (1024, 17986, 80.0, "chunks 1024/17986 (5.7%), documents 3/9, 12.8 chunks/s, ETA 22m05s"),
        (0, 10, 5.0, "chunks 0/10 (0.0%), documents 3/9, 0.0 chunks/s, ETA ?"),
        (10, 10, 2.0, "chunks 10/10 (100.0%), documents 3/9, 5.0 chunks/s, ETA 0m00s"),
    ],
)
def test_progress_line_rate_and_eta(done: int, total: int, seconds: float, expected: str) -> None:
    # rate = 1024 / 80 = 12.8 chunks/s; ETA = (17986 - 1024) / 12.8 = 1325.2 s = 22 min 5 s
    assert progress_line(done, total, "3/9", seconds) == f"ingest progress: {expected}"


def test_documents_are_done_once_their_last_new_chunk_is_embedded() -> None:
    view = _ProgressView("off", 6, ["a", "a", "b", "c", "c", "c"], every=10.0)
    assert [view.documents_done(n) for n in range(7)] == [0, 0, 1, 2, 2, 2, 3]


def test_the_log_view_writes_a_line_at_most_every_interval(caplog, monkeypatch) -> None:
    clock = {"now": 100.0}
    monkeypatch.setattr("app.ingest.pipeline.time.monotonic", lambda: clock["now"])
    with caplog.at_level(logging.INFO, logger="app.ingest.pipeline"):
        view = _ProgressView("log", 300, [f"d{i}" for i in range(300)], every=10.0)
        for step in range(1, 31):
            clock["now"] += 1.0
            view.update(step * 10)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ingest progress")]
    assert len(lines) == 3  # at 10, 20 and 30 s
    assert lines[0] == "ingest progress: chunks 100/300 (33.3%), documents 100/300, 10.0 chunks/s, ETA 0m20s"
