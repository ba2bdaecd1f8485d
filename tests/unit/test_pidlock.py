"""The pid lock file (app/pidlock.py): the holder's pid, and the address a serving process announced, as a
process refused reads them; what a process announces goes into the locks it holds and into those it takes
later, and leaves when it takes it back."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from app import pidlock

ADDRESS = "http://127.0.0.1:8123"


@pytest.fixture(autouse=True)
def announced_nothing() -> Iterator[None]:
    yield
    pidlock.announce(None)  # what one test announces must not reach another's locks


def test_a_holder_is_known_by_its_pid_and_the_lock_goes_with_release(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    fd = pidlock.acquire(lock)
    assert lock.read_text() == str(os.getpid())
    assert pidlock.held_by(lock) == pidlock.Holder(str(os.getpid()), None)
    with pytest.raises(pidlock.LockHeldError) as refused:
        pidlock.acquire(lock)
    assert (refused.value.holder, refused.value.address) == (str(os.getpid()), None)
    pidlock.release(fd)
    assert pidlock.held_by(lock) is None


def test_an_announced_address_is_written_in_the_locks_held_and_taken_later(tmp_path: Path) -> None:
    earlier = pidlock.acquire(tmp_path / "earlier")
    pidlock.announce(ADDRESS)
    later = pidlock.acquire(tmp_path / "later")
    expected = pidlock.Holder(str(os.getpid()), ADDRESS)
    for name in ("earlier", "later"):
        assert (tmp_path / name).read_text() == f"{os.getpid()}\n{ADDRESS}\n"
        assert pidlock.held_by(tmp_path / name) == expected
    with pytest.raises(pidlock.LockHeldError) as refused:
        pidlock.acquire(tmp_path / "later")
    assert (refused.value.holder, refused.value.address) == expected

    pidlock.announce(None)
    assert pidlock.held_by(tmp_path / "earlier") == pidlock.Holder(str(os.getpid()), None)
    assert (tmp_path / "later").read_text() == str(os.getpid())
    pidlock.release(earlier)
    pidlock.release(later)
    pidlock.announce(ADDRESS)  # a lock let go is no longer written
    assert (tmp_path / "earlier").read_text() == str(os.getpid())


def test_a_lock_file_without_a_pid_names_an_unknown_holder(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    fd = pidlock.acquire(lock)
    os.ftruncate(fd, 0)
    assert pidlock.held_by(lock) == pidlock.Holder("unknown", None)
    pidlock.release(fd)
