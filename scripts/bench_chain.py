"""Chain-only time per query: everything after the query embedding, with the query vectors given.

Opens the configured store (collection `beir-<dir>`, the one `sieve eval --beir DIR` uses; point
RAG__STORE__PATH at a copy of an embedded store, since only one process may open it), loads the split's
queries, embeds them once, then times for every query, one at a time:

    dense     the store's HNSW query (candidate_k nearest chunks: ids and distances)
    bm25 top  the BM25 index's top bm25_candidate_k over the collection
    fetch     the candidates' texts, metadata and vectors (the store's chunk cache, and its get of the
              chunks not cached)
    merge     the rest of candidate generation (index refresh check, dense scores, unit vectors, order)
    stages    every stage of the chain (`RetrievalChain.run_stages`), and each stage on its own

The candidate generation and the stages are the chain's own code (`CandidateGenerator.generate_many`,
`RetrievalChain.run_stages`); the store and the index are wrapped only to read the clock around their calls.
Prints p50/p95 per part and the load average (the machine is shared: compare runs made side by side).

    .venv/bin/python scripts/bench_chain.py                        # SciFact test queries
    .venv/bin/python scripts/bench_chain.py --profile              # and cProfile's top 20 (by own time)
    .venv/bin/python scripts/bench_chain.py --json target/chain.json --before target/chain-before.json
    .venv/bin/python scripts/bench_chain.py --vectors target/q.npy --dump target/run.jsonl   # to diff runs

A script that prints figures, not a timed test.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import os
import pstats
import statistics
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

from app.evaluation.golden.beir import load_beir_cases
from app.evaluation.golden.cases import load_golden_set
from app.retrieval.chain import RetrievalRequest
from app.service import Sieve
from app.settings import load_settings, merge, nested

DATASETS_DIR = Path(os.environ.get("SIEVE_DATASETS", "../shared/datasets"))
PARTS = ("dense", "bm25 top", "fetch", "merge", "candidates", "stages", "chain-only")


class Clock:
    """Milliseconds spent in the wrapped calls, per part, for the query being timed."""

    def __init__(self) -> None:
        self.now: dict[str, float] = {}

    def wrap(self, obj: Any, method: str, part: str) -> None:
        inner = getattr(obj, method)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.now[part] = self.now.get(part, 0.0) + (time.perf_counter() - t0) * 1000

        setattr(obj, method, timed)


def digest(value: Any) -> str:
    """sha256 of a value's exact content (an array's dtype, shape and bytes; anything else as JSON)."""
    h = hashlib.sha256()
    if isinstance(value, np.ndarray):
        h.update(f"{value.dtype}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    else:
        h.update(json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr).encode())
    return h.hexdigest()[:16]


def candidate_record(c: Any) -> list[Any]:
    """One raw candidate, exactly: id, doc id, scores (repr), origin, digests of text, metadata, vector
    and unit vector, and the nearest-cosine bound."""
    return [
        c.chunk_id,
        c.doc_id,
        {k: repr(v) for k, v in c.scores.items()},
        sorted(c.origin),
        digest(c.text),
        digest(c.metadata),
        None if c.embedding is None else digest(c.embedding),
        None if c.unit is None else digest(c.unit),
        repr(c.nearest),
    ]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (an observed value)."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, int(np.ceil(q / 100 * len(ordered))) - 1))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--beir", default=str(DATASETS_DIR / "scifact"), help="BEIR directory (queries, qrels)"
    )
    parser.add_argument("--split", default="test")
    parser.add_argument("--collection", help="default beir-<dir name>")
    parser.add_argument(
        "--golden-set", help="take the queries from this golden set instead (configured collection)"
    )
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--queries", type=int, default=0, help="at most this many queries (0 = all)")
    parser.add_argument("--rounds", type=int, default=2, help="timed passes over the queries (best kept)")
    parser.add_argument("--profile", action="store_true", help="print cProfile's top 20 of one more pass")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--before", help="a --json file of an earlier run: print it beside this one")
    parser.add_argument(
        "--dump",
        help="write every query's candidates and result here (ids, exact scores, trace reasons) to diff "
        "two runs",
    )
    parser.add_argument(
        "--vectors",
        help="query vectors (.npy): read when the file exists, else embedded and written there, so two runs "
        "(two versions of the code) see the very same vectors",
    )
    args = parser.parse_args()

    if args.golden_set:
        settings = load_settings(
            merge(*([nested("rag.store.collection", args.collection)] if args.collection else []))
        )
        golden = load_golden_set(args.golden_set)
    else:
        beir = Path(args.beir)
        settings = load_settings(
            merge(nested("rag.store.collection", args.collection or f"beir-{beir.resolve().name}"))
        )
        golden = load_beir_cases(beir, args.split)
    collection = settings.rag.store.collection
    cases = golden.cases[: args.queries] if args.queries else golden.cases
    sieve = Sieve.open(settings)
    try:
        chain = sieve.chain
        chunks = sieve.store.count()
        if chunks == 0:
            print(
                f"error: collection {collection!r} of {sieve.store.description} is empty; ingest first",
                file=sys.stderr,
            )
            return 2
        if args.vectors and Path(args.vectors).exists():
            vectors = np.load(args.vectors)
            if len(vectors) != len(cases):
                print(f"error: {args.vectors}: {len(vectors)} vectors, not {len(cases)}", file=sys.stderr)
                return 2
        else:
            vectors = np.asarray(sieve.embedder.embed_queries([c.query for c in cases]))
            if args.vectors:
                np.save(args.vectors, vectors)
        clock = Clock()
        generator = chain.candidates
        # the store's dense search, and the read of every candidate's text, metadata and vector (before
        # the chunk cache: `query` returned them with the dense hits, `get` read the BM25-only ones)
        store = generator.store
        clock.wrap(store, "query_ids" if hasattr(store, "query_ids") else "query", "dense")
        clock.wrap(store, "chunks" if hasattr(store, "chunks") else "get", "fetch")
        if generator.lexical is not None:
            clock.wrap(generator.lexical, "top", "bm25 top")
        today = date.today()
        dump: dict[int, Any] | None = {} if args.dump else None

        def one(i: int) -> tuple[dict[str, float], dict[str, float]]:
            case = cases[i]
            clock.now = {}
            t0 = time.perf_counter()
            (cset,) = generator.generate_many([case.query], vectors[i : i + 1], [case.knowledge_tag])
            t1 = time.perf_counter()
            result = chain.run_stages(
                RetrievalRequest(case.query, args.top_k, case.knowledge_tag), cset, today
            )
            t2 = time.perf_counter()
            parts = dict(clock.now)
            parts["candidates"] = (t1 - t0) * 1000
            parts["merge"] = parts["candidates"] - sum(
                parts.get(p, 0.0) for p in ("dense", "bm25 top", "fetch")
            )
            parts["stages"] = (t2 - t1) * 1000
            parts["chain-only"] = (t2 - t0) * 1000
            stages = {s.name: s.latency_ms for s in result.trace.stages}
            if dump is not None:
                dump[i] = {
                    "query": case.id,
                    "candidates": [candidate_record(c) for c in cset.candidates],
                    "origins": cset.origins,
                    "documents": [
                        [d.chunk_id, {k: repr(v) for k, v in d.scores.items()}] for d in result.documents
                    ],
                    "trace": [
                        [
                            s.name,
                            s.input_count,
                            s.output_count,
                            [[r.chunk_id, r.reason] for r in s.removed],
                            s.added,
                        ]
                        for s in result.trace.stages
                    ],
                    "rankedAfter": result.trace.ranked_after,
                }
            return parts, stages

        for i in range(min(10, len(cases))):  # warm-up: caches, lazily built index arrays
            one(i)
        best: tuple[float, list[dict[str, float]], list[dict[str, float]]] | None = None
        for _ in range(max(1, args.rounds)):
            runs = [one(i) for i in range(len(cases))]
            p50 = statistics.median(r[0]["chain-only"] for r in runs)
            if best is None or p50 < best[0]:
                best = (p50, [r[0] for r in runs], [r[1] for r in runs])
        _, parts, stages = best  # type: ignore[misc]
        candidates = [
            len(generator.generate_many([c.query], vectors[i : i + 1], [c.knowledge_tag])[0].candidates)
            for i, c in enumerate(cases[:50])
        ]
        if args.profile:
            profiler = cProfile.Profile()
            profiler.enable()
            for i in range(len(cases)):
                one(i)
            profiler.disable()
    finally:
        sieve.close()

    load = os.getloadavg()
    figures: dict[str, Any] = {
        "collection": collection,
        "chunks": chunks,
        "queries": len(cases),
        "candidatesMean": statistics.fmean(candidates) if candidates else 0.0,
        "load": [round(x, 2) for x in load],
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "parts": {
            p: {
                "p50": statistics.median(r.get(p, 0.0) for r in parts),
                "p95": percentile([r.get(p, 0.0) for r in parts], 95),
            }
            for p in PARTS
        },
        "stages": {
            name: {
                "p50": statistics.median(s.get(name, 0.0) for s in stages),
                "p95": percentile([s.get(name, 0.0) for s in stages], 95),
            }
            for name in (stages[0] if stages else {})
        },
    }
    before = json.loads(Path(args.before).read_text(encoding="utf-8")) if args.before else None
    print(
        f"chain-only per query over {collection} ({chunks} chunks), {len(cases)} queries, top {args.top_k}, "
        f"{figures['candidatesMean']:.0f} candidates a query; load average "
        f"{' / '.join(f'{x:.2f}' for x in load)}"
    )
    head = "| part | p50 ms | p95 ms |" + (" before p50 | before p95 |" if before else "")
    print(head)
    print("|---|---|---|" + ("---|---|" if before else ""))
    rows = [(p, figures["parts"][p], (before or {}).get("parts", {}).get(p)) for p in PARTS]
    rows += [(f"stage {n}", v, (before or {}).get("stages", {}).get(n)) for n, v in figures["stages"].items()]
    for name, now, old in rows:
        line = f"| {name} | {now['p50']:.2f} | {now['p95']:.2f} |"
        if before:
            line += f" {old['p50']:.2f} | {old['p95']:.2f} |" if old else " | |"
        print(line)
    if dump is not None:
        lines = [json.dumps(dump[i], ensure_ascii=False) for i in sorted(dump)]
        Path(args.dump).write_text("\n".join(lines) + "\n", encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    if args.profile:
        pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
