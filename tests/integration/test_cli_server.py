"""`sieve query --server` and `sieve eval --server` against a real `sieve serve` on 127.0.0.1 (the packaged
e5 embedder, a copy of the sample base), next to the same commands run locally on another copy: the same
output and exit codes, no model loaded by the client, and no weight-loading bar or transformers warning on
stderr or in the server log."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.exit_codes import UNAVAILABLE
from app.store.chroma import LOCK_FILE
from tests.fixtures.processes import stop_process
from tests.fixtures.seeded_store import seeded_store
from tests.fixtures.sieve_serve import EXIT_TIMEOUT_S, clean_env, wait_ready

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SIEVE = Path(sys.executable).with_name("sieve")
ADMIN_TOKEN = "cli-server-it-admin-token-0123"
COMMAND_TIMEOUT_S = 600
QUERY = "工资什么时候发"
NOISE = ("Loading weights", "loss_type=None")


@dataclass
class Served:
    url: str
    output_dir: Path
    log: Path
    store: Path
    pid: int = 0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, free_port: Callable[[], int]) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("cli-server")
    port = free_port()
    served = Served(f"http://127.0.0.1:{port}", base / "server-eval", base / "serve.log", base / "store")
    env = clean_env(
        RAG__STORE__PATH=str(seeded_store(served.store)),
        RAG__SERVER__JOBS_DIR=str(base / "jobs"),
        RAG__SERVER__ADMIN_TOKEN=ADMIN_TOKEN,
        RAG__EVALUATE__ENABLED="false",
        RAG__EVALUATE__OUTPUT_DIR=str(served.output_dir),
    )
    with served.log.open("wb") as out:
        proc = subprocess.Popen(
            [str(SIEVE), "serve", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    served.pid = proc.pid
    try:
        wait_ready(proc, served.url, served.log)
        yield served
    finally:
        stop_process(proc, EXIT_TIMEOUT_S)


@pytest.fixture(scope="module")
def local_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A user's shell for local commands: its own copy of the sample base (the server holds its own)."""
    base = tmp_path_factory.mktemp("cli-local")
    env = clean_env(
        RAG__STORE__PATH=str(seeded_store(base / "store")), RAG__EVALUATE__OUTPUT_DIR=str(base / "local-eval")
    )
    return {k: v for k, v in env.items() if k not in ("SIEVE_SERVER", "SIEVE_TOKEN")}


@dataclass
class Done:
    code: int
    out: str
    err: str
    seconds: float


