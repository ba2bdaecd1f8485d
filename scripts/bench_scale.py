"""Sieve at scale: synthetic collections of 100k and 1M chunks, measured.

    python scripts/bench_scale.py [--sizes 100000,1000000] [--workdir target/bench-scale] [--doc FILE]

For each size N, under `--workdir`/n<N>/ (kept between runs, so "ready after the first build" is measurable):
1. build (once): the synthetic corpus of scripts/scale_corpus.py, vectors from its `HashEmbedder`, written
   into an embedded Chroma store in batches of the client's max batch size; the build time is printed;
2. start-up: a real server process (this script's `serve` command: the app of app/main.py over uvicorn,
   its Sieve opened with the hash embedder instead of a model) is started on the store; time until /ready
   and its resident memory (VmRSS, and the peak VmHWM) are read. The first start after a build also builds
   the persisted BM25 index (printed as the lexical build); the next start is the "ready" figure;
3. writes over real HTTP with an admin token: one-document `POST /api/documents` latency (median and worst of
   20, each a new document of 3 chunks), and a 1,000-document batch (as a job: time until done);
4. chain-only query time (the query's vector given: the hash embedder costs little beside it), p50/p95 of 200
   queries, without and with a knowledge tag, measured in a process of its own (`chain` command), after the
   BM25 index's background id check (its wait is printed as id_check_wait_s);
5. dense recall@50 of Chroma's HNSW against exact search (numpy, over the vectors regenerated from the
   corpus, in blocks) for 200 queries, at a few ef_search values, with the query time at each;
6. a replica check (the first size only): a `chroma run` server, two `serve` processes on it, a document
   written through one, and the time until the other's BM25 finds it.
Prints a Markdown table and writes it between the `bench-scale` markers of `--doc` (unless --no-doc).
The machine is shared: the load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from scale_corpus import Corpus, HashEmbedder  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
COLLECTION = "bench"


def size_dir(workdir: Path, size: int) -> Path:
    return workdir / f"n{size}"


def store_settings(path: Path) -> Any:
    from app.settings import StoreSettings

    return StoreSettings(path=str(path), collection=COLLECTION)


def index_text(title: str, text: str) -> str:
    return f"{title}\n\n{text}" if title else text


# -- 1. build ---------------------------------------------------------------------------------------


def build(where: Path, size: int, settings: Any = None) -> dict[str, Any]:
    """Write `size` synthetic chunks into the store of `settings` (default: embedded, `where/chroma`);
    resumes a build that was stopped."""
    from app.store import ChromaStore, StoredChunk

    marker = where / "built.json"
    if marker.exists():
        return dict(json.loads(marker.read_text()))
    where.mkdir(parents=True, exist_ok=True)
    embedder = HashEmbedder()
    store = ChromaStore.open(settings or store_settings(where / "chroma"), embedder.identity())
    batch = store._max_batch()
    done = store.count() // batch * batch  # every add call is atomic; redo the last partial batch
    corpus = Corpus()
    started = time.perf_counter()
    todo: queue.Queue[Any] = queue.Queue(maxsize=3)
    # every chunk's vector, row = chunk number, for the exact search of the recall figure
    vectors_path = where / "vectors.npy"
    if done and not vectors_path.exists():
        done = 0  # no saved vectors for what is stored: write it all again (upserts are idempotent)
    mode = "r+" if done else "w+"
    saved = np.lib.format.open_memmap(
        vectors_path, mode=mode, dtype=np.float32, shape=(size, HashEmbedder.dimension)
    )

    def produce() -> None:
        pending: list[Any] = []
        made = 0
        row = done
        for doc in corpus.chunks(size):
            for chunk in doc:
                made += 1
                if made > done:
                    pending.append(chunk)
            if len(pending) >= batch:
                part, pending[:] = pending[:batch], pending[batch:]
                vectors = embedder.embed([index_text(c.title, c.text) for c in part])
                saved[row : row + len(part)] = vectors
                row += len(part)
                todo.put((part, vectors))
        while pending:
            part, pending[:] = pending[:batch], pending[batch:]
            vectors = embedder.embed([index_text(c.title, c.text) for c in part])
            saved[row : row + len(part)] = vectors
            row += len(part)
            todo.put((part, vectors))
        todo.put(None)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    written = done
    last_log = time.monotonic()
    while (item := todo.get()) is not None:
        part, vectors = item
        store.upsert([StoredChunk(c.chunk_id, c.text, c.metadata()) for c in part], vectors)
        written += len(part)
        if time.monotonic() - last_log > 30:
            last_log = time.monotonic()
            rate = (written - done) / (time.perf_counter() - started)
            print(f"  build n={size}: {written}/{size} chunks, {rate:.0f}/s, load {load()}", flush=True)
    seconds = time.perf_counter() - started
    saved.flush()
    count = store.count()
    store.close()
    info = {"size": size, "chunks": count, "store_build_seconds": round(seconds, 1), "resumed_at": done}
    marker.write_text(json.dumps(info))
    return info


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: the smallest value with at least q% of the values at or below it."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of process `pid` in MiB: resident memory now and at its peak."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields.get("VmRSS", 0.0), fields.get("VmHWM", 0.0)


# -- the server under test ----------------------------------------------------------------------------


def bench_settings(args: argparse.Namespace) -> Any:
    """Sieve's settings for a bench process: the bench store, no startup ingest, no evaluation."""
    from app.settings import load_settings, merge, nested

    parts = [
        nested("rag.store.collection", COLLECTION),
        nested("rag.ingest.on_startup", False),
        nested("rag.ingest.paths", []),
        nested("rag.evaluate.enabled", False),
        nested("rag.server.jobs_dir", str(args.jobs_dir)),
        nested("rag.lexical.refresh_seconds", args.refresh_seconds),
    ]
    if args.admin_token:
        parts.append(nested("rag.server.admin_token", args.admin_token))
    if args.chroma_port:
        parts += [nested("rag.store.mode", "http"), nested("rag.store.port", args.chroma_port)]
    else:
        parts.append(nested("rag.store.path", str(args.store)))
    if args.lexical_path:
        parts.append(nested("rag.lexical.path", str(args.lexical_path)))
    return load_settings(merge(*parts))


