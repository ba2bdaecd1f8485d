"""The pid lock file: a process holds a directory (the embedded store, the lexical index) by an exclusive,
non-blocking `flock` on a file in it, and writes its pid into that file so that a process refused can say
which process holds it. The lock goes with the process: a killed holder leaves no lock behind."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class LockHeldError(RuntimeError):
    """Another process holds the lock file; `holder` is the pid it wrote ("unknown" when it wrote none)."""

    def __init__(self, lock_path: Path, holder: str) -> None:
        super().__init__(f"{lock_path} is held by another process (pid {holder})")
        self.holder = holder


def acquire(lock_path: Path) -> int:
    """Take the lock `lock_path` (the file is created when absent, its folder must exist) and write this
    process's pid into it; the open descriptor, for `release`. Raise `LockHeldError` when another process
    holds it."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise LockHeldError(lock_path, holder) from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def release(fd: int | None) -> None:
    """Let go of a lock `acquire` took (nothing when `fd` is None)."""
    if fd is None:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def held_by(lock_path: Path) -> str | None:
    """The pid another process wrote into `lock_path` while it holds the lock; None when nobody does.

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


def _holder(fd: int) -> str:
    """The pid the holder of the lock file `fd` wrote into it."""
    return os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