def sieve(env: dict[str, str], *argv: str) -> Done:
    started = time.perf_counter()
    done = subprocess.run(
        [str(SIEVE), *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
    )
    return Done(done.returncode, done.stdout, done.stderr, time.perf_counter() - started)


def without_latency(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_latency(v) for k, v in value.items() if k != "latencyMs"}
    if isinstance(value, list):
        return [without_latency(v) for v in value]
    return value


def masked(text: str) -> str:
    """The output with its timings (`12 ms`, `0.3 ms`, `p50=9ms`) replaced by `#`."""
    return re.sub(r"\d+(\.\d+)? ?ms\b", "# ms", text)


def test_a_local_command_on_the_served_store_is_told_where_the_server_listens(
    served: Served, local_env: dict[str, str]
) -> None:
    """`sieve serve --port N` records its address with its store lock: a local `sieve query` on that store
    (whose own settings say port 8000) is told to ask http://127.0.0.1:N."""
    assert (served.store / LOCK_FILE).read_text() == f"{served.pid}\n{served.url}\n"
    held = sieve({**local_env, "RAG__STORE__PATH": str(served.store)}, "query", QUERY)
    assert (held.code, held.out) == (UNAVAILABLE, "")
    assert held.err == (
        f"error: the embedded store {served.store} is open in `sieve serve` (pid {served.pid}, listening on "
        f"{served.url}), and it allows one process at a time. Ask that server instead: --server {served.url} "
        f"(or SIEVE_SERVER={served.url}); otherwise stop it, or share the store through a Chroma server "
        "(rag.store.mode: http)\n"
    )


def test_query_over_the_server_prints_what_a_local_query_prints(
    served: Served, local_env: dict[str, str]
) -> None:
    remote_env = {**local_env, "SIEVE_SERVER": served.url}
    local = sieve(local_env, "query", QUERY, "--json", "--top-k", "3")
    remote = sieve(remote_env, "query", QUERY, "--json", "--top-k", "3")
    assert (local.code, remote.code) == (0, 0), local.err + remote.err
    local_body, remote_body = json.loads(local.out), json.loads(remote.out)
    assert [d["docId"] for d in remote_body["documents"]] == [
        "hr-payroll-zh",
        "hr-offboarding-zh",
        "finance-expense-reimbursement-zh",
    ]
    assert without_latency(remote_body) == without_latency(local_body)

    # the admin's debug trace is the local one; a reader's counts the documents hidden from readers
    local_table = sieve(local_env, "query", QUERY, "--debug")
    admin_env = {**local_env, "SIEVE_TOKEN": ADMIN_TOKEN}
    remote_table = sieve(admin_env, "query", QUERY, "--debug", "--server", served.url)
    reader_table = sieve(local_env, "query", QUERY, "--debug", "--server", served.url)
    assert (local_table.code, remote_table.code, reader_table.code) == (0, 0, 0), (
        local_table.err + remote_table.err
    )
    assert masked(remote_table.out) == masked(local_table.out)
    assert "travel-expense-2022" in local_table.out and "travel-expense-2022" not in reader_table.out
    assert "hidden from readers: status=retired" in reader_table.out
    assert "finance-expense-reimbursement-zh " in remote_table.out  # the full id, never cut with "…"
    assert remote_table.err == ""  # no model loads in the client, so nothing is logged
    for noise in NOISE:
        assert noise not in local.err and noise not in local_table.err
    print(
        f"\nwall time of `sieve query --debug`: local {local_table.seconds:.2f} s, "
        f"--server {remote_table.seconds:.2f} s"
    )


def test_eval_over_the_server_prints_what_a_local_eval_prints_and_writes_the_servers_reports(
    served: Served, local_env: dict[str, str]
) -> None:
    remote_env = {**local_env, "SIEVE_SERVER": served.url, "SIEVE_TOKEN": ADMIN_TOKEN}
    local = sieve(local_env, "eval")
    remote = sieve(remote_env, "eval")
    assert (local.code, remote.code) == (0, 0), local.err[-2000:] + remote.err[-2000:]
    local_lines, remote_lines = local.out.splitlines(), remote.out.splitlines()
    assert remote_lines[0].startswith("done cases=")
    assert masked(remote_lines[0]) == masked(local_lines[0])
    assert [masked(line).split(":")[0] for line in remote_lines] == [
        masked(line).split(":")[0] for line in local_lines
    ]
    latest = served.output_dir / "retrieval-eval-latest.json"
    assert f"report: {latest}" in remote_lines
    report = json.loads(latest.read_text(encoding="utf-8"))
    assert remote_lines[0].startswith(f"done cases={report['summary']['cases']} ")
    for noise in NOISE:
        assert noise not in local.err


def test_a_failed_gate_over_the_server_exits_1_naming_the_check_as_locally(
    served: Served, local_env: dict[str, str]
) -> None:
    local = sieve(local_env, "eval", "--max-p95-ms", "0.001")
    remote = sieve(
        {**local_env, "SIEVE_TOKEN": ADMIN_TOKEN}, "eval", "--max-p95-ms", "0.001", "--server", served.url
    )
    assert (local.code, remote.code) == (1, 1), local.err[-2000:] + remote.err[-2000:]
    failed = [line for line in remote.err.splitlines() if line.startswith("gate failed: ")]
    assert len(failed) == 1
    assert re.fullmatch(r"gate failed: max_p95_ms: latencyMs\.p95=\d+\.\d{4}, needs <= 0\.001", failed[0])
    assert [line for line in local.err.splitlines() if line.startswith("gate failed: max_p95_ms")] != []


def test_a_wrong_token_is_exit_2_in_one_line(served: Served, local_env: dict[str, str]) -> None:
    done = sieve({**local_env, "SIEVE_TOKEN": "not-the-admin-token-42"}, "eval", "--server", served.url)
    assert done.code == 2
    assert done.out == ""
    assert done.err == (
        f"error: the server at {served.url} refused the token (401): missing or wrong admin token: send "
        "'Authorization: Bearer <rag.server.admin_token>'; set $SIEVE_TOKEN to the server's token\n"
    )


def test_the_server_log_has_no_weight_loading_bar_or_transformers_warning(served: Served) -> None:
    log = served.log.read_text(errors="replace")
    assert "Sieve is ready" in log
    for noise in NOISE:
        assert noise not in log
