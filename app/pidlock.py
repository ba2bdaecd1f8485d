"""The pid lock file: a process holds a directory (the embedded store, the lexical index) by an exclusive,
non-blocking `flock` on a file in it, and writes its pid into that file so that a process refused can say
which process holds it. The lock goes with the process: a killed holder leaves no lock behind.

A process that serves (`sieve serve`) also announces where it listens (`announce`): the address is written
on the line after the pid, in every lock file it holds and in every one it takes later, so a process refused
can say where to ask instead (`Holder.address`)."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path
from typing import NamedTuple


class Holder(NamedTuple):
    """What the holder of a lock file wrote into it: its `pid` ("unknown" when it wrote none) and, when it
    announced one, the `address` it serves on (`http://127.0.0.1:8000`)."""

    pid: str
    address: str | None = None


class LockHeldError(RuntimeError):
    """Another process holds the lock file; `holder` is the pid it wrote ("unknown" when it wrote none),
    `address` the one it announced (None when none)."""

    def __init__(self, lock_path: Path, holder: Holder) -> None:
        super().__init__(f"{lock_path} is held by another process (pid {holder.pid})")
        self.holder = holder.pid
        self.address = holder.address


class _Process:
    """The locks this process holds (their descriptors) and the address it announced; `guard` orders an
    `announce` with the `acquire` and `release` of other threads."""

    guard = threading.Lock()
    held: set[int] = set()
    address: str | None = None


def acquire(lock_path: Path) -> int:
    """Take the lock `lock_path` (the file is created when absent, its folder must exist) and write this
    process's pid into it (and its announced address); the open descriptor, for `release`. Raise
    `LockHeldError` when another process holds it."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise LockHeldError(lock_path, holder) from None
    with _Process.guard:
        _write(fd, _Process.address)
        _Process.held.add(fd)
    return fd


def release(fd: int | None) -> None:
    """Let go of a lock `acquire` took (nothing when `fd` is None)."""
    if fd is None:
        return
    with _Process.guard:
        _Process.held.discard(fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def announce(address: str | None) -> None:
    """Write `address` (where this process serves, `http://host:port`) beside the pid in every lock file this
    process holds, and in every one it takes from now on; None takes it back."""
    with _Process.guard:
        _Process.address = address
        for fd in _Process.held:
            _write(fd, address)


def held_by(lock_path: Path) -> Holder | None:
    """What another process wrote into `lock_path` while it holds the lock; None when nobody does.

    Takes nothing and creates nothing: a shared lock, taken and let go at once, conflicts only with a
    holder's exclusive one. A missing or unreadable file, or a file system without flock, counts as free
    here (whoever then acquires the lock meets the same file and says so)."""
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    return None


def _write(fd: int, address: str | None) -> None:
    """The lock file's content: the pid, then the address on its own line. Written over the old content
    before the file is cut to it, so that a reader never finds the pid missing."""
    content = (str(os.getpid()) + (f"\n{address}\n" if address else "")).encode()
    os.pwrite(fd, content, 0)
    os.ftruncate(fd, len(content))


def _holder(fd: int) -> Holder:
    """What the holder of the lock file `fd` wrote into it."""
    lines = os.pread(fd, 4096, 0).decode(errors="replace").splitlines()
    pid = lines[0].strip() if lines else ""
    address = lines[1].strip() if len(lines) > 1 else ""
    return Holder(pid or "unknown", address or None)
