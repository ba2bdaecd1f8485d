"""Free disk space: every write Sieve makes leaves at least `rag.store.min_free_mb` free, or is refused.

Embedded Chroma must never meet a full disk. Measured on Chroma 1.5: a write that runs out of space fails
with `Error in compaction: Failed to apply logs to the metadata segment`, and from then on the process's
Chroma client is broken: every call fails while the disk stays full, and the first call after space is
freed (a count, a query, a write) never returns, holding Python's interpreter lock (Chroma's bindings do not
release it), so no thread of the process runs again: not `/health`, not the SIGTERM handler, not the
shutdown's deadline timer. A new process opens the same files and works. So Sieve checks the free space
before each write instead (`SpaceGuard.check`, a `statvfs`: microseconds), and refuses the write with
`InsufficientStorage` (the API's 507) while less than the reserve would be left.

`storage_exhausted(exc)` tells a failure caused by a full disk or quota (ENOSPC, EDQUOT, SQLite's
SQLITE_FULL) anywhere in an exception's chain, so that one is answered 507 too, whatever raised it.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path

from app.store.errors import StoreError

MIB = 1024 * 1024
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
SQLITE_FULL = 13  # sqlite3's result code "database or disk is full"
# a store failure with less than this free is taken for a full disk, even with the guard off
NEARLY_FULL_BYTES = MIB


class InsufficientStorage(StoreError):
    """A write refused, or failed, for lack of disk space; the message names the folder, what is free and
    the reserve."""


def storage_exhausted(exc: BaseException | None) -> bool:
    """True when `exc` or an exception it was raised from or during (but `from None`) is a full disk or an
    exhausted quota: `InsufficientStorage`, an `OSError` ENOSPC or EDQUOT, SQLite's "database or disk is
    full"."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, InsufficientStorage):
            return True
        if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
            return True
        if isinstance(exc, sqlite3.OperationalError) and (
            getattr(exc, "sqlite_errorcode", None) == SQLITE_FULL or "database or disk is full" in str(exc)
        ):
            return True
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return False


def free_bytes(path: Path) -> int:
    """The bytes an unprivileged writer may still use on the filesystem of `path` (or of its nearest
    existing parent, for a folder not made yet)."""
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    stat = os.statvfs(probe)
    return stat.f_bavail * stat.f_frsize


class SpaceGuard:
    """The folders Sieve writes to, and the free space each must keep (`min_free_bytes`; 0: unguarded).

    `free` measures a folder's free bytes (`free_bytes`; a test passes a fake), kept as `measure`."""

    def __init__(
        self,
        folders: Iterable[str | Path],
        min_free_bytes: int,
        free: Callable[[Path], int] = free_bytes,
    ):
        self.folders = list(dict.fromkeys(Path(f) for f in folders))
        self.min_free_bytes = min_free_bytes
        self.measure = free

    def problem(self, need: int = 0) -> str | None:
        """None when every folder has `need` bytes plus the reserve free, else why not (the first one
        short); a folder whose free space cannot be read is not judged (the write itself will tell)."""
        if self.min_free_bytes <= 0:
            return None
        for folder in self.folders:
            try:
                free = self.measure(folder)
            except OSError:
                continue
            if free - need < self.min_free_bytes:
                this_write = f" and {_mib(need)} for this write" if need else ""
                return (
                    f"insufficient storage: {_mib(free)} free on the filesystem of {folder}, less than "
                    f"rag.store.min_free_mb={self.min_free_bytes / MIB:g} MiB{this_write}; writes are "
                    "refused until space is freed there"
                )
        return None

    def nearly_full(self) -> bool:
        """A folder has less than the reserve free, or less than `NEARLY_FULL_BYTES` whatever the reserve
        (0 included): what a store failure is taken to have been caused by (`ChromaStore._call`)."""
        floor = max(self.min_free_bytes, NEARLY_FULL_BYTES)
        for folder in self.folders:
            try:
                if self.measure(folder) < floor:
                    return True
            except OSError:
                continue
        return False

    def least_free(self) -> str:
        """ "<free> free on the filesystem of <folder>" for the folder with the least free space."""
        measured = []
        for folder in self.folders:
            try:
                measured.append((self.measure(folder), str(folder)))
            except OSError:
                continue
        if not measured:
            return "free space unknown"
        free, fullest = min(measured)
        return f"{_mib(free)} free on the filesystem of {fullest}"

    def check(self, need: int = 0) -> None:
        """Raise `InsufficientStorage` with `problem`'s reason when there is one."""
        if (problem := self.problem(need)) is not None:
            raise InsufficientStorage(problem)


def _mib(nbytes: int) -> str:
    """`nbytes` in MiB, or in KiB below one MiB (a write's own size is often that small)."""
    nbytes = max(nbytes, 0)
    return f"{nbytes / MIB:.1f} MiB" if nbytes >= MIB else f"{nbytes / 1024:.1f} KiB"
