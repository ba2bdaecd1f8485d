"""What every `sieve` subcommand shares: the settings of this invocation, opening the Sieve, logging, and
the shape of an error line.

Exit codes: the one table in `app.exit_codes`."""

from __future__ import annotations

import logging
import sys
from typing import Any

from app import exit_codes
from app.settings import load_settings, merge

EXIT_OK, EXIT_GATE, EXIT_INPUT, EXIT_RUNTIME = (
    exit_codes.OK,
    exit_codes.GATE_FAILED,
    exit_codes.BAD_INPUT,
    exit_codes.UNAVAILABLE,
)

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


def open_sieve(settings, rebuild: bool = False):
    """The Sieve of `settings`: models loaded, store opened, BM25 index built."""
    from app.service import Sieve

    return Sieve.open(settings, rebuild=rebuild)


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)-5s %(name)s - %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    for noisy in NOISY_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.WARNING)


def fail(message: str, code: int = EXIT_INPUT) -> int:
    """Print `error: <message>` on stderr and return `code` (the command's exit code)."""
    print(f"error: {message}", file=sys.stderr)
    return code
