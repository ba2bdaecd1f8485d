"""`sieve experiment`: the variants of an experiment file run side by side on one store, the base untouched.

1. Plan (nothing built yet): each variant's index (`index.decide`), its embedder (one per distinct
   rag.models embedder/prompts, loaded once) and its reranker; the estimated bytes of the collections to
   build against `rag.experiment.max_store_bytes`.
2. Build what is missing (`build.build`: from the document record, passage vectors through the shared
   embedding cache), reuse what is complete. Progress per variant in the log.
3. Evaluate the base, then each variant, on the same golden set and K, each into its own folder
   (`<output-dir>/<variant>/`, the files `sieve eval` writes), never compared with nor promoted to a
   baseline: `rag.evaluate.output_dir`'s baseline files are never read or written.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.evaluation.compare.baselines import Baseline
from app.evaluation.golden.cases import GoldenSet
from app.evaluation.render.files import write_reports
from app.evaluation.render.markdown import render_markdown
from app.evaluation.report.model import Report
from app.evaluation.session import evaluate
from app.experiment.build import Built, build, collection_bytes, open_variant, reused
from app.experiment.embed_cache import CachedEmbedder
from app.experiment.index import (
    BYTES_KEY,
    Budget,
    Decision,
    collection_name,
    decide,
    index_hash,
    is_experiment_collection,
    model_settings,
    record_digest,
)
from app.experiment.reuse import code_digest, collection_state, evaluation_key, load_entry, save_entry
from app.experiment.spec import ExperimentSpec, Variant
from app.ingest.check import RecordReader
from app.models import Embedder, load_embedder, load_reranker
from app.service import Sieve, index_text
from app.settings import EvaluateSettings, Settings
from app.store import ChromaStore
from app.store.record import DocumentRecord

log = logging.getLogger("sieve.experiment")

BASE = "base"


class ExperimentError(RuntimeError):
    """The experiment cannot run as asked (the message says why and what to do); nothing was built."""


@dataclass
class Planned:
    """One variant's plan: its settings, index decision, collection, embedder and reranker."""

    variant: Variant
    decision: Decision
    collection: str
    hashed: str
    embedder: Embedder
    reranker: object | None
    built: Built | None = None


@dataclass
class VariantRun:
    """One evaluated variant (the base included): its report and what it cost."""

    name: str
    overlay: dict[str, Any]
    decision: str
    collection: str
    report: Report
    paths: list[Path]
    cost: dict[str, float | int | None]
    reused: bool = False  # the evaluation is a stored one (app/experiment/reuse.py)


@dataclass
class ExperimentRun:
    spec: ExperimentSpec
    output_dir: Path
    runs: list[VariantRun] = field(default_factory=list)
    seconds: float = 0.0
    embedded: int = 0
    cache_hits: int = 0
    warnings: list[str] = field(default_factory=list)


class Models:
    """The embedders and rerankers variants need, loaded once each (the base's are the open Sieve's)."""

    def __init__(self, sieve: Sieve):
        self.sieve = sieve
        base = sieve.settings
        self._embedders: dict[str, Embedder] = {json.dumps(model_settings(base)): sieve.embedder}
        self._rerankers: dict[str, object | None] = {_rerank_key(base): sieve.reranker}
        self.loaded: list[Embedder] = []

    def embedder(self, settings: Settings) -> Embedder:
        key = json.dumps(model_settings(settings))
        if key not in self._embedders:
            log.info("experiment: loading embedder %s", settings.rag.models.embedder)
            self._embedders[key] = load_embedder(settings.rag.models)
            self.loaded.append(self._embedders[key])
        return self._embedders[key]

    def reranker(self, settings: Settings) -> object | None:
        key = _rerank_key(settings)
        if key not in self._rerankers:
            rerank = settings.rag.chain.rerank
            loaded = load_reranker(rerank, device=settings.rag.models.device) if rerank.enabled else None
            self._rerankers[key] = loaded
        return self._rerankers[key]

    def close(self) -> None:
        for embedder in self.loaded:
            close = getattr(embedder, "close", None)
            if close is not None:
                close()


def _rerank_key(settings: Settings) -> str:
    rerank = settings.rag.chain.rerank
    return json.dumps([rerank.enabled, rerank.model])


@dataclass(frozen=True)
class IndexPlan:
    """Which collection a variant runs on, decided without any model (`index.decide`)."""

    variant: Variant
    decision: Decision
    collection: str
    hashed: str