def serve(args: argparse.Namespace) -> int:
    """The app of app/main.py over uvicorn on 127.0.0.1, its Sieve opened with the hash embedder."""
    import logging

    import uvicorn

    from app.main import AppState, create_app
    from app.service import Sieve
    from app.store import ChromaStore

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = bench_settings(args)
    embedder = HashEmbedder()

    def start(state: AppState) -> None:
        t0 = time.perf_counter()
        state.phase = "opening the store and the BM25 index"
        store = ChromaStore.open(settings.rag.store, embedder.identity())
        t1 = time.perf_counter()
        sieve = Sieve(settings, embedder, store, None)  # type: ignore[arg-type]
        state.sieve, state.owns_sieve = sieve, True
        state.phase, state.ready = "ready", True
        logging.getLogger("bench").info(
            "bench-scale ready: store opened in %.2fs, index and chain in %.2fs (%d chunks)",
            t1 - t0,
            time.perf_counter() - t1,
            len(sieve.lexical),
        )

    app = create_app(settings, start=start)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", log_config=None)
    return 0


class Server:
    """A `serve` subprocess; `start()` returns the seconds until /ready answered 200."""

    def __init__(self, workdir: Path, name: str, extra: list[str], token: str):
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / f"serve-{name}.log"
        self.cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "serve",
            "--port",
            str(self.port),
            f"--admin-token={token}",  # one argument: a token may start with "-"
            "--jobs-dir",
            str(workdir / f"jobs-{name}"),
            *extra,
        ]
        self.headers = {"Authorization": f"Bearer {token}"}
        self.proc: Any = None

    def start(self, timeout: float = 1800) -> float:
        import subprocess

        import httpx

        env = {k: v for k, v in os.environ.items() if not k.startswith("RAG__") and k != "SIEVE_CONFIG"}
        started = time.perf_counter()
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        while time.perf_counter() - started < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited with {self.proc.returncode}: see {self.log_path}")
            try:
                if httpx.get(f"{self.url}/ready", timeout=2).status_code == 200:
                    return time.perf_counter() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"serve not ready within {timeout:.0f}s: see {self.log_path}")

    def stop(self, timeout: float = 60) -> None:
        import subprocess

        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_lines(self, needle: str) -> list[str]:
        return [line for line in self.log_path.read_text(errors="replace").splitlines() if needle in line]


def write_document(corpus: Corpus, doc_id: str, nonce: str, doc_no: int) -> dict[str, Any]:
    """A 3-chunk synthetic document as the API takes it; `nonce` makes each run's text new."""
    chunks = corpus.document(doc_no, chunks=3)
    doc: dict[str, Any] = {
        "id": doc_id,
        "title": chunks[0].title,
        "text": "\n\n".join(c.text for c in chunks) + f" {nonce}",
    }
    if chunks[0].knowledge:
        doc["knowledge"] = chunks[0].knowledge
    return doc


