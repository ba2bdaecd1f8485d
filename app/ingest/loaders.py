"""Load documents from Markdown, plain-text and JSONL files, collecting every problem instead of raising.

Formats, by suffix (case-insensitive):
- `.md` / `.markdown`: one document; optional YAML front matter between `---` lines at the top. Keys `id` and
  `title` become the document's id and title; every other key is metadata (`tags: [a, b]` -> "a,b", dates ->
  ISO strings). Without `id`, the id is the path relative to the directory argument, suffix removed, with `/`
  separators (a file named directly: its stem). Without `title`: the first `# ` heading, else the stem.
  `source` defaults to the relative path (with suffix).
- `.txt`: one document; id as above, title = stem, `source` defaults to the relative path.
- `.jsonl`: one document per non-blank line: `id` or `_id` (string or int) and `text` required, `title`
  optional, every other key metadata (scalars, or a list of scalars, comma-joined). A BEIR `corpus.jsonl`
  (`_id`, `title`, `text`) is this format.

Directories are walked recursively in sorted order; hidden files and directories are skipped, and so are files
with other suffixes. A file named directly with another suffix is an error.

Symbolic links inside a directory are not followed unless `follow_symlinks` (rag.ingest.follow_symlinks) is
true: each one is reported as a LoadError ("symbolic link not followed"), so nothing outside the folder given
is read by accident (a link to /etc/hostname) and the report says what was left out. A path named directly is
read even when it is a link (it was asked for). With `follow_symlinks`, links are followed, and a directory
reached twice (a link to an ancestor) is reported instead of walked again. A link loop (a link to itself), a
broken link, an unreadable directory and anything that is not a regular file (a FIFO would block the read) are
reported as bad files.

Access scope (docs/access.md): `tenant` (a string) and `access` (a list of strings, kept as a list, never
comma-joined; `app.access.scope.checked_access`) in front matter or a JSONL line; a document without its own
takes the longest matching `rag.ingest.access_defaults` entry for its file (`access_defaults`).

Metadata keys (front matter keys, JSONL fields) must be non-empty and not reserved by the store (see
`app.store.metadata_key_problem`); every string must be valid Unicode (a JSON "\\ud800" escape is not). A JSON
line nested too deeply for the parser is a bad line like any other.

A bad JSONL line skips that document only; a bad file skips that file only. A document id seen twice in one
run keeps the first and reports the second, naming both places. `load_paths` never raises for bad input:
every problem is a LoadError, so ingest reads and validates everything it was given before writing anything.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import date, datetime
from pathlib import Path
from typing import Any

import yaml

from app.access.scope import ACCESS, TENANT, AccessFieldError, checked_access, checked_tenant
from app.ingest.types import Document, LoadError
from app.settings import AccessDefault
from app.store import metadata_key_problem, metadata_value_problem, unicode_problem

MARKDOWN_SUFFIXES = frozenset({".md", ".markdown"})
TEXT_SUFFIXES = frozenset({".txt"})
JSONL_SUFFIXES = frozenset({".jsonl"})
SUPPORTED_SUFFIXES = MARKDOWN_SUFFIXES | TEXT_SUFFIXES | JSONL_SUFFIXES

Scalar = str | int | float | bool

_FRONT_MATTER_OPEN = "---"
_FRONT_MATTER_CLOSE = ("---", "...")
_H1 = re.compile(r"^ {0,3}#[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


@dataclass
class LoadResult:
    documents: list[Document] = field(default_factory=list)
    errors: list[LoadError] = field(default_factory=list)
    # files read without a file-level error (a JSONL file with some bad lines is still listed)
    files: list[str] = field(default_factory=list)


class _Invalid(Exception):
    """One problem with one document or file; becomes a LoadError where the location is known."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.message = message
        self.line = line


