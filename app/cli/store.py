"""`sieve store check` and `sieve store rebuild`: the configured store against the document record.

- `check`: the index compared with the record (counts, document ids, each document's chunk ids: content
  hashes under the current chunking), the embedder the collection was built with, and a read and a write
  probe; every problem printed with the command that fixes it. Exit 0 when healthy, 4 otherwise.
- `rebuild`: every recorded document chunked and embedded again under the current settings into a staging
  collection, switched to only when complete (app/ingest/rebuild.py); then the BM25 index is built over the
  new collection. Refuses (exit 4) when the collection holds documents the record lacks, unless
  `--drop-unrecorded`.

Neither opens the collection the way the service does: a collection built with another embedder, or one
that can no longer be read, is what they are for.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from app import exit_codes
from app.cli.common import fail, settings_with
from app.settings import Settings, nested

if TYPE_CHECKING:
    from app.ingest.check import CheckReport
    from app.ingest.rebuild import RebuildReport
    from app.models import Embedder
    from app.service import Sieve
    from app.store import ChromaStore
    from app.store.record import DocumentRecord

log = logging.getLogger("sieve")


def add_store_commands(sub: Any) -> None:
    store = sub.add_parser("store", help="check the index against the document record, or rebuild it")
    commands = store.add_subparsers(dest="store_command", required=True)
    check = commands.add_parser(
        "check", help="compare the index with the document record and probe the store (exit 0: healthy)"
    )
    check.add_argument("--json", action="store_true", help="print the findings as one JSON object")
    check.set_defaults(func=check_command)
    rebuild = commands.add_parser(
        "rebuild",
        help="re-chunk and re-embed every recorded document into a new collection, then switch to it",
    )
    rebuild.add_argument(
        "--drop-unrecorded",
        action="store_true",
        help="drop the documents the index holds but the record lacks (otherwise the rebuild refuses)",
    )
    rebuild.set_defaults(func=rebuild_command)


def _settings() -> Settings:
    # no query is made: no traced query model, no exact search read at open
    return settings_with(
        nested("rag.models.trace_queries", False), nested("rag.store.exact_search_max_chunks", 0)
    )


@contextmanager
def opened(settings: Settings) -> Iterator[tuple[Embedder, ChromaStore, DocumentRecord]]:
    """(embedder, store, record) of `settings`, closed on the way out. The store is opened whatever embedder
    built it (`check_embedder=False`) and without a query (a broken collection opens)."""
    from app.models import load_embedder
    from app.store import ChromaStore, check_not_locked
    from app.store.record import open_record

    check_not_locked(settings.rag.store)
    embedder = load_embedder(settings.rag.models)
    store = ChromaStore.open(settings.rag.store, embedder.identity(), check_embedder=False)
    record = None
    try:
        record = open_record(settings.rag.store, store.client)
        yield embedder, store, record
    finally:
        if record is not None:
            record.close()
        store.close()
        close_embedder = getattr(embedder, "close", None)
        if close_embedder is not None:
            close_embedder()


def check_command(args: argparse.Namespace) -> int:
    from app.ingest.check import check_store

    settings = _settings()
    with opened(settings) as (embedder, store, record):
        report = check_store(store, record, settings.rag.ingest, embedder.identity())
    if args.json:
        print(json.dumps(report.as_json(), ensure_ascii=False, indent=2))
    else:
        print(render_check(report))
    return exit_codes.OK if report.healthy else exit_codes.STORE_DAMAGED


def render_check(report: CheckReport) -> str:
    """The check's findings for a terminal: the counts, then each problem and its fix (or "healthy")."""
    lines = [f"store: {report.store}"]
    c = report.comparison
    if c is not None:
        stones = f", {c.tombstones} deleted through the API (tombstones)" if c.tombstones else ""
        lines.append(
            f"record: {c.recorded} documents ({c.expected_chunks} chunks under the current chunking)"
            f"{stones}; index: {c.indexed} documents, {c.stored_chunks} chunks"
        )
    problems = report.problems()
    if not problems:
        lines.append("healthy: the index matches the record, and the store reads and writes")
    for problem in problems:
        lines.append(f"problem: {problem.what}")
        lines.append(f"  fix: {problem.fix}")
    return "\n".join(lines)


def rebuild_command(args: argparse.Namespace) -> int:
    from app.ingest.rebuild import UnrecordedDocumentsError

    settings = _settings()
    with opened(settings) as (embedder, store, record):
        try:
            sieve, report = rebuilt_sieve(settings, embedder, store, record, args.drop_unrecorded)
        except UnrecordedDocumentsError as exc:
            return fail(str(exc), exit_codes.STORE_DAMAGED)
        sieve.close()
    print(report.summary())
    return exit_codes.OK


def rebuilt_sieve(
    settings: Settings,
    embedder: Embedder,
    store: ChromaStore,
    record: DocumentRecord,
    drop_unrecorded: bool,
) -> tuple[Sieve, RebuildReport]:
    """Rebuild `store` from `record` (app/ingest/rebuild.py), with a progress bar in a terminal and log
    lines otherwise; then a Sieve over the rebuilt collection, which builds and saves its BM25 index (the
    old index's files name the old collection's id). (that Sieve, the rebuild's report)."""
    from app.ingest.pipeline import Progress
    from app.ingest.rebuild import rebuild
    from app.service import Sieve

    progress: Progress = "bar" if sys.stderr.isatty() else "log"
    report = rebuild(
        store,
        record,
        embedder,
        embedder.identity(),
        settings.rag.store,
        settings.rag.ingest,
        progress,
        drop_unrecorded=drop_unrecorded,
    )
    if report.unreadable:
        print(
            f"note: the old collection could not be read ({report.unreadable}); rebuilt from the record",
            file=sys.stderr,
        )
    if report.dropped_unrecorded:
        print(f"dropped {len(report.dropped_unrecorded)} unrecorded document(s)", file=sys.stderr)
    return Sieve(settings, embedder, store, reranker=None, record=record), report
