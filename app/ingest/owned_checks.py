"""`sieve store check` beyond the chunk collection: every other collection and file Sieve owns
(app/store/owned.py), each probed by reading it whole and writing a scratch entry, each problem with its way
back. Each function returns the problems it found (`Problem`, its `part` the owned key), none when healthy.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from app.ingest.check import Problem
from app.lexical.files import files_problems
from app.store import ChromaStore
from app.store.chroma import chroma_files_problem
from app.store.owned import BM25, CHANGE_LOG, CHROMA_FILES, JOBS, REBUILD, RECORD, STAGING
from app.store.record import DocumentRecord, record_way_back

JOB_GLOB = "j-*.json"  # a job record's name (app/api/jobs.py)


def record_problems(record: DocumentRecord) -> list[Problem]:
    """The record's probe (`DocumentRecord.probe`: quick_check, a full read, a scratch write)."""
    return [Problem(what, record_way_back(), RECORD) for what in record.probe()]


def unopenable_record(error: Exception) -> Problem:
    """The record cannot be opened at all."""
    return Problem(str(getattr(error, "what", error)), record_way_back(), RECORD)


def change_log_problems(store: ChromaStore) -> list[Problem]:
    return [
        Problem(what, f"{REBUILD} (it makes the change log anew)", CHANGE_LOG)
        for what in store.probe_change_log()
    ]


def staging_problems(store: ChromaStore) -> list[Problem]:
    left = store.leftover_staging()
    return [] if left is None else [Problem(left, f"{REBUILD} (resumes or drops it, then switches)", STAGING)]


def chroma_files_problems(path: Path, opened: Exception | None) -> list[Problem]:
    """An embedded store's own files: `opened`, why the store could not be opened (None: it opened), and
    `PRAGMA quick_check` of `chroma.sqlite3`."""
    fix = f"{REBUILD} (moves Chroma's files aside and rebuilds them from the record)"
    problems = []
    if opened is not None:
        why = getattr(opened, "what", opened)
        problems.append(Problem(f"Chroma's files cannot be opened: {why}", fix, CHROMA_FILES))
    found = chroma_files_problem(path)
    if found is not None:
        problems.append(Problem(f"Chroma's files are damaged: {found}", fix, CHROMA_FILES))
    return problems


def bm25_problems(directory: Path) -> list[Problem]:
    fix = f"{REBUILD} (builds them anew), or delete {directory} (built from the store at the next start)"
    return [Problem(what, fix, BM25) for what in files_problems(directory)]


def unreadable_jobs(directory: Path) -> dict[Path, str]:
    """The job records in `directory` that cannot be read as a JSON object, with why."""
    found = {}
    for path in sorted(directory.glob(JOB_GLOB)) if directory.is_dir() else []:
        try:
            if not isinstance(json.loads(path.read_text(encoding="utf-8")), dict):
                found[path] = "not a JSON object"
        except (OSError, ValueError) as exc:
            found[path] = f"{type(exc).__name__}: {exc}"
    return found


def jobs_problems(directory: Path) -> list[Problem]:
    """Unreadable job records, and a folder that cannot be written (a scratch file)."""
    problems = [
        Problem(
            f"job record {path} is unreadable ({why}): the server ignores it",
            f"{REBUILD} (moves it aside; the rebuild indexes every recorded document)",
            JOBS,
        )
        for path, why in unreadable_jobs(directory).items()
    ]
    if directory.is_dir():
        scratch = directory / f".probe-{uuid.uuid4().hex}"
        try:
            scratch.write_text("", encoding="utf-8")
            scratch.unlink()
        except OSError as exc:
            problems.append(
                Problem(
                    f"the jobs folder {directory} cannot be written: {exc}",
                    f"make {directory} writable by this user",
                    JOBS,
                )
            )
    return problems


def move_jobs_aside(directory: Path, now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> list[Path]:
    """Rename the unreadable job records in `directory` to `<name>.broken-<UTC time>` (the server reads
    only `j-*.json`); the new paths."""
    stamp = now().strftime("%Y%m%dT%H%M%SZ")
    moved = []
    for path in unreadable_jobs(directory):
        aside = path.with_name(f"{path.name}.broken-{stamp}")
        path.rename(aside)
        moved.append(aside)
    return moved
