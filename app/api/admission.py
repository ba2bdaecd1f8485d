"""Admission of retrievals: at most `max_running` at once, at most `max_queued` more waiting for a slot,
each for at most `queue_timeout_s`; any other request is refused at once (the route answers 429 with
`Retry-After`).

Without it every request that arrives takes a worker thread (anyio's 40) and waits in the query batcher:
a burst of 100 long queries held 3 GB and kept the thread pool, and with it any sync route, busy for
minutes. A refused request costs the event loop a few microseconds and holds nothing.

It lives on the event loop: `acquire` and `release` are called from async code only, so its counters
need no lock, and `/health` and `/ready` never touch it. Refusals are counted and logged, at most one line
every `log_every_s` while they go on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger(__name__)

QUEUE_FULL = "queue full"
WAITED_TOO_LONG = "waited too long"
# what a refused client is told to wait before trying again (the Retry-After header, whole seconds)
RETRY_AFTER_S = 1


@dataclass(frozen=True)
class Refusal:
    """Why a request was not admitted, and the load it met."""

    why: str  # QUEUE_FULL or WAITED_TOO_LONG
    running: int
    queued: int

    def message(self, admission: Admission) -> str:
        if self.why == QUEUE_FULL:
            return (
                f"too many retrievals at once: {self.running} running "
                f"(rag.server.max_concurrent_retrievals={admission.max_running}) and {self.queued} waiting "
                f"(rag.server.max_queued_retrievals={admission.max_queued}); retry after {RETRY_AFTER_S} s"
            )
        return (
            f"too many retrievals at once: no slot within rag.server.queue_timeout_ms="
            f"{round(admission.queue_timeout_s * 1000)}; retry after {RETRY_AFTER_S} s"
        )


class Admission:
    def __init__(
        self,
        max_running: int,
        max_queued: int,
        queue_timeout_s: float,
        log_every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.max_running = max_running
        self.max_queued = max_queued
        self.queue_timeout_s = queue_timeout_s
        self.log_every_s = log_every_s
        self._clock = clock
        self.running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.admitted = 0
        self.refused: dict[str, int] = {QUEUE_FULL: 0, WAITED_TOO_LONG: 0}
        self._logged_at: float | None = None
        self._refused_at_log = 0

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def refuse_now(self) -> Refusal | None:
        """The refusal `acquire` would give at once (every slot taken, the queue full), counted and
        logged as such; None when `acquire` might admit or queue."""
        if self.running >= self.max_running and len(self._waiters) >= self.max_queued:
            return self._refuse(QUEUE_FULL)
        return None

    async def acquire(self) -> Refusal | None:
        """None when admitted (the caller then calls `release` once it is done), else the refusal."""
        if self.running < self.max_running and not self._waiters:
            self.running += 1
            self.admitted += 1
            return None
        if len(self._waiters) >= self.max_queued:
            return self._refuse(QUEUE_FULL)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, self.queue_timeout_s)
        except TimeoutError:
            if not (waiter.done() and not waiter.cancelled()):  # not handed a slot in the same instant
                self._forget(waiter)
                return self._refuse(WAITED_TOO_LONG)
        except BaseException:  # the request went away while waiting
            if waiter.done() and not waiter.cancelled():
                self.release()  # it was handed a slot: pass it on
            else:
                self._forget(waiter)
            raise
        self.admitted += 1
        return None

    def release(self) -> None:
        """A retrieval is done: its slot goes to the longest waiting request, else becomes free."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # `running` stays: the slot changes hands
                return
        self.running -= 1

    def counts(self) -> dict[str, int]:
        return {
            "running": self.running,
            "queued": self.queued,
            "admitted": self.admitted,
            "refusedQueueFull": self.refused[QUEUE_FULL],
            "refusedWaitedTooLong": self.refused[WAITED_TOO_LONG],
        }

    def _forget(self, waiter: asyncio.Future[None]) -> None:
        try:
            self._waiters.remove(waiter)
        except ValueError:
            pass

    def _refuse(self, why: str) -> Refusal:
        self.refused[why] += 1
        refusal = Refusal(why, self.running, self.queued)
        now = self._clock()
        if self._logged_at is None or now - self._logged_at >= self.log_every_s:
            total = sum(self.refused.values())
            log.warning(
                "admission: refused %d retrieval(s) since the last report (%d in all: queue full %d, waited "
                "too long %d); running %d of %d, waiting %d of %d",
                total - self._refused_at_log,
                total,
                self.refused[QUEUE_FULL],
                self.refused[WAITED_TOO_LONG],
                self.running,
                self.max_running,
                self.queued,
                self.max_queued,
            )
            self._logged_at = now
            self._refused_at_log = total
        return refusal


class AdmissionGate:
    """ASGI middleware: a retrieval that `Admission.refuse_now` would refuse is answered 429 before its body
    is read or validated. In a burst nearly every request is refused, and each one then costs the event
    loop a few microseconds instead of a body parse, a validation and an exception; the route's own
    `acquire` still decides for every other request."""

    def __init__(self, app: ASGIApp, admission: Callable[[], Admission], path: str = "/api/retrieve"):
        self.app = app
        self.admission = admission
        self.path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == self.path:
            admission = self.admission()
            refusal = admission.refuse_now()
            if refusal is not None:
                body = json.dumps({"error": refusal.message(admission)}).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 429,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"retry-after", str(RETRY_AFTER_S).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
