"""A reader that stops reading the command's output (`sieve ... | head -1`) ends it quietly with exit 0, not
with a BrokenPipeError traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_closed_stdout_is_exit_0_without_a_traceback(tmp_path: Path) -> None:
    queries = [f"q{i}" for i in range(3000)]
    (tmp_path / "qrels").write_text("".join(f"{q} 0 d1 1\n" for q in queries), encoding="utf-8")
    (tmp_path / "run").write_text("".join(f"{q} Q0 d1 1 1.0 t\n" for q in queries), encoding="utf-8")
    stderr = tmp_path / "stderr"
    with stderr.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app", "trec-eval", str(tmp_path / "qrels"), str(tmp_path / "run")]
            + ["--per-query"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=err,
        )
        assert proc.stdout is not None
        first = proc.stdout.readline()
        proc.stdout.close()
        code = proc.wait(timeout=60)
    assert first.split()[1:] == [b"q0", b"1.0000"]
    assert code == 0
    assert "Traceback" not in stderr.read_text(errors="replace")
