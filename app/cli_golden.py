"""`sieve golden ...`, `sieve label` and `sieve baseline ...`: build, label and audit the golden set, and pin
the evaluation's baseline.

Exit codes: the table in `app.exit_codes`.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_golden_commands(sub: Any) -> None:
    golden = sub.add_parser("golden", help="build, label and audit the golden set")
    gsub = golden.add_subparsers(dest="golden_command", required=True)
    _add_golden_subcommands(gsub)
    _add_top_level(sub)


def _add_golden_subcommands(gsub: Any) -> None:
    """`sieve golden sample | generate | pool | export | check`."""


def _add_top_level(sub: Any) -> None:
    """`sieve label` and `sieve baseline`."""

