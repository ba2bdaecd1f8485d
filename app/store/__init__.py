"""The vector store. Only this package imports chromadb."""

from app.store.chroma import (
    ChromaStore,
    EmbedderMismatchError,
    StoredChunk,
    StoreError,
    StoreLockedError,
    StoreUnavailableError,
    drop_collection,
    metadata_key_problem,
    metadata_value_problem,
    unicode_problem,
)

__all__ = [
    "ChromaStore",
    "EmbedderMismatchError",
    "StoreError",
    "StoreLockedError",
    "StoreUnavailableError",
    "StoredChunk",
    "drop_collection",
    "metadata_key_problem",
    "metadata_value_problem",
    "unicode_problem",
]
