"""Small matrix products on one BLAS thread.

OpenBLAS splits a product as small as a candidate set's 84 x 84 cosine matrix across every core (measured
here at 384 dimensions: for 84 rows the second thread worked as long as the first; for 32, not). On a busy
machine the threads wait for each other, and the product takes many times as long as on one thread
(docs/benchmarks.md#code-figures). Nothing the chain multiplies is large enough to gain from more threads
(the exact dense search over the whole collection, app/store/exact.py, is, and runs on every thread).

How. numpy's OpenBLAS (a pthreads build, as numpy's wheels carry) has one process-wide thread count, set
and read by its `openblas_set_num_threads` / `openblas_get_num_threads`. `one_thread` calls them itself,
through ctypes, at a fraction of the cost of threadpoolctl's `ThreadpoolController.limit`
(docs/benchmarks.md#code-figures), which inspects every loaded library again at every call. It also keeps
out of threadpoolctl's "controlling thread" rule (3.8): a thread that sets OpenBLAS's count outside a `limit`
block owns it while it lives, and other threads' settings are then ignored without a word. The libraries
are threadpoolctl's findings at the first call: every BLAS loaded by then, numpy's among them (this module
imports numpy first). A BLAS loaded after that (scipy's, which sentence-transformers brings) multiplies
nothing of numpy's and is left alone. Any other BLAS (an OpenMP OpenBLAS, MKL, BLIS) gets threadpoolctl's
`limit`.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy  # noqa: F401  (loads numpy's BLAS before `_openblas` lists the loaded ones)

# The thread count is process-wide and restored on exit: two threads interleaving their settings could
# leave the process on one thread for good, so they take turns.
_LOCK = threading.Lock()
# threadpoolctl's affixes of OpenBLAS's symbols (scipy-openblas builds: scipy_openblas_set_num_threads64_)
_PREFIXES, _SUFFIXES = ("", "scipy_"), ("", "64_", "_64")


@functools.cache
def _controller() -> Any:
    """threadpoolctl's view of the libraries loaded now (numpy's BLAS among them), found once."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


@functools.cache
def _openblas() -> tuple[tuple[Callable[[int], Any], Callable[[], int]], ...] | None:
    """(set, get) of each BLAS library `_controller()` found, or None when one is not a pthreads OpenBLAS
    whose two functions are found."""
    found = []
    for library in _controller().select(user_api="blas").lib_controllers:
        if library.internal_api != "openblas" or library.threading_layer != "pthreads":
            return None
        dll = ctypes.CDLL(library.filepath)  # already loaded: the same library, not a second copy
        for prefix, suffix in itertools.product(_PREFIXES, _SUFFIXES):
            setter = getattr(dll, f"{prefix}openblas_set_num_threads{suffix}", None)
            getter = getattr(dll, f"{prefix}openblas_get_num_threads{suffix}", None)
            if setter is not None and getter is not None:
                setter.restype, getter.restype = None, ctypes.c_int
                setter.argtypes, getter.argtypes = [ctypes.c_int], []
                found.append((setter, getter))
                break
        else:
            return None
    return tuple(found)


@contextmanager
def one_thread() -> Iterator[None]:
    """A context in which numpy's BLAS runs on one thread (process-wide, so calls take turns)."""
    with _LOCK:
        libraries = _openblas()
        if libraries is None:
            with _controller().limit(limits=1, user_api="blas"):
                yield
            return
        before = [get() for _, get in libraries]
        for set_threads, _ in libraries:
            set_threads(1)
        try:
            yield
        finally:
            for (set_threads, _), count in zip(libraries, before, strict=True):
                set_threads(count)
