"""Documents as loaded from files, and the chunks made from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Document:
    doc_id: str
    text: str
    title: str = ""
    # source, knowledge, status, effectiveFrom, effectiveTo, ... (scalar values only)
    metadata: dict[str, Any] = field(default_factory=dict)
    origin: str = ""  # the file it came from, as given to the loader
    line: int | None = None  # 1-based line in `origin` (JSONL), None for whole-file documents


@dataclass(frozen=True)
class Chunk:
    chunk_id: str
    doc_id: str
    text: str
    position: int  # 0-based index of the chunk within its document
    heading_path: tuple[str, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LoadError:
    path: str
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        return f"{where}: {self.message}"
