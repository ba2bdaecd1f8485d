"""The query log's files on disk: the live file and its rotations (path.1 the newest), which the log's writer
(app/api/querylog.py) rotates and prunes and `sieve golden sample` reads."""

from __future__ import annotations

from pathlib import Path


def rotated_file(path: Path, index: int) -> Path:
    """The rotated file number `index` of the log at `path`: path.1 is the newest."""
    return path.with_name(f"{path.name}.{index}")


def log_files(path: Path) -> list[Path]:
    """The files of the log at `path`, newest first: `path`, then path.1, path.2, ... while they exist."""
    found = [path] if path.exists() else []
    index = 1
    while rotated_file(path, index).exists():
        found.append(rotated_file(path, index))
        index += 1
    return found
