"""Readiness of the store, for `/ready`: the store's heartbeat, cached for at most `MAX_AGE_S`.

An orchestrator polls `/ready` often; the cache keeps that from becoming a stream of heartbeats, and the short
age keeps the answer honest: a store that went away turns `/ready` into a 503 within about a second, and
one that came back turns it into a 200 again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from app.store import StoreUnavailableError

MAX_AGE_S = 1.0


class Heartbeat(Protocol):
    def heartbeat(self) -> None: ...


class StoreProbe:
    def __init__(self, max_age_s: float = MAX_AGE_S, clock: Callable[[], float] = time.monotonic):
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._checked: tuple[int, float, str | None] | None = None  # (id of store, when, problem)

    def problem(self, store: Heartbeat) -> str | None:
        """None when `store` answered its heartbeat within the last `max_age_s` seconds, else why not.
        One heartbeat at a time: concurrent callers wait for it and share its answer."""
        with self._lock:
            now = self._clock()
            if self._checked is not None:
                store_id, when, problem = self._checked
                if store_id == id(store) and now - when < self.max_age_s:
                    return problem
            try:
                store.heartbeat()
                problem = None
            except StoreUnavailableError as exc:
                problem = f"vector store unavailable: {exc}"
            except Exception as exc:  # a probe answers; whatever went wrong is the reason
                problem = f"vector store check failed: {type(exc).__name__}: {exc}"
            self._checked = (id(store), self._clock(), problem)
            return problem


_probes_lock = threading.Lock()


def store_probe(holder: object) -> StoreProbe:
    """The probe kept on `holder` (the app's `state`), made on first use."""
    with _probes_lock:
        probe = getattr(holder, "store_probe", None)
        if probe is None:
            probe = StoreProbe()
            holder.store_probe = probe  # type: ignore[attr-defined]
        return probe
