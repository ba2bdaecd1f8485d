"""A small dynamic batcher: queries that arrive together are embedded in one model call.

Each caller hands its texts to `QueryBatcher.embed` and blocks. The first caller of a batch leads it: it
waits up to `wait_ms` for others to join (less if the batch fills up), then takes the model (the caller of
`encode` holds the urgent side of the priority lock) and, once it has it, takes every text that has arrived
meanwhile, up to `max_batch`. Callers that arrive while a batch is being encoded form the next one, so under
load batches grow by themselves and an idle model costs one query at most `wait_ms`. A caller that hands
several texts at once (a batch of its own, as the evaluation's) leads without waiting for company: it takes
whatever has arrived, and its batch costs no wait.

Results are the rows of one `encode` call over the batch: identical in value to one call per query up to
float rounding (padding to the batch's longest text is masked out by the model's attention).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import numpy as np


@dataclass
class _Request:
    texts: list[str]
    result: np.ndarray | None = None
    error: BaseException | None = None
    taken: bool = False  # in a batch that a leader is encoding
    done: bool = False


@dataclass
class QueryBatcher:
    encode: Callable[[list[str]], np.ndarray]  # one model call over all the texts, rows in input order
    hold: Callable[[], AbstractContextManager[object]]  # the model (the urgent side of its priority lock)
    max_batch: int = 16
    wait_ms: float = 2.0
    # Counters for tests and benchmarks: model calls made and texts embedded through them.
    calls: int = 0
    texts: int = 0
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _pending: list[_Request] = field(default_factory=list)
    _leading: bool = False

    def embed(self, texts: list[str]) -> np.ndarray:
        request = _Request(list(texts))
        if self.max_batch <= 1 or len(request.texts) >= self.max_batch:
            with self.hold():
                self._run([request])
            return self._outcome(request)
        with self._cond:
            self._pending.append(request)
            self._cond.notify_all()
        while True:
            with self._cond:
                while not request.done and (self._leading or request.taken):
                    self._cond.wait()
                if request.done:
                    return self._outcome(request)
                self._leading = True  # this caller leads the next batch
                # a batch of its own (several texts) does not wait for company
                wait_ms = self.wait_ms if len(request.texts) == 1 else 0.0
                deadline = time.monotonic() + wait_ms / 1000
                while self._pending_texts() < self.max_batch and (left := deadline - time.monotonic()) > 0:
                    self._cond.wait(left)
            self._lead()

    def _lead(self) -> None:
        """Take the model, then the batch (whatever arrived while waiting for the model joins it), and hand
        the leadership on before encoding, so the next batch gathers while this one runs."""
        batch: list[_Request] = []
        handed_on = False
        try:
            with self.hold():
                with self._cond:
                    batch = self._take()
                    self._leading = False
                    handed_on = True
                    self._cond.notify_all()
                if batch:
                    self._run(batch)
        finally:
            with self._cond:
                # Once handed on, the leadership is the next leader's: clearing it again here would let a
                # third caller lead beside it, and leaders would queue for the model one query each.
                if not handed_on:
                    self._leading = False
                for req in batch:
                    req.done = True
                self._cond.notify_all()

    def _take(self) -> list[_Request]:
        batch: list[_Request] = []
        count = 0
        while self._pending and (not batch or count + len(self._pending[0].texts) <= self.max_batch):
            req = self._pending.pop(0)
            req.taken = True
            batch.append(req)
            count += len(req.texts)
        return batch

    def _run(self, batch: list[_Request]) -> None:
        flat = [t for req in batch for t in req.texts]
        try:
            vectors = self.encode(flat)
        except Exception as exc:  # every caller of the batch sees the error of its call
            for req in batch:
                req.error = exc
            return
        self.calls += 1
        self.texts += len(flat)
        start = 0
        for req in batch:
            req.result = vectors[start : start + len(req.texts)]
            start += len(req.texts)

    def _pending_texts(self) -> int:
        return sum(len(req.texts) for req in self._pending)

    @staticmethod
    def _outcome(request: _Request) -> np.ndarray:
        if request.error is not None:
            raise request.error
        if request.result is None:
            raise RuntimeError("query batch finished without a result")
        return request.result
