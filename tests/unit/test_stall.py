"""`StallExit`: a process whose interpreter lock is held by one native call for longer than the period prints
its stacks and exits with 1; one whose threads keep running, or that is not armed, is left alone. The lock
is held by `sum(range(n))`, a C loop that never lets another thread run (as a stuck native call does)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(body: str, timeout: float = 60.0) -> tuple[int, str, float]:
    script = f"from app.stall import StallExit\nimport time\n{body}\nprint('finished')\n"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def test_a_native_call_holding_the_interpreter_for_longer_than_the_period_ends_the_process() -> None:
    code, output, took = run("StallExit(1.0, rearm_s=0.1).start()\ntime.sleep(0.3)\nsum(range(10**11))")
    assert code == 1, output
    assert "Timeout (0:00:01)!" in output and "line 5 in <module>" in output  # where it was stuck
    assert "finished" not in output
    assert took < 30


def test_threads_that_keep_running_are_not_a_stall_and_an_unarmed_watch_never_fires() -> None:
    code, output, _ = run("StallExit(0.5, rearm_s=0.1).start()\nfor _ in range(20):\n    time.sleep(0.1)")
    assert (code, output.strip()) == (0, "finished")
    code, output, _ = run("StallExit(0.3, armed=lambda: False, rearm_s=0.05).start()\nsum(range(3 * 10**7))")
    assert (code, output.strip()) == (0, "finished")
