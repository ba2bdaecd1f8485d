"""The dynamic query batcher, with a fake encoder (no torch): results, batching, limits and errors."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.models.batcher import QueryBatcher
from app.models.priority import PriorityLock


def vector(text: str) -> list[float]:
    return [float(len(text)), float(sum(map(ord, text)) % 97), 1.0]


class FakeEncoder:
    """Encodes each text independently; records the size of every call and can be slow."""

    def __init__(self, delay: float = 0.0, fail_on: str | None = None):
        self.delay = delay
        self.fail_on = fail_on
        self.sizes: list[int] = []
        self.busy = 0
        self.overlaps = 0
        self.most = 0  # the most calls in progress at once
        self._count = threading.Lock()

    def __call__(self, texts: list[str]) -> np.ndarray:
        with self._count:
            self.busy += 1
            self.most = max(self.most, self.busy)
            if self.busy > 1:
                self.overlaps += 1
        try:
            self.sizes.append(len(texts))
            time.sleep(self.delay)
            if self.fail_on is not None and self.fail_on in texts:
                raise ValueError(f"cannot encode {self.fail_on!r}")
            return np.array([vector(t) for t in texts], dtype=np.float32).reshape(len(texts), 3)
        finally:
            with self._count:
                self.busy -= 1


def run_concurrently(batcher: QueryBatcher, requests: list[list[str]]) -> list[np.ndarray | Exception]:
    out: list[np.ndarray | Exception] = [np.zeros(0)] * len(requests)
    start = threading.Barrier(len(requests))

    def call(i: int) -> None:
        start.wait()
        try:
            out[i] = batcher.embed(requests[i])
        except Exception as exc:  # noqa: BLE001 - handed back to the test
            out[i] = exc

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_one_caller_gets_its_own_vectors_in_one_call() -> None:
    encoder = FakeEncoder()
    batcher = QueryBatcher(encoder, nullcontext, max_batch=8, wait_ms=0.0)
    np.testing.assert_array_equal(batcher.embed(["ab", "c"]), np.array([vector("ab"), vector("c")]))
    assert encoder.sizes == [2]


def test_concurrent_callers_share_model_calls_and_each_gets_its_own_rows() -> None:
    encoder = FakeEncoder(delay=0.02)
    lock = PriorityLock()
    batcher = QueryBatcher(encoder, lock.urgent, max_batch=8, wait_ms=5.0)
    requests = [[f"query {i}" * (i + 1)] for i in range(16)]
    out = run_concurrently(batcher, requests)
    for req, got in zip(requests, out, strict=True):
        np.testing.assert_array_equal(got, np.array([vector(t) for t in req]))
    assert sum(encoder.sizes) == 16
    assert len(encoder.sizes) < 16  # some calls embedded several queries
    assert max(encoder.sizes) <= 8
    assert encoder.overlaps == 0  # one model call at a time
    assert (batcher.calls, batcher.texts) == (len(encoder.sizes), 16)


def test_with_two_query_slots_two_batches_run_at_once_and_never_three() -> None:
    encoder = FakeEncoder(delay=0.05)
    lock = PriorityLock(urgent_slots=2)
    batcher = QueryBatcher(encoder, lock.urgent, max_batch=4, wait_ms=5.0)
    requests = [[f"query {i}" * (i + 1)] for i in range(24)]
    out = run_concurrently(batcher, requests)
    for req, got in zip(requests, out, strict=True):
        np.testing.assert_array_equal(got, np.array([vector(t) for t in req]))
    assert sum(encoder.sizes) == 24 and max(encoder.sizes) <= 4
    assert encoder.most == 2  # a second batch was encoded while the first ran, and no third beside them
    assert (batcher.calls, batcher.texts) == (len(encoder.sizes), 24)


def test_a_request_with_max_batch_texts_or_more_goes_alone() -> None:
    encoder = FakeEncoder()
    batcher = QueryBatcher(encoder, nullcontext, max_batch=4, wait_ms=50.0)
    started = time.perf_counter()
    assert batcher.embed(["a"] * 6).shape == (6, 3)
    assert encoder.sizes == [6] and time.perf_counter() - started < 0.05


def test_max_batch_one_never_batches() -> None:
    encoder = FakeEncoder(delay=0.005)
    batcher = QueryBatcher(encoder, threading.Lock, max_batch=1, wait_ms=5.0)
    run_concurrently(batcher, [["q"] for _ in range(6)])
    assert encoder.sizes == [1] * 6


def test_an_error_reaches_every_caller_of_that_batch_and_only_them() -> None:
    encoder = FakeEncoder(delay=0.01, fail_on="bad")
    batcher = QueryBatcher(encoder, threading.Lock, max_batch=64, wait_ms=20.0)
    out = run_concurrently(batcher, [["bad"], ["good"], ["fine"]])
    failed = [o for o in out if isinstance(o, Exception)]
    assert failed and all(isinstance(o, ValueError) for o in failed)
    # the batcher keeps working after a failed batch
    np.testing.assert_array_equal(batcher.embed(["again"]), np.array([vector("again")]))


def test_an_idle_model_costs_one_query_at_most_the_wait() -> None:
    batcher = QueryBatcher(FakeEncoder(), nullcontext, max_batch=8, wait_ms=30.0)
    started = time.perf_counter()
    batcher.embed(["alone"])
    took = time.perf_counter() - started
    assert 0.03 <= took < 0.5


def test_a_request_of_several_texts_does_not_wait_for_company() -> None:
    encoder = FakeEncoder()
    batcher = QueryBatcher(encoder, nullcontext, max_batch=8, wait_ms=200.0)
    started = time.perf_counter()
    assert batcher.embed(["a", "b", "c"]).shape == (3, 3)
    assert encoder.sizes == [3] and time.perf_counter() - started < 0.15


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=5), min_size=1, max_size=8),
    st.integers(1, 6),
)
def test_every_caller_gets_exactly_its_rows_whatever_the_batching(requests, max_batch) -> None:
    encoder = FakeEncoder()
    batcher = QueryBatcher(encoder, threading.Lock, max_batch=max_batch, wait_ms=1.0)
    out = run_concurrently(batcher, requests)
    for req, got in zip(requests, out, strict=True):
        np.testing.assert_array_equal(got, np.array([vector(t) for t in req], dtype=np.float32))
    assert sum(encoder.sizes) == sum(map(len, requests))
    # a call is one request of max_batch texts or more, or at most max_batch texts
    big = {len(r) for r in requests if len(r) >= max_batch}
    assert all(size <= max_batch or size in big for size in encoder.sizes)


@pytest.mark.parametrize("max_batch", [2, 3])
def test_batches_never_exceed_max_batch_texts_for_small_requests(max_batch: int) -> None:
    encoder = FakeEncoder(delay=0.01)
    batcher = QueryBatcher(encoder, threading.Lock, max_batch=max_batch, wait_ms=10.0)
    run_concurrently(batcher, [["q"] for _ in range(9)])
    assert max(encoder.sizes) <= max_batch and sum(encoder.sizes) == 9


class GatedEncoder:
    """Each call blocks until the test opens its gate; records the texts of every call."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.gates: list[threading.Event] = []
        self._cond = threading.Condition()

    def __call__(self, texts: list[str]) -> np.ndarray:
        gate = threading.Event()
        with self._cond:
            self.calls.append(list(texts))
            self.gates.append(gate)
            self._cond.notify_all()
        assert gate.wait(10), "the test never opened this call's gate"
        return np.array([vector(t) for t in texts], dtype=np.float32).reshape(len(texts), 3)

    def wait_for_call(self, n: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.calls) >= n, 10), f"no model call {n}"


