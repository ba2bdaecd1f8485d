"""Readiness of the store, for `/ready`: the store's heartbeat, cached for at most `MAX_AGE_S`, and the
failures the store recorded on the calls it made for requests.

An orchestrator polls `/ready` often; the cache keeps that from becoming a stream of heartbeats, and the short
age keeps the answer honest: a store that went away turns `/ready` into a 503 within about a second, and
one that came back turns it into a 200 again. `/ready` answers from the event loop (`problem_soon`): the
heartbeat runs in a thread of its own, never in the worker threads the retrievals hold.

A disk below `rag.store.min_free_mb` (`StoreProbe.space`, app/store/space.py) makes `/ready` a 503 saying so
within the heartbeat's age; the store is not called while it lasts.

A store can answer its heartbeat and still fail the reads or writes of a collection (a Chroma server whose
compactor broke on a record answers its heartbeat, refuses every write to that collection and, once they must
apply its log, every read; a restart does not heal it). A store that records its failures (`FailureLog`,
`ChromaStore`) is therefore also asked for them: any recorded failure makes `/ready` a 503 at once, naming the
store, since when its reads or writes fail and why. While one is recorded, each heartbeat also re-tries that
kind of call, cheaply, at most every `RECHECK_S` (a count for reads; a scratch record written and deleted for
writes): a success clears the failure, so `/ready` heals when the store does, without waiting for a request.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from app.store import FailureKind, StoreFailedError, StoreFailure, StoreUnavailableError

MAX_AGE_S = 1.0
# how long /ready waits for a heartbeat under way before it answers with the last one (it answers from
# the event loop, so it must answer quickly however busy the store or the machine is)
WAIT_S = 0.05
# ... and how long when there is no last answer (startup makes one before /ready can say 200)
FIRST_WAIT_S = 2.0
# while a failure is recorded, how often at most a heartbeat re-tries that kind of call
RECHECK_S = 3.0


class Heartbeat(Protocol):
    def heartbeat(self) -> None: ...


@runtime_checkable
class FailureLog(Protocol):
    """A store that records the failures of its reads and writes (`ChromaStore`)."""

    description: str

    def failures(self) -> list[StoreFailure]: ...

    def recheck(self, kind: FailureKind) -> None: ...


def failure_reason(store: FailureLog, failures: list[StoreFailure]) -> str:
    """`/ready`'s reason for recorded failures: "vector store <description>: writes fail since <when>:
    <why>; run `sieve store check`"."""
    states = "; ".join(failure.describe() for failure in failures)
    return f"vector store {store.description}: {states}; run `sieve store check`"


