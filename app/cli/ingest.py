"""`sieve ingest`: put documents in the store (Markdown, text, JSONL, BEIR corpus.jsonl)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from app import exit_codes
from app.cli.common import fail, open_sieve, settings_with
from app.settings import nested


def add_ingest_command(sub: Any) -> None:
    ingest = sub.add_parser(
        "ingest", help="ingest files or directories (Markdown, text, JSONL, BEIR corpus.jsonl)"
    )
    ingest.add_argument("paths", nargs="+")
    ingest.add_argument(
        "--rebuild", action="store_true", help="drop the collection first (e.g. a new embedder)"
    )
    ingest.set_defaults(func=ingest_command)


def ingest_command(args: argparse.Namespace) -> int:
    # no query is made here: tracing the query model or reading every vector for the exact dense search
    # would only add seconds to the start (and the exact search a read-back after every committed batch)
    settings = settings_with(
        nested("rag.models.trace_queries", False), nested("rag.store.exact_search_max_chunks", 0)
    )
    missing = [p for p in args.paths if not os.path.exists(p)]
    if missing:
        return fail(f"no such file or directory: {', '.join(missing)}")
    sieve = open_sieve(settings, rebuild=args.rebuild)
    try:
        report = sieve.ingest(args.paths, progress=True)
    finally:
        sieve.close()
    print(report.summary())
    for error in report.errors:
        print(f"error: {error}", file=sys.stderr)
    return exit_codes.BAD_INPUT if report.errors else exit_codes.OK
