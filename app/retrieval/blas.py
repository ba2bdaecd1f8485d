"""Small matrix products on one BLAS thread.

OpenBLAS splits a product as small as a candidate set's 100 x 100 cosine matrix across every core. On a
busy machine the threads wait for each other: measured here under load, 15 ms with 2 threads against
0.4 ms with one. Nothing the chain multiplies is large enough to gain from more threads (the exact dense
search over the whole collection, app/store/exact.py, is, and runs on every thread).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy  # noqa: F401  (loads numpy's BLAS before `_blas_libraries` lists the loaded ones)

# The thread count is process-wide and is restored on exit: two threads interleaving their limits could
# leave the process on one thread for good, so they take turns.
_LOCK = threading.Lock()


@functools.cache
def _blas_libraries() -> tuple[Any, ...]:
    """threadpoolctl's controllers of the BLAS libraries loaded, found once: numpy's is among them (numpy,
    imported above, loads it); none for a numpy built without one. A BLAS loaded later (scipy's, which
    sentence-transformers brings) is not numpy's: it multiplies nothing here and is left alone."""
    from threadpoolctl import ThreadpoolController

    return tuple(ThreadpoolController().select(user_api="blas").lib_controllers)


@contextmanager
def one_thread() -> Iterator[None]:
    """A context in which numpy's BLAS runs on one thread. It sets each library's thread count directly
    (5 µs to enter and leave back to back, measured; `ThreadpoolController.limit` took 65 µs, since it
    inspects the loaded libraries again at every call)."""
    with _LOCK:
        libraries = _blas_libraries()
        before = [library.get_num_threads() for library in libraries]
        for library in libraries:
            library.set_num_threads(1)
        try:
            yield
        finally:
            for library, count in zip(libraries, before, strict=True):
                library.set_num_threads(count)
