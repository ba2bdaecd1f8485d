"""The last resort against a frozen interpreter: a server in which no Python thread could run for
`rag.server.stall_exit_seconds` prints every thread's stack and exits (status 1), so that its supervisor
starts it again (jobs resume) instead of it hanging for good.

A native call that never returns while it holds the interpreter lock freezes every thread of the process:
`/health`, the SIGTERM handler and the shutdown's deadline timer are all Python and wait for that lock. An
embedded Chroma called after it ran out of space does exactly that (app/store/space.py keeps Sieve from
getting there; another program filling the disk at the wrong moment still can). Nothing written in Python
can act then, but faulthandler's watchdog is a C thread that needs no lock: `StallExit` re-arms it every
`REARM_S` from a Python thread, so it fires only when no Python thread could run for the whole period.
"""

from __future__ import annotations

import faulthandler
import sys
import threading
from collections.abc import Callable
from typing import TextIO

# how often the watchdog is re-armed (a stall shorter than the period plus this is never taken for one)
REARM_S = 1.0


class StallExit:
    """Exit the process when no Python thread has run for `seconds` while `armed()` says to watch (a server
    is watched once it is ready: loading models and a large index may hold the lock for long)."""

    def __init__(
        self,
        seconds: float,
        armed: Callable[[], bool] = lambda: True,
        rearm_s: float = REARM_S,
        file: TextIO | None = None,
    ):
        self.seconds = seconds
        self.rearm_s = rearm_s
        self._armed = armed
        self._file = file if file is not None else sys.stderr
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._rearm, name="sieve-stall-exit", daemon=True)

    def start(self) -> None:
        if self.seconds > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()
        faulthandler.cancel_dump_traceback_later()

    def _rearm(self) -> None:
        while True:
            if self._armed():
                faulthandler.dump_traceback_later(self.seconds, exit=True, file=self._file)
            if self._stop.wait(self.rearm_s):
                return
