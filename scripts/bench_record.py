"""Benchmark: what the document record costs, and how long a rebuild from it takes.

    python scripts/bench_record.py [--quick] [--parts cost,put,rebuild] [--rebuild-sets SETS]
                                   [--workdir target/bench-record] [--doc FILE | --no-doc | --render]

The machine may be shared: compare the ratios of one run (alternated A B A B ...), not runs with each
other; the 1-minute load average is printed beside every figure. Each part writes its figures to
`--workdir`/results/<part>.json, so a long part run on its own (in the background) is rendered with the
others (`--render`: the block from the saved figures, nothing measured).

1. cost (the packaged model): what the record adds to an ingest.
   a) One-document write: `Sieve.ingest_documents` of one new ~1,000-character SciFact document (the write
      API's path), into one embedded store, by a Sieve with the record (A) and one without (B,
      record=None), alternately, `--singles` times each: the medians, their ratio, the median of the
      record's own put.
   b) Ingest throughput: the first `--docs` SciFact documents (corpus.jsonl read by the JSONL loader, as
      `sieve ingest` reads a BEIR corpus) into fresh embedded stores by the ingest pipeline with the record
      (A) and without it (B), alternately, `--rounds` times each: chunks/s, the ratio of the medians, and
      the record's share of A's time (its puts' seconds / the ingest's seconds; the goal is at most 5%).
2. put (no model): `DocumentRecord.put` of 1 new document and of 1,000 new ones (SciFact texts cut to
   ~1,000 characters), and of those 1,000 again unchanged, on a `SqliteRecord`, a `ChromaRecord` on a
   `chroma run` server and a `ChromaRecord` on an embedded Chroma client, alternately: ms a put.
3. rebuild: a record built, then every recorded document chunked and embedded again into a new collection.
   Sets: `scifact-hash` (SciFact, 17,986 chunks at the default chunking) and `synthetic-100k` (documents of
   scripts/scale_corpus.py, about 100,000 chunks), both with its hash embedder (the store is measured, not
   a model), and `scifact-model` (SciFact with the packaged model: the long one). With
   the hash embedder the live collection is first ingested with the record (that ingest is timed too); with
   the model only the record is written (the live collection stays empty). The rebuild is
   `app.ingest.rebuild.rebuild` (`sieve store rebuild`) where this checkout has it, else the re-ingest of
   every recorded document into a fresh collection through the ingest pipeline (what a rebuild does before
   its switch); the block says which.

`--quick` (cost: 6 writes each, 60 documents, 1 round; put: 5 singles, 200 documents; rebuild:
`scifact-hash` only) checks the script end to end. Prints a Markdown block and writes it between the
`bench-record` markers of `--doc` (unless --no-doc).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scale_corpus import Corpus, HashEmbedder  # noqa: E402

from app.ingest.pipeline import Ingestor  # noqa: E402
from app.ingest.types import Document  # noqa: E402
from app.settings import IngestSettings, StoreSettings  # noqa: E402
from app.store.record import (  # noqa: E402
    RECORD_FILE,
    DocumentRecord,
    SqliteRecord,
    Tombstone,
    open_record,
)

REPO = Path(__file__).resolve().parents[1]
DATASETS = Path(os.environ.get("SIEVE_DATASETS", REPO.parent / "shared" / "datasets"))
BEGIN, END = "<!-- bench-record:begin -->", "<!-- bench-record:end -->"
COLLECTION = "bench"
ONE_DOC_CHARS = 1000
REBUILD_SETS = ("scifact-hash", "synthetic-100k", "scifact-model")


# -- the arithmetic ---------------------------------------------------------------------------------


def median_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """median(a) / median(b): how many times B's typical figure A's is (1.0 = the same)."""
    return statistics.median(a) / statistics.median(b)


def overhead_percent(with_record: Sequence[float], without: Sequence[float]) -> float:
    """(median(with_record) / median(without) - 1) x 100: the percentage the record adds to a time."""
    return (median_ratio(with_record, without) - 1.0) * 100.0


def share_percent(part: float, whole: float) -> float:
    """part / whole x 100 (0 when whole is 0): the record's puts' share of an ingest's seconds."""
    return 100.0 * part / whole if whole > 0 else 0.0


