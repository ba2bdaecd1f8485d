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

# threadpoolctl's limit is process-wide and restores what it found on exit: two threads interleaving their
# limits could leave the process on one thread for good, so they take turns.
_LOCK = threading.Lock()


@functools.cache
def _controller() -> Any:
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()  # inspects the loaded BLAS libraries once


@contextmanager
def one_thread() -> Iterator[None]:
    """A context in which numpy's BLAS runs on one thread (about 25 µs to enter and leave, measured:
    threadpoolctl inspects the loaded libraries at every call, which keeps a library loaded later right)."""
    with _LOCK, _controller().limit(limits=1, user_api="blas"):
        yield
