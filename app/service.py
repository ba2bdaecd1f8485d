"""The composition root: one `Sieve` holds the models, the store, the BM25 index and the chain.

The API, the CLI and the evaluation all retrieve through `Sieve.chain`, the one chain object.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

from app.ingest.chunker import embedding_text
from app.ingest.pipeline import Ingestor, IngestReport, Progress
from app.ingest.types import Chunk, Document
from app.models import Embedder, load_embedder, load_reranker
from app.retrieval.candidates import CandidateGenerator
from app.retrieval.chain import RetrievalChain
from app.retrieval.lexical import Analyzer, Bm25Index
from app.retrieval.stages import build_stages
from app.retrieval.stages.rerank import PassageScorer
from app.retrieval.types import RetrievalResult, knowledge_tag_of
from app.settings import Settings
from app.store import ChromaStore, StoredChunk, drop_collection

log = logging.getLogger(__name__)


class Sieve:
    def __init__(
        self,
        settings: Settings,
        embedder: Embedder,
        store: ChromaStore,
        reranker: object | None,
        lexical: Bm25Index | None = None,
    ):
        """`lexical`: an index already built over `store` with these settings' analyzer, k1 and b;
        None builds one."""
        self.settings = settings
        self.embedder = embedder
        self.store = store
        self.reranker = reranker
        self.analyzer = lexical.analyzer if lexical else Analyzer(settings.rag.retrieval.jieba_user_dict)
        self.lexical: Bm25Index
        self.chain: RetrievalChain
        if lexical is None:
            self.refresh_index()
        else:
            self.lexical = lexical
            self.chain = self._build_chain()

    @classmethod
    def open(cls, settings: Settings, rebuild: bool = False) -> Sieve:
        """Load the models and open the store (the slow part of startup); builds the BM25 index."""
        rag = settings.rag
        t0 = time.perf_counter()
        embedder = load_embedder(rag.models)
        reranker = (
            load_reranker(rag.chain.rerank, device=rag.models.device) if rag.chain.rerank.enabled else None
        )
        log.info(
            "models loaded in %.1fs: embedder=%s (dim %d), reranker=%s",
            time.perf_counter() - t0,
            embedder.name,
            embedder.dimension,
            getattr(reranker, "name", None) or "none",
        )
        if rebuild:
            drop_collection(rag.store)
        store = ChromaStore.open(rag.store, embedder.identity())
        return cls(settings, embedder, store, reranker)

    def close(self) -> None:
        self.store.close()

    def with_settings(self, settings: Settings) -> Sieve:
        """Another Sieve over the same store and models, with `settings`' retrieval and chain options
        (benchmarks compare variants this way without reloading anything). The BM25 index is shared
        unless the variant changes its analyzer or parameters; models and store settings are not re-read."""
        same_index = (
            settings.rag.retrieval.jieba_user_dict == self.settings.rag.retrieval.jieba_user_dict
            and (settings.rag.chain.bm25.k1, settings.rag.chain.bm25.b)
            == (self.settings.rag.chain.bm25.k1, self.settings.rag.chain.bm25.b)
        )
        return Sieve(settings, self.embedder, self.store, self.reranker, self.lexical if same_index else None)

    # -- ingest ------------------------------------------------------------------------------------

    def ingest(
        self,
        paths: Sequence[str | Path],
        progress: Progress | bool = False,
        should_stop: Callable[[], bool] | None = None,
    ) -> IngestReport:
        writes: list[int] = []
        try:
            return self._ingestor(writes).ingest(paths, progress, should_stop)
        finally:
            if writes:  # also after an interrupted ingest: its committed batches are stored
                self.refresh_index()

    def ingest_documents(
        self,
        documents: Sequence[Document],
        on_progress: Callable[[int, int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        on_committed: Callable[[int, int], None] | None = None,
    ) -> IngestReport:
        """Add or replace `documents`; `should_stop()` -> True stops it at the next slice
        (`IngestInterrupted`, the batches committed so far stay stored). Progress goes to the log."""
        writes: list[int] = []
        try:
            return self._ingestor(writes).ingest_documents(
                documents,
                progress="log",
                on_progress=on_progress,
                should_stop=should_stop,
                on_committed=on_committed,
            )
        finally:
            if writes:
                self.refresh_index()

    def chunk_count(self, documents: Sequence[Document]) -> int:
        """How many chunks `documents` make with the configured chunker (no model, no store)."""
        return len(self._ingestor().chunk(documents))

    def _ingestor(self, writes: list[int] | None = None) -> Ingestor:
        """An Ingestor whose commit hook counts committed writes into `writes` (the index is rebuilt after
        an ingest that wrote anything)."""

        def on_commit(upserted: list[StoredChunk], deleted_ids: list[str]) -> None:
            if writes is not None:
                writes.append(len(upserted) + len(deleted_ids))

        return Ingestor(self.store, self.embedder, self.settings.rag.ingest, on_commit=on_commit)

    def refresh_index(self) -> None:
        """Rebuild the BM25 index over the whole collection and the chain that uses it."""
        t0 = time.perf_counter()
        ids, texts, tags = [], [], []
        for stored in self.store.iter_all(include_text=True):
            ids.append(stored.chunk_id)
            texts.append(_index_text(stored))
            tags.append(knowledge_tag_of(stored.metadata))
        bm25 = self.settings.rag.chain.bm25
        self.lexical = Bm25Index.build(ids, texts, self.analyzer, k1=bm25.k1, b=bm25.b, knowledge_tags=tags)
        self.chain = self._build_chain()
        log.info("BM25 index over %d chunks built in %.1fs", len(ids), time.perf_counter() - t0)

    # -- retrieval ---------------------------------------------------------------------------------

    def retrieve(
        self, query: str, top_k: int | None = None, knowledge_tag: str | None = None
    ) -> RetrievalResult:
        return self.chain.retrieve(query, top_k or self.settings.rag.retrieval.top_k, knowledge_tag)

    def _build_chain(self) -> RetrievalChain:
        """The chain every caller retrieves through: the stages of `rag.chain`, in that order."""
        rag = self.settings.rag
        # RerankStage checks at construction that a reranker really has .score(query, passages).
        stages = build_stages(rag.chain, self.lexical, cast("PassageScorer | None", self.reranker))
        candidates = CandidateGenerator(self.store, rag.retrieval, self.lexical)
        return RetrievalChain(self.embedder, candidates, stages)

    def describe(self) -> dict[str, object]:
        """What a report header needs: models, store and the chain's settings."""
        rag = self.settings.rag
        return {
            "embedder": self.embedder.identity(),
            "reranker": getattr(self.reranker, "name", None),
            "store": self.store.description,
            "collection": self.store.name,
            "chunks": self.store.count(),
            "retrieval": rag.retrieval.model_dump(),
            "chain": rag.chain.model_dump(),
        }


def _index_text(stored: StoredChunk) -> str:
    meta = stored.metadata
    heading = str(meta.get("heading_path", ""))
    chunk = Chunk(
        chunk_id=stored.chunk_id,
        doc_id=str(meta.get("doc_id", "")),
        text=stored.text,
        position=int(meta.get("position", 0)),
        heading_path=tuple(p for p in heading.split(" > ") if p),
        metadata=meta,
    )
    return embedding_text(chunk, str(meta.get("title", "")))
