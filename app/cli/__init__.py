"""The `sieve` command (also `python -m app`): one module per group of subcommands.

- `app.cli.serve`: `serve`;
- `app.cli.ingest`: `ingest`;
- `app.cli.query`: `query`;
- `app.cli.eval`: `eval`, `tune`, `compare`, `trec-eval`;
- `app.cli.experiment`: `experiment` (variants side by side, app/experiment/);
- `app.cli.golden`: `golden ...`, `baseline ...`, `label`;
- `app.cli.store`: `store check`, `store rebuild` (the index against the document record);
- `app.cli.client`: `--server URL` (or `$SIEVE_SERVER`) on `query` and `eval`, which ask a running
  `sieve serve` instead of loading the models here;
- `app.cli.common`: the settings of this invocation, `open_sieve`, logging.

Exit codes: one table for every subcommand and `sieve serve`, in `app.exit_codes`: 0 success; 1 an
evaluation gate check failed; 2 bad input (configuration, files, golden set, baseline report, a token the
server refuses); 3 the service could not start or the server could not be reached; 4 the index does not
match the document record or the store fails a probe (`store check`, `store rebuild`); 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from app import exit_codes
from app.cli.common import (
    configure_logging,
    open_sieve,
    set_config_path,
    settings_with,
)
from app.cli.eval import add_eval_commands
from app.cli.experiment import add_experiment_command
from app.cli.golden import add_golden_commands
from app.cli.ingest import add_ingest_command
from app.cli.query import add_query_command, render_result
from app.cli.serve import add_serve_command
from app.cli.store import add_store_commands
from app.settings import SettingsError

__all__ = [
    "main",
    "open_sieve",
    "render_result",
    "settings_with",
]


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    # the process's own command line (the `sieve` script, `python -m app`), not a call from code (the tests):
    # what a command may do once per process (`freeze_loaded_objects`)
    args.process_start = argv is None
    set_config_path(args.config)
    configure_logging(args.verbose)
    try:
        return int(args.func(args) or 0)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    except KeyboardInterrupt:
        return exit_codes.INTERRUPTED
    except BrokenPipeError:
        # the reader of stdout stopped reading (`sieve query ... | head`): it had what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return exit_codes.OK
    except Exception as exc:  # the boundary: one clear line instead of a traceback
        from app.evaluation.compare.comparison import BaselineError
        from app.evaluation.golden.cases import GoldenSetError
        from app.evaluation.scoring.trec import TrecFormatError
        from app.models import ModelLoadError
        from app.store import StoreError, StoreFailedError

        if isinstance(exc, GoldenSetError | TrecFormatError | FileNotFoundError | BaselineError):
            print(f"error: {exc}", file=sys.stderr)
            return exit_codes.BAD_INPUT
        if isinstance(exc, StoreFailedError):
            print(f"error: {exc.with_remedy()}", file=sys.stderr)
            return exit_codes.UNAVAILABLE
        if isinstance(exc, StoreError | ModelLoadError):
            print(f"error: {exc}", file=sys.stderr)
            return exit_codes.UNAVAILABLE
        raise


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sieve", description="RAG retrieval that grades itself.")
    parser.add_argument(
        "--config", help="YAML settings file (default: $SIEVE_CONFIG or config/application.yml)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_command(sub)
    add_ingest_command(sub)
    add_query_command(sub)
    add_eval_commands(sub)
    add_experiment_command(sub)
    add_golden_commands(sub)
    add_store_commands(sub)
    return parser


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