def per_second(count: int, seconds: float) -> float:
    """count / seconds (0 when no time passed)."""
    return count / seconds if seconds > 0 else 0.0


def load() -> float:
    return os.getloadavg()[0]


# -- the record, timed ------------------------------------------------------------------------------


class TimedRecord:
    """A `DocumentRecord` that adds the seconds of every `put` and `delete` to `seconds`."""

    def __init__(self, inner: DocumentRecord):
        self.inner = inner
        self.description = inner.description
        self.seconds = 0.0

    def put(self, documents: Sequence[Document]) -> int:
        started = time.perf_counter()
        try:
            return self.inner.put(documents)
        finally:
            self.seconds += time.perf_counter() - started

    def delete(self, doc_ids: Sequence[str], tombstone: bool = False) -> int:
        started = time.perf_counter()
        try:
            return self.inner.delete(doc_ids, tombstone)
        finally:
            self.seconds += time.perf_counter() - started

    def tombstones(self, doc_ids: Sequence[str] | None = None) -> dict[str, Tombstone]:
        return self.inner.tombstones(doc_ids)

    def get(self, doc_ids: Sequence[str]) -> list[Document]:
        return self.inner.get(doc_ids)

    def count(self) -> int:
        return self.inner.count()

    def hashes(self) -> dict[str, str]:
        return self.inner.hashes()

    def iter_documents(self, batch: int = 500) -> Iterator[Document]:
        return self.inner.iter_documents(batch)

    def close(self) -> None:
        self.inner.close()


# -- documents --------------------------------------------------------------------------------------


def scifact_documents(limit: int | None = None) -> list[Document]:
    """SciFact's corpus as `sieve ingest` loads it (the JSONL loader), the first `limit` documents."""
    from app.ingest.loaders import load_paths

    corpus = DATASETS / "scifact" / "corpus.jsonl"
    if not corpus.is_file():
        raise SystemExit(f"error: {corpus} not found (set SIEVE_DATASETS)")
    loaded = load_paths([corpus])
    if loaded.errors:
        raise SystemExit(f"error: {corpus}: {loaded.errors[0]}")
    return loaded.documents[:limit] if limit is not None else loaded.documents


def cut(text: str, chars: int) -> str:
    """`text` cut at the last space before `chars` characters (whole when shorter)."""
    return text if len(text) <= chars else text[: text.rfind(" ", 0, chars) + 1 or chars].rstrip()


def one_kb_documents(source: Sequence[Document], prefix: str, count: int, nonce: str) -> list[Document]:
    """`count` new documents of ~1,000 characters: SciFact texts (repeated to length, then cut), ids
    `<prefix>-<n>`, `nonce` in each text so it is new to the store."""
    out = []
    for n in range(count):
        doc = source[n % len(source)]
        text = doc.text
        while len(text) < ONE_DOC_CHARS:
            text = f"{text} {doc.text}"
        body = f"{nonce} {n}. {cut(text, ONE_DOC_CHARS - len(nonce) - 12)}"
        out.append(Document(doc_id=f"{prefix}-{n}", text=body, title=doc.title, origin="api"))
    return out


def synthetic_documents(chunks: int, settings: IngestSettings) -> list[Document]:
    """Documents of scripts/scale_corpus.py (a synthetic document's chunks joined by blank lines, its tag as
    `knowledge`) until they make at least `chunks` chunks at `settings`' chunking."""
    ingestor = Ingestor(None, None, settings)  # type: ignore[arg-type]  # chunking only
    corpus = Corpus()
    out: list[Document] = []
    made = 0
    doc_no = 0
    while made < chunks:
        parts = corpus.document(doc_no)
        meta = {"knowledge": parts[0].knowledge} if parts[0].knowledge else {}
        doc = Document(
            doc_id=parts[0].doc_id,
            text="\n\n".join(p.text for p in parts),
            title=parts[0].title,
            metadata=meta,
            origin="bench-record",
        )
        made += len(ingestor.chunk([doc]))
        out.append(doc)
        doc_no += 1
    return out


