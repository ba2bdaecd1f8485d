"""The chunks made from documents, and what a load reports (`Document` is the store's: app/store/types.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.store.types import Document

__all__ = ["Chunk", "Document", "LoadError"]


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
