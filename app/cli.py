"""The `sieve` command (also `python -m app`).

Exit codes: one table for every subcommand and `sieve serve`, in `app.exit_codes`: 0 success; 1 an
evaluation gate check failed; 2 bad input (configuration, files, golden set, baseline report); 3 the
service could not start (model or store unavailable); 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from app import exit_codes
from app.settings import SettingsError, load_settings, merge, nested

EXIT_OK, EXIT_GATE, EXIT_INPUT, EXIT_RUNTIME = (
    exit_codes.OK,
    exit_codes.GATE_FAILED,
    exit_codes.BAD_INPUT,
    exit_codes.UNAVAILABLE,
)
# The --config file of this invocation, handed to load_settings as an argument (not via os.environ).
_config_path: str | None = None

log = logging.getLogger("sieve")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    global _config_path
    _config_path = args.config or None
    _configure_logging(args.verbose)
    try:
        return int(args.func(args) or 0)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        return exit_codes.INTERRUPTED
    except Exception as exc:  # the boundary: one clear line instead of a traceback
        from app.evaluation.compare.comparison import BaselineError
        from app.evaluation.golden.cases import GoldenSetError
        from app.evaluation.scoring.trec import TrecFormatError
        from app.models import ModelLoadError
        from app.store import StoreError

        if isinstance(exc, GoldenSetError | TrecFormatError | FileNotFoundError | BaselineError):
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_INPUT
        if isinstance(exc, StoreError | ModelLoadError):
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_RUNTIME
        raise


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sieve", description="RAG retrieval that grades itself.")
    parser.add_argument(
        "--config", help="YAML settings file (default: $SIEVE_CONFIG or config/application.yml)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser(
        "serve", help="serve the HTTP API (ingests and evaluates at startup as configured)"
    )
    serve.add_argument(
        "--evaluate",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the startup evaluation (rag.evaluate.enabled)",
    )
    serve.add_argument("--host", help="rag.server.host")
    serve.add_argument("--port", type=int, help="rag.server.port")
    serve.set_defaults(func=_serve)

    ingest = sub.add_parser(
        "ingest", help="ingest files or directories (Markdown, text, JSONL, BEIR corpus.jsonl)"
    )
    ingest.add_argument("paths", nargs="+")
    ingest.add_argument(
        "--rebuild", action="store_true", help="drop the collection first (e.g. a new embedder)"
    )
    ingest.set_defaults(func=_ingest)

    query = sub.add_parser("query", help="retrieve through the chain and show what each stage did")
    query.add_argument("text")
    query.add_argument("--top-k", type=int)
    query.add_argument("--knowledge-tag")
    query.add_argument("--json", action="store_true", help="print the same object as POST /api/retrieve")
    query.add_argument("--debug", action="store_true", help="list every removed chunk with its reason")
    query.set_defaults(func=_query)

    from app.cli_eval import add_eval_commands

    add_eval_commands(sub)
    from app.cli_golden import add_golden_commands

    add_golden_commands(sub)
    return parser


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)-5s %(name)s - %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    for noisy in ("chromadb", "httpx", "sentence_transformers", "jieba", "urllib3", "posthog"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def settings_with(*overrides: dict[str, Any]):
    """Settings from the --config file (else $SIEVE_CONFIG / config/application.yml), env and flags."""
    return load_settings(merge(*overrides), config_path=_config_path)


def _serve(args: argparse.Namespace) -> int:
    import signal

    import uvicorn

    from app.main import create_app

    overrides = []
    if args.evaluate is not None:
        overrides.append(nested("rag.evaluate.enabled", args.evaluate))
    if args.host:
        overrides.append(nested("rag.server.host", args.host))
    if args.port:
        overrides.append(nested("rag.server.port", args.port))
    settings = settings_with(*overrides)
    exit_code = {"code": 0}
    server: uvicorn.Server | None = None

    def on_fatal(code: int) -> None:
        exit_code["code"] = code
        if server is not None:
            server.should_exit = True

    app = create_app(settings, on_fatal=on_fatal)
    state = app.state.sieve_state
    deadline = settings.rag.server.shutdown_seconds

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            # Writers stop at their next slice from this moment, not after uvicorn has drained connections.
            if state.stop_deadline is None:
                state.stop_deadline = time.monotonic() + deadline
                _exit_after(deadline - 0.25)
            state.stopping.set()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app,
        host=settings.rag.server.host,
        port=settings.rag.server.port,
        log_level="info",
        log_config=None,
        timeout_graceful_shutdown=max(1, int(deadline / 3)),
    )
    server = _Server(config)
    # uvicorn re-raises the SIGTERM that stopped it after its graceful shutdown, which would end the
    # process as "killed by SIGTERM"; a clean shutdown on request is a success, so that re-raise is ignored.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return exit_code["code"]


def _exit_after(seconds: float) -> None:
    """The last resort of the shutdown deadline: end the process if it is still here after `seconds`."""
    import threading

    def force() -> None:
        log.error("shutdown took longer than rag.server.shutdown_seconds; exiting now")
        logging.shutdown()
        os._exit(EXIT_RUNTIME)

    timer = threading.Timer(seconds, force)
    timer.daemon = True
    timer.start()


def open_sieve(settings, rebuild: bool = False):
    from app.service import Sieve

    return Sieve.open(settings, rebuild=rebuild)


def _ingest(args: argparse.Namespace) -> int:
    # no query is made here: tracing the query model or reading every vector for the exact dense search
    # would only add seconds to the start (and the exact search a read-back after every committed batch)
    settings = settings_with(
        nested("rag.models.trace_queries", False), nested("rag.store.exact_search_max_chunks", 0)
    )
    missing = [p for p in args.paths if not os.path.exists(p)]
    if missing:
        print(f"error: no such file or directory: {', '.join(missing)}", file=sys.stderr)
        return EXIT_INPUT
    sieve = open_sieve(settings, rebuild=args.rebuild)
    try:
        report = sieve.ingest(args.paths, progress=True)
    finally:
        sieve.close()
    print(report.summary())
    for error in report.errors:
        print(f"error: {error}", file=sys.stderr)
    return EXIT_INPUT if report.errors else EXIT_OK


def _query(args: argparse.Namespace) -> int:
    from app.api.schemas import retrieve_response, to_json

    settings = settings_with()
    text = args.text
    if not text.strip():
        print("error: query must not be blank", file=sys.stderr)
        return EXIT_INPUT
    top_k = settings.rag.retrieval.top_k if args.top_k is None else args.top_k
    if not 1 <= top_k <= 100:
        print(f"error: --top-k must be between 1 and 100, got {top_k}", file=sys.stderr)
        return EXIT_INPUT
    sieve = open_sieve(settings)
    try:
        if settings.rag.ingest.on_startup and sieve.store.count() == 0 and settings.rag.ingest.paths:
            sieve.ingest(settings.rag.ingest.paths, progress=True)
        result = sieve.retrieve(text, top_k, args.knowledge_tag)
    finally:
        sieve.close()
    response = retrieve_response(result, debug=args.debug)
    if args.json:
        print(json.dumps(to_json(response), ensure_ascii=False, indent=2))
    else:
        print(render_result(response))
    return EXIT_OK


def render_result(r) -> str:
    origins = ", ".join(f"{k} {v}" for k, v in r.candidateOrigins.items())
    lines = [
        f"query: {r.query}",
        f"{r.finalCount} of {r.originalCount} candidates ({origins}); fallback used: "
        f"{'yes' if r.fallbackUsed else 'no'}; {r.latencyMs:.0f} ms",
        "",
        f"{'#':>2}  {'docId':<24} {'source':<16} {'dense':>6} {'bm25':>7} {'fused':>7} {'rerank':>7}"
        "  title / text",
    ]
    for d in r.documents:
        s = d.scores
        snippet = " ".join(d.text.split())[:60]
        lines.append(
            f"{d.rank:>2}  {_clip(d.docId, 24):<24} {_clip(d.source, 16):<16} {_num(s.dense, 3):>6} "
            f"{_num(s.bm25, 2):>7} {_num(s.fused, 4):>7} {_num(s.rerank, 2):>7}  {d.title}: {snippet}"
        )
        for a in d.attached:
            heading = a.headingPath.split(" > ")[-1]
            lines.append(f"{'':>4}+ attached {a.chunkId} [{heading}]: {' '.join(a.text.split())[:60]}")
    if not r.documents:
        lines.append("    (no documents)")
    lines += ["", "stages:"]
    for st in r.stages:
        if st.skipped:
            status = st.skipped
        else:
            status = f"{st.inputCount:>3} -> {st.outputCount:<3} removed {st.removed}"
            if st.added:
                status += f", added {st.added}"
        lines.append(f"  {st.name:<21} {status:<40} {st.latencyMs:7.1f} ms")
        for item in st.removedItems or []:
            lines.append(f"      - {item.docId} ({item.chunkId}): {item.reason}")
    return "\n".join(lines)


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