# -- models and stores ------------------------------------------------------------------------------


def packaged_embedder() -> Any:
    from app.models import load_embedder
    from app.settings import ModelsSettings

    return load_embedder(ModelsSettings(cache_dir=str(REPO / "target" / "models")))


def open_store(path: Path, embedder: Any, collection: str = COLLECTION) -> Any:
    from app.store import ChromaStore

    return ChromaStore.open(StoreSettings(path=str(path), collection=collection), embedder.identity())


def fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


# -- 1. cost ----------------------------------------------------------------------------------------


def cost_single_writes(embedder: Any, where: Path, singles: int) -> dict[str, Any]:
    """Part 1a: one-document writes through two Sieves on one store, with and without the record."""
    from app.lexical.index import Analyzer, Bm25Index
    from app.service import Sieve
    from app.settings import load_settings, merge, nested

    settings = load_settings(
        merge(nested("rag.store.path", str(where)), nested("rag.store.collection", COLLECTION))
    )
    store = open_store(where, embedder)
    record = TimedRecord(SqliteRecord(where / RECORD_FILE))
    lexical = Bm25Index(Analyzer())
    sieves = {
        "A": Sieve(settings, embedder, store, None, lexical=lexical, record=record),
        "B": Sieve(settings, embedder, store, None, lexical=lexical, record=None),
    }
    # each source text twice in a row: the A and the B of a pair make the same number of chunks
    source = [doc for doc in scifact_documents(400)[300:] for _ in range(2)]
    docs = one_kb_documents(source, "one", 2 * singles + 4, f"w{int(time.time())}")
    for name, sieve in sieves.items():  # warm-up: the workers, the store's first writes
        sieve.ingest_documents(docs[:2] if name == "A" else docs[2:4])
    record.seconds = 0.0
    rows: list[dict[str, Any]] = []
    for n, doc in enumerate(docs[4:]):
        name = "AB"[n % 2]
        before, started, put_before = load(), time.perf_counter(), record.seconds
        sieves[name].ingest_documents([doc])
        seconds = time.perf_counter() - started
        rows.append({"config": name, "ms": seconds * 1000, "put_ms": (record.seconds - put_before) * 1000})
        rows[-1]["load"] = before
        print(json.dumps({"single": True, **rows[-1]}), flush=True)
    record.close()
    store.close()
    return {"rows": rows, "chars": ONE_DOC_CHARS}


def ingest_once(folder: Path, docs: int, with_record: bool) -> dict[str, Any]:
    """One run of part 1b, in this process: the first `docs` SciFact documents into the new store `folder`
    by the ingest pipeline, with the record or without it."""
    embedder = packaged_embedder()
    documents = scifact_documents(docs)
    store = open_store(folder, embedder)
    record = TimedRecord(SqliteRecord(folder / RECORD_FILE)) if with_record else None
    before, started = load(), time.perf_counter()
    report = Ingestor(store, embedder, IngestSettings(), record=record).ingest_documents(documents)
    seconds = time.perf_counter() - started
    row = {
        "config": "A" if with_record else "B",
        "seconds": seconds,
        "chunks": report.added,
        "put_s": record.seconds if record is not None else 0.0,
        "load_before": before,
        "load_after": load(),
    }
    if record is not None:
        record.close()
    store.close()
    embedder.close()
    return row