def measure_writes(server: Server, corpus: Corpus, singles: int, batch: int) -> dict[str, Any]:
    import httpx

    nonce = f"run{int(time.time())}"
    latencies = []
    with httpx.Client(timeout=600, headers=server.headers) as client:
        for i in range(singles):
            doc = write_document(corpus, f"bench-w-{i}", nonce, 10_000_000 + i)
            t0 = time.perf_counter()
            response = client.post(f"{server.url}/api/documents", json={"documents": [doc]})
            latencies.append(time.perf_counter() - t0)
            if response.status_code != 200:
                raise RuntimeError(f"one-document write: {response.status_code} {response.text[:300]}")
        docs = [write_document(corpus, f"bench-b-{i}", nonce, 10_100_000 + i) for i in range(batch)]
        t0 = time.perf_counter()
        response = client.post(f"{server.url}/api/documents", json={"documents": docs})
        if response.status_code == 202:
            job = response.json()["job"]
            while True:
                view = client.get(f"{server.url}/api/jobs/{job}").json()
                if view["state"] in ("done", "failed", "interrupted"):
                    break
                time.sleep(0.1)
            if view["state"] != "done":
                raise RuntimeError(f"batch job {view['state']}: {view}")
            report = view["report"]
        elif response.status_code == 200:
            report = response.json()
        else:
            raise RuntimeError(f"batch write: {response.status_code} {response.text[:300]}")
        batch_s = time.perf_counter() - t0
    return {
        "write_p50_ms": percentile(latencies, 50) * 1000,
        "write_max_ms": max(latencies) * 1000,
        "batch_docs": batch,
        "batch_chunks": int(report["chunks"]),
        "batch_s": batch_s,
    }


# -- chain-only queries and dense recall (a process of its own: the embedded store is one process's) ----


class GivenVectors:
    """The chain's query embedder with every query's vector computed beforehand (a dict lookup)."""

    def __init__(self, vectors: dict[str, np.ndarray]):
        self.vectors = vectors

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.vectors[t] for t in texts])