def load_paths(
    paths: list[str | Path], follow_symlinks: bool = False, access_defaults: Sequence[AccessDefault] = ()
) -> LoadResult:
    """Load every supported file under `paths` (files or directories) in order; never raises for bad input.

    `follow_symlinks`: follow symbolic links found inside the directories (see the module docstring).
    `access_defaults`: rag.ingest.access_defaults, for the documents that give no scope of their own."""
    result = LoadResult()
    seen: dict[str, str] = {}  # doc id -> "file:line" where it was first defined
    for given in paths:
        root = Path(given)
        try:
            info = root.stat()
        except OSError as exc:
            result.errors.append(LoadError(str(root), None, _stat_problem(root, exc)))
            continue
        if stat.S_ISDIR(info.st_mode):
            targets = _walk(root, follow_symlinks)
        elif not stat.S_ISREG(info.st_mode):
            result.errors.append(LoadError(str(root), None, "not a regular file or a directory"))
            continue
        elif root.suffix.lower() not in SUPPORTED_SUFFIXES:
            result.errors.append(
                LoadError(
                    str(root),
                    None,
                    f"unsupported file type '{root.suffix or '(none)'}' "
                    f"(expected one of {', '.join(sorted(SUPPORTED_SUFFIXES))})",
                )
            )
            continue
        else:
            targets = [(root, Path(root.name))]
        for target in targets:
            if isinstance(target, LoadError):
                result.errors.append(target)
            else:
                _load_file(*target, result, seen)
    if access_defaults:
        result.documents = [with_default_scope(doc, access_defaults) for doc in result.documents]
    return result


# _EMPTY_ACCESS_KEPT: a document that gives `access: []` (or null) keeps the key, its value None, so that
# `with_default_scope` does not fill it from rag.ingest.access_defaults: an empty scope reads as "the admin
# only", and a folder's default (say `public`) must not widen it. The chunker drops the None.


def with_default_scope(doc: Document, defaults: Sequence[AccessDefault]) -> Document:
    """`doc` with the `tenant` and `access` of the longest entry of `defaults` whose path is its file or a
    folder above it (both made absolute from the working directory), for each of the two it does not give
    itself; unchanged when none matches (the first of two equally long entries counts)."""
    if TENANT in doc.metadata and ACCESS in doc.metadata:
        return doc
    file = Path(os.path.abspath(doc.origin)).parts
    best: AccessDefault | None = None
    depth = -1
    for entry in defaults:
        parts = Path(os.path.abspath(entry.path)).parts
        if file[: len(parts)] == parts and len(parts) > depth:
            best, depth = entry, len(parts)
    if best is None:
        return doc
    metadata = dict(doc.metadata)
    if TENANT not in metadata and best.tenant is not None:
        metadata[TENANT] = best.tenant
    if ACCESS not in metadata and best.access:
        metadata[ACCESS] = list(best.access)
    return replace(doc, metadata=metadata)


