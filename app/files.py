"""The one file writer of the app: every report, baseline, tuning document and golden-set export is written
with `atomic_write_text`, so a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import os
import tempfile
import threading
from datetime import UTC, datetime
from pathlib import Path

_UMASK_LOCK = threading.Lock()


def ordinary_file_mode() -> int:
    """The mode a plain `open(path, "w")` would give a new file: 0o666 minus the process umask."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:  # os.umask can only be read by setting it
        current = os.umask(0o022)
        os.umask(current)
    return 0o666 & ~current


def atomic_write_text(path: Path, text: str, keep_mode: bool = False) -> None:
    """Replace `path` with `text` all at once (a temporary file in the same folder, fsync, rename): a reader
    sees the old file or the new one, never half of one. The file gets the ordinary mode (0666 minus the
    umask), or with `keep_mode` the mode of the file it replaces when there is one."""
    mode = ordinary_file_mode()
    if keep_mode and path.exists():
        mode = path.stat().st_mode & 0o777
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)  # mkstemp creates 0600
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def utc_now() -> datetime:
    return datetime.now(UTC)


def file_stamp(when: datetime | None = None) -> str:
    """The UTC timestamp in a written file's name (`<prefix>-<stamp>.json`): `20261203T123758Z`."""
    return (when or utc_now()).strftime("%Y%m%dT%H%M%SZ")


def change_line(path: str | Path, written: bool, before: int, after: int, noun: str, *details: str) -> str:
    """The line a command prints for a file it writes into, `wrote golden_set/generated.jsonl (30 -> 39
    cases)` or `unchanged: golden_set/golden-set.json (67 cases; datasetVersion 2026-12-03.1)`: the path, the
    count of `noun` (singular; an "s" is added unless the count is 1) before and after, then `details`, each
    after a semicolon."""
    counted = f"{after} {noun}{'' if after == 1 else 's'}"
    count = f"{before} -> {counted}" if before != after else counted
    return f"{'wrote' if written else 'unchanged:'} {path} ({'; '.join([count, *details])})"
