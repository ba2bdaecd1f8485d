"""What the golden-set audit reads besides the golden set (the store, the embedder, the previous report), and
what an evaluation calls: `audit_section` (never raises: an audit that could not run says why) and
`attach_audit`."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from datetime import date
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from app.evaluation.golden.audit.checks import AuditResult, audit_golden_set
from app.evaluation.golden.audit.index import CHUNK, DOC_OR_CHUNK, IndexView, case_refs, ref_docs
from app.evaluation.golden.cases import GoldenSet
from app.evaluation.report.model import NEAR_DUPLICATE_COSINE, Audit, Report
from app.settings import EvaluateSettings, HardFilterSettings
from app.store import StoredChunk

log = logging.getLogger("sieve.evaluation")

EMBED_BATCH = 16  # the query batcher's default max batch: less padding than one large batch


class AuditStore(Protocol):
    """The store as the audit reads it: every chunk (metadata, text when asked), and chunks by id."""

    def iter_all(self, include_text: bool = True) -> Iterable[StoredChunk]: ...

    def get(self, ids: Sequence[str], include_embeddings: bool = True) -> Sequence[StoredChunk]: ...


class AuditEmbedder(Protocol):
    """The embedder as the audit uses it: query vectors with its query prompt (and, when it has one, a
    `name` the audit records)."""

    def embed_queries(self, texts: list[str]) -> np.ndarray: ...


@dataclass(frozen=True)
class AuditSource:
    """What the audit reads besides the golden set: the store (`iter_all`, `get`), the embedder
    (`embed_queries`, which applies its query prompt, and `name`) and the hard filter's settings."""

    store: AuditStore
    embedder: AuditEmbedder
    hard_filter: HardFilterSettings


def read_previous_report(path: Path) -> tuple[dict[str, Any] | None, str]:
    """The previous report at `path` and a note naming it, or None and why not (missing, unreadable)."""
    if not path.exists():
        return None, f"no previous report at {path}"
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        return None, f"previous report {path} not readable: {exc}"
    if not isinstance(report, dict):
        return None, f"previous report {path} is not a report object"
    return report, str(path)


def previous_content(report: dict[str, Any] | None) -> dict[str, str]:
    """{id: content hash} recorded by a report's case records (`expectedContent`); the first record of an
    id wins. Empty for no report, or one without such records."""
    out: dict[str, str] = {}
    for record in (report or {}).get("cases") or []:
        content = record.get("expectedContent") if isinstance(record, dict) else None
        if isinstance(content, dict):
            for key, sha in content.items():
                if isinstance(key, str) and isinstance(sha, str):
                    out.setdefault(key, sha)
    return out


def load_index(store: AuditStore, golden: GoldenSet, recorded: dict[str, str]) -> IndexView:
    """The index view the audit needs, read with as little text as it can: every chunk's metadata, then the
    texts of the chunks the cases name and of the chunks of the documents they name (the hard filter's
    text rule and the chunk hashes read them), and every text only when a stale chunk id has a recorded
    hash to look for."""
    index = IndexView.from_rows((c.chunk_id, c.metadata, None) for c in store.iter_all(include_text=False))
    wanted: set[str] = set()
    stale_with_hash = False
    for case in golden.cases:
        for ref in case_refs(case):
            level = index.holds(ref)
            if level == CHUNK:
                wanted.add(ref.id)
            for doc in ref_docs(ref, index):
                wanted.update(index.doc_chunks.get(doc, []))
            if level is None and ref.level in (CHUNK, DOC_OR_CHUNK) and ref.id in recorded:
                stale_with_hash = True
    if stale_with_hash:
        index.add_texts({c.chunk_id: c.text for c in store.iter_all(include_text=True)})
    elif wanted:
        index.add_texts({c.chunk_id: c.text for c in store.get(sorted(wanted), include_embeddings=False)})
    return index


def embed_queries(embed: Callable[[list[str]], np.ndarray], queries: Sequence[str]) -> np.ndarray:
    """The query vectors of `queries`, EMBED_BATCH at a time."""
    parts = [
        np.asarray(embed(list(queries[i : i + EMBED_BATCH]))) for i in range(0, len(queries), EMBED_BATCH)
    ]
    return np.vstack(parts) if parts else np.zeros((0, 1))


def run_audit(
    golden: GoldenSet,
    source: AuditSource,
    as_of: date,
    previous_path: Path,
    near_duplicate_cosine: float = NEAR_DUPLICATE_COSINE,
) -> AuditResult:
    """Gather the index view, the query vectors and the previous report's hashes, then `audit_golden_set`."""
    previous, note = read_previous_report(previous_path)
    recorded = previous_content(previous)
    index = load_index(source.store, golden, recorded)
    vectors = embed_queries(source.embedder.embed_queries, [c.query for c in golden.cases])
    audit = audit_golden_set(
        golden, index, vectors, source.hard_filter, as_of, recorded, near_duplicate_cosine
    )
    audit.embedder = getattr(source.embedder, "name", None)
    audit.previous_report = note + (
        f" ({len(recorded)} recorded content hashes)" if previous is not None else ""
    )
    return audit


def previous_report_path(settings: EvaluateSettings) -> Path:
    """The previous report an audit reads recorded content hashes from: `<output_dir>/<prefix>-latest.json`
    of `settings` (`EvaluateSettings`), as it is before this run writes its own."""
    return Path(settings.output_dir) / f"{settings.report_prefix}-latest.json"


def audit_section(golden: GoldenSet, source: AuditSource | None, settings: EvaluateSettings) -> AuditResult:
    """The audit for an evaluation with `settings` (`EvaluateSettings`): never raises. Not enabled, no
    source, or an internal error: `ran` false and `error` saying why."""
    audit_settings = getattr(settings, "audit", None)
    if audit_settings is not None and not audit_settings.enabled:
        return AuditResult(ran=False, error="not run: rag.evaluate.audit.enabled is false")
    if source is None:
        return AuditResult(ran=False, error="not run: no store and embedder were given to audit against")
    try:
        audit = run_audit(
            golden,
            source,
            settings.as_of or date.today(),
            previous_report_path(settings),
            audit_settings.near_duplicate_cosine if audit_settings is not None else NEAR_DUPLICATE_COSINE,
        )
    except Exception as exc:  # the audit is information: it must never cost the evaluation its report
        log.exception("[RetrievalEval] golden-set audit could not run")
        return AuditResult(ran=False, error=f"could not run: {type(exc).__name__}: {exc}")
    log.info("[RetrievalEval] golden-set audit: %s", audit.summary)
    return audit


def attach_audit(report: Report, audit: AuditResult | None) -> None:
    """Put `audit` into `report` as `audit`, and each case record's `expectedContent` from it (the
    per-case content hashes the next audit remaps stale ids with); the report's audit keeps no copy."""
    if audit is None:
        report.audit = None
        return
    for record in report.cases:
        record.resolved.expected_content = dict(audit.expected_content.get(record.case.id, {}))
    report.audit = Audit(**{f.name: getattr(audit, f.name) for f in fields(Audit)})
