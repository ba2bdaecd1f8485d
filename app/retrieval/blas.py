"""Small matrix products on one BLAS thread.

OpenBLAS splits a product as small as a candidate set's 100 x 100 cosine matrix across every core. On a
busy machine the threads wait for each other: measured here under load, 15 ms with 2 threads against
0.4 ms with one. Nothing the chain multiplies is large enough to gain from more threads.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

# threadpoolctl's limit is process-wide and restores what it found on exit: two threads interleaving their
# limits could leave the process on one thread for good, so they take turns.
_LOCK = threading.Lock()


_inspected: tuple[int, list[Any]] | None = None  # (len(sys.modules) then, the BLAS libraries found)


def _blas_libraries() -> list[Any]:
    """The loaded BLAS libraries (threadpoolctl's controllers), inspected again only when a module was
    imported since (a BLAS library arrives with a module: numpy's, then scipy's, ...). Call under _LOCK."""
    global _inspected
    modules = len(sys.modules)
    if _inspected is None or _inspected[0] != modules:
        from threadpoolctl import ThreadpoolController

        found = [lib for lib in ThreadpoolController().lib_controllers if lib.user_api == "blas"]
        _inspected = (len(sys.modules), found)  # threadpoolctl's own imports count too
    return _inspected[1]


class _OneThread:
    """What threadpoolctl's `limit(limits=1, user_api="blas")` does, without its inspection of every loaded
    library at each call (about 50 µs a call, measured; this is a few µs): remember each BLAS library's
    thread count, set 1, put it back on exit."""

    def __enter__(self) -> None:
        _LOCK.acquire()
        try:
            self._libraries = _blas_libraries()
            self._before = [lib.get_num_threads() for lib in self._libraries]
            for lib, n in zip(self._libraries, self._before, strict=True):
                if n != 1:
                    lib.set_num_threads(1)
        except BaseException:
            _LOCK.release()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            for lib, n in zip(self._libraries, self._before, strict=True):
                if n != 1:
                    lib.set_num_threads(n)
        finally:
            _LOCK.release()


def one_thread() -> _OneThread:
    """A context in which numpy's BLAS runs on one thread (a few µs to enter and leave)."""
    return _OneThread()
