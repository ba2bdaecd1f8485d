"""The one JSONL reader and writer of the app: the judgments file, the drafts, the label queue, the query log
and golden-set exports all go through it, so writer and reader agree on what a line is.

A line ends with "\\n" and with nothing else:

- `dumps_line` writes one value as one line. Non-ASCII text stays readable (UTF-8, not `\\uXXXX`), except the
  characters some readers take for a line break (U+2028, U+2029, U+0085) and lone surrogates (which UTF-8
  cannot encode): those are written as `\\uXXXX` escapes, so a written line never holds them raw. Control
  characters below U+0020 (NUL, CR, ...) are escaped by JSON itself.
- `split_lines` splits on "\\n" only (never `str.splitlines`, which also breaks at U+2028, U+2029, U+0085,
  form feed, ...), so a file written by another tool with such a character raw inside a string still reads.
- `read_jsonl` parses every line it can and reports each one it cannot as `file:line: problem`, so one bad
  line never hides the others.
- `append_lines` appends whole lines under a lock held across threads and processes, with one `write` and an
  fsync, so concurrent writers never interleave.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# characters a line must never hold raw: Unicode line and paragraph separators, NEL, lone surrogates
_UNSAFE = re.compile("[\u2028\u2029\u0085\ud800-\udfff]")
_APPEND_LOCKS: dict[Path, threading.Lock] = {}
_APPEND_LOCKS_GUARD = threading.Lock()


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def dumps_line(value: Any) -> str:
    """`value` as one JSON line, "\\n" included (see the module docstring for what is escaped)."""
    return _UNSAFE.sub(_escape, json.dumps(value, ensure_ascii=False)) + "\n"


def encode_line(value: Any) -> bytes:
    """`dumps_line(value)` as UTF-8 (it always encodes: nothing unencodable is left raw)."""
    return dumps_line(value).encode("utf-8")


def split_lines(text: str) -> Iterator[tuple[int, str]]:
    """(1-based number, line) for every line of `text` that is not blank, split on "\\n" only. A "\\r"
    before the "\\n" (a file saved on Windows) is dropped."""
    for number, line in enumerate(text.split("\n"), start=1):
        if line.endswith("\r"):
            line = line[:-1]
        if line.strip():
            yield number, line


@dataclass
class JsonlRead:
    """What `read_jsonl` found in the file `path`: `values` as (line number, parsed value) in file order,
    and `problems` as (line number, problem) for each line that is not JSON. A reader that refuses some
    values adds its own with `refuse`; `messages` gives them all as `file:line: problem`, in line order."""

    path: str
    values: list[tuple[int, Any]] = field(default_factory=list)
    problems: list[tuple[int, str]] = field(default_factory=list)

    def refuse(self, number: int, problem: str) -> None:
        self.problems.append((number, problem))

    def messages(self) -> list[str]:
        return [f"{self.path}:{number}: {problem}" for number, problem in sorted(self.problems)]


def parse_jsonl(text: str, path: str | Path) -> JsonlRead:
    """Every line of `text` parsed (see `read_jsonl`); `path` names the file in the problems."""
    out = JsonlRead(str(path))
    for number, line in split_lines(text):
        try:
            out.values.append((number, json.loads(line)))
        except (ValueError, RecursionError) as exc:
            reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            out.refuse(number, f"not JSON: {reason}")
    return out


def read_text(path: str | Path) -> str | None:
    """The file's text, None when it does not exist. Bytes that are not UTF-8 become U+FFFD (the line
    holding them is then reported by whoever reads its fields, not the whole file refused); OSError when it
    cannot be read."""
    try:
        return Path(path).read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return None


def read_jsonl(path: str | Path) -> JsonlRead:
    """Every line of the file at `path`; a missing file has none. OSError when it cannot be read."""
    text = read_text(path)
    return JsonlRead(str(path)) if text is None else parse_jsonl(text, path)


def _append_lock(path: Path) -> threading.Lock:
    with _APPEND_LOCKS_GUARD:
        return _APPEND_LOCKS.setdefault(path.resolve(), threading.Lock())


def append_lines(path: str | Path, values: Iterable[Any], mode: int = 0o644) -> int:
    """Append each of `values` as one line (`encode_line`), all with one `write`, flushed and fsynced before
    returning, under a lock held across threads and processes (`fcntl.flock`). A file whose last line lacks
    its "\\n" (a hand edit) gets one first. Creates the file (with `mode`) and its folder. Every value is
    encoded before anything is written, so a value that cannot be encoded leaves the file as it was. Returns
    the bytes written."""
    data = b"".join(encode_line(v) for v in values)
    if not data:
        return 0
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _append_lock(path):
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data
            written = os.write(fd, data)
            if written != len(data):  # a regular file writes all or fails: say so, never go on silently
                raise OSError(f"{path}: wrote {written} of {len(data)} bytes")
            os.fsync(fd)
        finally:
            os.close(fd)  # releases the flock
    return len(data)


def dumps_json(value: Any, indent: int | None = 2) -> str:
    """`value` as a JSON document ("\n" at the end) with the same escapes as `dumps_line`, so no line of
    it holds a character another tool takes for a line break."""
    return _UNSAFE.sub(_escape, json.dumps(value, ensure_ascii=False, indent=indent)) + "\n"


def render_jsonl(values: Iterable[Any]) -> str:
    """The text of a JSONL file holding `values` (for files replaced whole, `atomic_write_text`)."""
    return "".join(dumps_line(v) for v in values)
