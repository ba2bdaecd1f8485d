"""A lock that lets urgent work (queries) go before background work (ingest slices).

The embedder runs one model call at a time: torch already uses every core it was given, and two calls at
once only slow each other down. A large ingest therefore holds the model in short slices; between two slices
every waiting query runs first, so a query waits for at most the one slice in progress.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class PriorityLock:
    """Mutual exclusion with two classes of holder.

    `urgent()` waits only for the current holder. `background()` also waits while any urgent caller is
    waiting, so a stream of background slices can never starve a query. Urgent callers among themselves,
    and background callers among themselves, are served in no particular order.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._held = False
        self._urgent_waiting = 0

    @contextmanager
    def urgent(self) -> Iterator[None]:
        with self._cond:
            self._urgent_waiting += 1
            try:
                self._cond.wait_for(lambda: not self._held)
            finally:
                self._urgent_waiting -= 1
            self._held = True
        try:
            yield
        finally:
            self._release()

    @contextmanager
    def background(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._held and self._urgent_waiting == 0)
            self._held = True
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        with self._cond:
            self._held = False
            self._cond.notify_all()
