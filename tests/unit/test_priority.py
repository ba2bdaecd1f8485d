"""The priority lock and sliced embedding on one worker, with a fake model (workers: test_embed_workers)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from app.models.embedder import Embedder, EmbeddingInterrupted
from app.models.priority import PriorityLock


class FakeModel:
    """Encodes a text as [len(text), 1, 0, ...] normalised; records every call and can be made slow."""

    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.calls: list[tuple[str | None, list[str]]] = []

    def get_sentence_embedding_dimension(self) -> int:
        return 4

    def encode(self, texts, prompt=None, **_: object) -> np.ndarray:
        self.calls.append((prompt, list(texts)))
        time.sleep(self.delay)
        vecs = np.array([[len(t), 1.0, 0.0, 0.0] for t in texts], dtype=np.float32)
        return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


def embedder(model: FakeModel, slice_ms: float = 250.0, batch_size: int = 32) -> Embedder:
    return Embedder(model, "fake", "0", batch_size, "q: ", "p: ", slice_ms)


def test_passages_come_back_in_input_order_whatever_the_slicing() -> None:
    texts = ["a" * n for n in (3, 10, 1, 7, 5)]
    out = embedder(FakeModel()).embed_passages(texts)
    expected = np.array([[n, 1, 0, 0] for n in (3, 10, 1, 7, 5)], dtype=np.float32)
    np.testing.assert_allclose(out, expected / np.linalg.norm(expected, axis=1, keepdims=True), rtol=1e-6)


def test_the_first_slice_is_one_passage_then_slices_fit_the_time_budget() -> None:
    model = FakeModel(delay=0.01)  # 10 ms a call: about 10 ms a passage for single-passage slices
    emb = embedder(model, slice_ms=50.0)
    emb.embed_passages(["x"] * 40)
    sizes = [len(texts) for _, texts in model.calls]
    assert sizes[0] == 1
    assert sum(sizes) == 40
    assert max(sizes) <= 32 and max(sizes) > 1


def test_progress_is_reported_after_every_slice() -> None:
    seen: list[tuple[int, int]] = []
    embedder(FakeModel()).embed_passages(["x"] * 5, on_progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (5, 5)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_should_stop_interrupts_between_slices() -> None:
    model = FakeModel()
    calls = {"n": 0}

    def stop() -> bool:
        calls["n"] += 1
        return calls["n"] > 2  # two slices run, the third is refused

    with pytest.raises(EmbeddingInterrupted) as info:
        embedder(model, slice_ms=1e-6).embed_passages(["x"] * 10, should_stop=stop)
    assert (info.value.done, info.value.total) == (2, 10)
    assert len(model.calls) == 2


def test_a_query_waits_for_at_most_the_slice_in_progress() -> None:
    # Each model call takes 50 ms; slices are one passage (slice budget below one call). A query sent while
    # the ingest runs must be the very next model call after the slice in progress.
    model = FakeModel(delay=0.05)
    emb = embedder(model, slice_ms=1.0)
    ingest = threading.Thread(target=emb.embed_passages, args=(["passage"] * 20,))
    ingest.start()
    time.sleep(0.12)  # the ingest is inside its third slice
    calls_before = len(model.calls)
    emb.embed_queries(["the query"])
    ingest.join()
    prompts = [prompt for prompt, _ in model.calls]
    assert prompts.index("q: ") <= calls_before  # at most the slice in progress ran before it
    assert prompts.count("p: ") == 20


def test_background_waits_while_an_urgent_caller_waits() -> None:
    lock = PriorityLock()
    order: list[str] = []
    holder_in = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with lock.background():
            holder_in.set()
            release.wait(5)
            order.append("first background")

    def background() -> None:
        with lock.background():
            order.append("background")

    def urgent() -> None:
        with lock.urgent():
            order.append("urgent")

    first = threading.Thread(target=hold)
    first.start()
    holder_in.wait(5)
    waiting_bg = threading.Thread(target=background)
    waiting_bg.start()
    time.sleep(0.05)
    waiting_urgent = threading.Thread(target=urgent)
    waiting_urgent.start()
    time.sleep(0.05)
    release.set()
    for t in (first, waiting_bg, waiting_urgent):
        t.join(5)
    assert order == ["first background", "urgent", "background"]


def test_background_slots_let_that_many_slices_in_and_an_urgent_caller_waits_for_all_of_them() -> None:
    lock = PriorityLock(background_slots=2)
    order: list[str] = []
    both_in = threading.Barrier(3)
    release = threading.Event()

    def slice_(name: str) -> None:
        with lock.background():
            both_in.wait(5)  # two background holders at once, or this times out
            release.wait(5)
            order.append(name)

    def third_slice() -> None:
        with lock.background():
            order.append("third slice")

    def urgent() -> None:
        with lock.urgent():
            order.append("urgent")

    slices = [threading.Thread(target=slice_, args=(f"slice {i}",)) for i in (1, 2)]
    for t in slices:
        t.start()
    both_in.wait(5)
    waiting_urgent = threading.Thread(target=urgent)
    waiting_urgent.start()
    time.sleep(0.05)
    waiting_bg = threading.Thread(target=third_slice)  # a free slot, but an urgent caller waits
    waiting_bg.start()
    time.sleep(0.05)
    assert order == []
    release.set()
    for t in (*slices, waiting_urgent, waiting_bg):
        t.join(5)
    assert sorted(order[:2]) == ["slice 1", "slice 2"]
    assert order[2:] == ["urgent", "third slice"]


def test_background_slots_must_be_positive() -> None:
    with pytest.raises(ValueError, match="background_slots must be at least 1"):
        PriorityLock(background_slots=0)


def test_urgent_slots_let_that_many_urgent_holders_in_never_beside_a_slice() -> None:
    lock = PriorityLock(background_slots=1, urgent_slots=2)
    order: list[str] = []
    both_in = threading.Barrier(3)
    release = threading.Event()

    def query(name: str) -> None:
        with lock.urgent():
            both_in.wait(5)  # two urgent holders at once, or this times out
            release.wait(5)
            order.append(name)

    def third_query() -> None:
        with lock.urgent():
            order.append("third query")

    def slice_() -> None:
        with lock.background():
            order.append("slice")

    queries = [threading.Thread(target=query, args=(f"query {i}",)) for i in (1, 2)]
    for t in queries:
        t.start()
    both_in.wait(5)
    waiting_query = threading.Thread(target=third_query)  # both slots taken: it waits
    waiting_query.start()
    time.sleep(0.05)
    waiting_slice = threading.Thread(target=slice_)  # urgent holders in and one waiting: it waits
    waiting_slice.start()
    time.sleep(0.05)
    assert order == []
    release.set()
    for t in (*queries, waiting_query, waiting_slice):
        t.join(5)
    # the third query got a slot only when one of the first two left; the slice waited for all three
    assert order[0] in ("query 1", "query 2")
    assert sorted(order[:3]) == ["query 1", "query 2", "third query"]
    assert order[3] == "slice"


def test_an_urgent_caller_waits_for_the_slice_in_progress_whatever_its_free_slots() -> None:
    lock = PriorityLock(urgent_slots=4)
    order: list[str] = []
    slice_in = threading.Event()
    release = threading.Event()

    def slice_() -> None:
        with lock.background():
            slice_in.set()
            release.wait(5)
            order.append("slice")

    def query() -> None:
        with lock.urgent():
            order.append("query")

    first = threading.Thread(target=slice_)
    first.start()
    slice_in.wait(5)
    waiting = threading.Thread(target=query)
    waiting.start()
    time.sleep(0.05)
    assert order == []
    release.set()
    for t in (first, waiting):
        t.join(5)
    assert order == ["slice", "query"]


def test_urgent_slots_must_be_positive() -> None:
    with pytest.raises(ValueError, match="urgent_slots must be at least 1"):
        PriorityLock(urgent_slots=0)
