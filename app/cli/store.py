"""`sieve store check|rebuild|backup|restore`: the configured store against the document record, and the
way back for every collection and file Sieve owns (app/store/owned.py).

- `check`: every owned collection and file probed (app/ingest/owned_checks.py: the record, the change log, a
  staging collection left behind, Chroma's own files, the BM25 files, the jobs folder), then the index
  compared with the record (counts, document ids, each document's chunk ids: content hashes under the
  current chunking), the embedder the collection was built with, and a read and a write probe; every
  problem printed with its way back. Exit 0 when healthy, 4 otherwise. A store whose files cannot be opened
  and a record that cannot be opened are problems too, not a failure to start.
- `rebuild`: every recorded document chunked and embedded again under the current settings into a staging
  collection, switched to only when complete (app/ingest/rebuild.py); then the BM25 index is built over the
  new collection. Before that it clears the way: Chroma's files moved aside when they cannot be opened or
  fail `PRAGMA quick_check` (the record intact), the change log made anew when it cannot be read or written,
  unreadable job records moved aside. Refuses (exit 4) when the collection holds documents the record
  lacks, unless `--drop-unrecorded`, and when the record is damaged, naming its way back.
  `--record-from-index` first makes the record again from what it still reads and the collection's chunks
  (app/ingest/record_from_index.py).
- `backup [PATH]`: an online copy of the record (SQLite's backup API; a server's record copied document by
  document), `target/backups/documents-<collection>-<time>.sqlite3` by default; `sieve serve` may run.
- `restore FILE`: a backup put back as the record (the one it replaces moved aside, embedded; dropped, on a
  server).

None opens the collection the way the service does: a collection built with another embedder, or one
that can no longer be read, is what they are for.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
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
    store = sub.add_parser(
        "store", help="check the index and every file Sieve owns, rebuild it, back up or restore the record"
    )
    commands = store.add_subparsers(dest="store_command", required=True)
    check = commands.add_parser(
        "check",
        help="probe every collection and file Sieve owns, compare the index with the record (0: healthy)",
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
    rebuild.add_argument(
        "--record-from-index",
        action="store_true",
        help="first make the document record again from what it still reads and the index's chunks "
        "(a damaged record with no backup)",
    )
    rebuild.set_defaults(func=rebuild_command)
    backup = commands.add_parser("backup", help="copy the document record to a SQLite file (online)")
    backup.add_argument(
        "path",
        nargs="?",
        help="the file to write (default: target/backups/documents-<collection>-<time>.sqlite3)",
    )
    backup.set_defaults(func=backup_command)
    restore = commands.add_parser("restore", help="put a backup back as the document record")
    restore.add_argument("file", help="a file `sieve store backup` wrote")
    restore.set_defaults(func=restore_command)


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
        _close(embedder)


def _close(embedder: Embedder) -> None:
    close_embedder = getattr(embedder, "close", None)
    if close_embedder is not None:
        close_embedder()


def check_command(args: argparse.Namespace) -> int:
    from app.models import load_embedder
    from app.store import check_not_locked

    settings = _settings()
    check_not_locked(settings.rag.store)
    embedder = load_embedder(settings.rag.models)
    try:
        report = check_everything(settings, embedder)
    finally:
        _close(embedder)
    if args.json:
        print(json.dumps(report.as_json(), ensure_ascii=False, indent=2))
    else:
        print(render_check(report))
    return exit_codes.OK if report.healthy else exit_codes.STORE_DAMAGED


def check_everything(settings: Settings, embedder: Embedder) -> CheckReport:
    """Every collection and file Sieve owns, probed (app/store/owned.py): the record first, then Chroma's
    files, the chunk collection against the record, the change log, a staging collection left behind, the
    BM25 files and the jobs folder. An embedded store whose files cannot be opened, or a record that cannot
    be opened, is a problem of the report; a Chroma server that cannot be reached raises
    (`StoreUnavailableError`: exit 3)."""
    from app.ingest import owned_checks as probe
    from app.ingest.check import CheckReport, check_store
    from app.service import lexical_directory
    from app.store import ChromaStore, StoreUnavailableError
    from app.store.record import RecordError, open_record

    rag = settings.rag
    embedded = rag.store.mode == "embedded"
    where = f"embedded Chroma at {rag.store.path}" if embedded else f"Chroma server at {rag.store.host}"
    others = []
    store = None
    opened_error = None
    try:
        store = ChromaStore.open(rag.store, embedder.identity(), check_embedder=False)
    except StoreUnavailableError as exc:
        if not embedded:
            raise
        opened_error = exc
    record = None
    try:
        if embedded or store is not None:
            record = open_record(rag.store, store.client if store is not None else None)
            others += probe.record_problems(record)
    except RecordError as exc:
        others.append(probe.unopenable_record(exc))
    try:
        if embedded:
            others += probe.chroma_files_problems(Path(rag.store.path), opened_error)
        if store is None:
            report = CheckReport(store=f"{where}, collection '{rag.store.collection}'")
        else:
            report = check_store(store, record, rag.ingest, embedder.identity())
            others += probe.change_log_problems(store) + probe.staging_problems(store)
            report.notes += _experiment_notes(store, rag.store.collection)
        others += probe.bm25_problems(lexical_directory(settings))
        others += probe.jobs_problems(Path(rag.server.jobs_dir))
    finally:
        if record is not None:
            record.close()
        if store is not None:
            store.close()
    report.others = others
    return report


def _experiment_notes(store: ChromaStore, collection: str) -> list[str]:
    """The experiment collections of `collection`, as a note: known, not strays (app/experiment/index.py)."""
    from app.experiment.index import experiment_collections_note

    note = experiment_collections_note(collection, store.collections())
    return [] if note is None else [note]


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
    lines += [f"note: {note}" for note in report.notes]
    problems = report.problems()
    if not problems:
        lines.append("healthy: the index matches the record, and the store reads and writes")
    for problem in problems:
        lines.append(f"problem: {problem.what}")
        lines.append(f"  fix: {problem.fix}")
    return "\n".join(lines)


def rebuild_command(args: argparse.Namespace) -> int:
    from app.ingest.rebuild import UnrecordedDocumentsError
    from app.models import load_embedder
    from app.store import ChromaStore, check_not_locked
    from app.store.record import RecordError, open_record

    settings = _settings()
    check_not_locked(settings.rag.store)
    embedder = load_embedder(settings.rag.models)
    try:
        if settings.rag.store.mode == "embedded":
            refused = _clear_chroma_files(settings, args.record_from_index)
            if refused is not None:
                return fail(refused, exit_codes.STORE_DAMAGED)
        store = ChromaStore.open(settings.rag.store, embedder.identity(), check_embedder=False)
        record = None
        try:
            if args.record_from_index:
                record = _record_from_index(settings, store)
            else:
                record = open_record(settings.rag.store, store.client)
                if record.damage is not None:
                    raise RecordError(record.damaged_message(record.damage))
            _clear_the_way(settings, store)
            sieve, report = rebuilt_sieve(settings, embedder, store, record, args.drop_unrecorded)
            sieve.close()  # and with it the record and the store
            record = None
        except (RecordError, UnrecordedDocumentsError) as exc:
            return fail(str(exc), exit_codes.STORE_DAMAGED)
        finally:
            if record is not None:
                record.close()
            store.close()
    finally:
        _close(embedder)
    print(report.summary())
    return exit_codes.OK


def _clear_chroma_files(settings: Settings, record_from_index: bool) -> str | None:
    """An embedded store whose Chroma files fail `PRAGMA quick_check` or cannot be opened: moved aside
    (said on stderr) when the record is intact, so the rebuild makes them anew from it. Why it refuses
    instead, or None."""
    from app.store import ChromaStore, StoreUnavailableError
    from app.store.chroma import chroma_files_problem, move_chroma_files_aside
    from app.store.record import RecordError, SqliteRecord, record_path, record_way_back

    path = Path(settings.rag.store.path)
    broken = chroma_files_problem(path)
    if broken is None:
        try:
            ChromaStore.open(settings.rag.store, {}, check_embedder=False).close()
        except StoreUnavailableError as exc:
            broken = str(exc)
    if broken is None:
        return None
    if record_from_index:
        return (
            f"Chroma's files cannot be used ({broken}), so the record cannot be rebuilt from the index; "
            f"restore a backup of the record instead: {record_way_back()}"
        )
    try:
        record = SqliteRecord(record_path(settings.rag.store))
    except RecordError as exc:
        return f"Chroma's files cannot be used ({broken}) and {exc}"
    damage = record.damage
    record.close()
    if damage is not None:
        return (
            f"Chroma's files cannot be used ({broken}) and {record.damaged_message(damage)}; restore the "
            "record first"
        )
    aside = move_chroma_files_aside(path)
    print(
        f"note: Chroma's files in {path} cannot be used ({broken}); moved aside to {aside}, rebuilding them "
        "from the record",
        file=sys.stderr,
    )
    return None


def _clear_the_way(settings: Settings, store: ChromaStore) -> None:
    """What a rebuild makes anew before it starts, said on stderr: a change log that cannot be read or
    written (dropped: the rebuild's own entry starts the new one), unreadable job records (moved aside)."""
    from app.ingest.owned_checks import move_jobs_aside

    broken = store.probe_change_log()
    if broken:
        store.reset_change_log()
        print(f"note: {'; '.join(broken)}; made anew", file=sys.stderr)
    for aside in move_jobs_aside(Path(settings.rag.server.jobs_dir)):
        print(f"note: unreadable job record moved aside to {aside}", file=sys.stderr)


def _record_from_index(settings: Settings, store: ChromaStore) -> DocumentRecord:
    """The record made again from what it still reads and the collection's chunks (`recover_record`); the
    old one moved aside (embedded) or dropped (a server). Said on stderr."""
    from app.ingest.record_from_index import recover_record
    from app.store import StoreError
    from app.store.record import (
        RecordError,
        SqliteRecord,
        drop_server_record,
        moved_aside,
        open_record,
        record_path,
        record_way_back,
    )

    rag = settings.rag
    damaged: DocumentRecord | None = None
    try:
        damaged = open_record(rag.store, store.client)
    except RecordError as exc:
        log.warning("the record cannot be opened (%s): every document is rebuilt from its chunks", exc)
    try:
        chunks = list(store.iter_all(include_text=True))
    except StoreError as exc:
        if damaged is not None:
            damaged.close()
        raise RecordError(
            f"the chunk collection cannot be read either ({exc}), so the record cannot be rebuilt from it; "
            f"{record_way_back()}"
        ) from exc
    recovered = recover_record(chunks, damaged, rag.ingest.chunk_overlap)
    if damaged is not None:
        damaged.close()
    if rag.store.mode == "embedded":
        path = record_path(rag.store)
        if path.exists():
            print(f"note: the old record moved aside to {moved_aside(path)}", file=sys.stderr)
        record: DocumentRecord = SqliteRecord(path)
    else:
        drop_server_record(rag.store, store.client)
        record = open_record(rag.store, store.client)
    for start in range(0, len(recovered.documents), 500):
        record.put(recovered.documents[start : start + 500])
    if recovered.tombstones:
        record.put_tombstones(recovered.tombstones)
    print(recovered.summary(), file=sys.stderr)
    return record


def backup_command(args: argparse.Namespace) -> int:
    """The record copied to `args.path` (default in `BACKUP_DIR`) and checked there; `sieve serve` may run
    (an embedded record is read with SQLite's online backup, no lock taken)."""
    from app.store import ChromaStore
    from app.store.record import (
        BACKUP_DIR,
        RecordError,
        SqliteRecord,
        backup_name,
        backup_sqlite,
        copy_documents,
        open_record,
        record_path,
    )

    rag = _settings().rag
    target = Path(args.path) if args.path else BACKUP_DIR / backup_name(rag.store.collection)
    if target.exists():
        return fail(f"{target} exists already: name a new file")
    try:
        if rag.store.mode == "embedded":
            backup_sqlite(record_path(rag.store), target)
        else:
            store = ChromaStore.open(rag.store, {}, check_embedder=False)
            try:
                source = open_record(rag.store, store.client)
                copy = SqliteRecord(target)
                try:
                    copy_documents(source, copy)
                finally:
                    copy.close()
            finally:
                store.close()
        copy = SqliteRecord(target)
        try:
            if copy.damage is not None:
                raise RecordError(copy.damaged_message(copy.damage))
            documents, stones = copy.count(), len(copy.tombstones())
        finally:
            copy.close()
    except RecordError as exc:
        target.unlink(missing_ok=True)
        return fail(f"no backup written: {exc}", exit_codes.STORE_DAMAGED)
    print(f"backed up: {documents} documents, {stones} tombstone(s) to {target}")
    return exit_codes.OK


def restore_command(args: argparse.Namespace) -> int:
    """`args.file` (a backup) checked, then put back as the record: the current one moved aside (embedded)
    or dropped (a server)."""
    from app.store import ChromaStore, check_not_locked
    from app.store.record import (
        RecordError,
        backup_sqlite,
        checked_backup,
        copy_documents,
        drop_server_record,
        moved_aside,
        open_record,
        record_path,
    )

    rag = _settings().rag
    try:
        backup = checked_backup(Path(args.file))
    except RecordError as exc:
        return fail(str(exc))
    try:
        documents, stones = backup.count(), len(backup.tombstones())
        check_not_locked(rag.store)
        if rag.store.mode == "embedded":
            path = record_path(rag.store)
            if path.exists():
                print(f"note: the current record moved aside to {moved_aside(path)}", file=sys.stderr)
            backup_sqlite(Path(args.file), path)
            where = str(path)
        else:
            store = ChromaStore.open(rag.store, {}, check_embedder=False)
            try:
                drop_server_record(rag.store, store.client)
                record = open_record(rag.store, store.client)
                copy_documents(backup, record)
                where = record.description
            finally:
                store.close()
    finally:
        backup.close()
    print(
        f"restored: {documents} documents, {stones} tombstone(s) from {args.file} into {where}. Documents "
        "written after the backup are in the index only: `sieve store check` names them, and `sieve store "
        "rebuild --record-from-index` takes them back into the record from their chunks"
    )
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
