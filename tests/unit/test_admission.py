"""Admission of retrievals on the event loop: slots, the bounded queue, its timeout, hand-over, refusals."""

from __future__ import annotations

import asyncio
import logging

import pytest

from app.api.admission import QUEUE_FULL, WAITED_TOO_LONG, Admission


def run(coroutine):  # type: ignore[no-untyped-def]
    return asyncio.run(coroutine)


def test_slots_then_the_queue_then_refusal_at_once() -> None:
    async def scenario() -> None:
        admission = Admission(max_running=2, max_queued=1, queue_timeout_s=5.0)
        assert await admission.acquire() is None
        assert await admission.acquire() is None
        waiting = asyncio.ensure_future(admission.acquire())
        await asyncio.sleep(0)
        assert (admission.running, admission.queued) == (2, 1)
        refusal = await admission.acquire()
        assert refusal is not None and refusal.why == QUEUE_FULL
        assert (refusal.running, refusal.queued) == (2, 1)
        admission.release()  # the slot passes to the waiting request
        assert await waiting is None
        assert (admission.running, admission.queued) == (2, 0)
        admission.release()
        admission.release()
        assert admission.running == 0
        assert admission.counts() == {
            "running": 0,
            "queued": 0,
            "admitted": 3,
            "refusedQueueFull": 1,
            "refusedWaitedTooLong": 0,
        }

    run(scenario())


def test_a_request_that_waits_past_the_timeout_is_refused_and_leaves_the_queue() -> None:
    async def scenario() -> None:
        admission = Admission(max_running=1, max_queued=4, queue_timeout_s=0.05)
        assert await admission.acquire() is None
        refusal = await admission.acquire()
        assert refusal is not None and refusal.why == WAITED_TOO_LONG
        assert admission.queued == 0
        admission.release()
        assert admission.running == 0

    run(scenario())


def test_the_longest_waiting_request_gets_the_slot_first() -> None:
    async def scenario() -> None:
        admission = Admission(max_running=1, max_queued=3, queue_timeout_s=5.0)
        await admission.acquire()
        order: list[int] = []

        async def wait(i: int) -> None:
            assert await admission.acquire() is None
            order.append(i)

        tasks = [asyncio.ensure_future(wait(i)) for i in range(3)]
        await asyncio.sleep(0)
        for _ in range(3):
            admission.release()
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        assert order == [0, 1, 2]

    run(scenario())


def test_a_request_that_goes_away_while_waiting_holds_no_slot() -> None:
    async def scenario() -> None:
        admission = Admission(max_running=1, max_queued=2, queue_timeout_s=5.0)
        await admission.acquire()
        gone = asyncio.ensure_future(admission.acquire())
        await asyncio.sleep(0)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert admission.queued == 0
        admission.release()
        assert admission.running == 0

    run(scenario())


def test_a_slot_handed_to_a_request_that_went_away_passes_on() -> None:
    async def scenario() -> None:
        admission = Admission(max_running=1, max_queued=2, queue_timeout_s=5.0)
        await admission.acquire()
        gone = asyncio.ensure_future(admission.acquire())
        await asyncio.sleep(0)
        admission.release()  # handed to `gone` ...
        gone.cancel()  # ... which is cancelled before it runs again
        try:
            admitted = await gone is None  # asyncio.wait_for may let the result win over the cancel
        except asyncio.CancelledError:
            admitted = False  # then the slot was released on its behalf
        if admitted:
            admission.release()
        assert admission.running == 0
        assert await admission.acquire() is None

    run(scenario())


def test_no_queue_refuses_as_soon_as_the_slots_are_taken() -> None:
    async def scenario() -> None:
        admission = Admission(max_running=1, max_queued=0, queue_timeout_s=5.0)
        await admission.acquire()
        refusal = await admission.acquire()
        assert refusal is not None and refusal.why == QUEUE_FULL

    run(scenario())


def test_refusals_are_logged_at_most_once_per_period(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]

    async def scenario() -> None:
        admission = Admission(
            max_running=1, max_queued=0, queue_timeout_s=1.0, log_every_s=10.0, clock=lambda: now[0]
        )
        await admission.acquire()
        for _ in range(5):
            await admission.acquire()
        now[0] += 10.0
        await admission.acquire()

    with caplog.at_level(logging.WARNING, logger="app.api.admission"):
        run(scenario())
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "admission: refused 1 retrieval(s) since the last report (1 in all: queue full 1, "
        "waited too long 0); running 1 of 1, waiting 0 of 0",
        "admission: refused 5 retrieval(s) since the last report (6 in all: queue full 6, "
        "waited too long 0); running 1 of 1, waiting 0 of 0",
    ]
