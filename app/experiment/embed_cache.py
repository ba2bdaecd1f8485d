"""Passage vectors kept by (model identity, passage prompt, text hash), so variants that share an embedder
embed only the texts they do not share (two chunkings of one document share every chunk the document's
short sections make), and a rebuilt variant after a record change embeds only the changed texts.

One SQLite file, `<rag.experiment.cache_dir>/embeddings.sqlite3`: key = sha256 of the JSON
[identity, prompt, sha256(text)], value = the float32 vector's bytes. The cache only ever holds what the
model returned for that exact text and prompt, so a hit is the vector a call would compute.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from app.ingest.pipeline import PassageEmbedder

CACHE_FILE = "embeddings.sqlite3"


def cache_key(identity: dict[str, Any], prompt: str, text: str) -> str:
    """sha256 of [identity (sorted keys), prompt, sha256(text)] as JSON."""
    text_hash = hashlib.sha256(text.encode("utf-8")).hexdigest()
    body = json.dumps([identity, prompt, text_hash], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


class CachedEmbedder:
    """A `PassageEmbedder` that asks `inner` only for the texts the cache lacks; counts hits and misses."""

    def __init__(self, inner: PassageEmbedder, identity: dict[str, Any], prompt: str, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.inner = inner
        self.identity = identity
        self.prompt = prompt
        self.hits = 0
        self.misses = 0
        self._db = sqlite3.connect(directory / CACHE_FILE, check_same_thread=False)
        self._db.execute("CREATE TABLE IF NOT EXISTS vectors (key TEXT PRIMARY KEY, vector BLOB NOT NULL)")

    def embed_passages(
        self,
        texts: list[str],
        show_progress: bool = False,
        on_progress: Callable[[int, int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> np.ndarray:
        keys = [cache_key(self.identity, self.prompt, text) for text in texts]
        found = self._get(keys)
        missing = [i for i, key in enumerate(keys) if key not in found]
        self.hits += len(texts) - len(missing)
        self.misses += len(missing)
        if missing:
            fresh = self.inner.embed_passages(
                [texts[i] for i in missing], show_progress, on_progress, should_stop
            )
            self._put({keys[i]: fresh[row] for row, i in enumerate(missing)})
            found.update({keys[i]: fresh[row] for row, i in enumerate(missing)})
        elif on_progress is not None:
            on_progress(len(texts), len(texts))
        return np.stack([found[key] for key in keys]).astype(np.float32)

    def seed(self, rows: Iterable[tuple[str, np.ndarray]], batch: int = 2000) -> int:
        """Keep the (text, vector) pairs of `rows` (vectors this model made for these texts under this
        prompt, e.g. the base collection's) that the cache lacks; how many were new."""
        added = 0
        pending: dict[str, np.ndarray] = {}
        for text, vector in rows:
            pending[cache_key(self.identity, self.prompt, text)] = vector
            if len(pending) >= batch:
                added += self._put_new(pending)
                pending = {}
        return added + self._put_new(pending)

    def _put_new(self, vectors: dict[str, np.ndarray]) -> int:
        new = {k: v for k, v in vectors.items() if k not in self._get(list(vectors))}
        if new:
            self._put(new)
        return len(new)

    def _get(self, keys: list[str]) -> dict[str, np.ndarray]:
        out = {}
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), 500):
            part = unique[start : start + 500]
            marks = ",".join("?" * len(part))
            rows = self._db.execute(f"SELECT key, vector FROM vectors WHERE key IN ({marks})", part)
            out.update({key: np.frombuffer(blob, dtype=np.float32) for key, blob in rows})
        return out

    def _put(self, vectors: dict[str, np.ndarray]) -> None:
        with self._db:
            self._db.executemany(
                "INSERT OR REPLACE INTO vectors (key, vector) VALUES (?, ?)",
                [(key, np.asarray(v, dtype=np.float32).tobytes()) for key, v in vectors.items()],
            )

    def close(self) -> None:
        self._db.close()
