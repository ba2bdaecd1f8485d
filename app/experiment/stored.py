"""A whole experiment from its stored evaluations, with no model loaded: `sieve experiment` asks this first,
and runs the experiment (app/experiment/run.py) only when something changed (app/experiment/reuse.py says
what an evaluation's key is made of)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from app.evaluation.golden.cases import GoldenSet
from app.experiment.index import record_digest
from app.experiment.reuse import code_digest, load_entry
from app.experiment.run import (
    BASE,
    ExperimentRun,
    Reuse,
    VariantRun,
    base_against_record,
    golden_bytes,
    index_plans,
    reused_run,
    variant_evaluate_settings,
)
from app.experiment.spec import ExperimentSpec
from app.ingest.check import RecordReader
from app.settings import Settings
from app.store import ChromaStore

log = logging.getLogger("sieve.experiment")


def reuse_only(
    spec: ExperimentSpec, settings: Settings, golden: GoldenSet, output_dir: Path
) -> ExperimentRun | None:
    """The whole experiment from stored evaluations, without loading any model, when every variant's
    collection is complete and none of the evaluations' keys changed; None otherwise (the full run then
    evaluates what changed). Opens the store (its lock, embedded) and the record only to read them."""
    from app.store.record import open_record

    started = time.perf_counter()
    store = ChromaStore.open(settings.rag.store, {}, check_embedder=False, create=False)
    try:
        record = open_record(settings.rag.store, store.client)
        try:
            found = (
                None
                if record.damage is not None
                else _reused(spec, settings, golden, output_dir, store, record)
            )
        finally:
            record.close()
    finally:
        store.close()
    if found is None:
        return None
    runs, warnings = found
    log.info("experiment: every evaluation reused (nothing any depends on changed; --rerun runs them again)")
    return ExperimentRun(spec, output_dir, runs, time.perf_counter() - started, warnings=warnings)


def _reused(
    spec: ExperimentSpec,
    settings: Settings,
    golden: GoldenSet,
    output_dir: Path,
    store: ChromaStore,
    record: RecordReader,
) -> tuple[list[VariantRun], list[str]] | None:
    """(every stored run, the warnings) or None (`reuse_only`)."""
    digest = record_digest(record.hashes(), record.tombstones())
    reuse = Reuse(Path(settings.rag.experiment.cache_dir), golden_bytes(golden), digest, code_digest())
    runs = _stored_runs(spec, settings, store, reuse, output_dir)
    if runs is None:
        return None
    warning = base_against_record(store, record)
    return runs, [warning] if warning else []


def _stored_runs(
    spec: ExperimentSpec, settings: Settings, store: ChromaStore, reuse: Reuse, output_dir: Path
) -> list[VariantRun] | None:
    """The base's and every variant's stored evaluation, or None as soon as one is missing."""
    plans = index_plans(spec, settings, store, reuse.record)
    if any(p.decision in ("build", "resume") for p in plans):
        return None
    targets: list[tuple[str, dict[str, Any], str, Settings, ChromaStore]] = [
        (BASE, {}, "base", settings, store)
    ]
    for p in plans:
        own = store if p.decision == "base" else store.side(p.collection, p.variant.settings.rag.store, {})
        targets.append((p.variant.name, p.variant.overlay, p.decision, p.variant.settings, own))
    entries = [load_entry(reuse.cache_dir, reuse.key(s, st)) for _, _, _, s, st in targets]
    if any(entry is None for entry in entries):
        return None
    return [
        reused_run(name, overlay, decision, st.name, entry, variant_evaluate_settings(s, output_dir, name))
        for (name, overlay, decision, s, st), entry in zip(targets, entries, strict=True)
        if entry is not None
    ]
