"""The real CrossEncoderScorer shared by concurrent requests: its one fast tokenizer is never used by two
threads at once (that fails with "Already borrowed"), and scores do not depend on what else is running.

With tokenizers 0.23 this run passes even without the lock (the collision window is narrow); the unit test
with a borrow-checking fake (tests/unit/test_reranker_windows.py) fails without the lock every time."""

from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from app.models import load_reranker
from app.settings import RerankSettings
from tests.fixtures.tiny_models import tiny_cross_encoder_dir  # noqa: F401  (a session fixture)

pytestmark = pytest.mark.integration

THREADS = 8
CALLS = 50
QUERIES = ["refund policy", "how do i reset my password", "annual leave request"]
PASSAGES = [
    "the refund policy is 30 days " * 20,  # longer than one window: tokenised for windows
    "password reset by email",
    "annual leave needs manager approve " * 12,
    "",
    "weather cat dog apple banana",
]


@pytest.fixture
def eager_thread_switching():
    """Switch threads every microsecond instead of every 5 ms, so unguarded shared state gets interleaved."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


@pytest.mark.usefixtures("eager_thread_switching")
def test_eight_threads_score_concurrently_without_error_and_as_sequentially(
    tiny_cross_encoder_dir: Path,  # noqa: F811
) -> None:
    reranker = load_reranker(
        RerankSettings(model=str(tiny_cross_encoder_dir), window_tokens=16, window_stride=8, batch_size=4)
    )
    assert reranker is not None
    expected = {q: reranker.score(q, PASSAGES) for q in QUERIES}
    start = threading.Barrier(THREADS)

    def worker(t: int) -> list[tuple[str, list[float]]]:
        start.wait()  # all threads begin together, so their calls overlap
        out = []
        for i in range(CALLS):
            query = QUERIES[(t + i) % len(QUERIES)]
            out.append((query, reranker.score(query, PASSAGES)))
        return out

    with ThreadPoolExecutor(THREADS) as pool:
        results = [r for chunk in pool.map(worker, range(THREADS)) for r in chunk]

    assert len(results) == THREADS * CALLS
    for query, scores in results:
        assert scores == expected[query]
