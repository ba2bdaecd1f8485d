"""Access scopes at scale: what a scoped or tagged query's candidates cost beside an unscoped one's.

    python scripts/bench_access.py [--size 100000] [--workdir target/bench-access] [--queries 200]
    python scripts/bench_access.py parts --size 1000000   # the parts that scale, in process, no store
    python scripts/bench_access.py unscoped               # Chroma's unscoped search, vectors held or not
    python scripts/bench_access.py labels --size 300000   # a new principal's label mask, two ways

Main run, one process, one collection of `--size` chunks (built once under `--workdir`/n<N>/, kept):
- texts from scripts/scale_corpus.py's `Corpus` (so BM25 has real postings), vectors random unit vectors
  (384 dims, seeded), written into an embedded Chroma store;
- 50 tenants, 20 groups each (1,000 groups). Each document (and its chunks) belongs to one tenant: `t00`, the
  small tenant, holds 1% of the documents, the 49 others share the rest by Zipf(1) shares (`t01` the
  largest, about 22%); its `access` lists 1-3 of its tenant's groups, and `public` for 20% of documents;
- the corpus's knowledge tags, except 1% of the documents (drawn apart from the tenant) tagged `audit`;
- the BM25 index (`Bm25Index`) built in process from the same chunks and labels as the service builds it.

Per case, p50 / p95 / mean of `CandidateGenerator.generate_many` for one query (its vector given; default
`RetrievalSettings`, hybrid on, `candidate_k` 50), the queries of every case interleaved so that the
machine's load falls on all alike: unscoped; a principal of `t01` with 3 groups; a principal of `t00` with
3 groups; the `audit` tag (1%); the `finance` tag (the corpus's largest). Which dense path each query took
is counted by wrapping the store: the exact search, the unfiltered search post-filtered by the index's
labels, or Chroma's filtered search (`where`).

Each case is measured with the in-process vectors off (the collection is over
rag.store.exact_search_max_chunks: Chroma's HNSW serves) and then on (`--filtered-max`, every vector held for
filtered queries: `ChromaStore.load_exact(..., filtered_max_chunks)`), in the same run.

`parts`: at `--size` (1M by default) without a store: a BM25 index over that many corpus chunks, its masked
top-50 per case; the label mask of a scope; the exact search over a filter's matching vectors
(`ExactSearch` holding `--size` random vectors). Prints a Markdown table; the machine is shared, so the load
average is printed beside the figures.

`labels`: the distinct index labels of `--size` documents (scopes as above, the corpus's five tags in turn,
`audit` for 1%), and what a principal's first mask over them costs: asked of `label_matches` label by label
(the rule, one JSON parse each) against `LabelMasks` (labels parsed once, then array passes), for each
principal and a second principal of the same tenant; both answers compared.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from scale_corpus import DIM, Corpus, SyntheticChunk  # noqa: E402

COLLECTION = "bench_access"
TENANTS = 50
GROUPS_PER_TENANT = 20
SMALL_SHARE = 0.01
PUBLIC_SHARE = 0.2
RARE_TAG, RARE_SHARE = "audit", 0.01
SEED = 23


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: the smallest value with at least q% of the values at or below it."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def group(tenant: int, number: int) -> str:
    return f"t{tenant:02d}-g{number:02d}"


class Scopes:
    """Each document's tenant, access list and (rare) tag, deterministic in the document number."""

    def __init__(self) -> None:
        weights = 1.0 / np.arange(1, TENANTS)
        self._big_cdf = np.cumsum(weights) / weights.sum()  # tenants 1..49, Zipf(1)

    def of(self, doc_no: int) -> tuple[str, list[str], bool]:
        u = np.random.default_rng([SEED, doc_no]).random(8)
        tenant = 0 if u[0] < SMALL_SHARE else 1 + int(np.searchsorted(self._big_cdf, u[1]))
        groups = sorted({int(x * GROUPS_PER_TENANT) for x in u[2 : 2 + 1 + int(u[5] * 3)]})
        access = [f"group:{group(tenant, g)}" for g in groups]
        if u[6] < PUBLIC_SHARE:
            access.append("public")
        return f"t{tenant:02d}", access, u[7] < RARE_SHARE

    def metadata(self, chunk: SyntheticChunk) -> dict[str, Any]:
        tenant, access, rare = self.of(int(chunk.doc_id[1:]))
        meta = chunk.metadata()
        meta.update(tenant=tenant, access=access, origin="bench-access")
        if rare:
            meta["knowledge"] = RARE_TAG
        return meta


