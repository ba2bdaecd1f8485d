"""The lexical index on disk: a snapshot plus an append-only journal, both crash-safe, nothing pickled.

A directory holds
- `manifest.json`: which snapshot is current (its generation), the BM25 parameters and analyzer version it
  was built with, the store collection it mirrors and how far it has read the store's change log;
- `snap-<gen>.npz` (numpy arrays, `allow_pickle=False`) and `snap-<gen>.json` (chunk ids, terms, tags):
  the live chunks, their forward lists and postings (see `Bm25Index`), loaded without tokenising anything;
- `journal-<gen>.log`: every change since that snapshot, one line each, `<crc32 hex> <json>\\n`, flushed and
  fsync'd before the write is acknowledged. A write is journalled as the analyzer's output (each chunk's
  term counts, `Bm25Index.upsert`'s records), not its text, so replaying the journal at start tokenises
  nothing (re-tokenising 60,000 chunks of journal took minutes at 1M chunks).

Crash safety: a snapshot is written under new file names and becomes current only when `manifest.json` is
replaced by an atomic rename (after fsync); a kill -9 before that leaves the previous snapshot and journal in
force. A journal line cut short by a kill fails its checksum and is dropped with everything after it, so a
write is in the index entirely or not at all; the store's change log then brings back whatever was lost.
One process at a time: `lock` is held (flock) while the index is open.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from app import pidlock

log = logging.getLogger(__name__)

FORMAT = 1
MANIFEST = "manifest.json"
LOCK = "lock"
_ARRAYS = (
    "doc_len",
    "tag",
    "digest",
    "fwd_start",
    "fwd_terms",
    "fwd_tf",
    "df",
    "post_start",
    "post_slots",
    "post_tf",
)


class LexicalFilesError(RuntimeError):
    """The index directory cannot be used; the message says which and why."""


def lock(directory: Path) -> int:
    """Hold the index directory (created when absent) for this process (app/pidlock.py); the descriptor, for
    `pidlock.release`."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        return pidlock.acquire(directory / LOCK)
    except pidlock.LockHeldError as held:
        raise LexicalFilesError(
            f"the lexical index {directory} is open in another process (pid {held.holder}); give each Sieve "
            f"process its own rag.lexical.path"
        ) from None


def check_free(directory: Path) -> None:
    """Raise LexicalFilesError now if another process holds the directory (take the lock, release it)."""
    pidlock.release(lock(directory))


def read_manifest(directory: Path) -> dict[str, Any] | None:
    path = directory / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # unreadable: rebuilt by the caller
    return manifest if isinstance(manifest, dict) and manifest.get("format") == FORMAT else None


def save_snapshot(
    directory: Path, state: dict[str, Any], tags: list[str], manifest: dict[str, Any]
) -> dict[str, Any]:
    """Write a new snapshot and make it current; returns the new manifest (generation + 1, empty journal).
    A snapshot that cannot be written whole (a full disk) leaves none of its files and the current one as it
    was."""
    generation = int(manifest.get("generation", 0)) + 1
    arrays = directory / f"snap-{generation}.npz"
    strings = directory / f"snap-{generation}.json"
    journal = directory / f"journal-{generation}.log"
    tmp = directory / f"{MANIFEST}.tmp"
    new_manifest = {**manifest, "format": FORMAT, "generation": generation, "chunks": len(state["ids"])}
    try:
        with open(arrays, "wb") as f:
            np.savez(f, **{name: state[name] for name in _ARRAYS})
            f.flush()
            os.fsync(f.fileno())
        _write_synced(strings, json.dumps({"ids": state["ids"], "terms": state["terms"], "tags": tags}))
        _write_synced(journal, "")
        _write_synced(tmp, json.dumps(new_manifest, indent=1))
    except BaseException:
        # (a full disk): the current snapshot stays, and the partial new one takes no space
        for partial in (arrays, strings, journal, tmp):
            partial.unlink(missing_ok=True)
        raise
    os.replace(tmp, directory / MANIFEST)
    _sync_dir(directory)
    for old in directory.iterdir():
        if old.name.startswith(("snap-", "journal-")) and old.name.split("-", 1)[1].split(".")[0] != str(
            generation
        ):
            old.unlink(missing_ok=True)
    return new_manifest