def cost_ingest(where: Path, docs: int, rounds: int) -> dict[str, Any]:
    """Part 1b: A (with the record) and B (without), alternately, each run a process of its own (an embedded
    Chroma is one client per path and process) on a new store; the time is the ingest's, not the start's."""
    rows: list[dict[str, Any]] = []
    for round_no in range(rounds):
        for name in "AB":
            folder = fresh(where / f"store-{name}{round_no}")
            command = [sys.executable, str(Path(__file__).resolve()), "--ingest-once", str(folder)]
            command += ["--docs", str(docs), *(["--with-record"] if name == "A" else []), "--no-doc"]
            done = subprocess.run(command, cwd=REPO, capture_output=True, check=False)
            found = [x for x in done.stdout.decode().splitlines() if x.startswith("BENCH-JSON ")]
            if done.returncode != 0 or not found:
                raise RuntimeError(
                    f"ingest run {name} failed ({done.returncode}): {done.stderr.decode()[-3000:]}"
                )
            rows.append(json.loads(found[-1].split(" ", 1)[1]))
            print(json.dumps(rows[-1]), flush=True)
    return {"rows": rows, "documents": docs}


def part_cost(args: argparse.Namespace, workdir: Path, kinds: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Parts 1a ("single") and 1b ("ingest") of `kinds`, by result name."""
    out: dict[str, dict[str, Any]] = {}
    if "single" in kinds:
        embedder = packaged_embedder()
        print(f"== cost: one-document writes (load {load():.1f})", flush=True)
        out["cost-single"] = cost_single_writes(embedder, fresh(workdir / "cost-single"), args.singles)
        embedder.close()
    if "ingest" in kinds:
        print(f"== cost: ingest of {args.docs} SciFact documents (load {load():.1f})", flush=True)
        out["cost-ingest"] = cost_ingest(fresh(workdir / "cost-ingest"), args.docs, args.rounds)
    return out


# -- 2. put -----------------------------------------------------------------------------------------


@dataclass
class ChromaServer:
    """A `chroma run` on 127.0.0.1 (a free port), its data under `path`."""

    path: Path
    port: int = 0
    proc: Any = None

    def start(self, timeout: float = 60.0) -> None:
        import httpx

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        chroma = Path(sys.executable).with_name("chroma")
        command = [str(chroma), "run", "--path", str(self.path / "db"), "--host", "127.0.0.1"]
        with (self.path / "chroma.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [*command, "--port", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "ANONYMIZED_TELEMETRY": "False"},
            )
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.port}/api/v2/heartbeat"
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if httpx.get(url, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"chroma run did not start: see {self.path / 'chroma.log'}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def put_records(where: Path, server: ChromaServer) -> tuple[dict[str, DocumentRecord], list[Any]]:
    """The three records of part 2 ({label: record}) and the stores holding their clients (to close)."""
    embedder = HashEmbedder()
    http = StoreSettings(mode="http", port=server.port, collection=COLLECTION)
    from app.store import ChromaStore

    served = ChromaStore.open(http, embedder.identity())
    embedded = open_store(where / "embedded-chroma", embedder)
    # an embedded client's record: the server kind's collection, through the embedded store's own client
    as_server = StoreSettings(mode="http", collection=COLLECTION)
    records: dict[str, DocumentRecord] = {
        "SqliteRecord (embedded store)": SqliteRecord(where / "sqlite" / RECORD_FILE),
        "ChromaRecord on `chroma run`": open_record(http, served.client),
        "ChromaRecord on an embedded Chroma": open_record(as_server, embedded.client),
    }
    return records, [served, embedded]


def time_put(record: DocumentRecord, documents: list[Document]) -> float:
    started = time.perf_counter()
    record.put(documents)
    return (time.perf_counter() - started) * 1000


def part_put(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    where = fresh(workdir / "put")
    source = scifact_documents(1200)
    server = ChromaServer(where)
    server.start()
    stores: list[Any] = []
    try:
        records, stores = put_records(where, server)
        labels = list(records)
        nonce = f"p{int(time.time())}"
        for label, record in records.items():  # warm-up: tables, collections, connections
            record.put(one_kb_documents(source, f"warm-{labels.index(label)}", 2, nonce))
        rows: list[dict[str, Any]] = []

        def measure(kind: str, round_no: int, docs: Callable[[int], list[Document]]) -> None:
            order = labels if round_no % 2 == 0 else labels[::-1]
            for label in order:
                documents = docs(labels.index(label))
                before = load()
                ms = time_put(records[label], documents)
                rows.append({"record": label, "kind": kind, "documents": len(documents), "ms": ms})
                rows[-1]["load"] = before
                print(json.dumps(rows[-1]), flush=True)

        for i in range(args.put_singles):
            measure("new", i, lambda b, i=i: one_kb_documents(source, f"one-{b}-{i}", 1, nonce))
        for i in range(args.put_rounds):
            batch = lambda b, i=i: one_kb_documents(source, f"many-{b}-{i}", args.put_batch, nonce)  # noqa: E731
            measure("new", i, batch)
            measure("unchanged", i, batch)
        for record in records.values():
            record.close()
    finally:
        for store in stores:
            store.close()
        server.stop()
    return {"rows": rows, "chars": ONE_DOC_CHARS}


# -- 3. rebuild -------------------------------------------------------------------------------------


def rebuild_available() -> bool:
    try:
        from app.ingest import rebuild  # noqa: F401
    except ImportError:
        return False
    return True


def rebuild_documents(name: str, settings: IngestSettings) -> list[Document]:
    if name == "synthetic-100k":
        return synthetic_documents(100_000, settings)
    return scifact_documents()


def build_live(where: Path, name: str, embedder: Any, documents: list[Document]) -> dict[str, Any]:
    """The record of `documents` in the store at `where`; with the hash embedder, the live collection too
    (ingested with the record, timed). The store is closed again."""
    store = open_store(where, embedder)
    record = TimedRecord(SqliteRecord(where / RECORD_FILE))
    out: dict[str, Any] = {"load_before_build": load()}
    started = time.perf_counter()
    if name == "scifact-model":
        record.put(documents)
    else:
        report = Ingestor(store, embedder, IngestSettings(), record=record).ingest_documents(documents)
        out["ingest_chunks"] = report.added
    out["build_s"] = time.perf_counter() - started
    out["build_put_s"] = record.seconds
    out["record_documents"] = record.count()
    record.close()
    store.close()
    return out


def run_rebuild(where: Path, embedder: Any) -> dict[str, Any]:
    """Rebuild the store at `where` from its record: `sieve store rebuild`'s function where this checkout
    has it, else the re-ingest of every recorded document into a fresh collection."""
    record = SqliteRecord(where / RECORD_FILE)
    before, started = load(), time.perf_counter()
    if rebuild_available():
        from app.ingest.rebuild import rebuild

        settings = StoreSettings(path=str(where), collection=COLLECTION)
        live = open_store(where, embedder)
        report = rebuild(live, record, embedder, embedder.identity(), settings, IngestSettings(), "log")
        live.close()
        out = {"how": "sieve store rebuild", "chunks": report.chunks, "embedded": report.embedded}
    else:
        read_started = time.perf_counter()
        documents = list(record.iter_documents())
        read_s = time.perf_counter() - read_started
        target = open_store(where, embedder, f"{COLLECTION}-rebuilt")
        report = Ingestor(target, embedder, IngestSettings()).ingest_documents(documents, progress="log")
        target.close()
        out = {"how": "re-ingest", "chunks": report.chunks, "embedded": report.added, "read_s": read_s}
    out |= {"seconds": time.perf_counter() - started, "load_before": before, "load_after": load()}
    record.close()
    return out


def part_rebuild(args: argparse.Namespace, workdir: Path, name: str) -> dict[str, Any]:
    embedder = packaged_embedder() if name == "scifact-model" else HashEmbedder()
    try:
        documents = rebuild_documents(name, IngestSettings())
        where = fresh(workdir / f"rebuild-{name}" / "store")
        print(f"== rebuild {name}: {len(documents)} documents (load {load():.1f})", flush=True)
        out = {"set": name, "documents": len(documents), **build_live(where, name, embedder, documents)}
        print(json.dumps(out), flush=True)
        out |= run_rebuild(where, embedder)
        print(json.dumps(out), flush=True)
    finally:
        close = getattr(embedder, "close", None)
        if close is not None:
            close()
    return out


# -- the block --------------------------------------------------------------------------------------


def render_single(figures: dict[str, Any]) -> list[str]:
    single = figures["rows"]
    a = [r["ms"] for r in single if r["config"] == "A"]
    b = [r["ms"] for r in single if r["config"] == "B"]
    puts = [r["put_ms"] for r in single if r["config"] == "A"]
    loads = [r["load"] for r in single]
    lines = [
        f"One-document write: `Sieve.ingest_documents` of one new ~{figures['chars']:,}-character "
        f"SciFact document into one embedded store, with the record (A) and without (B), alternately, "
        f"{len(a)} each (load {min(loads):.1f}-{max(loads):.1f}):",
        "",
        "| | median | fastest | slowest | the record's put (median) |",
        "|---|---:|---:|---:|---:|",
        f"| A, with the record | {statistics.median(a):.0f} ms | {min(a):.0f} ms | {max(a):.0f} ms | "
        f"{statistics.median(puts):.1f} ms |",
        f"| B, record=None | {statistics.median(b):.0f} ms | {min(b):.0f} ms | {max(b):.0f} ms | |",
        "",
        f"A / B: **{median_ratio(a, b):.3f}x** (ratio of the medians, {overhead_percent(a, b):+.1f}%); the "
        f"put itself is {share_percent(statistics.median(puts), statistics.median(a)):.1f}% of A's median.",
    ]
    return lines


def render_ingest(figures: dict[str, Any]) -> list[str]:
    ingest = figures["rows"]
    lines = [
        f"Ingest of the first {figures['documents']} SciFact documents "
        f"({ingest[0]['chunks']:,} chunks) into fresh embedded stores by the ingest pipeline, alternately:",
        "",
        "| run | record | seconds | chunks/s | the record's puts | share | load before | load after |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for n, r in enumerate(ingest, 1):
        kept = r["config"] == "A"
        puts = f"{r['put_s']:.3f} s | {share_percent(r['put_s'], r['seconds']):.2f}%" if kept else " | "
        lines.append(
            f"| {n} | {'SqliteRecord' if kept else 'none'} | {r['seconds']:.1f} | "
            f"{per_second(r['chunks'], r['seconds']):.1f} | {puts} | "
            f"{r['load_before']:.1f} | {r['load_after']:.1f} |"
        )
    with_record = [r["seconds"] for r in ingest if r["config"] == "A"]
    without = [r["seconds"] for r in ingest if r["config"] == "B"]
    shares = [share_percent(r["put_s"], r["seconds"]) for r in ingest if r["config"] == "A"]
    lines += [
        "",
        f"With the record / without: **{median_ratio(with_record, without):.3f}x** (ratio of the medians, "
        f"{overhead_percent(with_record, without):+.1f}%); the record's own share of the ingest time, timed "
        f"around its puts: **{max(shares):.2f}%** at most (goal: at most 5%).",
    ]
    return lines


def render_put(put: dict[str, Any]) -> list[str]:
    rows = put["rows"]
    labels = list(dict.fromkeys(r["record"] for r in rows))
    batch = max(r["documents"] for r in rows)

    def cell(label: str, kind: str, documents: int) -> str:
        ms = [r["ms"] for r in rows if (r["record"], r["kind"], r["documents"]) == (label, kind, documents)]
        if not ms:
            return "-"
        per_doc = f" ({statistics.median(ms) / documents:.3f} ms a document)" if documents > 1 else ""
        return f"{statistics.median(ms):.1f} ms{per_doc}"

    singles = len([r for r in rows if r["record"] == labels[0] and r["documents"] == 1])
    batches = len([r for r in rows if r["record"] == labels[0] and r["documents"] == batch]) // 2
    loads = [r["load"] for r in rows]
    lines = [
        f"`DocumentRecord.put` alone (no model; ~{put['chars']:,}-character documents), the three records "
        f"alternately; medians of {singles} puts of 1 document and {batches} of {batch:,} (load "
        f"{min(loads):.1f}-{max(loads):.1f}):",
        "",
        f"| record | 1 new document | {batch:,} new documents | the same {batch:,} again, unchanged |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| {label} | {cell(label, 'new', 1)} | {cell(label, 'new', batch)} | "
        f"{cell(label, 'unchanged', batch)} |"
        for label in labels
    ]
    return lines


def render_rebuild(rebuilds: list[dict[str, Any]]) -> list[str]:
    lines = [
        "Rebuild from the record: every recorded document chunked and embedded again into a new collection "
        "(how: `sieve store rebuild` = `app.ingest.rebuild.rebuild`, staging collection and switch; "
        "re-ingest = every recorded document read from the record and ingested into a fresh collection by "
        "the ingest pipeline, the rebuild's work before its switch):",
        "",
        "| set | embedder | documents | chunks | live collection first (ingest with the record) "
        "| rebuild, how | rebuild | chunks/s | load before / after |",
        "|---|---|---:|---:|---:|---|---:|---:|---|",
    ]
    for r in rebuilds:
        model = r["set"] == "scifact-model"
        live = "record only" if model else f"{r['build_s']:.1f} s (puts {r['build_put_s']:.2f} s)"
        lines.append(
            f"| {r['set']} | {'packaged e5-small' if model else 'hash'} | {r['documents']:,} | "
            f"{r['chunks']:,} | {live} | {r['how']} | {r['seconds']:.1f} s | "
            f"{per_second(r['chunks'], r['seconds']):.1f} | {r['load_before']:.1f} / {r['load_after']:.1f} |"
        )
    for how in dict.fromkeys(r["how"] for r in rebuilds):
        by_set = {r["set"]: r for r in rebuilds if r["how"] == how}
        if "scifact-hash" in by_set and "synthetic-100k" in by_set:
            small, large = by_set["scifact-hash"], by_set["synthetic-100k"]
            lines += [
                "",
                f"Hash embedder, {how}, {large['chunks']:,} against {small['chunks']:,} chunks: "
                f"**{large['seconds'] / small['seconds']:.2f}x** the time for "
                f"{large['chunks'] / small['chunks']:.2f}x the chunks.",
            ]
    return lines


def render(results: dict[str, Any]) -> str:
    cores = len(os.sched_getaffinity(0))
    lines = [
        f"Measured by `make bench-record` on {cores} usable cores, {time.strftime('%Y-%m-%d %H:%M')}; "
        "load average (1 min) beside the figures.",
    ]
    if "cost-single" in results:
        lines += ["", *render_single(results["cost-single"])]
    if "cost-ingest" in results:
        lines += ["", *render_ingest(results["cost-ingest"])]
    if "put" in results:
        lines += ["", *render_put(results["put"])]
    rebuilds = sorted(
        (figures for part, figures in results.items() if part.startswith("rebuild-")),
        key=lambda r: (r["how"], REBUILD_SETS.index(r["set"])),
    )
    if rebuilds:
        lines += ["", *render_rebuild(rebuilds)]
    return "\n".join(lines)


def write_block(doc: Path, block: str) -> None:
    """Replace what lies between the bench-record markers of `doc` (nothing else is touched)."""
    text = doc.read_text(encoding="utf-8")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(f"{head}{BEGIN}\n{block}\n{END}{tail}", encoding="utf-8")


# -- the run ----------------------------------------------------------------------------------------


def saved(workdir: Path) -> dict[str, Any]:
    """Every part's saved figures, by part."""
    return {p.stem: json.loads(p.read_text()) for p in sorted((workdir / "results").glob("*.json"))}


def save(workdir: Path, part: str, figures: dict[str, Any]) -> None:
    (workdir / "results").mkdir(parents=True, exist_ok=True)
    (workdir / "results" / f"{part}.json").write_text(json.dumps(figures, indent=1))


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer of everything (a few minutes)")
    parser.add_argument(
        "--parts", default="cost,put,rebuild", help="any of cost (= single,ingest), put, rebuild"
    )
    parser.add_argument(
        "--rebuild-sets", help=f"any of {', '.join(REBUILD_SETS)} (default: all; quick: scifact-hash)"
    )
    parser.add_argument("--singles", type=int, help="one-document writes of each kind (20; quick 6)")
    parser.add_argument("--docs", type=int, help="SciFact documents of the ingest runs (300; quick 60)")
    parser.add_argument("--rounds", type=int, help="ingest runs of each kind (2; quick 1)")
    parser.add_argument("--put-singles", type=int, help="puts of 1 document per record (20; quick 5)")
    parser.add_argument("--put-batch", type=int, help="documents of the large put (1000; quick 200)")
    parser.add_argument("--put-rounds", type=int, default=3, help="large puts per record")
    parser.add_argument("--workdir", type=Path, default=REPO / "target" / "bench-record")
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "benchmarks.md")
    parser.add_argument("--no-doc", action="store_true")
    parser.add_argument("--render", action="store_true", help="render the saved figures only")
    parser.add_argument(
        "--ingest-once", type=Path, help="(internal) one ingest run of part 1b into this store"
    )
    parser.add_argument("--with-record", action="store_true", help="(internal) that run keeps the record")
    args = parser.parse_args()
    quick = args.quick
    args.singles = args.singles or (6 if quick else 20)
    args.docs = args.docs or (60 if quick else 300)
    args.rounds = args.rounds or (1 if quick else 2)
    args.put_singles = args.put_singles or (5 if quick else 20)
    args.put_batch = args.put_batch or (200 if quick else 1000)
    sets = args.rebuild_sets or ("scifact-hash" if quick else ",".join(REBUILD_SETS))
    args.rebuild_sets = [s for s in sets.split(",") if s]
    unknown = [s for s in args.rebuild_sets if s not in REBUILD_SETS]
    if unknown:
        parser.error(f"--rebuild-sets: unknown {', '.join(unknown)} (known: {', '.join(REBUILD_SETS)})")
    return args