def index_plans(spec: ExperimentSpec, base: Settings, store: ChromaStore, digest: str) -> list[IndexPlan]:
    """Each variant's collection: the base's (`store`) for unchanged index settings, else its own."""
    stored = store.collections()
    out = []
    for variant in spec.variants:
        hashed = index_hash(variant.settings, digest)
        name = collection_name(base.rag.store.collection, hashed)
        decision = decide(base, variant.settings, stored.get(name))
        out.append(IndexPlan(variant, decision, store.name if decision == "base" else name, hashed))
    return out


def plan(spec: ExperimentSpec, sieve: Sieve, models: Models, digest: str) -> list[Planned]:
    """Each variant's plan: its collection, embedder and reranker."""
    return [
        Planned(
            p.variant,
            p.decision,
            p.collection,
            p.hashed,
            models.embedder(p.variant.settings),
            models.reranker(p.variant.settings),
        )
        for p in index_plans(spec, sieve.settings, sieve.store, digest)
    ]


def base_against_record(store: ChromaStore, record: RecordReader) -> str | None:
    """Why the base collection's documents are not the record's (variants are built from the record, so
    they would differ from the base by more than their settings), or None; an `ExperimentError` when the
    base collection is empty (nothing to compare with)."""
    recorded = set(record.hashes())
    indexed = {str(c.metadata.get("doc_id")) for c in store.iter_all(include_text=False)}
    if not indexed:
        raise ExperimentError(f"the base collection '{store.name}' is empty: `sieve ingest` documents first")
    extra, missing = indexed - recorded, recorded - indexed
    if not extra and not missing:
        return None
    return (
        f"the base collection '{store.name}' holds {len(extra)} document(s) the document record lacks and "
        f"lacks {len(missing)} recorded one(s) (`sieve store check` says which): the variants' "
        "collections are built from the record, so they differ from the base by more than their settings"
    )


def readable_record(sieve: Sieve) -> DocumentRecord:
    """The open Sieve's document record; an `ExperimentError` when there is none or it is damaged."""
    record = sieve.record
    if record is None or record.damage is not None:
        raise ExperimentError("the document record cannot be read: `sieve store check` says why")
    return record


def check_budget(plans: list[Planned], sieve: Sieve, limit: int) -> Budget:
    """The budget of the experiment collections (`ExperimentError` when over): every stored one but those
    this run builds again, plus the estimate of those it builds (each document chunked with the variant's
    settings; metadata bytes per chunk as the base collection's)."""
    base_name = sieve.settings.rag.store.collection
    stored = {n: m for n, m in sieve.store.collections().items() if is_experiment_collection(base_name, n, m)}
    building = {p.collection for p in plans if p.decision in ("build", "resume")}
    kept = sum(int(m.get(BYTES_KEY, 0)) for n, m in stored.items() if n not in building)
    new = sum(_estimate(p, sieve) for p in plans if p.decision in ("build", "resume"))
    budget = Budget(limit, kept, new)
    problem = budget.problem()
    if problem:
        raise ExperimentError(problem)
    return budget


def _estimate(planned: Planned, sieve: Sieve) -> int:
    """The estimated bytes of `planned`'s collection once built (`index.estimated_bytes`)."""
    from app.experiment.index import estimated_bytes
    from app.ingest.chunker import chunk_document

    ingest = planned.variant.settings.rag.ingest
    text = chunks = 0
    for doc in sieve.record.iter_documents() if sieve.record is not None else ():
        for chunk in chunk_document(doc, ingest.chunk_size, ingest.chunk_overlap, ingest.min_chunk_chars):
            text += len(chunk.text.encode("utf-8"))
            chunks += 1
    per_chunk = _base_metadata_bytes(sieve)
    return estimated_bytes(text, per_chunk * chunks, chunks, planned.embedder.dimension)


def _base_metadata_bytes(sieve: Sieve, sample: int = 200) -> int:
    """Mean metadata bytes per chunk over the base collection's first `sample` chunks (256 when empty)."""
    sizes = []
    for chunk in sieve.store.iter_all(include_text=False):
        sizes.append(len(json.dumps(chunk.metadata, ensure_ascii=False).encode("utf-8")))
        if len(sizes) >= sample:
            break
    return int(sum(sizes) / len(sizes)) if sizes else 256


def build_all(
    plans: list[Planned], sieve: Sieve, record: RecordReader, cache_dir: Path, progress: Any
) -> tuple[int, int]:
    """Build or reuse every variant collection the plans name, once each (variants sharing index settings
    share it); (chunks embedded by the model, chunks whose vector the cache held)."""
    done: dict[str, Built] = {}
    embedded = hits = 0
    seed_from_base(plans, sieve, cache_dir)
    for i, planned in enumerate(plans, start=1):
        where = f"variant '{planned.variant.name}' ({i}/{len(plans)})"
        if planned.decision == "base":
            log.info(
                "experiment: %s: the base collection '%s' (index settings unchanged)", where, sieve.store.name
            )
        elif planned.collection in done:
            planned.built = done[planned.collection]
        else:
            planned.built, counts = _build_one(planned, sieve.store, record, cache_dir, progress, where)
            embedded, hits = embedded + counts[0], hits + counts[1]
            done[planned.collection] = planned.built
    return embedded, hits


