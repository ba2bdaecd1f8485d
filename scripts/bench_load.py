"""Load on a real `sieve serve`: query latency idle and during a large write, and many concurrent clients.

    python scripts/bench_load.py [--clients 8] [--queries 1000] [--write-chunks 300] [--doc FILE]

Starts `sieve serve` on a free 127.0.0.1 port with its own store in a temporary folder (the sample knowledge
base is ingested at its start), an admin token and the evaluation off, then measures over HTTP:
1. idle: sequential queries (the golden set's, in turn), latency p50/p95;
2. during a write: one document of `--write-chunks` chunks is posted (above rag.server.sync_write_chunks it
   runs as a job) and sequential queries run until the job is done; p50/p95 and the ratio to idle p95;
3. `--clients` threads each sending `--queries` queries on their own connection: errors, throughput, p95,
   and the throughput ratio to one sequential client (the idle phase);
4. unless --no-compare, the server is restarted on the same store once per setting of `COMPARED`, and
   phases 1 and 3 run again: `query_slots=1` (one query model call at a time), `max_query_batch=1`
   (queries embedded one model call each: the batcher's gain and its p95) and `trace_queries=false` (the
   query model eager, not traced), so each is compared with the default within one run.
Prints a Markdown block and writes it between the `bench-load` markers of `--doc` (unless --no-doc).
Figures vary with what else the machine runs: compare the ratios of one run, not runs with each other.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
SIEVE = Path(sys.executable).with_name("sieve")
READY_TIMEOUT_S = 600.0


# The settings the default server is compared with (unless --no-compare): name -> environment.
COMPARED = [
    ("query_slots=1", {"RAG__MODELS__QUERY_SLOTS": "1"}),
    ("max_query_batch=1", {"RAG__MODELS__MAX_QUERY_BATCH": "1"}),
    ("trace_queries=false", {"RAG__MODELS__TRACE_QUERIES": "false"}),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: the smallest value with at least q% of the values at or below it."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def golden_queries() -> list[str]:
    data = json.loads((REPO / "golden_set" / "golden-set.json").read_text(encoding="utf-8"))
    cases = data["cases"] if isinstance(data, dict) else data
    return [c["query"] for c in cases]


def timed_query(client: httpx.Client, query: str) -> tuple[float, bool]:
    started = time.perf_counter()
    try:
        ok = client.post("/api/retrieve", json={"query": query}).status_code == 200
    except httpx.HTTPError:
        ok = False
    return (time.perf_counter() - started) * 1000, ok


def big_document(chunks: int) -> dict[str, str]:
    body = "\n\n".join(
        f"## Procedure {i}\n\nArchive procedure {i}: folder {i} is labelled, scanned, checked by a second "
        f"person and stored in cabinet {i % 17}; requests to retrieve it go through the records desk."
        for i in range(chunks)
    )
    return {"id": "bench-load-archive", "title": "Archive procedures", "text": body}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--queries", type=int, default=1000, help="queries per client")
    parser.add_argument("--idle-queries", type=int, default=200)
    parser.add_argument("--write-chunks", type=int, default=300)
    parser.add_argument("--no-compare", action="store_true", help="skip the servers of COMPARED")
    parser.add_argument("--doc", default=str(REPO / "docs" / "benchmarks.md"))
    parser.add_argument("--no-doc", action="store_true")
    args = parser.parse_args()
    doc = Path(args.doc)
    if not args.no_doc and "<!-- bench-load:begin -->" not in doc.read_text(encoding="utf-8"):
        print(
            f"error: {doc} has no <!-- bench-load:begin --> ... <!-- bench-load:end --> markers",
            file=sys.stderr,
        )
        return 2

    token = secrets.token_hex(16)
    admin = {"Authorization": f"Bearer {token}"}
    queries = golden_queries()
    wall = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sieve-bench-load-") as tmp:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAG__")}
        env |= {
            "RAG__STORE__PATH": f"{tmp}/store",
            "RAG__SERVER__JOBS_DIR": f"{tmp}/jobs",
            "RAG__SERVER__ADMIN_TOKEN": token,
            "RAG__EVALUATE__ENABLED": "false",
            "RAG__MODELS__CACHE_DIR": str(REPO / "target" / "models"),
        }
        url = f"http://127.0.0.1:{port}"
        proc = start_server(env, port, Path(tmp) / "serve.log")
        try:
            wait_ready(url, proc, Path(tmp) / "serve.log")
            with httpx.Client(base_url=url, timeout=120) as client:
                for q in queries[:10]:  # warm up
                    timed_query(client, q)
                idle = [timed_query(client, queries[i % len(queries)]) for i in range(args.idle_queries)]
                during, write_s, job = measure_during_write(client, admin, queries, args.write_chunks)
            concurrent = measure_concurrent(url, queries, args.clients, args.queries)
        finally:
            stop_server(proc)
        compared: dict[str, dict[str, Any]] = {}
        for name, setting in [] if args.no_compare else COMPARED:
            server_env = env | setting | {"RAG__INGEST__ON_STARTUP": "false"}
            log_path = Path(tmp) / f"serve-{name.replace('=', '-')}.log"
            proc = start_server(server_env, port, log_path)
            try:
                wait_ready(url, proc, log_path)
                with httpx.Client(base_url=url, timeout=120) as client:
                    for q in queries[:10]:
                        timed_query(client, q)
                    idle1 = [timed_query(client, queries[i % len(queries)]) for i in range(args.idle_queries)]
                compared[name] = {
                    "idle": idle1,
                    **measure_concurrent(url, queries, args.clients, args.queries),
                }
            finally:
                stop_server(proc)
    block = render(idle, during, write_s, job, concurrent, args, time.perf_counter() - wall, compared)
    print(block)
    if not args.no_doc:
        text = doc.read_text(encoding="utf-8")
        begin, end = "<!-- bench-load:begin -->", "<!-- bench-load:end -->"
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        doc.write_text(f"{head}{begin}\n{block}\n{end}{tail}", encoding="utf-8")
        print(f"written to {doc}")
    return 0


def start_server(env: dict[str, str], port: int, log_path: Path) -> subprocess.Popen:
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [str(SIEVE), "serve", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_ready(url: str, proc: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"sieve serve exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    sys.exit(f"sieve serve not ready after {READY_TIMEOUT_S:.0f}s")


def measure_during_write(
    client: httpx.Client, admin: dict[str, str], queries: list[str], chunks: int
) -> tuple[list[tuple[float, bool]], float, dict]:
    started = time.perf_counter()
    accepted = client.post("/api/documents", json={"documents": [big_document(chunks)]}, headers=admin)
    if accepted.status_code != 202:
        sys.exit(f"the write was not accepted as a job: {accepted.status_code} {accepted.text}")
    job_id = accepted.json()["job"]
    samples: list[tuple[float, bool]] = []
    i = 0
    while True:
        job = client.get(f"/api/jobs/{job_id}", headers=admin).json()
        if job["state"] not in ("queued", "running"):
            break
        samples.append(timed_query(client, queries[i % len(queries)]))
        i += 1
    if job["state"] != "done":
        sys.exit(f"the write job ended {job['state']}: {job.get('error')}")
    return samples, time.perf_counter() - started, job


def measure_concurrent(url: str, queries: list[str], clients: int, per_client: int) -> dict[str, float]:
    results: list[list[tuple[float, bool]]] = [[] for _ in range(clients)]

    def run(slot: int) -> None:
        with httpx.Client(base_url=url, timeout=120) as client:
            for i in range(per_client):
                results[slot].append(timed_query(client, queries[(slot * 7 + i) % len(queries)]))

    started = time.perf_counter()
    threads = [threading.Thread(target=run, args=(slot,)) for slot in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - started
    flat = [r for rs in results for r in rs]
    latencies = [ms for ms, _ in flat]
    return {
        "queries": len(flat),
        "errors": sum(1 for _, ok in flat if not ok),
        "seconds": seconds,
        "qps": len(flat) / seconds,
        "p50": statistics.median(latencies),
        "p95": percentile(latencies, 95),
    }


def render(idle, during, write_s, job, concurrent, args, wall: float, compared=None) -> str:
    idle_ms = [ms for ms, _ in idle]
    during_ms = [ms for ms, _ in during]
    idle_p95, during_p95 = percentile(idle_ms, 95), percentile(during_ms, 95)
    errors = sum(1 for _, ok in idle + during if not ok)
    one_client = 1000 / statistics.mean(idle_ms)  # queries/s of one sequential client
    lines = [
        f"Measured by `make bench-load` on {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}, "
        f"wall {wall / 60:.1f} min, load average {' / '.join(f'{x:.1f}' for x in os.getloadavg())} at the "
        "end. Latency is the client's, over HTTP on 127.0.0.1 (nearest-rank p95).",
        "",
        "| server | phase | queries | errors | p50 ms | p95 ms | p95 / idle p95 | queries/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
        f"| default | idle, one client | {len(idle)} | {sum(1 for _, ok in idle if not ok)} | "
        f"{statistics.median(idle_ms):.0f} | {idle_p95:.0f} | 1.00 | {one_client:.1f} |",
        f"| default | during a {job['chunks']}-chunk write (job, {write_s:.0f} s), one client | "
        f"{len(during)} | "
        f"{sum(1 for _, ok in during if not ok)} | {statistics.median(during_ms):.0f} | "
        f"{during_p95:.0f} | {during_p95 / idle_p95:.2f} | |",
        f"| default | {args.clients} clients x {args.queries} | {concurrent['queries']:.0f} | "
        f"{concurrent['errors']:.0f} | {concurrent['p50']:.0f} | {concurrent['p95']:.0f} | "
        f"{concurrent['p95'] / idle_p95:.2f} | {concurrent['qps']:.1f} |",
    ]
    sentences = [
        f"Default server: {args.clients} clients get **{concurrent['qps'] / one_client:.2f}x** the "
        f"throughput of one sequential client ({concurrent['qps']:.1f} vs {one_client:.1f} queries/s)."
    ]
    for name, other in (compared or {}).items():
        other_ms = [ms for ms, _ in other["idle"]]
        one = 1000 / statistics.mean(other_ms)
        lines += [
            f"| {name} | idle, one client | {len(other_ms)} | "
            f"{sum(1 for _, ok in other['idle'] if not ok)} | {statistics.median(other_ms):.0f} | "
            f"{percentile(other_ms, 95):.0f} | {percentile(other_ms, 95) / idle_p95:.2f} | {one:.1f} |",
            f"| {name} | {args.clients} clients x {args.queries} | {other['queries']:.0f} | "
            f"{other['errors']:.0f} | {other['p50']:.0f} | {other['p95']:.0f} | "
            f"{other['p95'] / idle_p95:.2f} | {other['qps']:.1f} |",
        ]
        sentences.append(
            f"With {name} (the same store, right after): {other['qps'] / one:.2f}x ({other['qps']:.1f} vs "
            f"{one:.1f} queries/s); one client p50 {statistics.median(other_ms):.0f} ms against "
            f"{statistics.median(idle_ms):.0f}; {args.clients}-client p95 {other['p95']:.0f} ms against "
            f"{concurrent['p95']:.0f}."
        )
    lines += ["", " ".join(sentences) + f" Errors in the two single-client phases: {errors}."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
