"""Ingest on several worker threads, with a fake model: vectors and order as one thread's,
the shared tokenizer never entered by two threads at once, queries first, stopping, progress, errors, and
torch's per-thread intra-op counts (workers 1, queries their own)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from app.models.embedder import Embedder, EmbeddingInterrupted


class FakeModel:
    """A sentence-transformers stand-in. A text embeds as [len(prompt + text), 1, 0, 0] scaled to length 1,
    through `encode` (queries, one-worker ingest) or `preprocess` + `__call__` (worker slices).

    `preprocess` behaves like a Hugging Face fast tokenizer used from two threads at once: the second one
    in raises "Already borrowed". `__call__` records each model call's start ("p" passages, "q" queries go
    through `encode`), the torch thread count it ran at, how many calls overlapped, and can wait on `gate`.
    """

    def __init__(self, delay: float = 0.0, gate: threading.Event | None = None, fail_on: str = ""):
        self.delay = delay
        self.gate = gate
        self.fail_on = fail_on
        self.calls: list[str] = []
        self.threads_seen: dict[str, set[int]] = {"p": set(), "q": set()}
        self.active = 0
        self.max_active = 0
        self._in_tokenizer = 0
        self._guard = threading.Lock()

    def get_sentence_embedding_dimension(self) -> int:
        return 4

    def preprocess(self, texts: list[str], prompt: str | None = None) -> dict[str, torch.Tensor]:
        with self._guard:
            self._in_tokenizer += 1
            busy = self._in_tokenizer > 1
        try:
            if busy:
                raise RuntimeError("Already borrowed")
            time.sleep(0.001)  # room for a second thread to come in
            lengths = [float(len((prompt or "") + t)) for t in texts]
            return {"length": torch.tensor(lengths), "fail": torch.tensor([t == self.fail_on for t in texts])}
        finally:
            with self._guard:
                self._in_tokenizer -= 1

    def __call__(self, features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        with self._guard:
            self.calls.append("p")
            self.threads_seen["p"].add(torch.get_num_threads())
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            if self.gate is not None:
                self.gate.wait(10)
            time.sleep(self.delay)
            if bool(features["fail"].any()):
                raise ValueError("this passage breaks the model")
            n = features["length"]
            return {"sentence_embedding": torch.stack([n, torch.ones_like(n), 0 * n, 0 * n], dim=1)}
        finally:
            with self._guard:
                self.active -= 1

    def encode(self, texts, prompt=None, **_: object) -> np.ndarray:
        kind = "q" if prompt == "q: " else "p"
        with self._guard:
            self.calls.append(kind)
            self.threads_seen[kind].add(torch.get_num_threads())
        time.sleep(self.delay)
        vecs = np.array([[len((prompt or "") + t), 1.0, 0.0, 0.0] for t in texts], dtype=np.float32)
        return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


def embedder(model: FakeModel, workers: int, slice_ms: float = 250.0, query_threads: int | None = None):
    return Embedder(
        model, "fake", "0", 32, "q: ", "p: ", slice_ms, workers=workers, query_threads=query_threads
    )


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def expected(texts: list[str]) -> np.ndarray:
    # "p: " + text has len(text) + 3 characters
    vecs = np.array([[len(t) + 3, 1.0, 0.0, 0.0] for t in texts], dtype=np.float32)
    return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


def test_workers_give_the_vectors_of_one_thread_in_input_order() -> None:
    texts = ["a" * n for n in (3, 10, 1, 7, 5, 12, 2, 9)]
    one = embedder(FakeModel(), workers=1).embed_passages(texts)
    emb = embedder(FakeModel(), workers=3, slice_ms=1e-6)  # one passage a slice: 8 slices on 3 workers
    many = emb.embed_passages(texts)
    np.testing.assert_allclose(one, expected(texts), rtol=1e-6)
    np.testing.assert_allclose(many, expected(texts), rtol=1e-6)
    emb.close()  # the workers stop; the next ingest starts them again
    np.testing.assert_allclose(emb.embed_passages(texts[:2]), expected(texts[:2]), rtol=1e-6)
    emb.close()


def test_the_fake_tokenizer_raises_when_two_threads_use_it_at_once() -> None:
    # The check below is only worth something if the fake does fail when it is shared without a lock.
    model = FakeModel()
    errors: list[str] = []
    start = threading.Barrier(8)

    def tokenise() -> None:
        start.wait(5)
        for _ in range(20):
            try:
                model.preprocess(["some text"])
            except RuntimeError as exc:
                errors.append(str(exc))

    threads = [threading.Thread(target=tokenise) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert errors and set(errors) == {"Already borrowed"}


def test_eight_workers_run_the_model_at_once_but_never_the_tokenizer() -> None:
    model = FakeModel(delay=0.005)
    emb = embedder(model, workers=8, slice_ms=1e-6)
    texts = [f"passage {i} " * (1 + i % 7) for i in range(160)]
    out = emb.embed_passages(texts)  # "Already borrowed" would come out of here
    emb.close()
    np.testing.assert_allclose(out, expected(texts), rtol=1e-6)
    assert model.calls.count("p") == 160
    assert model.max_active > 1  # slices did run side by side


def test_a_query_waits_for_the_slices_in_progress_and_no_others() -> None:
    gate = threading.Event()
    model = FakeModel(gate=gate)
    emb = embedder(model, workers=2, slice_ms=1e-6)  # one passage a slice
    ingest = threading.Thread(target=emb.embed_passages, args=(["passage"] * 12,))
    ingest.start()
    deadline = time.monotonic() + 5
    while model.calls.count("p") < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    query = threading.Thread(target=emb.embed_queries, args=(["the query"],))
    query.start()
    time.sleep(0.1)  # the query now waits for the two slices in progress
    gate.set()
    query.join(5)
    ingest.join(5)
    emb.close()
    assert model.calls == ["p", "p", "q"] + ["p"] * 10


def test_should_stop_hands_out_no_more_slices_and_the_ones_in_flight_finish() -> None:
    model = FakeModel(delay=0.01)
    asked = {"n": 0}

    def stop() -> bool:
        asked["n"] += 1
        return asked["n"] > 2  # asked before each slice is handed out: two go, the third is refused

    emb = embedder(model, workers=2, slice_ms=1e-6)
    with pytest.raises(EmbeddingInterrupted) as info:
        emb.embed_passages(["x"] * 10, should_stop=stop)
    emb.close()
    assert (info.value.done, info.value.total) == (2, 10)
    assert model.calls == ["p", "p"]


def test_progress_is_reported_in_the_calling_thread_after_every_slice() -> None:
    seen: list[tuple[int, int, str]] = []
    emb = embedder(FakeModel(), workers=3, slice_ms=1e-6)
    emb.embed_passages(
        ["x"] * 7, on_progress=lambda d, t: seen.append((d, t, threading.current_thread().name))
    )
    emb.close()
    assert [(d, t) for d, t, _ in seen] == [(d, 7) for d in range(1, 8)]  # one passage a slice
    assert {name for _, _, name in seen} == {threading.current_thread().name}


def test_a_failing_slice_raises_after_the_others_in_flight_and_the_workers_stay_usable() -> None:
    model = FakeModel(fail_on="bad")
    emb = embedder(model, workers=2, slice_ms=1e-6)
    with pytest.raises(ValueError, match="this passage breaks the model"):
        emb.embed_passages(["good one", "bad", "fine"])
    np.testing.assert_allclose(emb.embed_passages(["ok"]), expected(["ok"]), rtol=1e-6)
    emb.close()


def test_workers_run_one_torch_thread_and_queries_keep_their_own_count() -> None:
    torch.set_num_threads(2)
    model = FakeModel()
    emb = embedder(model, workers=2, slice_ms=1e-6, query_threads=2)
    emb.embed_passages(["x"] * 6)
    emb.embed_queries(["q"])
    assert model.threads_seen == {"p": {1}, "q": {2}}
    assert torch.get_num_threads() == 2
    fresh: list[int] = []  # a thread that first runs torch after the workers started gets the query count
    t = threading.Thread(target=lambda: fresh.append(torch.get_num_threads()))
    t.start()
    t.join(5)
    assert fresh == [2]
    emb.close()


def test_one_worker_is_the_path_before_workers_one_thread_in_the_calling_thread() -> None:
    torch.set_num_threads(2)
    model = FakeModel()
    emb = embedder(model, workers=1, query_threads=2)
    emb.embed_passages(["x"] * 4)
    emb.embed_queries(["q"])
    assert model.threads_seen == {"p": {1}, "q": {2}}  # through `encode`, at one thread
    assert torch.get_num_threads() == 2  # restored after each slice


def test_workers_must_be_positive() -> None:
    with pytest.raises(ValueError, match="workers must be at least 1"):
        embedder(FakeModel(), workers=0)