def principals() -> dict[str, Any]:
    from app.access.scope import Principal

    return {
        "big": Principal("big", tenant="t01", groups=tuple(group(1, g) for g in (0, 1, 2))),
        "small": Principal("small", tenant="t00", groups=tuple(group(0, g) for g in (0, 1, 2))),
    }


def chunks_of(size: int) -> Iterator[list[SyntheticChunk]]:
    yield from Corpus().chunks(size)


def unit_vectors(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def open_store(path: Path) -> Any:
    from app.settings import StoreSettings
    from app.store import ChromaStore

    identity = {"name": "bench-random-384", "dimension": DIM, "checksum": "random"}
    return ChromaStore.open(StoreSettings(path=str(path), collection=COLLECTION), identity)


def build(where: Path, size: int) -> dict[str, Any]:
    """Write `size` chunks into the embedded store under `where` (once; kept)."""
    from app.store import StoredChunk

    marker = where / "built.json"
    if marker.exists():
        return dict(json.loads(marker.read_text()))
    where.mkdir(parents=True, exist_ok=True)
    store = open_store(where / "chroma")
    batch = store._max_batch()
    scopes = Scopes()
    started = time.perf_counter()
    pending: list[SyntheticChunk] = []
    written = 0

    def flush(part: list[SyntheticChunk]) -> None:
        nonlocal written
        vectors = unit_vectors(np.random.default_rng([SEED, written]), len(part))
        store.upsert([StoredChunk(c.chunk_id, c.text, scopes.metadata(c)) for c in part], vectors)
        written += len(part)
        print(f"  build n={size}: {written} chunks, load {load()}", file=sys.stderr, flush=True)

    for doc in chunks_of(size):
        pending.extend(doc)
        if len(pending) >= batch:
            flush(pending[:batch])
            pending = pending[batch:]
    if pending:
        flush(pending)
    info = {"size": size, "chunks": store.count(), "build_s": round(time.perf_counter() - started, 1)}
    store.close()
    marker.write_text(json.dumps(info))
    return info


def lexical_index(size: int) -> tuple[Any, dict[str, int]]:
    """The BM25 index over the collection's chunks (texts and labels as the service indexes them), and how
    many chunks each tenant and the rare tag hold."""
    from app.lexical.index import Analyzer, Bm25Index
    from app.service import index_text
    from app.store import StoredChunk
    from app.store.types import index_label_of

    index = Bm25Index(Analyzer())
    scopes = Scopes()
    counts: Counter[str] = Counter()
    pending: list[tuple[str, str, str | None]] = []
    for doc in chunks_of(size):
        for c in doc:
            meta = scopes.metadata(c)
            counts[meta["tenant"]] += 1
            counts[f"tag:{meta.get('knowledge')}"] += 1
            pending.append(
                (c.chunk_id, index_text(StoredChunk(c.chunk_id, c.text, meta)), index_label_of(meta))
            )
        if len(pending) >= 10_000:
            index.upsert(pending)
            pending = []
    index.upsert(pending)
    return index, dict(counts)


class PathCounter:
    """Wraps a store's `query_ids` and exact search to name the dense path each query took."""

    def __init__(self, store: Any):
        self.store = store
        self.calls: list[str] = []
        self.store_seconds = 0.0
        inner_query, inner_exact = store.query_ids, store._exact_query

        def query_ids(embeddings: Any, n: int, where: Any = None, principal: Any = None) -> Any:
            self._filtered = where is not None or principal is not None
            self._exact = False
            t = time.perf_counter()
            out = inner_query(embeddings, n, where, principal)
            self.store_seconds += time.perf_counter() - t
            if self._exact:
                self.calls.append("exact")
            elif self._filtered:
                self.calls.append("where")
            else:
                self.calls.append(f"unfiltered {n}")
            return out

        def exact_query(*args: Any) -> Any:
            out = inner_exact(*args)
            self._exact = out is not None
            return out

        store.query_ids, store._exact_query = query_ids, exact_query

    def take(self) -> tuple[str, float]:
        calls, seconds = self.calls, self.store_seconds
        self.calls, self.store_seconds = [], 0.0
        return " + ".join(calls), seconds


CASES = ("unscoped", "scoped: big tenant", "scoped: 1% tenant", f"tag {RARE_TAG} (1%)", "tag finance")


def case_filter(case: str) -> tuple[str | None, Any]:
    people = principals()
    return {
        "unscoped": (None, None),
        "scoped: big tenant": (None, people["big"]),
        "scoped: 1% tenant": (None, people["small"]),
        f"tag {RARE_TAG} (1%)": (RARE_TAG, None),
        "tag finance": ("finance", None),
    }[case]


def measure(store: Any, index: Any, queries: list[str], vectors: np.ndarray) -> dict[str, Any]:
    """Per case: candidate generation times (s), the store's share, and the dense paths taken."""
    from app.retrieval.candidates import CandidateGenerator
    from app.settings import RetrievalSettings

    generator = CandidateGenerator(store, RetrievalSettings(), index)
    counter = PathCounter(store)
    results: dict[str, Any] = {c: {"times": [], "store": [], "paths": Counter(), "found": []} for c in CASES}
    for i, (text, vector) in enumerate(zip(queries, vectors, strict=True)):
        for case in CASES:
            tag, principal = case_filter(case)
            t = time.perf_counter()
            got = generator.generate_many([text], vector[None, :], [tag], [principal])
            seconds = time.perf_counter() - t
            path, store_s = counter.take()
            if i < 5:  # warm-up: caches, the first touches of postings and masks
                continue
            results[case]["times"].append(seconds)
            results[case]["store"].append(store_s)
            results[case]["paths"][path] += 1
            results[case]["found"].append(got[0].origins["dense"] + got[0].origins["both"])
    del store.query_ids, store._exact_query  # the class's own methods again
    return results


def summary(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    base = percentile(results["unscoped"]["times"], 95)
    out = {}
    for case, r in results.items():
        times = r["times"]
        out[case] = {
            "p50_ms": percentile(times, 50) * 1000,
            "p95_ms": percentile(times, 95) * 1000,
            "mean_ms": float(np.mean(times)) * 1000,
            "store_p50_ms": percentile(r["store"], 50) * 1000,
            "p95_ratio": percentile(times, 95) / base,
            "dense_found_mean": float(np.mean(r["found"])),
            "paths": dict(r["paths"].most_common()),
        }
    return out


def table(title: str, rows: dict[str, dict[str, Any]], shares: dict[str, float]) -> str:
    lines = [
        f"**{title}**",
        "",
        "| Query | matching share | p50 ms | p95 ms | mean ms | store p50 ms | p95 / unscoped p95 "
        "| dense path (queries) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case, r in rows.items():
        paths = ", ".join(f"{p} ({n})" for p, n in r["paths"].items())
        lines.append(
            f"| {case} | {shares[case]:.2%} | {r['p50_ms']:.1f} | {r['p95_ms']:.1f} | {r['mean_ms']:.1f} | "
            f"{r['store_p50_ms']:.1f} | {r['p95_ratio']:.2f}x | {paths} |"
        )
    return "\n".join(lines)


def main_run(args: argparse.Namespace) -> int:
    where = args.workdir / f"n{args.size}"
    started = time.perf_counter()
    info = build(where, args.size)
    print(f"store: {info}, load {load()}", file=sys.stderr, flush=True)
    t = time.perf_counter()
    index, counts = lexical_index(args.size)
    print(f"BM25 index: {len(index)} chunks in {time.perf_counter() - t:.1f}s", file=sys.stderr, flush=True)
    store = open_store(where / "chroma")
    store.warm_up(DIM)
    corpus = Corpus()
    rng = np.random.default_rng(7)
    queries = [corpus.query(rng)[0] for _ in range(args.queries + 5)]
    vectors = unit_vectors(np.random.default_rng(8), len(queries))
    shares = {case: index.tag_count(*case_filter(case)) / len(index) for case in CASES}
    out: dict[str, Any] = {"size": args.size, "counts": counts, "shares": shares}
    print(f"the store's HNSW (held vectors off), load {load()}", file=sys.stderr, flush=True)
    out["hnsw"] = summary(measure(store, index, queries, vectors))
    if args.filtered_max:
        t, before = time.perf_counter(), rss_mib()
        said = store.load_exact(args.exact_max, args.filtered_max)
        out["load_exact_s"] = time.perf_counter() - t
        out["load_exact_rss_mib"] = rss_mib() - before
        print(f"{said}, load {load()}", file=sys.stderr, flush=True)
        out["held"] = summary(measure(store, index, queries, vectors))
    store.close()
    out["wall_s"] = time.perf_counter() - started
    out["load"] = load()
    print("BENCH-JSON " + json.dumps(out), flush=True)
    print(
        f"Measured by `make bench-access` on 2 shared cores, {time.strftime('%Y-%m-%d')}, "
        f"{args.size:,} chunks, {args.queries} queries a case, wall {out['wall_s'] / 60:.1f} min, "
        f"load average at the end {out['load']}.\n"
    )
    print(table("Chroma's HNSW for the dense search (held vectors off)", out["hnsw"], shares))
    if "held" in out:
        print()
        title = (
            f"Held vectors on (rag.store.exact_filtered_max_chunks {args.filtered_max:,}, "
            f"read in {out['load_exact_s']:.1f}s, RSS +{out['load_exact_rss_mib']:.0f} MiB)"
        )
        print(table(title, out["held"], shares))
    return 0


def corpus_tag(corpus: Corpus, doc_no: int) -> str | None:
    """Document `doc_no`'s knowledge tag as `Corpus.document` draws it, without making its text."""
    from scale_corpus import TAGS

    head = corpus._doc_rng(doc_no).random(1024)[:4]  # the first four draws of `document`
    return TAGS[int(np.searchsorted(corpus._tag_cdf, head[3]))] if head[2] < 0.8 else None


def parts(args: argparse.Namespace) -> int:
    """The parts that scale, measured in process at `--size` without a store (module docstring)."""
    out: dict[str, Any] = {"size": args.size}
    index = None
    if not args.no_bm25:
        t = time.perf_counter()
        index, _ = lexical_index(args.size)
        out["bm25_build_s"] = time.perf_counter() - t
        print(
            f"BM25 index: {len(index)} chunks in {out['bm25_build_s']:.1f}s, load {load()}", file=sys.stderr
        )
    corpus = Corpus()
    rng = np.random.default_rng(7)
    queries = [corpus.query(rng)[0] for _ in range(args.queries + 5)]
    qvec = unit_vectors(np.random.default_rng(8), len(queries))
    t = time.perf_counter()
    exact, written = filled_exact(args, corpus)
    out["exact_fill_s"] = time.perf_counter() - t
    print(f"exact search: {len(exact)} vectors in {out['exact_fill_s']:.1f}s, load {load()}", file=sys.stderr)
    out["rows"] = {case: measure_part(case, exact, index, queries, qvec, written) for case in CASES}
    out["load"] = load()
    print("BENCH-JSON " + json.dumps(out), flush=True)
    print(parts_table(out))
    return 0


def filled_exact(args: argparse.Namespace, corpus: Corpus) -> tuple[Any, list[Any]]:
    """An `ExactSearch` holding `--size` random vectors with the scopes and tags, filled as the store's
    writes fill it (a batch at a time); and the last batch's chunks, to write again."""
    from app.store import StoredChunk
    from app.store.exact import ExactSearch

    exact = ExactSearch(args.exact_max, args.size)
    exact.load([], args.size)
    scopes = Scopes()
    batch: list[StoredChunk] = []
    for chunk_id in corpus.chunk_ids(args.size):
        doc_no = int(chunk_id[1:8])
        tenant, access, rare = scopes.of(doc_no)
        meta: dict[str, Any] = {"doc_id": chunk_id[:8], "tenant": tenant, "access": access}
        tag = RARE_TAG if rare else corpus_tag(corpus, doc_no)
        if tag is not None:
            meta["knowledge"] = tag
        batch.append(StoredChunk(chunk_id, "", meta))
        if len(batch) == 10_000 or len(exact) + len(batch) == args.size:
            vectors = unit_vectors(np.random.default_rng([SEED, len(exact)]), len(batch))
            for c, v in zip(batch, vectors, strict=True):
                c.embedding = v
            exact.apply(batch, [])
            last, batch = batch, []
    return exact, last


def measure_part(
    case: str, exact: Any, index: Any, queries: list[str], qvec: np.ndarray, written: list[Any]
) -> dict[str, Any]:
    """One case's figures: the first sight of its filter, its first search after a change, its BM25 and
    exact searches in the steady state, and its exact search with a one-chunk write before each query (a
    chunk of the last batch written again with a new vector: every write is a change to every filter)."""
    tag, principal = case_filter(case)
    bm25, dense, under_writes = [], [], []
    exact.apply([], ["no-such-id"])  # a change: the first search computes the rows and gathers
    t0 = time.perf_counter()
    covered = exact.covers(tag, principal)
    mask_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    exact.search(qvec[:1], 50, tag, principal)
    first_s = time.perf_counter() - t0
    fresh = unit_vectors(np.random.default_rng([SEED, 1]), len(queries))
    for i, (text, vector) in enumerate(zip(queries, qvec, strict=True)):
        t0 = time.perf_counter()
        if index is not None:
            index.top(text, 50, tag, principal)
        t1 = time.perf_counter()
        exact.search(vector[None, :], 50, tag, principal)
        t2 = time.perf_counter()
        chunk = written[i % len(written)]
        chunk.embedding = fresh[i]
        exact.apply([chunk], [])
        t3 = time.perf_counter()
        exact.search(vector[None, :], 50, tag, principal)
        t4 = time.perf_counter()
        if i >= 5:
            bm25.append(t1 - t0)
            dense.append(t2 - t1)
            under_writes.append(t4 - t3)
    matching = exact._matching_rows(tag, principal) if tag is not None or principal is not None else None
    return {
        "matching": None if matching is None else len(matching),
        "bm25_p50_ms": percentile(bm25, 50) * 1000 if index is not None else None,
        "bm25_p95_ms": percentile(bm25, 95) * 1000 if index is not None else None,
        "rows_mask_ms": mask_s * 1000,
        "first_ms": first_s * 1000 if covered else None,
        "exact_p50_ms": percentile(dense, 50) * 1000 if covered else None,
        "exact_p95_ms": percentile(dense, 95) * 1000 if covered else None,
        "writes_p50_ms": percentile(under_writes, 50) * 1000 if covered else None,
        "writes_p95_ms": percentile(under_writes, 95) * 1000 if covered else None,
    }


def parts_table(out: dict[str, Any]) -> str:
    def ms(*values: float | None) -> str:
        return " / ".join("-" if v is None else f"{v:.1f}" for v in values)

    lines = [
        f"\n**The parts that scale, in process at {out['size']:,} chunks** (load at the end {out['load']})\n",
        "| Query | matching chunks | BM25 masked top-50 p50 / p95 ms "
        "| first sight of the filter: label mask and rows (ms) "
        "| exact, first query after a change (ms) | exact over the matching vectors p50 / p95 ms "
        "| exact, a write before each query p50 / p95 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for case, r in out["rows"].items():
        matching = "all" if r["matching"] is None else f"{r['matching']:,}"
        lines.append(
            f"| {case} | {matching} | {ms(r['bm25_p50_ms'], r['bm25_p95_ms'])} | {ms(r['rows_mask_ms'])} "
            f"| {ms(r['first_ms'])} | {ms(r['exact_p50_ms'], r['exact_p95_ms'])} "
            f"| {ms(r['writes_p50_ms'], r['writes_p95_ms'])} |"
        )
    return "\n".join(lines)


def unscoped(args: argparse.Namespace) -> int:
    """Chroma's unscoped search alone (`query_ids`, 200 queries): before the vectors are held, held, and
    held with a scoped exact search before each query (the main run interleaves them so)."""
    from app.retrieval.blas import one_thread

    store = open_store(args.workdir / f"n{args.size}" / "chroma")
    store.warm_up(DIM)
    vectors = unit_vectors(np.random.default_rng(8), args.queries + 5)
    small = principals()["small"]

    def run(label: str, before: Any = None) -> None:
        times = []
        for v in vectors:
            if before is not None:
                before(v)
            t = time.perf_counter()
            store.query_ids(v[None, :], 50)
            times.append(time.perf_counter() - t)
        print(
            f"| {label} | {percentile(times[5:], 50) * 1000:.1f} | {percentile(times[5:], 95) * 1000:.1f} |"
        )

    def scoped(v: np.ndarray) -> None:
        store.query_ids(v[None, :], 50, None, small)

    def scoped_one_thread(v: np.ndarray) -> None:
        with one_thread():
            scoped(v)

    print("| Unscoped `query_ids` | p50 ms | p95 ms |\n|---|---|---|")
    run("before the vectors are held")
    run("before the vectors are held, again")
    store.load_exact(args.exact_max, args.filtered_max)
    run("held")
    run("held, a scoped exact search before each", scoped)
    run("held, a scoped exact search on one BLAS thread before each", scoped_one_thread)
    run("held, again")
    print(f"\nload average at the end {load()}")
    store.close()
    return 0


def labels(args: argparse.Namespace) -> int:
    """A principal's first label mask at `--size` documents (module docstring)."""
    from app.access.scope import Principal, chunk_label, label_matches
    from app.store.types import LabelMasks

    scopes, tags = Scopes(), [None, "finance", "legal", "hr", "ops"]
    distinct: dict[str, None] = {}
    for doc_no in range(args.size):
        tenant, access, rare = scopes.of(doc_no)
        label = chunk_label(RARE_TAG if rare else tags[doc_no % 5], {"tenant": tenant, "access": access})
        distinct.setdefault(str(label))
    names = list(distinct)
    masks = LabelMasks()
    t = time.perf_counter()
    masks.parse(names)
    print(
        f"{len(names):,} distinct labels of {args.size:,} documents; parsed once in "
        f"{time.perf_counter() - t:.2f}s; load {load()}"
    )
    print("\n| principal | label by label (ms) | LabelMasks (ms) |\n|---|---|---|")
    for name, first in principals().items():
        for who in (first, Principal(f"{name}, 2 groups", tenant=first.tenant, groups=first.groups[:2])):
            t = time.perf_counter()
            slow = [label_matches(label, None, who) for label in names]
            t_slow = time.perf_counter() - t
            t = time.perf_counter()
            fast = masks(names, None, who, [])
            t_fast = time.perf_counter() - t
            assert fast.tolist() == slow, who
            print(f"| {who.name} | {t_slow * 1000:.0f} | {t_fast * 1000:.1f} |")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", nargs="?", default="run", choices=["run", "parts", "unscoped", "labels"])
    parser.add_argument("--size", type=int, default=None, help="chunks (run: 100,000; parts: 1,000,000)")
    parser.add_argument("--workdir", type=Path, default=Path("target/bench-access"))
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument(
        "--no-bm25", action="store_true", help="parts: without the BM25 index (its build is long)"
    )
    parser.add_argument("--exact-max", type=int, default=30_000, help="rag.store.exact_search_max_chunks")
    parser.add_argument(
        "--filtered-max", type=int, default=1_000_000, help="rag.store.exact_filtered_max_chunks (0: off)"
    )
    args = parser.parse_args()
    if args.size is None:
        args.size = 1_000_000 if args.command == "parts" else 100_000
    return {"parts": parts, "unscoped": unscoped, "labels": labels}.get(args.command, main_run)(args)


if __name__ == "__main__":
    sys.exit(main())
