"""The vector store. Only this package imports chromadb."""

from app.store.chroma import (
    ChromaStore,
    EmbedderMismatchError,
    FailureKind,
    StoreError,
    StoreFailedError,
    StoreFailure,
    StoreLockedError,
    StoreUnavailableError,
    check_not_locked,
    metadata_key_problem,
    metadata_value_problem,
    store_metadata_problem,
    unicode_problem,
)
from app.store.chunk_cache import ChunkCache
from app.store.space import InsufficientStorage, SpaceGuard, storage_exhausted
from app.store.types import ChangeEntry, StoredChunk, vector_norm

__all__ = [
    "ChangeEntry",
    "ChromaStore",
    "ChunkCache",
    "EmbedderMismatchError",
    "FailureKind",
    "InsufficientStorage",
    "StoreError",
    "StoreFailedError",
    "StoreFailure",
    "StoreLockedError",
    "StoreUnavailableError",
    "SpaceGuard",
    "StoredChunk",
    "check_not_locked",
    "metadata_key_problem",
    "metadata_value_problem",
    "storage_exhausted",
    "store_metadata_problem",
    "unicode_problem",
    "vector_norm",
]