def seed_from_base(plans: list[Planned], sieve: Sieve, cache_dir: Path) -> int:
    """When a collection to build shares the base's embedder (the same model and prompts), put the base
    collection's vectors into the embedding cache first: the build then embeds only the texts the base does
    not hold (reading a stored vector costs far less than embedding its text). How many were new."""
    if not any(p.decision in ("build", "resume") and p.embedder is sieve.embedder for p in plans):
        return 0
    embedder = sieve.embedder
    cached = CachedEmbedder(embedder, embedder.identity(), embedder.passage_prompt, cache_dir)
    try:
        chunks = sieve.store.iter_all(include_text=True, include_vectors=True)
        added = cached.seed((index_text(c), c.embedding) for c in chunks if c.embedding is not None)
    finally:
        cached.close()
    log.info(
        "experiment: %d passage vectors taken into the embedding cache from '%s'", added, sieve.store.name
    )
    return added


def _build_one(
    planned: Planned, base: ChromaStore, record: RecordReader, cache_dir: Path, progress: Any, where: str
) -> tuple[Built, tuple[int, int]]:
    """`planned`'s collection, reused when complete, else built (or resumed) through the embedding cache;
    (it, (chunks embedded, chunks from the cache))."""
    identity = planned.embedder.identity()
    settings = planned.variant.settings
    store, anew = open_variant(base, planned.collection, settings, identity, planned.hashed)
    if planned.decision == "reuse" and not anew:
        log.info("experiment: %s: reusing collection '%s' (complete)", where, planned.collection)
        return reused(store), (0, 0)
    verb = "resuming" if planned.decision == "resume" and not anew else "building"
    log.info("experiment: %s: %s collection '%s' from the document record", where, verb, planned.collection)
    cached = CachedEmbedder(planned.embedder, identity, planned.embedder.passage_prompt, cache_dir)
    try:
        built = build(store, record, cached, settings, identity, planned.hashed, progress)
    finally:
        cached.close()
    log.info(
        "experiment: %s: %d chunks in %.1fs (%d embedded, %d from the embedding cache)",
        where,
        built.chunks,
        built.seconds,
        cached.misses,
        cached.hits,
    )
    return built, (cached.misses, cached.hits)


NO_BASELINE = Baseline(None, None, "an experiment's variant is compared with the experiment's base")


@dataclass(frozen=True)
class Reuse:
    """What an evaluation's key is made of besides its settings and collection (app/experiment/reuse.py),
    and whether a stored evaluation may stand in for it (`enabled`: not with --rerun)."""

    cache_dir: Path
    golden: bytes
    record: str
    code: str
    enabled: bool = True

    def key(self, settings: Settings, store: ChromaStore) -> str:
        return evaluation_key(self.golden, settings, collection_state(store), self.record, self.code)


def evaluate_all(
    plans: list[Planned], sieve: Sieve, golden: GoldenSet, output_dir: Path, reuse: Reuse
) -> list[VariantRun]:
    """The base's evaluation, then each variant's, each into its own folder under `output_dir`."""
    base_bytes, base_chunks = collection_bytes(sieve.store, sieve.embedder.dimension)
    base_cost: dict[str, float | int | None] = {
        "ingestSeconds": None,
        "chunks": base_chunks,
        "storeBytes": base_bytes,
    }
    runs = [_evaluated(BASE, {}, "base", sieve, golden, output_dir, base_cost, reuse)]
    for i, planned in enumerate(plans, start=1):
        log.info("experiment: evaluating variant '%s' (%d/%d)", planned.variant.name, i, len(plans))
        store = planned.built.store if planned.built is not None else sieve.store
        if store is not sieve.store:
            held = planned.variant.settings.rag.store
            log.info("%s", store.load_exact(held.exact_search_max_chunks, held.exact_filtered_max_chunks))
        variant = sieve.with_settings(planned.variant.settings, planned.embedder, store, planned.reranker)
        built = planned.built
        cost: dict[str, float | int | None] = (
            {"ingestSeconds": built.seconds, "chunks": built.chunks, "storeBytes": built.bytes}
            if built is not None
            else dict(base_cost)
        )
        name, overlay = planned.variant.name, planned.variant.overlay
        runs.append(_evaluated(name, overlay, planned.decision, variant, golden, output_dir, cost, reuse))
    return runs


