"""Benchmark: what the reconciliation of the index with the document record costs (app/ingest/reconcile.py).

    python scripts/bench_reconcile.py --sample STORE [--rounds 5] [--workdir target/bench-reconcile]

Two stores whose index matches their record, so a pass indexes nothing and its cost is the comparison:
1. the sample knowledge base (36 documents), a copy of the embedded store `--sample` (one ingested with
   the packaged model, e.g. `target/chroma` after `make run`, or a test store under target/test-stores);
2. SciFact (5,183 documents, 17,986 chunks at the default chunking) ingested with the record into a fresh
   embedded store by the hash embedder of scripts/scale_corpus.py (the comparison reads no model).
For each: the full pass (start-up) with no chunk ids kept (a first start: every document chunked) and with
the chunk-id cache a previous start wrote (a new Reconciler reading it each round, as a restart does), and
the incremental pass after a job (nothing changed; 10 documents changed in the record), `--rounds` times
each, the median and the slowest; the 1-minute load average beside.
The machine may be shared: compare figures of one run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scale_corpus import HashEmbedder  # noqa: E402

from app.ingest.pipeline import Ingestor  # noqa: E402
from app.ingest.reconcile import Reconciler  # noqa: E402
from app.ingest.types import Document  # noqa: E402
from app.settings import IngestSettings, ModelsSettings, StoreSettings  # noqa: E402
from app.store import ChromaStore  # noqa: E402
from app.store.record import RECORD_FILE, SqliteRecord  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DATASETS = Path(os.environ.get("SIEVE_DATASETS", REPO.parent / "shared" / "datasets"))


def timed(rounds: int, run: Callable[[], object]) -> tuple[float, float]:
    seconds = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), max(seconds)


def measure(name: str, path: Path, identity: dict[str, object], rounds: int) -> None:
    store = ChromaStore.open(StoreSettings(path=str(path)), identity)
    record = SqliteRecord(path / RECORD_FILE)
    cache = path / "chunk-ids.json"
    try:
        plan = Reconciler(IngestSettings(), cache).plan(record, store, full=True)
        if not plan.comparison.matches:
            raise SystemExit(f"error: {name}: the index does not match the record: {plan.comparison}")
        cold = timed(rounds, lambda: Reconciler(IngestSettings()).plan(record, store, full=True))
        warm = timed(rounds, lambda: Reconciler(IngestSettings(), cache).plan(record, store, full=True))
        reconciler = Reconciler(IngestSettings(), cache)
        reconciler.settle(reconciler.plan(record, store, full=True), {})
        quiet = timed(rounds, lambda: reconciler.plan(record, store))
        changed = [d.doc_id for d in record.iter_documents()][:10]
        originals = record.get(changed)
        record.put([Document(d.doc_id, f"{d.text} (changed)", d.title, d.metadata) for d in originals])
        ten = timed(rounds, lambda: reconciler.plan(record, store))
        record.put(originals)
        cells = [
            name,
            f"{plan.recorded:,}",
            f"{plan.comparison.expected_chunks:,}",
            *(f"{median:.3f} s ({slowest:.3f})" for median, slowest in (cold, warm)),
            *(f"{median * 1000:.1f} ms ({slowest * 1000:.1f})" for median, slowest in (quiet, ten)),
            f"{os.getloadavg()[0]:.1f}",
        ]
        print(f"| {' | '.join(cells)} |", flush=True)
    finally:
        record.close()
        store.close()


def scifact(path: Path) -> HashEmbedder:
    from app.ingest.loaders import load_paths

    embedder = HashEmbedder()
    store = ChromaStore.open(StoreSettings(path=str(path)), embedder.identity())
    record = SqliteRecord(path / RECORD_FILE)
    try:
        loaded = load_paths([DATASETS / "scifact" / "corpus.jsonl"])
        if loaded.errors or not loaded.documents:
            raise SystemExit(f"error: no SciFact corpus in {DATASETS} (SIEVE_DATASETS): {loaded.errors[:1]}")
        documents = loaded.documents
        Ingestor(store, embedder, IngestSettings(), record=record).ingest_documents(documents)
    finally:
        record.close()
        store.close()
    return embedder


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sample", type=Path, required=True, help="an embedded store of the sample base")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=REPO / "target" / "bench-reconcile")
    args = parser.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)

    from app.models import load_embedder

    print(
        "| store | documents | chunks | full pass, first start (slowest) | full pass, chunk ids kept | "
        "incremental, 0 changed | 10 changed | load |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    sample = args.workdir / "sample"
    shutil.copytree(args.sample, sample)
    e5 = load_embedder(ModelsSettings(cache_dir=str(REPO / "target" / "models")))
    measure("sample knowledge base", sample, e5.identity(), args.rounds)
    embedder = scifact(args.workdir / "scifact")
    measure("SciFact (hash embedder)", args.workdir / "scifact", embedder.identity(), args.rounds)


if __name__ == "__main__":
    main()
