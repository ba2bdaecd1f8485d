"""The composition root: one `Sieve` holds the models, the store, the BM25 index and the chain.

The API, the CLI and the evaluation all retrieve through `Sieve.chain`, the one chain object.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from app.access.scope import Principal
from app.ingest.chunker import embedding_text, stored_chunk
from app.ingest.pipeline import Ingestor, IngestReport, Progress
from app.ingest.reconcile import Reconciler, ReconcileReport, log_outcome, log_plan
from app.ingest.types import Document
from app.lexical.files import LexicalFilesError, check_free
from app.lexical.index import Analyzer, Bm25Index
from app.lexical.sync import LexicalSync, build_from_store
from app.models import Embedder, EmbeddingInterrupted, load_embedder, load_reranker
from app.retrieval.candidates import CandidateGenerator
from app.retrieval.chain import RetrievalChain
from app.retrieval.stages import build_stages
from app.retrieval.stages.rerank import PassageScorer
from app.retrieval.types import RetrievalResult
from app.settings import Settings
from app.store import ChromaStore, StoredChunk, check_not_locked
from app.store.record import DocumentRecord, content_hash, open_record
from app.store.types import index_label_of

if TYPE_CHECKING:
    from app.evaluation.session import EvaluationTarget

log = logging.getLogger(__name__)

RECONCILE_SLICE = 500  # documents a reconciliation reads from the record and ingests at a time
CHUNK_ID_CACHE = "reconcile-chunk-ids.json"  # in the BM25 index's folder (app/ingest/reconcile.py)


class Sieve:
    def __init__(
        self,
        settings: Settings,
        embedder: Embedder,
        store: ChromaStore,
        reranker: object | None,
        lexical: Bm25Index | None = None,
        record: DocumentRecord | None = None,
    ):
        """`lexical`: an index already built over `store` with these settings' analyzer, k1 and b;
        None builds one. `record`: the document record of `store` (app/store/record.py); None keeps no
        document (tests and benchmarks of the index alone)."""
        self.settings = settings
        self.embedder = embedder
        self.store = store
        self.reranker = reranker
        self.record = record
        self.analyzer = lexical.analyzer if lexical else Analyzer(settings.rag.retrieval.jieba_user_dict)
        self.lexical: Bm25Index
        self.chain: RetrievalChain
        self._sync: LexicalSync | None = None
        self.reconciler = Reconciler(settings.rag.ingest)
        if lexical is None:
            self._open_index()
        else:
            self.lexical = lexical
            self.chain = self._build_chain()

    @classmethod
    def open(cls, settings: Settings) -> Sieve:
        """Load the models and open the store (the slow part of startup); builds the BM25 index. An embedded
        store another process holds is a `StoreLockedError` before any model loads."""
        rag = settings.rag
        check_not_locked(rag.store)
        t0 = time.perf_counter()
        embedder = load_embedder(rag.models)
        reranker = (
            load_reranker(rag.chain.rerank, device=rag.models.device) if rag.chain.rerank.enabled else None
        )
        log.info(
            "models loaded in %.1fs: embedder=%s (dim %d, queries %s, %d query model call(s) at once), "
            "reranker=%s",
            time.perf_counter() - t0,
            embedder.name,
            embedder.dimension,
            embedder.query_mode,
            embedder.query_slots,
            getattr(reranker, "name", None) or "none",
        )
        store = ChromaStore.open(rag.store, embedder.identity())
        try:
            record = open_record(rag.store, store.client)
        except Exception:  # a record that cannot be opened: its message says the way back
            store.close()
            raise
        log.info("vector index loaded in %.1fs", store.warm_up(embedder.dimension))
        log.info(
            "%s", store.load_exact(rag.store.exact_search_max_chunks, rag.store.exact_filtered_max_chunks)
        )
        if record.damage is None:
            log.info("%s: %d documents kept", record.description, record.count())
        else:  # retrieval serves the index; the record refuses writes, and /ready says why
            log.error("%s", record.damaged_message(record.damage))
        try:
            return cls(settings, embedder, store, reranker, record=record)
        except Exception:  # the BM25 index failed to open (a store that fails its reads): let go of both
            record.close()
            store.close()
            raise

    def wait_id_check(self, timeout: float | None = None) -> None:
        """Wait for the BM25 index's background id check against the store, when one runs (it lists
        every id: seconds at a million chunks, beside the first queries). Benchmarks time what follows it."""
        if self._sync is not None and self._sync.id_check is not None:
            self._sync.id_check.join(timeout)

    def close(self) -> None:
        """Stop the index follower, the embedder's ingest workers and the store."""
        if self._sync is not None:
            self._sync.close()
        close_embedder = getattr(self.embedder, "close", None)
        if close_embedder is not None:
            close_embedder()  # its worker threads (a later ingest starts them again)
        if self.record is not None:
            self.record.close()
        self.store.close()

    def with_settings(
        self,
        settings: Settings,
        embedder: Embedder | None = None,
        store: ChromaStore | None = None,
        reranker: object | None = None,
    ) -> Sieve:
        """Another Sieve over the same store and models, with `settings`' retrieval and chain options
        (benchmarks compare variants this way without reloading anything). The BM25 index is shared
        unless the variant changes its analyzer or parameters; models and store settings are not re-read.
        An experiment's variant may bring its own `embedder`, `reranker` and `store` (another collection of
        this client): then its BM25 index is built in memory over that store. No record: nothing is written
        through it."""
        store = store or self.store
        same_index = (
            store is self.store
            and settings.rag.retrieval.jieba_user_dict == self.settings.rag.retrieval.jieba_user_dict
            and (settings.rag.chain.bm25.k1, settings.rag.chain.bm25.b)
            == (self.settings.rag.chain.bm25.k1, self.settings.rag.chain.bm25.b)
        )
        if same_index:
            lexical = self.lexical
        else:  # a variant's own index, in memory only (the persisted one belongs to this Sieve)
            bm25 = settings.rag.chain.bm25
            analyzer = Analyzer(settings.rag.retrieval.jieba_user_dict)
            lexical = build_from_store(store, analyzer, bm25.k1, bm25.b, index_text)
        return Sieve(
            settings,
            embedder or self.embedder,
            store,
            self.reranker if reranker is None else reranker,
            lexical,
            self.record if store is self.store else None,
        )

    # -- ingest ------------------------------------------------------------------------------------

    def ingest(
        self,
        paths: Sequence[str | Path],
        progress: Progress | bool = False,
        should_stop: Callable[[], bool] | None = None,
        log_tombstones: bool = True,
    ) -> IngestReport:
        """Ingest files and directories; the BM25 index follows every committed batch (`on_commit`).
        Documents deleted through the API stay out while unchanged in their files (`log_tombstones`: say
        which)."""
        return self._ingestor().ingest(paths, progress, should_stop, log_tombstones)

    def ingest_documents(
        self,
        documents: Sequence[Document],
        on_progress: Callable[[int, int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        on_committed: Callable[[int, int], None] | None = None,
    ) -> IngestReport:
        """Add or replace `documents`; `should_stop()` -> True stops it at the next slice
        (`IngestInterrupted`; the batches committed so far stay stored and indexed). Progress goes to the
        log. Once done, the reconciliation knows the documents are indexed as the record holds them."""
        report = self._ingestor().ingest_documents(
            documents,
            progress="log",
            on_progress=on_progress,
            should_stop=should_stop,
            on_committed=on_committed,
        )
        self.reconciler.indexed(documents)
        return report

    def delete_documents(self, doc_ids: Sequence[str]) -> tuple[int, int]:
        """Delete `doc_ids` as the API does: from the document record first, each leaving a tombstone there
        (so an ingest of its unchanged file does not add it again), then their chunks from the index and the
        BM25 index. (documents the record held, chunks deleted)."""
        kept = self.record.delete(doc_ids, tombstone=True) if self.record is not None else 0
        chunk_ids = sorted(self.store.metadata_of([], list(doc_ids)))
        if chunk_ids:
            self.store.delete(chunk_ids)
            self.on_commit([], chunk_ids)
        self.reconciler.forget(doc_ids)
        return kept, len(chunk_ids)

    def reconcile(
        self,
        full: bool = False,
        should_stop: Callable[[], bool] | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> ReconcileReport | None:
        """Make the index catch up with the document record (app/ingest/reconcile.py): index the recorded
        documents it lacks or holds in another version, remove the chunks of documents deleted through the
        API. `full` compares every document (start-up), else only those changed since the last pass. The
        caller holds the write lock. A store failure ends the pass early, said in the report's `error`;
        `should_stop()` stops it as it stops an ingest (`EmbeddingInterrupted`). None without a record.
        `on_progress(done, total)` counts documents indexed."""
        if self.record is None:
            return None
        started = time.perf_counter()
        plan = self.reconciler.plan(self.record, self.store, full)
        report = ReconcileReport(plan, compared_in=time.perf_counter() - started)
        log_plan(plan, report.compared_in)
        indexed: dict[str, str] = {}
        todo = plan.to_index
        try:
            if plan.deleted_chunks:
                self.store.delete(plan.deleted_chunks)
                self.on_commit([], plan.deleted_chunks)
                report.removed_chunks = len(plan.deleted_chunks)
            for offset in range(0, len(todo), RECONCILE_SLICE):
                if on_progress is not None:
                    on_progress(offset, len(todo))
                documents = self.record.get(todo[offset : offset + RECONCILE_SLICE])
                ingested = self.ingest_documents(documents, should_stop=should_stop)
                report.embedded += ingested.added
                indexed.update((d.doc_id, content_hash(d)) for d in documents)
            if todo and on_progress is not None:
                on_progress(len(todo), len(todo))
        except EmbeddingInterrupted:
            raise
        except Exception as exc:  # said in the log and by /ready; the next pass tries again
            report.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.reconciler.settle(plan, indexed)
            report.indexed = sorted(indexed)
            report.seconds = time.perf_counter() - started
        log_outcome(report)
        return report

    def reconcile_pending(self) -> bool:
        """Whether a reconciliation after the jobs has anything to look at (the record changed other than
        through this Sieve's ingests and deletes, or a pass left documents unindexed); asked without the
        write lock. False without a record."""
        return self.record is not None and self.reconciler.pending(self.record)

    def chunk_count(self, documents: Sequence[Document]) -> int:
        """How many chunks `documents` make with the configured chunker (no model, no store)."""
        return len(self._ingestor().chunk(documents))

    def _ingestor(self) -> Ingestor:
        """An Ingestor whose commit hook updates the BM25 index in step with every store write (the index is
        the chain's own object, updated in place, so the chain needs no rebuild)."""
        return Ingestor(
            self.store, self.embedder, self.settings.rag.ingest, on_commit=self.on_commit, record=self.record
        )

    def on_commit(self, upserted: list[StoredChunk], deleted_ids: list[str]) -> None:
        """The ingest pipeline committed `upserted` (id, text, metadata) and deleted `deleted_ids`: update
        the BM25 index in step (and, through the change log, every other process's)."""
        if self._sync is not None:
            self._sync.apply_commit(upserted, deleted_ids)
        else:  # an index handed in from outside (tests, variants): update it in memory
            self.lexical.upsert([(c.chunk_id, index_text(c), index_label_of(c.metadata)) for c in upserted])
            self.lexical.delete(deleted_ids)

    def _open_index(self) -> None:
        """Open the persisted BM25 index, catching it up with the store, and build the chain over it.

        Where the index lives: `rag.lexical.path`, or by default under the embedded store's path, or (a
        Chroma server) under target/lexical/. Afterwards the index follows this process's writes through
        `on_commit` and, on a Chroma server, other processes' through the change log, checked before
        queries and every `refresh_seconds` in the background."""
        rag = self.settings.rag
        found = lexical_directory(self.settings)
        directory: Path | None = found
        try:
            check_free(found)
        except LexicalFilesError as exc:
            # e.g. `sieve ingest` into a Chroma server while `sieve serve` holds the default directory:
            # work on an in-memory index (its writes still reach the others through the change log)
            log.warning("%s; using an in-memory BM25 index built from the store", exc)
            directory = None
        if directory is not None:  # the chunk ids of the record's documents, kept for the next start
            self.reconciler = Reconciler(rag.ingest, directory / CHUNK_ID_CACHE)
        self._sync = LexicalSync(
            self.store,
            directory,
            self.analyzer,
            rag.chain.bm25.k1,
            rag.chain.bm25.b,
            rag.lexical.refresh_seconds,
            index_text,
            rag.lexical.change_log_retention_seconds,
        )
        # a server must not wait for a million ids to be listed when the counts already agree
        self.lexical = self._sync.open(check_ids_in_background=True)
        if rag.store.mode == "http":  # other processes may write: follow them, before queries and idle
            self.lexical.refresher = self._sync.catch_up
            self._sync.follow()
        # Embedded, this process holds the store's lock until it closes: no other process can write, so
        # after `open`'s catch-up every write is this process's own, applied through `on_commit`, and
        # queries skip the change-log read (once every refresh_seconds; docs/benchmarks.md#code-figures).
        self.chain = self._build_chain()

    # -- retrieval ---------------------------------------------------------------------------------

    def retrieve(
        self,
        query: str,
        top_k: int | None = None,
        knowledge_tag: str | None = None,
        principal: Principal | None = None,
    ) -> RetrievalResult:
        """The chain's answer; `principal`: only chunks it may read (None: every chunk)."""
        top_k = top_k or self.settings.rag.retrieval.top_k
        return self.chain.retrieve(query, top_k, knowledge_tag, principal)

    def _build_chain(self) -> RetrievalChain:
        """The chain every caller retrieves through: the stages of `rag.chain`, in that order."""
        rag = self.settings.rag
        # RerankStage checks at construction that a reranker really has .score(query, passages).
        stages = build_stages(rag.chain, self.lexical, cast("PassageScorer | None", self.reranker))
        diversity = rag.chain.diversity
        # `Candidate.nearest` is read only by a diversity stage with a max_cosine
        nearest = diversity.enabled and diversity.max_cosine is not None
        candidates = CandidateGenerator(self.store, rag.retrieval, self.lexical, nearest=nearest)
        # the registry's stages copy a candidate to score it and never write into one: no raw copies
        return RetrievalChain(self.embedder, candidates, stages, copy_raw=False)

    def evaluation_target(self) -> EvaluationTarget:
        """What an evaluation of this service needs: its chain, the ids its store holds, its description,
        and what the golden-set audit reads."""
        from app.evaluation.golden.audit.source import AuditSource
        from app.evaluation.report.model import ServiceDescription
        from app.evaluation.run.runner import KnownIds
        from app.evaluation.session import EvaluationTarget

        return EvaluationTarget(
            chain=self.chain,  # one chain for the run and its sweep, even if an ingest rebuilds it meanwhile
            known=KnownIds.from_store(self.store, self.record),
            described=ServiceDescription.model_validate(self.describe()),
            chain_settings=self.settings.rag.chain,
            audit=AuditSource(self.store, self.embedder, self.settings.rag.chain.hard_filter),
            access=self.settings.rag.access,
        )

    def describe(self) -> dict[str, object]:
        """What a report header needs: models, store and the chain's settings; `settings` is every setting
        that can move a result (the fingerprint's, `result_settings`)."""
        from app.evaluation.run.fingerprint import result_settings

        rag = self.settings.rag
        return {
            "embedder": self.embedder.identity(),
            "reranker": getattr(self.reranker, "name", None),
            "store": self.store.description,
            "collection": self.store.name,
            "chunks": self.store.count(),
            "retrieval": rag.retrieval.model_dump(),
            "chain": rag.chain.model_dump(),
            "settings": result_settings(rag),
        }


def freeze_loaded_objects() -> None:
    """Put every object alive now (the loaded models, the store, the index: about 500,000) out of the cyclic
    garbage collector's reach (`gc.freeze`): its full collections then walk only what was made since, instead
    of taking 190-320 ms each, about once every five evaluations (docs/benchmarks.md, "Evaluation cost").

    Once per process, by the command that started it, once the service is loaded (`sieve serve`, `sieve
    eval`): an object frozen while in a reference cycle is never collected, so code that opens many services
    in one process (the tests) must not call it for each."""
    gc.freeze()


def lexical_directory(settings: Settings) -> Path:
    rag = settings.rag
    if rag.lexical.path:
        return Path(rag.lexical.path)
    if rag.store.mode == "embedded":
        return Path(rag.store.path) / "lexical" / rag.store.collection
    return Path("target") / "lexical" / f"{rag.store.host}-{rag.store.port}-{rag.store.collection}"


def index_text(stored: StoredChunk) -> str:
    """The text a stored chunk was embedded and BM25-indexed from (`chunker.embedding_text`)."""
    chunk = stored_chunk(stored.chunk_id, stored.text, stored.metadata)
    return embedding_text(chunk, str(stored.metadata.get("title", "")))
