"""The real e5 model shared by concurrent queries (the dynamic batcher) and ingest on several torch threads:
vectors equal to one-by-one, one-thread embedding (cosine >= 0.9999 per row)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from app.models import ensure_e5_folder, load_embedder
from app.models.embedder import torch_threads
from app.settings import ModelsSettings

pytestmark = pytest.mark.integration

SHARED_CACHE = Path(__file__).resolve().parents[2] / "target" / "models"
THREADS = 8
PER_THREAD = 6
QUERIES = [
    "如何申请年假？",
    "报销款项多久到账？",
    "How do I reset my password?",
    "VPN connection fails when working from home",
    "Ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３ café",
    "what is the refund policy for orders over 50 euros, and who pays the return shipping?",
    "工资什么时候发",
    "a",
]


@pytest.fixture(scope="module")
def e5():
    ensure_e5_folder(SHARED_CACHE)
    return load_embedder(
        ModelsSettings(cache_dir=str(SHARED_CACHE), max_query_batch=16, query_batch_wait_ms=5.0)
    )


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a_i . b_i / (|a_i| |b_i|) per row."""
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_eight_threads_of_queries_get_the_vectors_of_one_by_one_embedding(e5) -> None:
    sequential = {q: e5.embed_queries([q])[0] for q in QUERIES}
    calls_before, texts_before = e5.query_batcher.calls, e5.query_batcher.texts
    got: dict[int, list[tuple[str, np.ndarray]]] = {t: [] for t in range(THREADS)}
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def client(slot: int) -> None:
        start.wait()
        try:
            for i in range(PER_THREAD):
                q = QUERIES[(slot + i) % len(QUERIES)]
                got[slot].append((q, e5.embed_queries([q])[0]))
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(slot,)) for slot in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors
    pairs = [pair for slot in range(THREADS) for pair in got[slot]]
    assert len(pairs) == THREADS * PER_THREAD
    batched = np.stack([v for _, v in pairs])
    one_by_one = np.stack([sequential[q] for q, _ in pairs])
    assert cosines(batched, one_by_one).min() >= 0.9999
    calls = e5.query_batcher.calls - calls_before
    assert e5.query_batcher.texts - texts_before == THREADS * PER_THREAD
    assert calls < THREADS * PER_THREAD  # queries that arrived together shared a model call


def test_ingest_slices_on_every_core_give_the_one_thread_vectors(e5) -> None:
    passages = [q * 5 for q in QUERIES]
    with torch_threads(1):
        before = e5.ingest_threads
        e5.ingest_threads = 1
        one = e5.embed_passages(passages)
        e5.ingest_threads = 4
        many = e5.embed_passages(passages)
        e5.ingest_threads = before
    assert cosines(one, many).min() >= 0.9999
