"""A lock that lets urgent work (queries) go before background work (ingest slices).

A query runs alone on the model: it waits for the ingest slices in progress and for nothing else. A large
ingest holds the model in short slices, up to `background_slots` of them at once (one per ingest worker,
each on its own core); while a query waits, no new slice starts, so a query waits for at most the slices
already running, which run side by side and so take about one slice's time.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class PriorityLock:
    """Mutual exclusion between urgent holders, and between urgent and background holders.

    `urgent()` waits until nobody holds the lock: one urgent holder at a time, never beside a slice.
    `background()` waits while any urgent caller holds or waits for the lock and while `background_slots`
    background holders are in; so a stream of background slices can never starve a query. Callers of one
    class are served in no particular order.
    """

    def __init__(self, background_slots: int = 1) -> None:
        if background_slots < 1:
            raise ValueError(f"background_slots must be at least 1 (got {background_slots})")
        self.background_slots = background_slots
        self._cond = threading.Condition()
        self._urgent_held = False
        self._background_held = 0
        self._urgent_waiting = 0

    @contextmanager
    def urgent(self) -> Iterator[None]:
        with self._cond:
            self._urgent_waiting += 1
            try:
                self._cond.wait_for(lambda: not self._urgent_held and self._background_held == 0)
            finally:
                self._urgent_waiting -= 1
            self._urgent_held = True
        try:
            yield
        finally:
            with self._cond:
                self._urgent_held = False
                self._cond.notify_all()

    @contextmanager
    def background(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(
                lambda: (
                    not self._urgent_held
                    and self._urgent_waiting == 0
                    and self._background_held < self.background_slots
                )
            )
            self._background_held += 1
        try:
            yield
        finally:
            with self._cond:
                self._background_held -= 1
                self._cond.notify_all()