class FifoLock:
    """The model, granted in the order it was asked for (so which waiting leader goes next is fixed), each
    grant taking `grant_s` (a model that is slow to hand over: the caller that released it runs on)."""

    def __init__(self, grant_s: float = 0.0) -> None:
        self.grant_s = grant_s
        self._cond = threading.Condition()
        self._queue: list[object] = []
        self._held = False

    def waiting(self) -> int:
        with self._cond:
            return len(self._queue)

    @contextmanager
    def hold(self) -> Iterator[None]:
        me = object()
        with self._cond:
            self._queue.append(me)
            self._cond.wait_for(lambda: not self._held and self._queue[0] is me)
            self._queue.pop(0)
            self._held = True
        time.sleep(self.grant_s)
        try:
            yield
        finally:
            with self._cond:
                self._held = False
                self._cond.notify_all()


def test_a_caller_whose_query_was_embedded_returns_without_leading_another_call() -> None:
    # a's call runs; b arrives and leads the next batch (waiting for the model); c joins b's batch. When a's
    # call ends, a must not hand the lead on again: clearing the flag b holds would make c a second leader,
    # queued for the model although b's batch took c's query; c's vector would be ready after b's call,
    # but c would wait for a third call (d's) before it could answer. Under 8 HTTP clients that makes
    # queries wait for other queries' calls, and almost every model call embeds one query.
    encoder, model = GatedEncoder(), FifoLock(grant_s=0.1)
    batcher = QueryBatcher(encoder, model.hold, max_batch=16, wait_ms=0.0)
    got: dict[str, np.ndarray] = {}

    def start(text: str) -> threading.Thread:
        thread = threading.Thread(target=lambda: got.update({text: batcher.embed([text])}))
        thread.start()
        return thread

    def until(condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 10
        while not condition():
            assert time.monotonic() < deadline, "the batcher never got there"
            time.sleep(0.005)

    a = start("a")
    encoder.wait_for_call(1)
    b = start("b")
    until(lambda: model.waiting() == 1)  # b leads the next batch and waits for the model
    c = start("c")
    until(lambda: len(batcher._pending) == 2)  # c waits to join b's batch
    encoder.gates[0].set()
    encoder.wait_for_call(2)
    a.join(5)
    assert encoder.calls[:2] == [["a"], ["b", "c"]]
    d = start("d")
    until(lambda: model.waiting() >= 1)  # d leads the third call and waits for the model
    time.sleep(0.1)  # (a second leader c would be queued for the model here, ahead of d)
    encoder.gates[1].set()
    b.join(5)
    c.join(5)
    assert not c.is_alive(), "c's vector was ready after the second call, but c waited for a third"
    encoder.wait_for_call(3)
    assert encoder.calls[2] == ["d"]
    encoder.gates[2].set()
    d.join(5)
    for text in "abcd":
        np.testing.assert_array_equal(got[text], np.array([vector(text)], dtype=np.float32))
    assert len(encoder.calls) == 3