def _evaluated(
    name: str,
    overlay: dict[str, Any],
    decision: str,
    sieve: Sieve,
    golden: GoldenSet,
    output_dir: Path,
    cost: dict[str, float | int | None],
    reuse: Reuse,
) -> VariantRun:
    """`sieve`'s evaluation into `output_dir/name`, never a baseline, its cost completed from the summary;
    a stored one when nothing it depends on changed (app/experiment/reuse.py)."""
    ev = variant_evaluate_settings(sieve.settings, output_dir, name)
    key = reuse.key(sieve.settings, sieve.store)
    entry = load_entry(reuse.cache_dir, key) if reuse.enabled else None
    if entry is not None:
        log.info("experiment: '%s': nothing it depends on changed: its evaluation is reused", name)
        return reused_run(name, overlay, decision, sieve.store.name, entry, ev)
    outcome = evaluate(sieve.evaluation_target(), ev, golden, baseline=NO_BASELINE, promote=False)
    summary = outcome.report.summary
    latency = (summary.latency_ms or {}) if summary is not None else {}
    context = summary.budget.get("contextChars") if summary is not None else None
    full = {**cost, "p50Ms": latency.get("p50"), "p95Ms": latency.get("p95"), "contextChars": context}
    save_entry(reuse.cache_dir, key, outcome.report, full)
    return VariantRun(name, overlay, decision, sieve.store.name, outcome.report, outcome.paths, full)


def variant_evaluate_settings(settings: Settings, output_dir: Path, name: str) -> EvaluateSettings:
    """The evaluation settings of one variant: its own folder, no baseline."""
    update = {"output_dir": str(output_dir / name), "baseline": "none"}
    return settings.rag.evaluate.model_copy(update=update)


def reused_run(
    name: str,
    overlay: dict[str, Any],
    decision: str,
    collection: str,
    entry: tuple[Report, dict[str, Any]],
    ev: EvaluateSettings,
) -> VariantRun:
    """A stored evaluation as this run's: its report files written again into the variant's folder."""
    report, cost = entry
    paths = write_reports(report, ev, render_markdown(report, ev.report.case_detail))
    return VariantRun(name, overlay, decision, collection, report, paths, cost, reused=True)


def run_experiment(
    spec: ExperimentSpec,
    sieve: Sieve,
    golden: GoldenSet,
    output_dir: Path,
    progress: Any = "log",
    rerun: bool = False,
    clock: Callable[[], float] = time.perf_counter,
) -> ExperimentRun:
    """Plan, check the budget, build, evaluate (the module docstring's steps)."""
    started = clock()
    models = Models(sieve)
    record = readable_record(sieve)
    digest = record_digest(record.hashes(), record.tombstones())
    experiment = sieve.settings.rag.experiment
    reuse = Reuse(Path(experiment.cache_dir), golden_bytes(golden), digest, code_digest(), not rerun)
    warning = base_against_record(sieve.store, record)
    try:
        plans = plan(spec, sieve, models, digest)
        check_budget(plans, sieve, experiment.max_store_bytes)
        embedded, hits = build_all(plans, sieve, record, Path(experiment.cache_dir), progress)
        runs = evaluate_all(plans, sieve, golden, output_dir, reuse)
    finally:
        models.close()
    warnings = [warning] if warning else []
    return ExperimentRun(spec, output_dir, runs, clock() - started, embedded, hits, warnings)


def golden_bytes(golden: GoldenSet) -> bytes:
    """The golden set file's bytes (its path as the key when it cannot be read: then nothing is reused)."""
    try:
        return Path(golden.path).read_bytes()
    except (OSError, TypeError):
        return f"unreadable:{golden.path}:{time.time()}".encode()


LOCK_NAME = "experiment.lock"


def experiment_lock(settings: Settings) -> Path:
    """The lock file two experiments on one store cannot both hold: in the embedded store's folder, or
    (a Chroma server) in `rag.experiment.cache_dir`, named by the server (this machine's experiments)."""
    store = settings.rag.store
    if store.mode == "embedded":
        return Path(store.path) / LOCK_NAME
    return Path(settings.rag.experiment.cache_dir) / f"experiment-{store.host}-{store.port}.lock"


def default_output_dir(settings: Settings, name: str | None) -> Path:
    """`<rag.evaluate.output_dir>/experiments/<name, else a timestamp>`."""
    from app.evaluation.render.files import report_stamp

    return Path(settings.rag.evaluate.output_dir) / "experiments" / (name or report_stamp())