def main() -> int:
    import logging

    args = arguments()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("app.ingest").setLevel(logging.INFO)  # the rebuild's progress lines
    if not args.no_doc and BEGIN not in args.doc.read_text(encoding="utf-8"):
        print(f"error: {args.doc} has no {BEGIN} ... {END} markers", file=sys.stderr)
        return 2
    if args.ingest_once:
        print(
            "BENCH-JSON " + json.dumps(ingest_once(args.ingest_once, args.docs, args.with_record)), flush=True
        )
        return 0
    workdir: Path = args.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    parts = [] if args.render else [p for p in args.parts.split(",") if p]
    print(f"{len(os.sched_getaffinity(0))} usable cores; load average {load():.1f}", flush=True)
    kinds = [k for k in ("single", "ingest") if k in parts or "cost" in parts]
    if kinds:
        for name, figures in part_cost(args, workdir, kinds).items():
            save(workdir, name, figures)
    if "put" in parts:
        save(workdir, "put", part_put(args, workdir))
    if "rebuild" in parts:
        for name in args.rebuild_sets:
            figures = part_rebuild(args, workdir, name)
            save(workdir, f"rebuild-{name}-{figures['how'].replace(' ', '-')}", figures)
    block = render(saved(workdir))
    print(block)
    if not args.no_doc:
        write_block(args.doc, block)
        print(f"written to {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