def _stat_problem(path: Path, exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "symbolic link loop (the link leads back to itself)"
    if exc.errno == errno.ENOENT:
        if path.is_symlink():
            return f"broken symbolic link (its target {_link_target(path)} does not exist)"
        return "no such file or directory"
    return f"cannot read: {exc.strerror or exc}"


def _link_target(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def _walk(root: Path, follow_symlinks: bool) -> list[tuple[Path, Path] | LoadError]:
    """(file, path relative to `root`) for the supported, non-hidden regular files under `root`, and a
    LoadError for each entry that cannot be read (links not followed, loops, unreadable directories, special
    files), all in the order of their relative paths (so "a/z" before "b")."""
    walk = _Walk(follow_symlinks)
    walk.visit(root)
    entries: list[tuple[Path, Path] | LoadError] = [(file, file.relative_to(root)) for file in walk.found]
    entries += walk.errors
    return sorted(
        entries,
        key=lambda e: (Path(e.path).relative_to(root) if isinstance(e, LoadError) else e[1]).as_posix(),
    )


class _Walk:
    """One walk of a folder tree: the supported regular files found, and the entries that cannot be read."""

    def __init__(self, follow_symlinks: bool):
        self.follow_symlinks = follow_symlinks
        self.found: list[Path] = []
        self.errors: list[LoadError] = []
        self.walked: set[tuple[int, int]] = set()  # (device, inode) of every directory walked: a cycle stops

    def visit(self, directory: Path) -> None:
        """Every non-hidden entry of `directory`, by name, and of its subdirectories, depth first."""
        for entry in self._listing(directory):
            if not entry.name.startswith("."):
                self._entry(Path(entry.path), entry)

    def _listing(self, directory: Path) -> list[os.DirEntry[str]]:
        """The entries of `directory` by name; none (and an error) when it cannot be listed or was walked
        already (a symbolic link loop)."""
        try:
            info = directory.stat()
            if (info.st_dev, info.st_ino) in self.walked:
                self.errors.append(
                    LoadError(
                        str(directory),
                        None,
                        f"symbolic link loop: it leads to {os.path.realpath(directory)}, a directory "
                        f"already walked; not walked again",
                    )
                )
                return []
            self.walked.add((info.st_dev, info.st_ino))
            with os.scandir(directory) as listing:
                return sorted(listing, key=lambda e: e.name)
        except OSError as exc:
            self.errors.append(
                LoadError(str(directory), None, f"cannot list directory: {exc.strerror or exc}")
            )
            return []

    def _entry(self, path: Path, entry: os.DirEntry[str]) -> None:
        """A directory is walked, a supported regular file found; a link not followed, a special file or an
        entry that cannot be read is an error."""
        supported = path.suffix.lower() in SUPPORTED_SUFFIXES
        try:
            is_link = entry.is_symlink()
            info = path.stat()  # follows links
        except OSError as exc:
            self.errors.append(LoadError(str(path), None, _stat_problem(path, exc)))
            return
        is_dir = stat.S_ISDIR(info.st_mode)
        if is_link and not self.follow_symlinks:
            if is_dir or supported:
                self.errors.append(
                    LoadError(
                        str(path),
                        None,
                        f"symbolic link not followed (it points to {_link_target(path)}); "
                        f"set rag.ingest.follow_symlinks: true to read links",
                    )
                )
            return
        if is_dir:
            self.visit(path)
        elif supported:
            if stat.S_ISREG(info.st_mode):
                self.found.append(path)
            else:
                self.errors.append(
                    LoadError(str(path), None, "not a regular file (a FIFO, socket or device)")
                )


def _load_file(file: Path, relative: Path, result: LoadResult, seen: dict[str, str]) -> None:
    origin = str(file)
    suffix = file.suffix.lower()
    file_errors: list[LoadError] = []  # line-level ones, reported in line order
    try:
        data = file.read_bytes()
    except OSError as exc:
        message = _stat_problem(file, exc) if exc.errno in (errno.ELOOP, errno.ENOENT) else None
        result.errors.append(LoadError(origin, None, message or f"cannot read file: {exc.strerror or exc}"))
        return
    try:
        if suffix in JSONL_SUFFIXES:
            documents = _read_jsonl(data, origin, file_errors)
        else:
            text = _decode(data)
            if suffix in MARKDOWN_SUFFIXES:
                documents = [_read_markdown(text, origin, relative)]
            else:
                documents = [_read_text(text, origin, relative)]
    except _Invalid as exc:
        result.errors.append(LoadError(origin, exc.line, exc.message))
        return
    result.files.append(origin)
    for doc in documents:
        where = f"{origin}:{doc.line}" if doc.line else origin
        if doc.doc_id in seen:
            file_errors.append(
                LoadError(
                    origin, doc.line, f"duplicate doc id '{doc.doc_id}' (first defined at {seen[doc.doc_id]})"
                )
            )
            continue
        seen[doc.doc_id] = where
        result.documents.append(doc)
    result.errors.extend(sorted(file_errors, key=lambda e: e.line or 0))


def _decode(data: bytes, line_offset: int = 0) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = line_offset + data[: exc.start].count(b"\n") + 1
        raise _Invalid(f"not valid UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start}", line) from None


def _path_id(relative: Path) -> str:
    return relative.with_suffix("").as_posix()


# --- Markdown and plain text ------------------------------------------------------------------------------


def _read_markdown(text: str, origin: str, relative: Path) -> Document:
    front, body = _split_front_matter(text)
    doc_id = _pop_id(front, "id") or _path_id(relative)
    title = front.pop("title", None)
    metadata = {"source": relative.as_posix(), **front}
    body = body.strip()
    if not body:
        raise _Invalid("document has no text (only front matter or whitespace)")
    return Document(
        doc_id=doc_id,
        text=body,
        title=str(title) if title not in (None, "") else (_first_h1(body) or relative.stem),
        metadata=metadata,
        origin=origin,
    )


def _read_text(text: str, origin: str, relative: Path) -> Document:
    body = text.strip()
    if not body:
        raise _Invalid("document has no text")
    return Document(
        doc_id=_path_id(relative),
        text=body,
        title=relative.stem,
        metadata={"source": relative.as_posix()},
        origin=origin,
    )


def _split_front_matter(text: str) -> tuple[dict[str, Scalar | list[str] | None], str]:
    """(metadata, body). Lines are 1-based file lines in every message."""
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].rstrip() != _FRONT_MATTER_OPEN:
        return {}, text
    close = next((i for i in range(1, len(lines)) if lines[i].rstrip() in _FRONT_MATTER_CLOSE), None)
    if close is None:
        raise _Invalid("front matter opened with '---' is never closed (expected a line with only '---')", 1)
    block = "".join(lines[1:close])
    try:
        raw = yaml.safe_load(block)
    except RecursionError:
        raise _Invalid("front matter is not valid YAML: nested too deeply to read", 2) from None
    except yaml.YAMLError as exc:
        # +1 for 1-based lines, +1 for the opening '---'
        problem_mark = getattr(exc, "problem_mark", None)
        context_mark = getattr(exc, "context_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        context = getattr(exc, "context", None)
        if context and context_mark is not None:
            problem += f" ({context} started at line {context_mark.line + 2})"
        mark = problem_mark or context_mark
        raise _Invalid(f"front matter is not valid YAML: {problem}", mark.line + 2 if mark else 1) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise _Invalid(f"front matter must be a mapping of keys to values, got {type(raw).__name__}", 2)
    metadata: dict[str, Scalar | list[str] | None] = {}
    for key, value in raw.items():
        try:
            problem = metadata_key_problem(str(key))
            if problem:
                raise _Invalid(problem)
            scalar = _pop_id({"id": value}, "id") if key == "id" else _field_value(str(key), value)
            if problem := metadata_value_problem(scalar):
                raise _Invalid(problem)
        except _Invalid as exc:
            raise _Invalid(
                f"front matter key {str(key)!r}: {exc.message}", _key_line(lines, close, key)
            ) from None
        if scalar is not None or key == ACCESS:  # an empty access is kept: see _EMPTY_ACCESS_KEPT
            metadata[str(key)] = scalar
    return metadata, "".join(lines[close + 1 :])


def _key_line(lines: list[str], close: int, key: object) -> int:
    name = re.escape(str(key))
    pattern = re.compile(rf"""^(?:{name}|"{name}"|'{name}')\s*:""")
    return next((i + 1 for i in range(1, close) if pattern.match(lines[i])), 2)


def _first_h1(body: str) -> str | None:
    fence: str | None = None
    for line in body.splitlines():
        fence_match = _FENCE.match(line)
        if fence_match:
            marker = fence_match.group(1)
            if fence is None:
                fence = marker
            elif marker[0] == fence[0] and len(marker) >= len(fence):
                fence = None
            continue
        if fence is None and (heading := _H1.match(line)):
            return heading.group(1).strip()
    return None


# --- JSONL ------------------------------------------------------------------------------------------------


def _read_jsonl(data: bytes, origin: str, errors: list[LoadError]) -> list[Document]:
    documents: list[Document] = []
    for number, raw_line in enumerate(data.split(b"\n"), start=1):
        try:
            line = _decode(raw_line, number - 1)
            if not line.strip():
                continue
            documents.append(_jsonl_document(line, origin, number))
        except _Invalid as exc:
            errors.append(LoadError(origin, exc.line or number, exc.message))
    return documents


def _jsonl_document(line: str, origin: str, number: int) -> Document:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise _Invalid(f"invalid JSON: {exc.msg} (column {exc.colno})", number) from None
    except RecursionError:
        raise _Invalid("invalid JSON: nested too deeply to read", number) from None
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        raise _Invalid(f"invalid JSON: {exc}", number) from None
    if not isinstance(record, dict):
        raise _Invalid(f"expected a JSON object, got {_json_type(record)}", number)

    if "id" in record and "_id" in record and str(record["id"]) != str(record["_id"]):
        raise _Invalid(f"both 'id' ({record['id']!r}) and '_id' ({record['_id']!r}) given; use one", number)
    key = "id" if "id" in record else "_id"
    doc_id = _pop_id(record, key)
    record.pop("_id", None)
    if doc_id is None:
        raise _Invalid("missing 'id' (or '_id'): a non-empty string or an integer", number)

    text = record.pop("text", None)
    if not isinstance(text, str) or not text.strip():
        got = (
            "missing" if text is None else f"got {_json_type(text)}" if not isinstance(text, str) else "empty"
        )
        raise _Invalid(f"'text' must be a non-empty string ({got})", number)

    title = record.pop("title", None)
    if title is not None and not isinstance(title, str | int | float):
        raise _Invalid(f"'title' must be a string, got {_json_type(title)}", number)

    for name, value in (("id", doc_id), ("text", text), ("title", title)):
        if isinstance(value, str) and (problem := unicode_problem(value)):
            raise _Invalid(f"field '{name}': {problem}", number)

    metadata = _jsonl_metadata(record, number)
    return Document(
        doc_id=doc_id,
        text=text,
        title="" if title is None else str(title),
        metadata=metadata,
        origin=origin,
        line=number,
    )


def _jsonl_metadata(record: dict[str, Any], number: int) -> dict[str, Scalar | list[str] | None]:
    """A JSONL line's fields other than id, text and title, as the document's metadata; an _Invalid
    naming the field and the line for the first one that cannot be stored."""
    metadata: dict[str, Scalar | list[str] | None] = {}
    for name, value in record.items():
        try:
            problem = metadata_key_problem(name)
            if problem:
                raise _Invalid(problem)
            scalar = _field_value(name, value)
            if problem := metadata_value_problem(scalar):
                raise _Invalid(problem)
        except _Invalid as exc:
            raise _Invalid(f"field {name!r}: {exc.message}", number) from None
        if scalar is not None or name == ACCESS:  # an empty access is kept: see _EMPTY_ACCESS_KEPT
            metadata[name] = scalar
    return metadata


def _json_type(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return "a number" if isinstance(value, int | float) else "a string"


# --- shared -----------------------------------------------------------------------------------------------


def _pop_id(mapping: dict[str, Any], key: str) -> str | None:
    """The id under `key` as a string; None if absent. Strings and integers only: `1.5` or `true` is wrong."""
    if key not in mapping:
        return None
    value = mapping.pop(key)
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise _Invalid(f"'{key}' must be a string or an integer, got {value!r}")
    doc_id = str(value).strip()
    if not doc_id:
        raise _Invalid(f"'{key}' is empty")
    return doc_id


def _field_value(name: str, value: Any) -> Scalar | list[str] | None:
    """A metadata field's value as stored: the access fields checked as such, the others `_metadata_value`."""
    try:
        if name == TENANT:
            return checked_tenant(value)
        if name == ACCESS:
            return checked_access(value)
    except AccessFieldError as exc:
        raise _Invalid(str(exc)) from None
    return _metadata_value(value)


def _metadata_value(value: Any) -> Scalar | None:
    """A metadata value as Chroma can store it: scalars as they are, dates as ISO strings, a list of scalars
    comma-joined; None means "absent" (so does an empty object). Other nested objects, and lists of objects or
    lists, are errors."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, list | tuple):
        items = [
            _metadata_value(item) if not isinstance(item, list | tuple | dict) else item for item in value
        ]
        if any(isinstance(item, list | tuple | dict) for item in items):
            raise _Invalid(
                "a list may hold only scalars (strings, numbers, dates), not nested lists or objects"
            )
        return ",".join(str(item) for item in items if item is not None)
    if isinstance(value, dict):
        if not value:
            return None  # BEIR corpora write `"metadata": {}` on every line; an empty object holds nothing
        raise _Invalid(
            "nested objects are not supported; metadata values must be scalars or lists of scalars"
        )
    raise _Invalid(f"unsupported value {value!r}")
