"""The real e5 model shared by concurrent queries (the dynamic batcher) and ingest on several workers:
vectors equal to one-by-one, one-thread embedding (cosine >= 0.9999 per row)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from app.models import ensure_e5_folder, load_embedder
from app.models.embedder import Embedder, configure_torch_threads, usable_cores
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
    assert e5.query_slots == max(1, usable_cores() // configure_torch_threads())  # the default, 0 = auto
    eight_threads_of_queries(e5)


def test_eager_queries_in_two_slots_run_two_model_calls_at_once_with_the_one_by_one_vectors() -> None:
    """Untraced queries, two model calls at once. They tokenise under the embedder's lock (`_encode_split`),
    as ingest workers do, rather than in `model.encode`: the fast tokenizer can fail with "Already
    borrowed" when two threads use it at once (not seen in this test without the lock, which it cannot
    prove absent)."""
    ensure_e5_folder(SHARED_CACHE)
    eager = load_embedder(
        ModelsSettings(
            cache_dir=str(SHARED_CACHE),
            max_query_batch=2,
            query_batch_wait_ms=0.0,
            trace_queries=False,
            query_slots=2,
        )
    )
    assert eager.query_model is None and eager.query_slots == 2
    encode, busy, most, count = eager.query_batcher.encode, [0], [0], threading.Lock()

    def counted(texts: list[str]) -> np.ndarray:
        with count:
            busy[0] += 1
            most[0] = max(most[0], busy[0])
        try:
            return encode(texts)
        finally:
            with count:
                busy[0] -= 1

    eager.query_batcher.encode = counted
    eight_threads_of_queries(eager)
    assert most[0] == 2  # two model calls ran at once, never three


def eight_threads_of_queries(e5: Embedder) -> None:
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


def test_ingest_workers_give_the_one_thread_vectors(e5) -> None:
    # The same model and tokenizer behind a one-worker embedder (one slice at a time) and a
    # four-worker one with one-passage slices, so that the workers tokenise and run the model side by side.
    passages = [q * 5 for q in QUERIES]
    one = Embedder(e5.model, e5.name, e5.checksum, 32, e5.query_prompt, e5.passage_prompt, workers=1)
    many = Embedder(
        e5.model, e5.name, e5.checksum, 32, e5.query_prompt, e5.passage_prompt, slice_ms=1e-6, workers=4
    )
    try:
        assert cosines(one.embed_passages(passages), many.embed_passages(passages)).min() >= 0.9999
    finally:
        many.close()


def test_eight_threads_of_ingest_and_queries_on_eight_workers_get_the_sequential_vectors(e5) -> None:
    # 8 client threads x 4 calls of 3 passages each, beside queries, on 8 workers of one real model: its
    # one fast tokenizer is used by every worker (tokenised under a lock), and nothing raises
    # ("Already borrowed") or mixes rows up.
    shared = Embedder(
        e5.model,
        e5.name,
        e5.checksum,
        32,
        e5.query_prompt,
        e5.passage_prompt,
        slice_ms=1e-6,
        workers=8,
        max_query_batch=16,
        query_batch_wait_ms=2.0,
    )
    texts = [f"{q} ({i})" for i, q in enumerate(QUERIES * 4)]
    sequential = dict(zip(texts, e5.embed_passages(texts), strict=True))
    query_one_by_one = {q: e5.embed_queries([q])[0] for q in QUERIES}
    got: list[tuple[str, np.ndarray]] = []
    got_queries: list[tuple[str, np.ndarray]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS + 1)

    def ingest_client(slot: int) -> None:
        start.wait()
        try:
            for call in range(4):
                mine = [texts[(slot * 4 + call + k * 11) % len(texts)] for k in range(3)]
                got.extend(zip(mine, shared.embed_passages(mine), strict=True))
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    def query_client() -> None:
        start.wait()
        try:
            for q in QUERIES:
                got_queries.append((q, shared.embed_queries([q])[0]))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=ingest_client, args=(slot,)) for slot in range(THREADS)]
    threads.append(threading.Thread(target=query_client))
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
    finally:
        shared.close()
    assert not errors
    assert len(got) == THREADS * 4 * 3 and len(got_queries) == len(QUERIES)
    batched = np.stack([v for _, v in got])
    alone = np.stack([sequential[t] for t, _ in got])
    assert cosines(batched, alone).min() >= 0.9999
    queries = np.stack([v for _, v in got_queries])
    assert cosines(queries, np.stack([query_one_by_one[q] for q, _ in got_queries])).min() >= 0.9999
