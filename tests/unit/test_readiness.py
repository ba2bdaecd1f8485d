"""The store probe behind /ready: a heartbeat at most once per `max_age_s`, its answer shared meanwhile."""

from __future__ import annotations

import threading

from app.api.readiness import StoreProbe
from app.store import StoreUnavailableError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Store:
    def __init__(self) -> None:
        self.up = True
        self.beats = 0

    def heartbeat(self) -> None:
        self.beats += 1
        if not self.up:
            raise StoreUnavailableError("Chroma server at http://127.0.0.1:1 is unreachable: refused")


def test_a_heartbeat_is_cached_for_less_than_max_age() -> None:
    clock, store = Clock(), Store()
    probe = StoreProbe(max_age_s=1.0, clock=clock)
    assert probe.problem(store) is None
    clock.now += 0.999
    assert probe.problem(store) is None
    assert store.beats == 1
    clock.now += 0.001
    assert probe.problem(store) is None
    assert store.beats == 2


def test_a_store_going_away_and_coming_back_shows_within_max_age() -> None:
    clock, store = Clock(), Store()
    probe = StoreProbe(max_age_s=1.0, clock=clock)
    assert probe.problem(store) is None
    store.up = False
    clock.now += 1.0
    assert probe.problem(store) == (
        "vector store unavailable: Chroma server at http://127.0.0.1:1 is unreachable: refused"
    )
    store.up = True
    clock.now += 0.5
    assert probe.problem(store) is not None  # still the cached answer
    clock.now += 0.5
    assert probe.problem(store) is None


def test_any_error_from_the_check_is_a_reason_not_an_exception() -> None:
    class Broken:
        def heartbeat(self) -> None:
            raise ValueError("odd")

    assert StoreProbe().problem(Broken()) == "vector store check failed: ValueError: odd"


def test_another_store_is_checked_afresh() -> None:
    clock = Clock()
    probe = StoreProbe(max_age_s=1.0, clock=clock)
    first, second = Store(), Store()
    second.up = False
    assert probe.problem(first) is None
    assert probe.problem(second) is not None
    assert (first.beats, second.beats) == (1, 1)


def test_concurrent_callers_share_one_heartbeat() -> None:
    clock, store = Clock(), Store()
    probe = StoreProbe(max_age_s=1.0, clock=clock)
    answers: list[str | None] = []
    threads = [threading.Thread(target=lambda: answers.append(probe.problem(store))) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == [None] * 16
    assert store.beats == 1
