"""Issue 11 §3 pieces without a model: the ingest thread chooser, the progress line, slice threads."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from app.ingest.pipeline import _ProgressView, progress_line
from app.models.embedder import Embedder, ThreadChooser


def test_the_chooser_measures_each_candidate_first_then_runs_the_cheapest() -> None:
    chooser = ThreadChooser([1, 2], probe_every=100)
    assert chooser.next() == 2
    chooser.learn(2, ms=500.0, chars=1000)  # 500 ms per 1000 characters
    assert chooser.next() == 1
    chooser.learn(1, ms=300.0, chars=1000)
    assert [chooser.next() for _ in range(5)] == [1] * 5
    assert chooser.cost == {2: 500.0, 1: 300.0}


def test_the_chooser_reprobes_and_follows_a_machine_that_gets_quieter() -> None:
    chooser = ThreadChooser([2, 1], probe_every=4)
    chooser.next()
    chooser.learn(2, 600.0, 1000)
    chooser.next()
    chooser.learn(1, 300.0, 1000)
    picks = []
    for _ in range(40):
        threads = chooser.next()
        picks.append(threads)
        chooser.learn(threads, 150.0 if threads == 2 else 300.0, 1000)  # two threads got cheaper
    assert picks[:3] == [1, 2, 1]  # slice 4 (every 4th) re-measures two threads
    # two threads' average falls 600 -> 465 -> 370.5 -> 304.35 -> 258.0 (< 300) at the 4th probe, slice 16
    # (picks[i] is slice i + 3); from then on two threads, with a one-thread probe every 4th slice
    assert picks[13:] == [2] + [2 if slice_no % 4 else 1 for slice_no in range(17, 43)]
    assert chooser.best() == 2


def test_the_moving_average_is_0_7_old_plus_0_3_new() -> None:
    chooser = ThreadChooser([1])
    chooser.learn(1, 100.0, 1000)
    chooser.learn(1, 200.0, 2000)  # 100 ms per 1000 characters again
    chooser.learn(1, 400.0, 1000)
    assert chooser.cost[1] == pytest.approx(0.7 * (0.7 * 100 + 0.3 * 100) + 0.3 * 400)


class FakeModel:
    def __init__(self) -> None:
        self.threads_seen: list[int] = []

    def get_sentence_embedding_dimension(self) -> int:
        return 2

    def encode(self, texts, **_: object) -> np.ndarray:
        import torch

        self.threads_seen.append(torch.get_num_threads())
        return np.ones((len(texts), 2), dtype=np.float32) / np.sqrt(2)


def test_ingest_slices_run_on_their_thread_count_and_torch_is_restored_after() -> None:
    import torch

    before = torch.get_num_threads()
    model = FakeModel()
    emb = Embedder(model, "fake", "0", 32, "", "", 250.0, ingest_threads=3)
    emb.embed_passages(["x"] * 4)
    assert set(model.threads_seen) == {3}
    assert torch.get_num_threads() == before
    emb.embed_queries(["q"])
    assert model.threads_seen[-1] == before


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
