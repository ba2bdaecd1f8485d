"""What the change log costs as it grows, and what pruning it costs: a script that prints figures.

Fills a fresh embedded store's change log (`<collection>-changes`) with `--entries` entries stamped evenly
over the last `--span-hours`, times the catch-up read every replica makes (`changes_since` of the last two
minutes, p50 of 20), prunes it to `--retention-hours` once (`ChromaStore.prune_changes`, what a writer runs
in the background), and times the read again.

    .venv/bin/python scripts/bench_change_log.py                                  # a week, 10 writes/min
    .venv/bin/python scripts/bench_change_log.py --entries 15000 --span-hours 25  # steady: an hour's prune

The store lives in a temporary directory, removed afterwards. A script that prints figures, not a timed test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from app.settings import StoreSettings
from app.store import ChromaStore

HOUR_NS = 3600 * 10**9
BATCH = 5000


def read_ms(store: ChromaStore) -> float:
    """p50 of 20 catch-up reads: the entries stamped in the last two minutes."""
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        store.changes_since(time.time_ns() - 120 * 10**9)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=100_000, help="change-log entries to write")
    parser.add_argument("--span-hours", type=float, default=168.0, help="their stamps cover this long")
    parser.add_argument("--retention-hours", type=float, default=24.0, help="then pruned to this")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        settings = StoreSettings(mode="embedded", path=str(Path(tmp) / "chroma"), collection="bench")
        store = ChromaStore.open(settings, {"name": "bench", "dimension": 8, "checksum": "none"})
        try:
            log = store._change_log()  # filled in bulk: one `record_change` per entry would take minutes
            now, span = time.time_ns(), int(args.span_hours * HOUR_NS)
            for start in range(0, args.entries, BATCH):
                n = min(BATCH, args.entries - start)
                log.add(
                    ids=[uuid.uuid4().hex for _ in range(n)],
                    embeddings=[[1.0]] * n,
                    documents=[json.dumps({"put": [f"c{start + i}"], "del": []}) for i in range(n)],
                    metadatas=[{"stamp": now - span + (start + i) * span // args.entries} for i in range(n)],
                )
            before = read_ms(store)
            print(f"{args.entries} entries over {args.span_hours:g} h: catch-up read p50 {before:.1f} ms")
            t0 = time.perf_counter()
            deleted = store.prune_changes(time.time_ns() - int(args.retention_hours * HOUR_NS))
            seconds = time.perf_counter() - t0
            print(
                f"pruned to {args.retention_hours:g} h: {deleted} deleted in {seconds:.2f} s, "
                f"{log.count()} left (with the marker); catch-up read p50 {read_ms(store):.1f} ms"
            )
        finally:
            store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
