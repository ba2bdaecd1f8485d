"""What every `sieve` subcommand shares: the settings of this invocation, opening the Sieve, logging, and
the shape of an error line.

Exit codes: the one table in `app.exit_codes`."""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal

from app import exit_codes
from app.settings import load_settings, merge

log = logging.getLogger("sieve")

# Loggers of libraries whose INFO lines say nothing a user of the command needs.
NOISY_LOGGERS = ("chromadb", "httpx", "httpcore", "sentence_transformers", "jieba", "urllib3", "posthog")


class _Invocation:
    """The --config file of this invocation, handed to load_settings as an argument (not via os.environ)."""

    config_path: str | None = None


def set_config_path(path: str | None) -> None:
    _Invocation.config_path = path or None


def settings_with(*overrides: dict[str, Any]):
    """Settings from the --config file (else $SIEVE_CONFIG / config/application.yml), env and flags."""
    return load_settings(merge(*overrides), config_path=_Invocation.config_path)


def open_sieve(settings, suggest_server: Literal["query", "eval", "experiment"] | None = None):
    """The Sieve of `settings`: models loaded, store opened, BM25 index built. An embedded store another
    process holds fails before the models load (`StoreLockedError`, exit 3); with `suggest_server` (the
    commands that take `--server`) its message says to ask that process, when it is `sieve serve`, instead."""
    from app.service import Sieve
    from app.store import StoreError, StoreLockedError

    try:
        return Sieve.open(settings)
    except StoreLockedError as exc:
        if suggest_server is None:
            raise
        message = held_store_message(exc.path, exc.holder, exc.address, settings.rag.server, suggest_server)
        raise StoreError(message) from exc


def held_store_message(
    path: Any, holder: str, address: str | None, server: Any, command: Literal["query", "eval", "experiment"]
) -> str:
    """The one line for a local `query`, `eval` or `experiment` whose embedded store another process holds:
    ask the server with `--server`; an evaluation or an experiment also needs the server's admin token. The
    server's address is the one the holder recorded with its lock (`sieve serve` does once it listens: then
    the holder is that server), else `server`'s host and port, the address `sieve serve` takes by default."""
    from app.cli.client import SERVER_ENV, TOKEN_ENV

    token = (
        f", with its rag.server.admin_token (in ${TOKEN_ENV} or this shell's settings)"
        if command != "query"
        else ""
    )
    if address is not None:
        url = server_url(address)
        return (
            f"the embedded store {path} is open in `sieve serve` (pid {holder}, listening on {address}), "
            f"and it allows one process at a time. Ask that server instead: --server {url} "
            f"(or {SERVER_ENV}={url}){token}; otherwise stop it, or share the store through a Chroma server "
            "(rag.store.mode: http)"
        )
    url = server_url(f"http://{_bracketed(server.host)}:{server.port}")
    return (
        f"the embedded store {path} is open in another process (pid {holder}), and it allows one process "
        f"at a time. If that is `sieve serve`, ask it instead: --server {url} "
        f"(or {SERVER_ENV}={url}){token}; otherwise stop it, or share the store through a Chroma server "
        "(rag.store.mode: http)"
    )


def server_url(address: str) -> str:
    """The URL a client on this machine asks a server listening on `address` (`http://host:port`) with: a
    wildcard host (0.0.0.0, ::) is asked on 127.0.0.1."""
    from urllib.parse import urlsplit

    parts = urlsplit(address)
    if parts.hostname not in ("0.0.0.0", "::", "", None):
        return address
    return f"{parts.scheme or 'http'}://127.0.0.1:{parts.port}"


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)-5s %(name)s - %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    for noisy in NOISY_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.WARNING)


def fail(message: str, code: int = exit_codes.BAD_INPUT) -> int:
    """Print `error: <message>` on stderr and return `code` (the command's exit code)."""
    print(f"error: {message}", file=sys.stderr)
    return code