def chain_and_recall(args: argparse.Namespace) -> int:
    from app.retrieval.chain import RetrievalChain
    from app.service import Sieve
    from app.store import ChromaStore

    settings = bench_settings(args)
    embedder = HashEmbedder()
    t0 = time.perf_counter()
    store = ChromaStore.open(settings.rag.store, embedder.identity())
    sieve = Sieve(settings, embedder, store, None)  # type: ignore[arg-type]
    opened_s = time.perf_counter() - t0
    # the background id check lists every id beside the first queries (tens of seconds at 1M,
    # docs/benchmarks.md#code-figures): time what follows it
    sieve.wait_id_check(timeout=900)
    id_check_s = time.perf_counter() - t0 - opened_s
    corpus = Corpus()
    rng = np.random.default_rng(7)
    queries = [corpus.query(rng) for _ in range(args.queries)]
    vectors = {
        text: vec for (text, _), vec in zip(queries, embedder.embed([q for q, _ in queries]), strict=True)
    }
    chain = RetrievalChain(GivenVectors(vectors), sieve.chain.candidates, sieve.chain.stages)
    for text, _ in queries[:10]:  # warm-up: caches, first touches of the postings
        chain.retrieve(text, 10)
    out: dict[str, Any] = {"open_s": opened_s, "id_check_wait_s": id_check_s}
    for label, tagged in (("untagged", False), ("tagged", True)):
        times = []
        bm25_times = []
        for text, tag in queries:
            t = time.perf_counter()
            chain.retrieve(text, 10, tag if tagged else None)
            times.append(time.perf_counter() - t)
            t = time.perf_counter()
            sieve.lexical.top(text, 50, tag if tagged else None)
            bm25_times.append(time.perf_counter() - t)
        out[f"chain_{label}_p50_ms"] = percentile(times, 50) * 1000
        out[f"chain_{label}_p95_ms"] = percentile(times, 95) * 1000
        out[f"bm25_top_{label}_p50_ms"] = percentile(bm25_times, 50) * 1000
    if args.profile:
        import cProfile
        import pstats

        profile = cProfile.Profile()
        profile.enable()
        for text, tag in queries:
            chain.retrieve(text, 10, tag)
        profile.disable()
        pstats.Stats(profile, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
    print("BENCH-JSON " + json.dumps(out), flush=True)
    sieve.close()
    return 0


def set_ef(args: argparse.Namespace) -> int:
    """Persist the collection's ef_search (Chroma reads it when a process first loads the HNSW segment,
    so a change made in a process that has queried already does not apply to that process)."""
    import chromadb
    from chromadb.config import Settings as ChromaClientSettings

    client = chromadb.PersistentClient(
        path=str(args.store), settings=ChromaClientSettings(anonymized_telemetry=False)
    )
    collection = client.get_collection(COLLECTION)
    previous = int(collection.configuration["hnsw"]["ef_search"])
    collection.modify(configuration={"hnsw": {"ef_search": args.ef}})
    print("BENCH-JSON " + json.dumps({"previous": previous, "ef": args.ef}), flush=True)
    return 0


def dense_recall(args: argparse.Namespace) -> int:
    """Recall@50 of Chroma's HNSW (at the collection's ef_search) against exact cosine search over the same
    vectors, for the benchmark's queries, with the query time; prints BENCH-JSON.

    Exact: the built corpus's vectors (saved at build, row = chunk number) plus every chunk written later
    through the API (read back from the store), scored by dot product (all unit length), top 50 each."""
    import chromadb
    from chromadb.config import Settings as ChromaClientSettings

    k = 50
    client = chromadb.PersistentClient(
        path=str(args.store), settings=ChromaClientSettings(anonymized_telemetry=False)
    )
    collection = client.get_collection(COLLECTION)
    corpus = Corpus()
    rng = np.random.default_rng(7)
    q = HashEmbedder().embed([corpus.query(rng)[0] for _ in range(args.queries)])
    t0 = time.perf_counter()
    collection.query(query_embeddings=q[:1], n_results=k, include=[])  # loads the HNSW segment
    load_s = time.perf_counter() - t0
    times = []
    found: list[list[str]] = []
    for i in range(len(q)):
        t = time.perf_counter()
        r = collection.query(query_embeddings=q[i : i + 1], n_results=k, include=[])
        times.append(time.perf_counter() - t)
        found.append(r["ids"][0])
    corpus_vectors = np.load(args.vectors, mmap_mode="r")
    row_ids = np.asarray(corpus.chunk_ids(len(corpus_vectors)), dtype=object)
    best_scores = np.full((len(q), 0), -np.inf, dtype=np.float32)
    best_ids = np.zeros((len(q), 0), dtype=object)
    for lo in range(0, len(corpus_vectors), 100_000):
        block = np.asarray(corpus_vectors[lo : lo + 100_000])
        best_scores, best_ids = _merge_top(
            best_scores, best_ids, (block @ q.T, row_ids[lo : lo + 100_000]), k
        )
    api = collection.get(where={"origin": "api"}, include=["embeddings"])
    if api["ids"]:
        extra = np.asarray(api["embeddings"], dtype=np.float32)
        best_scores, best_ids = _merge_top(
            best_scores, best_ids, (extra @ q.T, np.asarray(api["ids"], dtype=object)), k
        )
    recall = [len(set(exact) & set(got)) / k for exact, got in zip(best_ids.tolist(), found, strict=True)]
    out = {
        "ef": int(collection.configuration["hnsw"]["ef_search"]),
        "recall": float(np.mean(recall)),
        "p50_ms": percentile(times, 50) * 1000,
        "p95_ms": percentile(times, 95) * 1000,
        "segment_load_s": load_s,
    }
    print("BENCH-JSON " + json.dumps(out), flush=True)
    return 0


def _merge_top(
    scores: np.ndarray, ids: np.ndarray, block: tuple[np.ndarray, np.ndarray], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The best k (score, id) per query of those kept so far and a new block (scores: rows x queries)."""
    block_scores, block_ids = block
    all_scores = np.concatenate([scores, block_scores.T], axis=1)
    all_ids = np.concatenate([ids, np.broadcast_to(block_ids, (len(scores), len(block_ids)))], axis=1)
    top = np.argpartition(-all_scores, min(k, all_scores.shape[1] - 1), axis=1)[:, :k]
    rows = np.arange(len(scores))[:, None]
    return all_scores[rows, top], all_ids[rows, top]


# -- the lexical index alone (its own figures at sizes the vector store did not reach) ------------------


def lexical_alone(args: argparse.Namespace) -> int:
    """Build the BM25 index over `--size` corpus chunks straight from the generator (no store), save it,
    load it again, and time top(), a one-document update and a snapshot. Prints BENCH-JSON."""
    from app.lexical.files import Journal, load_snapshot, save_snapshot
    from app.lexical.index import Analyzer, Bm25Index
    from app.service import index_text
    from app.store import StoredChunk

    directory = args.workdir / f"lexical-n{args.size}"
    out: dict[str, Any] = {"size": args.size}
    corpus = Corpus()
    analyzer = Analyzer()
    analyzer.tokens("预热")  # jieba's dictionary, loaded once (not part of the build figure)
    if not (directory / "manifest.json").exists():
        index = Bm25Index(analyzer, k1=1.2, b=0.75, epsilon=0.25)
        t0 = time.perf_counter()
        pending: list[tuple[str, str, str | None]] = []
        done = 0
        for doc in corpus.chunks(args.size):
            for c in doc:
                text = index_text(StoredChunk(c.chunk_id, c.text, c.metadata()))
                pending.append((c.chunk_id, text, c.knowledge))
            if len(pending) >= 10_000:
                index.upsert(pending)
                done += len(pending)
                pending = []
                if done % 100_000 < 10_000:
                    print(
                        f"  lexical n={args.size}: {done} chunks, load {load()}", file=sys.stderr, flush=True
                    )
        index.upsert(pending)
        out["build_s"] = time.perf_counter() - t0
        out["build_rss_mib"] = rss_mib(os.getpid())[0]
        t0 = time.perf_counter()
        state, tags = index.export_state()
        directory.mkdir(parents=True, exist_ok=True)
        save_snapshot(directory, state, tags, {"bench": "lexical-alone"})
        out["snapshot_s"] = time.perf_counter() - t0
        (directory / "build.json").write_text(json.dumps(out))
        print("BENCH-JSON " + json.dumps(out), flush=True)
        return 0
    out.update(json.loads((directory / "build.json").read_text()))
    manifest = json.loads((directory / "manifest.json").read_text())
    out["files_mib"] = sum(f.stat().st_size for f in directory.glob("snap-*")) / 2**20
    before = rss_mib(os.getpid())[0]
    t0 = time.perf_counter()
    state, tags = load_snapshot(directory, manifest)
    index = Bm25Index.from_state(state, tags, analyzer, k1=1.2, b=0.75, epsilon=0.25)
    del state
    out["load_s"] = time.perf_counter() - t0
    out["loaded_rss_mib"] = rss_mib(os.getpid())[0]
    out["index_mib"] = out["loaded_rss_mib"] - before
    rng = np.random.default_rng(7)
    queries = [corpus.query(rng) for _ in range(args.queries)]
    for text, _ in queries[:10]:
        index.top(text, 50)
    for label, tagged in (("untagged", False), ("tagged", True)):
        times = []
        for text, tag in queries:
            t = time.perf_counter()
            index.top(text, 50, tag if tagged else None)
            times.append(time.perf_counter() - t)
        out[f"top_{label}_p50_ms"] = percentile(times, 50) * 1000
        out[f"top_{label}_p95_ms"] = percentile(times, 95) * 1000
    out["after_queries_rss_mib"] = rss_mib(os.getpid())[0]
    journal = Journal(directory, int(manifest["generation"]))
    times = []
    for i in range(20):
        doc = corpus.document(10_200_000 + i, chunks=3)
        items = [
            (f"{c.chunk_id}-w", index_text(StoredChunk(c.chunk_id, c.text, c.metadata())), c.knowledge)
            for c in doc
        ]
        t = time.perf_counter()
        journal.append([{"analysed": index.upsert(items)}])
        times.append(time.perf_counter() - t)
    out["update_p50_ms"] = percentile(times, 50) * 1000
    out["update_max_ms"] = max(times) * 1000
    t0 = time.perf_counter()
    index.export_state()
    out["export_s"] = time.perf_counter() - t0
    print("BENCH-JSON " + json.dumps(out), flush=True)
    return 0


# -- the run ------------------------------------------------------------------------------------------


def run_size(workdir: Path, size: int, args: argparse.Namespace) -> dict[str, Any]:
    import secrets

    row: dict[str, Any] = {"size": size}
    print(f"== {size:,} chunks: build (load {load()})", flush=True)
    info = build(size_dir(workdir, size), size)
    row["store_build_s"] = info["store_build_seconds"]
    where = size_dir(workdir, size)
    store = where / "chroma"
    lexical_manifest = store / "lexical" / COLLECTION / "manifest.json"
    token = secrets.token_urlsafe(24)
    extra = ["--store", str(store)]
    fresh = not lexical_manifest.exists()
    server = Server(where, "single", extra, token)
    try:
        if fresh:
            print(f"   first start: builds the BM25 index (load {load()})", flush=True)
            row["lexical_build_s"] = server.start()
            server.stop()
        else:
            row["lexical_build_s"] = info.get("lexical_build_s")
        print(f"   start-up (load {load()})", flush=True)
        row["ready_s"] = server.start()
        row["rss_mib"], row["hwm_mib"] = rss_mib(server.proc.pid)
        row["ready_log"] = (server.log_lines("BM25 index") or [""])[-1].split(": ", 1)[-1]
        print(
            f"   ready in {row['ready_s']:.1f}s, RSS {row['rss_mib']:.0f} MiB; writes (load {load()})",
            flush=True,
        )
        row.update(measure_writes(server, Corpus(), args.singles, args.batch))
        row["rss_after_writes_mib"] = rss_mib(server.proc.pid)[0]
    finally:
        server.stop()
    if fresh:
        info["lexical_build_s"] = row["lexical_build_s"]
        (where / "built.json").write_text(json.dumps(info))
    print(f"   chain-only queries and dense recall (load {load()})", flush=True)
    row.update(run_chain(where, store, args))
    row["load"] = load()
    return row


def run_step(where: Path, command: str, extra: list[str], before: list[str] | None = None) -> dict[str, Any]:
    """Run this script's `command` in a process of its own; its BENCH-JSON line, parsed."""
    import subprocess

    cmd = [sys.executable, str(Path(__file__).resolve()), *(before or []), command, *extra]
    log_path = where / f"{command}.log"
    with log_path.open("ab") as log:
        done = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=log, check=False)
    lines = [x for x in done.stdout.decode().splitlines() if x.startswith("BENCH-JSON ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{command} failed ({done.returncode}): see {log_path}")
    return dict(json.loads(lines[-1].split(" ", 1)[1]))


def run_chain(where: Path, store: Path, args: argparse.Namespace) -> dict[str, Any]:
    extra = ["--store", str(store), "--jobs-dir", str(where / "jobs-chain"), "--queries", str(args.queries)]
    out = run_step(where, "chain", extra + (["--profile"] if args.profile else []))
    recall = []
    default_ef = None
    try:
        for ef in args.ef:
            previous = run_step(where, "setef", ["--store", str(store), "--ef", str(ef)])["previous"]
            default_ef = previous if default_ef is None else default_ef
            print(f"   dense recall at ef_search {ef} (load {load()})", flush=True)
            recall.append(
                run_step(
                    where,
                    "recall",
                    [
                        "--store",
                        str(store),
                        "--vectors",
                        str(where / "vectors.npy"),
                        "--queries",
                        str(args.queries),
                    ],
                )
            )
    finally:
        if default_ef is not None:
            run_step(where, "setef", ["--store", str(store), "--ef", str(default_ef)])
    out["recall"] = recall
    return out


def run_replicas(workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Two `serve` processes on one `chroma run` (a 20,000-chunk collection built over HTTP): a document
    written through A (a new word in it), and the time until B's BM25 finds it, five times."""
    import secrets
    import socket
    import subprocess

    import httpx

    from app.settings import StoreSettings

    where = workdir / "replicas"
    where.mkdir(parents=True, exist_ok=True)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        chroma_port = int(sock.getsockname()[1])
    chroma = Path(sys.executable).with_name("chroma")
    log = (where / "chroma.log").open("ab")
    proc = subprocess.Popen(
        [str(chroma), "run", "--path", str(where / "db"), "--host", "127.0.0.1", "--port", str(chroma_port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "ANONYMIZED_TELEMETRY": "False"},
    )
    token = secrets.token_urlsafe(24)
    servers: list[Server] = []
    out: dict[str, Any] = {"refresh_seconds": args.refresh_seconds}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if (
                    httpx.get(f"http://127.0.0.1:{chroma_port}/api/v2/heartbeat", timeout=1).status_code
                    == 200
                ):
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"chroma run did not start: see {where / 'chroma.log'}")
            time.sleep(0.2)
        settings = StoreSettings(mode="http", port=chroma_port, collection=COLLECTION)
        out["chunks"] = build(where, args.replica_chunks, settings)["chunks"]
        for name in ("a", "b"):
            extra = [
                "--chroma-port",
                str(chroma_port),
                "--lexical-path",
                str(where / f"lexical-{name}"),
                "--refresh-seconds",
                str(args.refresh_seconds),
            ]
            servers.append(Server(where, name, extra, token))
        for server in servers:
            server.start()
        a, b = servers
        waits = []
        with httpx.Client(timeout=120) as client:
            for i in range(5):
                word = f"zq{secrets.token_hex(4)}"
                doc = {
                    "id": f"replica-{i}",
                    "title": "Replica check",
                    "text": f"The {word} manual, part {i}.",
                }
                written = client.post(f"{a.url}/api/documents", json={"documents": [doc]}, headers=a.headers)
                if written.status_code != 200:
                    raise RuntimeError(f"replica write: {written.status_code} {written.text[:300]}")
                t0 = time.perf_counter()
                while time.perf_counter() - t0 < 30:
                    found = client.post(f"{b.url}/api/retrieve", json={"query": word, "topK": 3}).json()
                    if any(
                        d["docId"] == doc["id"] and "bm25" in d["origin"] and (d["scores"]["bm25"] or 0) > 0
                        for d in found["documents"]
                    ):
                        break
                    time.sleep(0.02)
                else:
                    raise RuntimeError("replica B never found the document written through A")
                waits.append(time.perf_counter() - t0)
                time.sleep(0.3)
        out["caught_up_p50_s"] = percentile(waits, 50)
        out["caught_up_max_s"] = max(waits)
    finally:
        for server in servers:
            server.stop()
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    return out


def _fmt(value: Any, spec: str = ".1f", unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


def markdown(
    rows: list[dict[str, Any]], replica: dict[str, Any] | None, wall_s: float, lexical: list[dict[str, Any]]
) -> str:
    import platform

    cores = len(os.sched_getaffinity(0))
    lines = [
        f"Measured by `make bench-scale` on {cores} cores ({platform.processor() or platform.machine()}), "
        f"{time.strftime('%Y-%m-%d')}, wall {wall_s / 60:.1f} min; load average (1/5/15 min) at the end of "
        "each size in the last row. Synthetic mixed zh/en chunks, hash-embedder vectors (384 dims), "
        "Chroma embedded with the default HNSW settings (M 32, ef_construction 200, ef_search 200).",
        "",
        "| Figure | " + " | ".join(f"{r['size']:,} chunks" for r in rows) + " | Goal at 1M |",
        "|---|" + "---|" * len(rows) + "---|",
    ]

    def line(label: str, goal: str, cell: Any) -> None:
        lines.append(f"| {label} | " + " | ".join(cell(r) for r in rows) + f" | {goal} |")

    line(
        "Store build (Chroma add, batches of 5,000)", "", lambda r: _fmt(r.get("store_build_s"), ".0f", " s")
    )
    line("BM25 index first build (first start)", "", lambda r: _fmt(r.get("lexical_build_s"), ".0f", " s"))
    line("Start-up to ready (store + BM25 index)", "< 60 s", lambda r: _fmt(r.get("ready_s"), ".1f", " s"))
    line(
        "Resident memory at ready (peak)",
        "",
        lambda r: f"{r['rss_mib']:,.0f} MiB ({r['hwm_mib']:,.0f})" if "rss_mib" in r else "-",
    )
    line(
        "One-document write, `POST /api/documents` (median / worst of 20)",
        "< 1 s",
        lambda r: f"{r['write_p50_ms']:.0f} / {r['write_max_ms']:.0f} ms" if "write_p50_ms" in r else "-",
    )
    line(
        "1,000-document batch (a job)",
        "",
        lambda r: (
            f"{r['batch_s']:.1f} s = {r['batch_docs'] / r['batch_s']:.0f} docs/s" if "batch_s" in r else "-"
        ),
    )
    for label, key in (("no tag", "untagged"), ("with a knowledge tag", "tagged")):
        line(
            f"Chain-only query p50 / p95, {label}",
            "p95 < 50 ms",
            lambda r, key=key: f"{r[f'chain_{key}_p50_ms']:.1f} / {r[f'chain_{key}_p95_ms']:.1f} ms",
        )
        line(
            f"  of which BM25 top-50 p50, {label}",
            "",
            lambda r, key=key: f"{r[f'bm25_top_{key}_p50_ms']:.1f} ms",
        )
    efs = sorted({e["ef"] for r in rows for e in r.get("recall", [])})
    for ef in efs:

        def cell(r: dict[str, Any], ef: int = ef) -> str:
            for e in r.get("recall", []):
                if e["ef"] == ef:
                    return f"{e['recall']:.3f} ({e['p50_ms']:.1f} / {e['p95_ms']:.1f} ms)"
            return "-"

        line(f"Dense recall@50 vs exact, ef_search {ef} (query p50 / p95)", "≥ 0.99 at 100k", cell)
    line("Load average at the end", "", lambda r: r.get("load", "-"))
    if lexical:
        lines += [
            "",
            "The BM25 index alone (built from the generator, no store; the same code the server runs):",
            "",
            "| BM25 index | " + " | ".join(f"{r['size']:,} chunks" for r in lexical) + " |",
            "|---|" + "---|" * len(lexical),
        ]

        def lex(label: str, cell: Any) -> None:
            lines.append(f"| {label} | " + " | ".join(cell(r) for r in lexical) + " |")

        lex("First build (analyse + index, one thread)", lambda r: f"{r['build_s']:.0f} s")
        lex(
            "Snapshot: export + write, files on disk",
            lambda r: f"{r['snapshot_s']:.1f} s, {r['files_mib']:,.0f} MiB",
        )
        lex("Load at start (snapshot files -> index)", lambda r: f"{r['load_s']:.1f} s")
        lex("Memory of the loaded index (RSS growth)", lambda r: f"{r['index_mib']:,.0f} MiB")
        lex(
            "top-50 p50 / p95, no tag",
            lambda r: f"{r['top_untagged_p50_ms']:.1f} / {r['top_untagged_p95_ms']:.1f} ms",
        )
        lex(
            "top-50 p50 / p95, with a tag",
            lambda r: f"{r['top_tagged_p50_ms']:.1f} / {r['top_tagged_p95_ms']:.1f} ms",
        )
        lex("RSS after the queries (posting caches)", lambda r: f"{r['after_queries_rss_mib']:,.0f} MiB")
        lex(
            "A 3-chunk document indexed + journalled (median / worst of 20)",
            lambda r: f"{r['update_p50_ms']:.0f} / {r['update_max_ms']:.0f} ms",
        )
        lex(
            "Export of the whole index (what a snapshot holds the lock for)",
            lambda r: f"{r['export_s']:.1f} s",
        )
        lex("Load average at the end", lambda r: r.get("load", "-"))
    if replica:
        lines += [
            "",
            f"Replicas: two `serve` processes on one `chroma run` ({replica['chunks']:,} chunks), "
            f"`rag.lexical.refresh_seconds` {replica['refresh_seconds']:g}: a document written through one "
            f"was found by the other's BM25 after {replica['caught_up_p50_s']:.2f} s (median of 5, worst "
            f"{replica['caught_up_max_s']:.2f} s).",
        ]
    return "\n".join(lines)


BEGIN, END = "<!-- bench-scale:begin -->", "<!-- bench-scale:end -->"


def write_block(doc: Path, block: str) -> None:
    """Replace what lies between the bench-scale markers of `doc` (nothing else is touched)."""
    text = doc.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{doc} has no {BEGIN} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(f"{head}{BEGIN}\n{block}\n{END}{tail}", encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--workdir", type=Path, default=REPO / "target" / "bench-scale")
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "benchmarks.md")
    parser.add_argument("--no-doc", action="store_true")
    parser.add_argument("--no-replicas", action="store_true")
    parser.add_argument("--singles", type=int, default=20, help="one-document writes timed")
    parser.add_argument("--batch", type=int, default=1000, help="documents in the batch write")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--ef", type=lambda s: [int(x) for x in s.split(",")], default=[100, 200, 400, 800])
    parser.add_argument("--profile", action="store_true", help="cProfile the chain queries (to chain.log)")
    parser.add_argument("--replica-chunks", type=int, default=20_000)
    parser.add_argument(
        "--lexical-sizes", help="sizes for the BM25 index alone (default: --sizes), e.g. 100000,1000000"
    )
    parser.add_argument("--refresh-seconds", type=float, default=1.0)
    sub = parser.add_subparsers(dest="command")
    b = sub.add_parser("build", help="build one size's store only")
    b.add_argument("--size", type=int, required=True)
    se = sub.add_parser("setef", help="(internal) persist the collection's ef_search")
    se.add_argument("--store", type=Path, required=True)
    se.add_argument("--ef", type=int, required=True)
    rc = sub.add_parser("recall", help="(internal) dense recall@50 at the collection's ef_search")
    rc.add_argument("--store", type=Path, required=True)
    rc.add_argument("--vectors", type=Path, required=True)
    rc.add_argument("--queries", type=int, default=200)
    lx = sub.add_parser("lexical", help="the BM25 index alone: build (first call), then load and time")
    lx.add_argument("--size", type=int, required=True)
    lx.add_argument("--queries", type=int, default=200)
    for name in ("serve", "chain"):
        p = sub.add_parser(name, help=f"(internal) the {name} process")
        p.add_argument("--store", type=Path)
        p.add_argument("--chroma-port", type=int)
        p.add_argument("--lexical-path", type=Path)
        p.add_argument("--jobs-dir", type=Path, required=True)
        p.add_argument("--admin-token")
        p.add_argument("--refresh-seconds", type=float, default=1.0)
        p.add_argument("--port", type=int, default=0)
        p.add_argument("--queries", type=int, default=200)
        p.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    if args.command == "build":
        print(json.dumps(build(size_dir(args.workdir, args.size), args.size)))
        return 0
    if args.command == "serve":
        return serve(args)
    if args.command == "chain":
        return chain_and_recall(args)
    if args.command == "lexical":
        return lexical_alone(args)
    if args.command == "setef":
        return set_ef(args)
    if args.command == "recall":
        return dense_recall(args)
    wall = time.perf_counter()
    sizes = [int(x) for x in args.sizes.split(",")]
    if not args.no_doc:  # fail before any long work
        text = args.doc.read_text(encoding="utf-8")
        if BEGIN not in text or END not in text:
            print(f"error: {args.doc} has no {BEGIN} ... {END} markers", file=sys.stderr)
            return 2
    args.workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for size in sizes:
        rows.append(run_size(args.workdir, size, args))
        print(json.dumps(rows[-1], indent=1), flush=True)
    lexical_rows = []
    for size in [int(x) for x in (args.lexical_sizes or args.sizes).split(",")]:
        print(f"== the BM25 index alone at {size:,} chunks (load {load()})", flush=True)
        before = ["--workdir", str(args.workdir)]
        if not (args.workdir / f"lexical-n{size}" / "manifest.json").exists():
            run_step(args.workdir, "lexical", ["--size", str(size)], before)
        lexical_rows.append(run_step(args.workdir, "lexical", ["--size", str(size)], before))
        lexical_rows[-1]["load"] = load()
        print(json.dumps(lexical_rows[-1], indent=1), flush=True)
    replica = None if args.no_replicas else run_replicas(args.workdir, args)
    block = markdown(rows, replica, time.perf_counter() - wall, lexical_rows)
    print(block)
    if not args.no_doc:
        write_block(args.doc, block)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
