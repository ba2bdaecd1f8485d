"""`sieve ingest`: put documents in the store (Markdown, text, JSONL, BEIR corpus.jsonl)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from app import exit_codes
from app.cli.common import fail, open_sieve, settings_with
from app.cli.store import opened, rebuilt_sieve
from app.settings import Settings, nested

if TYPE_CHECKING:
    from app.ingest.pipeline import IngestReport


def add_ingest_command(sub: Any) -> None:
    ingest = sub.add_parser(
        "ingest", help="ingest files or directories (Markdown, text, JSONL, BEIR corpus.jsonl)"
    )
    ingest.add_argument("paths", nargs="+")
    ingest.add_argument(
        "--rebuild",
        action="store_true",
        help="keep PATH's documents in the document record, then rebuild the index from the whole record "
        "under the current settings (`sieve store rebuild`: e.g. a new embedder or chunking); nothing "
        "recorded is dropped",
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
    if args.rebuild:
        return _ingest_rebuilding(settings, args.paths)
    sieve = open_sieve(settings)
    try:
        report = sieve.ingest(args.paths, progress=True)
    finally:
        sieve.close()
    return _reported(report)


def _ingest_rebuilding(settings: Settings, paths: list[str]) -> int:
    """`ingest --rebuild`: PATH's documents (within the bounds, less those deleted through the API and
    unchanged since) into the document record, the index rebuilt from the whole record (`sieve store
    rebuild`, refusing when the index holds documents the record lacks), then PATH ingested as without
    --rebuild (nothing left to embed; documents gone from PATH's files leave the record and the index, and
    bad files are reported)."""
    from app.ingest.loaders import load_paths
    from app.ingest.pipeline import Ingestor
    from app.ingest.rebuild import UnrecordedDocumentsError
    from app.ingest.tombstones import without_deleted

    with opened(settings) as (embedder, store, record):
        ingest = settings.rag.ingest
        loaded = load_paths(
            list(paths), follow_symlinks=ingest.follow_symlinks, access_defaults=ingest.access_defaults
        )
        documents, _ = Ingestor(store, embedder, settings.rag.ingest).split_too_long(loaded.documents)
        documents = without_deleted(documents, record)
        record.put(documents)
        print(
            f"ingest --rebuild: {len(documents)} document(s) kept in the {record.description}; rebuilding "
            f"the index from all {record.count()} recorded documents (`sieve store rebuild`: API-written "
            "ones included, nothing recorded is dropped)",
            file=sys.stderr,
        )
        try:
            sieve, rebuilt = rebuilt_sieve(settings, embedder, store, record, drop_unrecorded=False)
        except UnrecordedDocumentsError as exc:
            return fail(str(exc), exit_codes.STORE_DAMAGED)
        print(rebuilt.summary())
        try:
            # the deleted documents were said above: left out again, quietly
            report = sieve.ingest(paths, progress=True, log_tombstones=False)
        finally:
            sieve.close()
    return _reported(report)


def _reported(report: IngestReport) -> int:
    print(report.summary())
    for error in report.errors:
        print(f"error: {error}", file=sys.stderr)
    return exit_codes.BAD_INPUT if report.errors else exit_codes.OK
