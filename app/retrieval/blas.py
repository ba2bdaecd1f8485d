"""Small matrix products on one BLAS thread.

OpenBLAS splits a product as small as a candidate set's 100 x 100 cosine matrix across every core. On a
busy machine the threads wait for each other: measured here under load, 15 ms with 2 threads against
0.4 ms with one. Nothing the chain multiplies is large enough to gain from more threads.
"""

from __future__ import annotations

import functools
from contextlib import AbstractContextManager
from typing import Any


@functools.cache
def _controller() -> Any:
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()  # inspects the loaded BLAS libraries once


def one_thread() -> AbstractContextManager[Any]:
    """A context in which numpy's BLAS runs on one thread (about 4 µs to enter and leave)."""
    return _controller().limit(limits=1, user_api="blas")  # type: ignore[no-any-return]
