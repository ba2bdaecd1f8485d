"""A burst of concurrent retrievals against a real `sieve serve`, with admission on and effectively off.

    python scripts/bench_admission.py [--burst 500] [--rounds 1]

For each of two servers (started in turn on a free 127.0.0.1 port, each on its own copy-free store in a
temporary folder: the sample base is ingested once, by the first): `--burst` requests at once, each a
1,000-character query with topK 100 and debug, from one asyncio client; meanwhile another process asks
`/health` and `/ready` every 50 ms and reads the server's resident memory (VmRSS) every 100 ms. Printed per
server: /health and /ready latency p50 / p99 / max, the answers by status, admitted throughput (200s per
second of the burst), whether every refusal carried Retry-After, and RSS before, at its peak, right after
the burst and 10 s later.

1. admission on: `rag.server` as configured (config/application.yml);
2. admission effectively off: max_concurrent_retrievals 10000, max_queued_retrievals 100000 (retrievals are
   then bounded only by anyio's 40 worker threads).
Every server is stopped with SIGTERM, and killed if it has not exited 30 s later.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
SIEVE = Path(sys.executable).with_name("sieve")
READY_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 30.0
SETTLE_S = 10.0
PROBE_EVERY_S = 0.05
RSS_EVERY_S = 0.1

SERVERS = [
    ("admission on (configured)", {}),
    (
        "admission off (very high limits)",
        {
            "RAG__SERVER__MAX_CONCURRENT_RETRIEVALS": "10000",
            "RAG__SERVER__MAX_QUEUED_RETRIEVALS": "100000",
            "RAG__SERVER__QUEUE_TIMEOUT_MS": "600000",
        },
    ),
]
QUERIES = [
    "How many days of annual leave do I get, and can I carry unused days over to next year?",
    "工资什么时候发？遇到节假日怎么办？",
    "What do I have to do when a customer visits the office?",
    "差旅住宿费用报销标准是多少？",
    "How do I connect to the VPN from home and who do I call when it fails?",
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


def long_query(i: int) -> str:
    base = f"{QUERIES[i % len(QUERIES)]} ({i}) "
    return (base * (1000 // len(base) + 1))[:1000]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def probe(url: str, pid: int, stop: Any, out: Connection) -> None:
    """In its own process (the burst's client must not slow it): /health and /ready latencies, and RSS."""
    latencies: dict[str, list[float]] = {"/health": [], "/ready": []}
    failures: list[str] = []
    rss: list[float] = []
    next_rss = 0.0
    with httpx.Client(base_url=url, timeout=120) as client:
        while not stop.is_set():
            for path in latencies:
                started = time.perf_counter()
                try:
                    status = client.get(path).status_code
                except httpx.HTTPError as exc:
                    status = f"{type(exc).__name__}"  # type: ignore[assignment]
                latencies[path].append((time.perf_counter() - started) * 1000)
                if status != 200:
                    failures.append(f"{path} {status}")
            if time.monotonic() >= next_rss:
                rss.append(rss_mb(pid))
                next_rss = time.monotonic() + RSS_EVERY_S
            time.sleep(PROBE_EVERY_S)
    out.send({"latencies": latencies, "failures": failures, "rss": rss})


async def burst(url: str, size: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def one(i: int) -> tuple[int | str, bool, float]:
            started = time.perf_counter()
            try:
                answer = await client.post(
                    "/api/retrieve", json={"query": long_query(i), "topK": 100, "debug": True}
                )
            except httpx.HTTPError as exc:
                return type(exc).__name__, False, time.perf_counter() - started
            return answer.status_code, "retry-after" in answer.headers, time.perf_counter() - started

        started = time.perf_counter()
        results = await asyncio.gather(*(one(i) for i in range(size)))
        seconds = time.perf_counter() - started
    statuses: dict[str, int] = {}
    for status, _, _ in results:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    admitted = [s for status, _, s in results if status == 200]
    refused = [(status, retry) for status, retry, _ in results if status in (429, 503)]
    return {
        "seconds": seconds,
        "statuses": statuses,
        "admitted": len(admitted),
        "admitted_s": max(admitted, default=0.0),  # when the last admitted answer came
        "refused": len(refused),
        "refused_with_retry_after": sum(1 for _, retry in refused if retry),
    }


def run_server(env: dict[str, str], port: int, log_path: Path, size: int) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(SIEVE), "serve", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_ready(url, proc, log_path)
        with httpx.Client(base_url=url, timeout=120) as client:
            for i in range(10):  # warm up: the first queries load and trace what they need
                client.post("/api/retrieve", json={"query": long_query(i), "topK": 100, "debug": True})
        time.sleep(2)
        before = rss_mb(proc.pid)
        stop = multiprocessing.Event()
        receiver, sender = multiprocessing.Pipe(duplex=False)
        prober = multiprocessing.Process(target=probe, args=(url, proc.pid, stop, sender))
        prober.start()
        time.sleep(1.0)
        outcome = asyncio.run(burst(url, size))
        after = rss_mb(proc.pid)
        time.sleep(SETTLE_S)
        settled = rss_mb(proc.pid)
        stop.set()
        probed = receiver.recv()
        prober.join(30)
        refusals = log_path.read_text(errors="replace").count("admission: refused")
        return {
            **outcome,
            **probed,
            "rss_before": before,
            "rss_peak": max([before, after, *probed["rss"]]),
            "rss_after": after,
            "rss_settled": settled,
            "refusal_log_lines": refusals,
        }
    finally:
        stop_server(proc)


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


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def render(results: list[tuple[str, dict[str, Any]]], size: int, wall: float) -> str:
    lines = [
        f"Measured by `make bench-admission` on {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}, wall "
        f"{wall / 60:.1f} min, load average {' / '.join(f'{x:.1f}' for x in os.getloadavg())} at the end. "
        f"A burst of {size} concurrent retrievals (1,000-character queries, topK 100, debug); /health and "
        f"/ready asked every {PROBE_EVERY_S * 1000:.0f} ms from another process (nearest-rank p99).",
        "",
        "| server | /health p50 / p99 / max ms | /ready p50 / p99 / max ms | answers | admitted/s | "
        "refused (with Retry-After) | RSS MB before / peak / after / +10 s |",
        "|---|---|---|---|---:|---:|---|",
    ]
    for name, r in results:
        cells = []
        for path in ("/health", "/ready"):
            ms = r["latencies"][path]
            cells.append(f"{percentile(ms, 50):.1f} / {percentile(ms, 99):.1f} / {max(ms):.1f}")
        answers = ", ".join(f"{status}: {n}" for status, n in sorted(r["statuses"].items()))
        throughput = r["admitted"] / r["admitted_s"] if r["admitted_s"] else 0.0
        lines.append(
            f"| {name} | {cells[0]} | {cells[1]} | {answers} | {throughput:.1f} | "
            f"{r['refused']} ({r['refused_with_retry_after']}) | {r['rss_before']:.0f} / "
            f"{r['rss_peak']:.0f} / {r['rss_after']:.0f} / {r['rss_settled']:.0f} |"
        )
    lines.append("")
    for name, r in results:
        lines.append(
            f"- {name}: burst {r['seconds']:.1f} s; last admitted answer after {r['admitted_s']:.1f} s; "
            f"probe failures {len(r['failures'])}; `admission: refused` log lines {r['refusal_log_lines']}."
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--burst", type=int, default=500)
    args = parser.parse_args()
    wall = time.perf_counter()
    results: list[tuple[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="sieve-bench-admission-") as tmp:
        base = {k: v for k, v in os.environ.items() if not k.startswith("RAG__")}
        base |= {
            "RAG__STORE__PATH": f"{tmp}/store",
            "RAG__SERVER__JOBS_DIR": f"{tmp}/jobs",
            "RAG__EVALUATE__ENABLED": "false",
            "RAG__MODELS__CACHE_DIR": str(REPO / "target" / "models"),
        }
        for i, (name, setting) in enumerate(SERVERS):
            env = base | setting | ({"RAG__INGEST__ON_STARTUP": "false"} if i else {})
            log_path = Path(tmp) / f"serve-{i}.log"
            result = run_server(env, free_port(), log_path, args.burst)
            results.append((name, result))
            print(f"{name}: done", file=sys.stderr)
    print(render(results, args.burst, time.perf_counter() - wall))
    return 0


if __name__ == "__main__":
    sys.exit(main())
