"""`sieve serve`: the HTTP API over uvicorn (ingests and evaluates at startup as configured)."""

from __future__ import annotations

import argparse
import logging
import os
import time
from typing import Any

from app import exit_codes, pidlock
from app.cli.common import log, settings_with
from app.settings import nested
from app.stall import StallExit


def add_serve_command(sub: Any) -> None:
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
    serve.set_defaults(func=serve_command)


def serve_command(args: argparse.Namespace) -> int:
    import uvicorn

    from app.main import create_app

    settings = settings_with(*_overrides(args))
    exit_code = {"code": 0}
    server: uvicorn.Server | None = None

    def on_fatal(code: int) -> None:
        exit_code["code"] = code
        if server is not None:
            server.should_exit = True

    app = create_app(settings, on_fatal=on_fatal)
    state = app.state.sieve_state
    state.freeze_after_load = getattr(args, "process_start", False)
    deadline = settings.rag.server.shutdown_seconds
    config = uvicorn.Config(
        app,
        host=settings.rag.server.host,
        port=settings.rag.server.port,
        log_level="info",
        log_config=None,
        timeout_graceful_shutdown=max(1, int(deadline / 3)),
    )
    server = _sieve_server(state, deadline)(config)
    # once ready (loading models and a large index may hold the interpreter lock for long)
    stall = StallExit(
        settings.rag.server.stall_exit_seconds, armed=lambda: state.ready or state.stopping.is_set()
    )
    _run(server, stall)
    return exit_code["code"]


def _overrides(args: argparse.Namespace) -> list[dict[str, Any]]:
    overrides = []
    if args.evaluate is not None:
        overrides.append(nested("rag.evaluate.enabled", args.evaluate))
    if args.host:
        overrides.append(nested("rag.server.host", args.host))
    if args.port is not None:  # --port 0 is refused by the settings (1-65535), not ignored
        overrides.append(nested("rag.server.port", args.port))
    return overrides


def _sieve_server(state: Any, deadline: float) -> type[Any]:
    """uvicorn's server, which records where it listens once it does and starts the shutdown deadline
    at the first signal."""
    import uvicorn

    class _Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:
                # recorded with the store lock, now or when startup takes it: a local `sieve query` refused
                # the store names this address (app/cli/common.py held_store_message)
                pidlock.announce(listening_address(self.servers))

        def handle_exit(self, sig: int, frame: Any) -> None:
            # Writers stop at their next slice from this moment, not after uvicorn has drained connections.
            if state.stop_deadline is None:
                state.stop_deadline = time.monotonic() + deadline
                _exit_after(deadline - 0.25)
            state.stopping.set()
            super().handle_exit(sig, frame)

    return _Server


def _run(server: Any, stall: StallExit) -> None:
    import signal

    stall.start()
    # uvicorn re-raises the SIGTERM that stopped it after its graceful shutdown, which would end the
    # process as "killed by SIGTERM"; a clean shutdown on request is a success, so that re-raise is ignored.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run()
    finally:
        stall.stop()
        signal.signal(signal.SIGTERM, previous)
        pidlock.announce(None)


def listening_address(servers: list[Any]) -> str | None:
    """`http://host:port` of the first socket uvicorn listens on (an IPv6 host in brackets); None without
    one."""
    for server in servers:
        for sock in server.sockets:
            host, port = sock.getsockname()[:2]
            return f"http://{f'[{host}]' if ':' in host else host}:{port}"
    return None


def _exit_after(seconds: float) -> None:
    """The last resort of the shutdown deadline: end the process if it is still here after `seconds`."""
    import threading

    def force() -> None:
        log.error("shutdown took longer than rag.server.shutdown_seconds; exiting now")
        logging.shutdown()
        os._exit(exit_codes.UNAVAILABLE)

    timer = threading.Timer(seconds, force)
    timer.daemon = True
    timer.start()
