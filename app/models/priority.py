"""A lock that lets urgent work (queries) go before background work (ingest slices).

Queries never run beside an ingest slice: a query waits for the slices in progress and for nothing else
but the other query calls that fill the `urgent_slots` (one model call of queries per slot, each on the
query threads, so concurrent batches use every core). A large ingest holds the model in short slices, up
to `background_slots` of them at once (one per ingest worker, each on its own core); while a query waits,
no new slice starts, so a query waits for at most the slices already running, which run side by side and
so take about one slice's time.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class PriorityLock:
    """Mutual exclusion between urgent and background holders, and at most `urgent_slots` urgent ones.

    `urgent()` waits until no background holder is in and fewer than `urgent_slots` urgent ones are: never
    beside a slice. `background()` waits while any urgent caller holds or waits for the lock and while
    `background_slots` background holders are in; so a stream of background slices can never starve a
    query. Callers of one class are served in no particular order.
    """

    def __init__(self, background_slots: int = 1, urgent_slots: int = 1) -> None:
        if background_slots < 1:
            raise ValueError(f"background_slots must be at least 1 (got {background_slots})")
        if urgent_slots < 1:
            raise ValueError(f"urgent_slots must be at least 1 (got {urgent_slots})")
        self.background_slots = background_slots
        self.urgent_slots = urgent_slots
        self._cond = threading.Condition()
        self._urgent_held = 0
        self._background_held = 0
        self._urgent_waiting = 0

    @contextmanager
    def urgent(self) -> Iterator[None]:
        with self._cond:
            self._urgent_waiting += 1
            try:
                self._cond.wait_for(
                    lambda: self._urgent_held < self.urgent_slots and self._background_held == 0
                )
            finally:
                self._urgent_waiting -= 1
            self._urgent_held += 1
        try:
            yield
        finally:
            with self._cond:
                self._urgent_held -= 1
                self._cond.notify_all()

    @contextmanager
    def background(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(
                lambda: (
                    self._urgent_held == 0
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