class StoreProbe:
    def __init__(
        self,
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
        recheck_s: float = RECHECK_S,
    ):
        self.max_age_s = max_age_s
        self.recheck_s = recheck_s
        self._clock = clock
        self._lock = threading.Lock()  # guards the fields below; never held during a heartbeat
        self._checked: tuple[int, float, str | None] | None = None  # (id of store, when, problem)
        self._running: tuple[int, Future[str | None]] | None = None  # the heartbeat under way
        self._rechecked: dict[tuple[int, FailureKind], float] = {}  # (id of store, kind) -> when
        # why writes cannot be made now (a full disk: `SpaceGuard.problem`), asked before each heartbeat
        self.space: Callable[[], str | None] | None = None

    def problem(self, store: Heartbeat) -> str | None:
        """None when `store` answered its heartbeat within the last `max_age_s` seconds and has no failure
        recorded, else why not. One heartbeat at a time: concurrent callers wait for it and share its
        answer."""
        found = self._lookup(store, start_thread=False)
        if found.check is None:
            return found.answer or recorded_problem(store)
        if found.owner:
            self._beat(store, found.check)
        return found.check.result() or recorded_problem(store)

    async def problem_soon(self, store: Heartbeat, wait_s: float = WAIT_S) -> str | None:
        """`problem` for the event loop, which must not wait on a store: the cached answer while it is
        fresh; otherwise a heartbeat in a thread of its own (one at a time, shared), waited for at most
        `wait_s`. Past that, the last answer for this store stands (the heartbeat goes on, and its answer
        serves the next call); with no answer yet, the heartbeat is waited for up to `FIRST_WAIT_S`. A
        failure the store recorded since is said at once (reading it takes no call to the store)."""
        found = self._lookup(store, start_thread=True)
        if found.check is None:
            return found.answer or recorded_problem(store)
        try:
            answer = await asyncio.wait_for(
                asyncio.shield(asyncio.wrap_future(found.check)), wait_s if found.known else FIRST_WAIT_S
            )
        except TimeoutError:
            if not found.known:
                return "vector store check pending: no heartbeat answer yet"
            answer = found.answer
        return answer or recorded_problem(store)

    def _lookup(self, store: Heartbeat, start_thread: bool) -> _Lookup:
        """The cached answer when fresh; else the heartbeat to wait for (already under way, or started
        here: in a thread of its own with `start_thread`, else by the caller) and the last answer."""
        with self._lock:
            now = self._clock()
            known, answer = False, None
            if self._checked is not None:
                store_id, when, problem = self._checked
                if store_id == id(store):
                    if now - when < self.max_age_s:
                        return _Lookup(True, problem, None)
                    known, answer = True, problem
            if self._running is not None and self._running[0] == id(store):
                return _Lookup(known, answer, self._running[1])
            future: Future[str | None] = Future()
            self._running = (id(store), future)
        if start_thread:
            threading.Thread(
                target=self._beat, args=(store, future), name="sieve-store-probe", daemon=True
            ).start()
        return _Lookup(known, answer, future, owner=not start_thread)

    def _beat(self, store: Heartbeat, future: Future[str | None]) -> None:
        problem = self._check(store)
        with self._lock:
            self._checked = (id(store), self._clock(), problem)
            if self._running is not None and self._running[1] is future:
                self._running = None
        future.set_result(problem)

    def _check(self, store: Heartbeat) -> str | None:
        """The heartbeat; then, for a `FailureLog`, the kinds of call it records failing re-tried (each at
        most every `recheck_s`) and what is still recorded. A disk below its reserve is the answer by
        itself (`space`): nothing is asked of the store then, not even a read."""
        if self.space is not None and (problem := self.space()) is not None:
            return problem
        try:
            store.heartbeat()
        except StoreUnavailableError as exc:
            return f"vector store unavailable: {exc}"
        except StoreFailedError as exc:
            if not isinstance(store, FailureLog):
                return f"vector store failing: {exc}"
        except Exception as exc:  # a probe answers; whatever went wrong is the reason
            return f"vector store check failed: {type(exc).__name__}: {exc}"
        if not isinstance(store, FailureLog):
            return None
        self._recheck(store)
        return recorded_problem(store)

    def _recheck(self, store: FailureLog) -> None:
        for kind in sorted({failure.kind for failure in store.failures()}):
            key = (id(store), kind)
            now = self._clock()
            with self._lock:
                if now - self._rechecked.get(key, -self.recheck_s) < self.recheck_s:
                    continue
                self._rechecked[key] = now
            try:
                store.recheck(kind)
            except Exception:  # the store records what failed; the answer reads it
                continue


def record_problem(record: object) -> str | None:
    """Why the document record refuses writes (damaged: `PRAGMA quick_check` failed at start-up), with its
    way back; None when it does not (or there is none)."""
    damage = getattr(record, "damage", None)
    return None if damage is None else record.damaged_message(damage)  # type: ignore[attr-defined]


def recorded_problem(store: object) -> str | None:
    """`failure_reason` for the failures `store` records now, or None (none, or not a `FailureLog`)."""
    if not isinstance(store, FailureLog):
        return None
    failures = store.failures()
    return failure_reason(store, failures) if failures else None


@dataclass(frozen=True)
class _Lookup:
    known: bool  # there is an answer for this store, fresh or not
    answer: str | None  # that answer
    check: Future[str | None] | None  # the heartbeat to wait for; None when the answer is fresh
    owner: bool = False  # the caller runs that heartbeat itself
