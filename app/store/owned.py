"""Every collection and file Sieve owns, in one place: what it is, how `sieve store check` probes it and its
way back when it is damaged. docs/recovery.md has the same table (a unit test keeps the two in step).

Two kinds of state. The **document record** is the truth: every document a write acknowledged. Everything
else is **derived** from it and made again by `sieve store rebuild`: the chunk collection (re-chunked and
re-embedded from the record), the change log (recreated empty, with the rebuild's own entry), the BM25 index
(built over the new collection), a staging collection a stopped rebuild left (resumed, or dropped when
unreadable), Chroma's own files (moved aside when they cannot be opened, then made anew), unreadable job
records (moved aside: the rebuild indexes every recorded document, which is what they were for).

The record itself has two ways back: a backup (`sieve store backup`, an online SQLite backup; `sieve store
restore FILE` puts it back), and, without one, `sieve store rebuild --record-from-index`, which keeps what
the damaged record still reads and rebuilds the rest of each document from its chunks in the collection.
"""

from __future__ import annotations

from dataclasses import dataclass

REBUILD = "sieve store rebuild"
RECORD_FROM_INDEX = "sieve store rebuild --record-from-index"
RESTORE = "sieve store restore"
BACKUP = "sieve store backup"

# the keys of OWNED, as a problem of `sieve store check` names what it is about (`Problem.part`)
COLLECTION = "collection"
CHANGE_LOG = "change-log"
STAGING = "staging"
RECORD = "record"
CHROMA_FILES = "chroma-files"
BM25 = "bm25"
JOBS = "jobs"


@dataclass(frozen=True)
class Owned:
    """One collection or file Sieve owns: `key` (`Problem.part`), `what` it is and `where`, how `store
    check` probes it, its `way_back` when damaged, and whether it is `derived` from the record."""

    key: str
    what: str
    where: str
    probe: str
    way_back: str
    derived: bool


OWNED: tuple[Owned, ...] = (
    Owned(
        RECORD,
        "the document record",
        "`documents.sqlite3` in `rag.store.path` (embedded); the collection `<collection>-documents` on a "
        "Chroma server",
        "embedded: `PRAGMA quick_check`, every document read, a scratch row written and deleted; on a "
        "server: every record read and its body parsed, a scratch record written and deleted",
        f"`{RESTORE} FILE` (a backup `{BACKUP}` made); without a backup `{RECORD_FROM_INDEX}`",
        derived=False,
    ),
    Owned(
        COLLECTION,
        "the chunk collection",
        "`rag.store.collection` (default `sieve`)",
        "every chunk's metadata read and compared with what the record makes; the embedder; a count, a get, "
        "a scratch record written and deleted",
        f"`{REBUILD}`",
        derived=True,
    ),
    Owned(
        CHANGE_LOG,
        "the change log",
        "the collection `<collection>-changes`",
        "every entry read and its body parsed as JSON; a scratch record written and deleted",
        f"`{REBUILD}` (drops it and starts it anew)",
        derived=True,
    ),
    Owned(
        STAGING,
        "a staging collection a stopped rebuild left",
        "the collection `<collection>-rebuild`",
        "its presence (none is left once a rebuild switched); a count and a scratch write",
        f"`{REBUILD}` (resumes it; drops it first when it cannot be read or written)",
        derived=True,
    ),
    Owned(
        CHROMA_FILES,
        "Chroma's own files (embedded)",
        "`chroma.sqlite3` and the segment folders in `rag.store.path`",
        "`PRAGMA quick_check` of `chroma.sqlite3` (read-only); the store opened",
        f"`{REBUILD}` (moves them aside to `<store path>.chroma-broken-<time>`, then rebuilds from the "
        "record)",
        derived=True,
    ),
    Owned(
        BM25,
        "the BM25 index files",
        "`rag.lexical.path` (default `<store path>/lexical/<collection>`)",
        "`manifest.json`, the snapshot and every journal line (checksums) read; a scratch file written",
        f"`{REBUILD}` (builds them anew); deleting the folder also works (built at the next start)",
        derived=True,
    ),
    Owned(
        JOBS,
        "the write jobs' records",
        "`rag.server.jobs_dir` (default `target/jobs`)",
        "every `j-*.json` read and parsed; a scratch file written",
        f"`{REBUILD}` (moves unreadable records aside: it indexes every recorded document)",
        derived=True,
    ),
)


BY_KEY: dict[str, Owned] = {o.key: o for o in OWNED}