def load_snapshot(directory: Path, manifest: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    generation = manifest.get("generation")
    try:
        with np.load(directory / f"snap-{generation}.npz", allow_pickle=False) as npz:
            state: dict[str, Any] = {name: npz[name] for name in _ARRAYS}
        strings = json.loads((directory / f"snap-{generation}.json").read_text(encoding="utf-8"))
        state["ids"], state["terms"] = strings["ids"], strings["terms"]
        tags = list(strings["tags"])
    except Exception as exc:  # a damaged zip, npy or JSON file raises many kinds: each means unreadable
        raise LexicalFilesError(
            f"lexical snapshot {generation} in {directory} is unreadable: {type(exc).__name__}: {exc}"
        ) from exc
    return state, tags


def files_problems(directory: Path) -> list[str]:
    """What `sieve store check` finds wrong with the index files in `directory`, read without changing
    anything: `manifest.json` unreadable, the snapshot it names unreadable, journal lines whose checksum
    fails (a line cut short at the end is a killed write, not damage: the next open drops it), or the folder
    not writable. No folder or no manifest yet: nothing (the index is built at the next start)."""
    path = directory / MANIFEST
    if not path.exists():
        return []
    problems = []
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise ValueError(f"not a manifest of format {FORMAT}")
    except (OSError, ValueError) as exc:
        return [f"BM25 index {path} is unreadable: {type(exc).__name__}: {exc}"]
    try:
        load_snapshot(directory, manifest)
    except LexicalFilesError as exc:
        problems.append(f"BM25 index: {exc}")
    journal = directory / f"journal-{manifest.get('generation')}.log"
    if journal.exists():
        bad = _bad_journal_line(journal.read_bytes())
        if bad is not None:
            problems.append(f"BM25 index journal {journal}: line {bad} fails its checksum")
    scratch = directory / f".probe-{uuid.uuid4().hex}"
    try:
        _write_synced(scratch, "")
        scratch.unlink()
    except OSError as exc:
        problems.append(f"BM25 index folder {directory} cannot be written: {exc}")
    return problems


def _bad_journal_line(raw: bytes) -> int | None:
    """The 1-based number of the first whole journal line that fails its checksum, or None."""
    for number, line in enumerate(raw.split(b"\n")[:-1], start=1):
        crc, _, body = line.partition(b" ")
        try:
            if int(crc, 16) == zlib.crc32(body):
                json.loads(body)
                continue
        except ValueError:
            pass
        return number
    return None


class Journal:
    """Appends change records to `journal-<gen>.log`; `read()` returns the intact ones."""

    def __init__(self, directory: Path, generation: int):
        self.path = directory / f"journal-{generation}.log"
        self.path.touch(exist_ok=True)
        self.size = self.path.stat().st_size

    def append(self, records: list[dict[str, Any]]) -> None:
        data = b"".join(_line(r) for r in records)
        with open(self.path, "ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        self.size += len(data)

    def read(self) -> list[dict[str, Any]]:
        """Intact records in order; a torn or corrupt line ends the journal there (the file is cut back)."""
        records = []
        good = 0
        with open(self.path, "rb") as f:
            raw = f.read()
        for line in raw.split(b"\n")[:-1]:  # the last piece is "" or a line cut short
            crc, _, body = line.partition(b" ")
            try:
                if int(crc, 16) != zlib.crc32(body):
                    break
                records.append(json.loads(body))
            except ValueError:
                break
            good += len(line) + 1
        if good != len(raw):
            if raw[good:].count(b"\n"):  # more than a last line cut short by a kill: damage
                log.warning(
                    "BM25 index journal %s is damaged at byte %d: the records from there on are dropped, "
                    "and the store's change log and the id check bring the index up to date",
                    self.path,
                    good,
                )
            with open(self.path, "r+b") as f:
                f.truncate(good)
                f.flush()
                os.fsync(f.fileno())
            self.size = good
        return records


def _line(record: dict[str, Any]) -> bytes:
    body = json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return f"{zlib.crc32(body):08x} ".encode() + body + b"\n"


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
