"""Candidate pools for the labelling page: what raters judge for each query.

A case's pool is the union, deduplicated by chunk, of the top K of several chain variants, each candidate
remembering which variants returned it and at which rank (TREC-style pooling: a document any reasonable
system would return gets a judgment, so a later change that surfaces it is not scored against a gap):

* `current`  — the chain as configured;
* `dense`    — dense candidates only (`rag.retrieval.hybrid: false`), no BM25 fusion, no reranker;
* `bm25`     — BM25 candidates only (`candidate_k: 0`), ordered by BM25 alone (weighted fusion with
               dense_weight 0), no similarity threshold (it reads dense scores), no reranker;
* `baseline` — the top K the baseline report recorded for the case (`baseline_report`), when its query is
               the case's query;
* `queued`   — the ids `sieve golden pool` queued for the case from a report (`queue_from_report`).

The hard filter, diversity and fallback stages run in every variant as configured: a rater should not spend
time on a retired or draft document that no variant of the service can return. K is the case's own topK,
else `rag.evaluate.top_k`, the depth Judged@K is measured at.

Order within a pool: by the best rank any variant gave the chunk, then by how many variants returned it
(more first), then by chunk id; queued chunks that no variant returned come last.
"""

from __future__ import annotations

import json
import logging
import math
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, Protocol

from pydantic import JsonValue

from app.jsonl import read_jsonl, render_jsonl
from app.lexical.index import _RUNS as ANALYZER_RUNS  # the analyzer's own split into CJK / latin runs
from app.retrieval.chain import RetrievalRequest
from app.retrieval.types import RetrievalResult
from app.settings import Settings
from app.store.types import ChunkMetadata, StoredChunk

log = logging.getLogger(__name__)

CURRENT, DENSE, BM25, BASELINE, QUEUED = "current", "dense", "bm25", "baseline", "queued"
CHAIN_VARIANTS = (CURRENT, DENSE, BM25)
VARIANTS = (*CHAIN_VARIANTS, BASELINE, QUEUED)


def variant_settings(settings: Settings) -> dict[str, Settings]:
    """The settings of each chain variant (see the module docstring), from `settings` ("current")."""
    rag = settings.rag
    chain, retrieval = rag.chain, rag.retrieval
    no_rerank = chain.rerank.model_copy(update={"enabled": False})
    dense = rag.model_copy(
        update={
            "retrieval": retrieval.model_copy(
                update={"hybrid": False, "candidate_k": retrieval.candidate_k or 50}
            ),
            "chain": chain.model_copy(
                update={"bm25": chain.bm25.model_copy(update={"enabled": False}), "rerank": no_rerank}
            ),
        }
    )
    bm25 = rag.model_copy(
        update={
            "retrieval": retrieval.model_copy(update={"hybrid": True, "candidate_k": 0}),
            "chain": chain.model_copy(
                update={
                    "similarity_threshold": chain.similarity_threshold.model_copy(update={"enabled": False}),
                    "bm25": chain.bm25.model_copy(
                        update={
                            "enabled": True,
                            "fusion": "weighted",
                            "dense_weight": 0.0,
                            "bm25_weight": 1.0,
                        }
                    ),
                    "rerank": no_rerank,
                }
            ),
        }
    )
    return {
        CURRENT: settings,
        DENSE: settings.model_copy(update={"rag": dense}),
        BM25: settings.model_copy(update={"rag": bm25}),
    }


@dataclass(frozen=True)
class Ranked:
    """One ranked chunk of a variant's list (`doc_id` "" when not known yet)."""

    chunk_id: str | None
    doc_id: str


@dataclass
class PoolEntry:
    """One chunk of a pool: `ranks` {variant: 1-based rank}."""

    chunk_id: str
    doc_id: str
    ranks: dict[str, int] = field(default_factory=dict)

    @property
    def best_rank(self) -> float:
        chain_ranks = [r for v, r in self.ranks.items() if v != QUEUED]
        return min(chain_ranks) if chain_ranks else math.inf


def merge_pool(lists: Mapping[str, Sequence[Ranked]]) -> list[PoolEntry]:
    """The union of `lists` ({variant: ranked chunks, best first}) by chunk id, each entry with every
    variant's rank of it (its first position when a list repeats it), in pool order (module docstring).
    Entries without a chunk id are left out (resolve them first: `resolve_queued`)."""
    entries: dict[str, PoolEntry] = {}
    for variant, ranked in lists.items():
        for rank, item in enumerate(ranked, start=1):
            if item.chunk_id is None:
                continue
            entry = entries.setdefault(item.chunk_id, PoolEntry(item.chunk_id, item.doc_id))
            entry.ranks.setdefault(variant, rank)
            if not entry.doc_id:
                entry.doc_id = item.doc_id
    return sorted(entries.values(), key=lambda e: (e.best_rank, -len(e.ranks), e.chunk_id))


# -- highlighting -----------------------------------------------------------------------------------------


def _has_cjk(term: str) -> bool:
    return any(m.group(1) for m in ANALYZER_RUNS.finditer(term))


def highlight(text: str, query_terms: Iterable[str], tokens: Callable[[str], list[str]]) -> list[list[Any]]:
    """`text` as segments `[piece, is_term]` whose pieces join back to `text` exactly; a piece is a term
    when the BM25 analyzer (`tokens`, `Analyzer.tokens`) makes it into one of `query_terms`:

    * a latin/digit word is a term when one of its own tokens (lowercased, stemmed) is a query term, so
      "Leaves" lights up for the query "leave";
    * in a CJK run, every occurrence of a CJK query term is one, longest term first, left to right
      (jieba's search-mode pieces of the query: 年假 in 年假天数).

    The page shows the pieces as text (never as HTML), so markup in a document is displayed, not run."""
    terms = set(query_terms)
    cjk_terms = sorted((t for t in terms if _has_cjk(t)), key=lambda t: (-len(t), t))
    segments: list[list[Any]] = []

    def add(piece: str, hit: bool) -> None:
        if not piece:
            return
        if segments and segments[-1][1] == hit:
            segments[-1][0] += piece
        else:
            segments.append([piece, hit])

    at = 0
    for match in ANALYZER_RUNS.finditer(text):
        add(text[at : match.start()], False)
        run = match.group(0)
        if match.group(2) is not None:
            add(run, any(t in terms for t in tokens(run)))
        else:
            _mark_cjk(unicodedata.normalize("NFKC", run), run, cjk_terms, add)
        at = match.end()
    add(text[at:], False)
    return segments


def _mark_cjk(normal: str, run: str, terms: list[str], add: Callable[[str, bool], None]) -> None:
    if len(normal) != len(run):  # NFKC changed the length: offsets would not map back, match as is
        normal = run
    i = start = 0
    while i < len(run):
        term = next((t for t in terms if normal.startswith(t, i)), None)
        if term is None:
            i += 1
            continue
        add(run[start:i], False)
        add(run[i : i + len(term)], True)
        i += len(term)
        start = i
    add(run[start:], False)


# -- baseline and queued ids -------------------------------------------------------------------------------


def baseline_report(output_dir: str | Path, prefix: str) -> Path | None:
    """The report whose top K is the `baseline` variant, from `output_dir`: the pinned report
    (`<prefix>-pinned.json`), else the last passing one (`<prefix>-passing.json`), else the newest of
    `<prefix>-latest.json` and the timestamped `<prefix>-<stamp>.json` that evaluated (status ok) and
    passed its gate, else `-latest.json` if it evaluated; None when there is none of these."""
    folder = Path(output_dir)
    latest = folder / f"{prefix}-latest.json"
    stamp = re.compile(rf"{re.escape(prefix)}-\d{{8}}T\d{{6}}Z\.json")
    stamped = sorted((p for p in folder.glob(f"{prefix}-*.json") if stamp.fullmatch(p.name)), reverse=True)
    chosen = [folder / f"{prefix}-pinned.json", folder / f"{prefix}-passing.json"]
    for path in [*chosen, latest, *stamped]:
        report = read_json(path) if path.is_file() else None
        if (
            not isinstance(report, dict)
            or report.get("status") != "ok"
            or not isinstance(report.get("cases"), list)
        ):
            continue
        if path in chosen or (report.get("gate") or {}).get("passed", True):
            return path
    report = read_json(latest) if latest.is_file() else None
    return latest if isinstance(report, dict) and report.get("status") == "ok" else None


def read_json(path: Path) -> Any:
    """The JSON at `path`, or None when it cannot be read as JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None


def report_rankings(report: Mapping[str, Any]) -> dict[str, tuple[str, list[Ranked]]]:
    """{case id: (its query, its ranked documents as chunks)} of a report JSON's cases."""
    out: dict[str, tuple[str, list[Ranked]]] = {}
    for case in report.get("cases") or []:
        if not isinstance(case, dict) or not isinstance(case.get("id"), str):
            continue
        ranked = [
            Ranked(str(d["chunkId"]), str(d.get("docId") or ""))
            for d in case.get("rankedDocuments") or []
            if isinstance(d, dict) and isinstance(d.get("chunkId"), str)
        ]
        out[case["id"]] = (str(case.get("query") or ""), ranked)
    return out


class QueueError(ValueError):
    """A report or comparison that `sieve golden pool` cannot read; the message names the file."""


@dataclass(frozen=True)
class QueueEntry:
    """One case's queued ids (`query` None: take the case's own; `ids` chunks, or documents whose chunk is
    chosen when the pool is built)."""

    case_id: str
    query: str | None
    knowledge_tag: str | None
    ids: tuple[Ranked, ...]

    def to_json(self, source: str, at: str) -> dict[str, JsonValue]:
        """The entry's line of the queue file, queued from `source` at `at`."""
        return {
            "caseId": self.case_id,
            "query": self.query,
            "knowledgeTag": self.knowledge_tag,
            "ids": [{"id": r.chunk_id, "docId": r.doc_id} for r in self.ids],
            "from": source,
            "queuedAt": at,
        }


def unjudged_keys(case: Mapping[str, Any], k: int) -> list[str]:
    """A report case's unjudged ids in its top K: the report's own `unjudged` when the report has it, else
    the match keys of the top K that are neither in `expected` (grade 0 included: judged) nor in
    `forbiddenDocIds`, in rank order, each once."""
    if isinstance(case.get("unjudged"), list):
        return [str(i) for i in case["unjudged"]]
    judged = set(case.get("expected") or {}) | set(case.get("forbiddenDocIds") or [])
    out: list[str] = []
    for d in (case.get("rankedDocuments") or [])[:k]:
        key = _match_key(d, str(case.get("matchOn") or "doc"))
        if key and key not in judged and key not in out:
            out.append(key)
    return out


def _match_key(ranked: Mapping[str, Any], match_on: str) -> str:
    field_name = {"doc": "docId", "chunk": "chunkId", "source": "source"}.get(match_on, "docId")
    return str(ranked.get(field_name) or "")


def queue_from_report(document: Mapping[str, Any], path: str, top_k: int | None = None) -> list[QueueEntry]:
    """The unjudged top-K ids of every case of a report JSON, or of the changed cases of a comparison JSON
    (`sieve compare --json`), as queue entries. A report's ids come with their chunks (from
    `rankedDocuments`); a comparison names documents only (its `unjudged` lists, else the new top of each
    fixed/broken case), their chunks are chosen when the pool is built. `top_k` cuts each case's K
    (never deepens it: a report holds its top K only). Raises QueueError for anything else."""
    if top_k is not None and top_k < 1:
        raise QueueError(f"--top-k must be at least 1, got {top_k}")
    if isinstance(document.get("cases"), list) and isinstance(document.get("run"), dict):
        if document.get("status") != "ok":
            raise QueueError(
                f"{path}: the report's run did not evaluate anything (status {document.get('status')!r})"
            )
        return _queue_from_cases(document["cases"], top_k)
    if isinstance(document.get("cases"), dict) and "baseline" in document:
        return _queue_from_comparison(document)
    raise QueueError(f"{path}: neither a Sieve report (run, cases) nor a comparison (baseline, cases)")


def _queue_from_cases(cases: Sequence[Any], top_k: int | None) -> list[QueueEntry]:
    out: list[QueueEntry] = []
    for case in cases:
        if not isinstance(case, dict) or not isinstance(case.get("id"), str):
            continue
        k = int(case.get("topK") or len(case.get("rankedDocuments") or []) or 0)
        k = min(k, top_k) if top_k else k
        keys = set(unjudged_keys(case, k))
        match_on = str(case.get("matchOn") or "doc")
        ids: list[Ranked] = []
        for d in (case.get("rankedDocuments") or [])[:k]:
            if isinstance(d, dict) and _match_key(d, match_on) in keys and isinstance(d.get("chunkId"), str):
                ranked = Ranked(d["chunkId"], str(d.get("docId") or ""))
                if ranked not in ids:
                    ids.append(ranked)
        if ids:
            out.append(
                QueueEntry(
                    case["id"], str(case.get("query") or "") or None, case.get("knowledgeTag"), tuple(ids)
                )
            )
    return out


def _queue_from_comparison(comparison: Mapping[str, Any]) -> list[QueueEntry]:
    details = comparison.get("caseDetails") or {}
    changes = comparison.get("cases") or {}
    found: dict[str, list[str]] = {}
    for kind in ("fixed", "broken", "improved", "worsened"):
        for item in changes.get(kind) or []:
            case_id = item if isinstance(item, str) else item.get("id") if isinstance(item, dict) else None
            if not isinstance(case_id, str):
                continue
            listed = None
            for source in (item, details.get(case_id)):
                if isinstance(source, dict):
                    for name in ("unjudged", "newUnjudged", "unjudgedIds"):
                        if isinstance(source.get(name), list):
                            listed = [str(i) for i in source[name]]
                            break
                if listed is not None:
                    break
            if listed is None and isinstance(details.get(case_id), dict):
                listed = [str(i) for i in details[case_id].get("now") or []]
            for doc in listed or []:
                found.setdefault(case_id, [])
                if doc not in found[case_id]:
                    found[case_id].append(doc)
    return [
        QueueEntry(
            case_id,
            (details.get(case_id) or {}).get("query") if isinstance(details.get(case_id), dict) else None,
            None,
            tuple(Ranked(None, doc) for doc in docs),
        )
        for case_id, docs in found.items()
        if docs
    ]


def write_queue(path: Path, entries: Sequence[QueueEntry], source: str) -> None:
    """Replace the queue file with `entries` (JSONL, one case a line), all at once."""
    from app.files import atomic_write_text

    at = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, render_jsonl(e.to_json(source, at) for e in entries))


def read_queue(path: str | Path) -> list[QueueEntry]:
    """The queue file's entries; a missing file is an empty queue. A line that is not a queue entry is
    skipped and logged with its file and line (`read_queue_lenient` returns them); QueueError only when the
    file cannot be read."""
    entries, problems = read_queue_lenient(path)
    for problem in problems:
        log.warning("label queue: skipped %s", problem)
    return entries


def read_queue_lenient(path: str | Path) -> tuple[list[QueueEntry], list[str]]:
    """The queue file's entries and one `file:line: problem` for each line that is not one."""
    try:
        parsed = read_jsonl(path)
    except OSError as exc:
        raise QueueError(f"{path}: cannot read the queue: {exc}") from None
    out: list[QueueEntry] = []
    for number, value in parsed.values:
        try:
            ids = tuple(
                Ranked(None if i.get("id") is None else str(i["id"]), str(i.get("docId") or ""))
                for i in value["ids"]
            )
            out.append(QueueEntry(str(value["caseId"]), value.get("query"), value.get("knowledgeTag"), ids))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            parsed.refuse(number, f"not a queue entry ({type(exc).__name__}: {exc})")
    return out, parsed.messages()


# -- building the pools ------------------------------------------------------------------------------


class ChunkSource(Protocol):
    """What the pools read of the store (`ChromaStore` has both)."""

    def chunks(self, ids: Sequence[str]) -> Mapping[str, StoredChunk]: ...

    def metadata_of(self, chunk_ids: Sequence[str], doc_ids: Sequence[str]) -> dict[str, ChunkMetadata]: ...


class Retriever(Protocol):
    def retrieve_many(
        self, requests: Sequence[RetrievalRequest], today: date | None = None
    ) -> list[RetrievalResult | Exception]: ...


@dataclass(frozen=True)
class PoolQuery:
    case_id: str
    query: str
    knowledge_tag: str | None
    k: int


@dataclass
class PoolChunk:
    """A pool entry with what the page shows of its chunk (`in_index` False: only a report knows it)."""

    entry: PoolEntry
    title: str
    source: str
    text: str
    in_index: bool = True


@dataclass
class Pool:
    query: PoolQuery
    chunks: list[PoolChunk]
    errors: dict[str, str] = field(default_factory=dict)  # variant -> why it has no list for this query


def resolve_queued(
    queued: Sequence[Ranked],
    query: str,
    pooled: Mapping[str, str],
    store: ChunkSource,
    best_of: Callable[[str, Sequence[str]], str | None],
) -> list[Ranked]:
    """Queued ids with their chunks: a queued id without a chunk id that is a chunk id in the store (a
    chunk-level case's) is that chunk; a document gets its chunk already in the pool (`pooled`: chunk id ->
    doc id), else the chunk `best_of(query, chunk ids)` picks (the best BM25 match); an id the store does
    not hold is left out."""
    out: list[Ranked] = []
    wanted = [r.doc_id for r in queued if r.chunk_id is None]
    by_doc: dict[str, list[str]] = {}
    pooled_docs: dict[str, str] = {}
    for chunk, doc in pooled.items():
        pooled_docs.setdefault(doc, chunk)
    missing = [d for d in wanted if d not in pooled_docs]
    as_chunk: dict[str, str] = {}  # a chunk-level case queues chunk ids: id -> its document
    if missing:
        for chunk, meta in store.metadata_of(missing, missing).items():
            doc = str(meta.get("doc_id", ""))
            by_doc.setdefault(doc, []).append(chunk)
            if chunk in missing:
                as_chunk[chunk] = doc
    for r in queued:
        if r.chunk_id is not None:
            out.append(r)
        elif r.doc_id in as_chunk:
            out.append(Ranked(r.doc_id, as_chunk[r.doc_id]))
        elif r.doc_id in pooled_docs:
            out.append(Ranked(pooled_docs[r.doc_id], r.doc_id))
        elif by_doc.get(r.doc_id):
            chunk = best_of(query, sorted(by_doc[r.doc_id])) or sorted(by_doc[r.doc_id])[0]
            out.append(Ranked(chunk, r.doc_id))
    return out


def build_pools(
    queries: Sequence[PoolQuery],
    chains: Mapping[str, Retriever],
    store: ChunkSource,
    baseline: Mapping[str, tuple[str, Sequence[Ranked]]] | None = None,
    queued: Mapping[str, Sequence[Ranked]] | None = None,
    best_of: Callable[[str, Sequence[str]], str | None] = lambda query, ids: None,
    today: date | None = None,
) -> dict[str, Pool]:
    """Every query's pool: each chain of `chains` ({variant: chain}) runs all queries in one batch at the
    query's K; `baseline` ({case id: (query, ranked)}) adds its top K for a case whose query is the same;
    `queued` ({case id: ranked}) adds the queued ids. Chunks no chain returned are read from `store`; one
    the store no longer holds is kept with an empty text and `in_index` False. A variant that fails for a
    query is named in that pool's `errors`, and the others still pool."""
    baseline = baseline or {}
    queued = queued or {}
    requests = [RetrievalRequest(q.query, q.k, q.knowledge_tag) for q in queries]
    results: dict[str, list[RetrievalResult | Exception]] = {
        name: chain.retrieve_many(requests, today) if requests else [] for name, chain in chains.items()
    }
    pools: dict[str, Pool] = {}
    for index, query in enumerate(queries):
        lists, shown, errors = _variant_lists(query, {name: r[index] for name, r in results.items()})
        recorded = baseline.get(query.case_id)
        if recorded is not None and recorded[0] == query.query:
            lists[BASELINE] = list(recorded[1][: query.k])
        pooled = {r.chunk_id: r.doc_id for ranked in lists.values() for r in ranked if r.chunk_id}
        if query.case_id in queued:
            lists[QUEUED] = resolve_queued(queued[query.case_id], query.query, pooled, store, best_of)
        pools[query.case_id] = Pool(query, _pool_chunks(merge_pool(lists), shown, store), errors)
    return pools


def _variant_lists(
    query: PoolQuery, outcomes: Mapping[str, RetrievalResult | Exception]
) -> tuple[dict[str, list[Ranked]], dict[str, PoolChunk], dict[str, str]]:
    """(each variant's top K of `query`, the chunks they returned as shown, each failed variant's error)."""
    lists: dict[str, list[Ranked]] = {}
    shown: dict[str, PoolChunk] = {}
    errors: dict[str, str] = {}
    for name, outcome in outcomes.items():
        if not isinstance(outcome, RetrievalResult):
            errors[name] = f"{type(outcome).__name__}: {outcome}"
            continue
        lists[name] = []
        for c in outcome.documents[: query.k]:
            lists[name].append(Ranked(c.chunk_id, c.doc_id))
            shown.setdefault(
                c.chunk_id, PoolChunk(PoolEntry(c.chunk_id, c.doc_id), c.title, c.source, c.text)
            )
    return lists, shown, errors


def _pool_chunks(
    entries: list[PoolEntry], shown: Mapping[str, PoolChunk], store: ChunkSource
) -> list[PoolChunk]:
    """The pool's entries with their title, source and text: as a chain returned them, else read from
    `store` (its document filled in from the chunk's metadata when unknown), else empty and not in the
    index."""
    unread = [e.chunk_id for e in entries if e.chunk_id not in shown]
    stored = store.chunks(unread) if unread else {}
    chunks: list[PoolChunk] = []
    for e in entries:
        if e.chunk_id in shown:
            chunks.append(
                PoolChunk(e, shown[e.chunk_id].title, shown[e.chunk_id].source, shown[e.chunk_id].text)
            )
        elif e.chunk_id in stored:
            meta = stored[e.chunk_id].metadata
            e.doc_id = e.doc_id or str(meta.get("doc_id", ""))
            chunks.append(
                PoolChunk(e, str(meta.get("title", "")), str(meta.get("source", "")), stored[e.chunk_id].text)
            )
        else:
            chunks.append(PoolChunk(e, "", "", "", in_index=False))
    return chunks


def queue_report_file(report: str | Path, queue: str | Path, top_k: int | None = None) -> list[QueueEntry]:
    """`sieve golden pool`: read a report or comparison JSON, and replace the queue file with its unjudged
    top-K ids (`queue_from_report`). Raises QueueError naming the file."""
    path = Path(report)
    if not path.is_file():
        raise QueueError(f"{path}: no such report file")
    document = read_json(path)
    if not isinstance(document, dict):
        raise QueueError(f"{path}: not a JSON object (a report from `sieve eval` or `sieve compare --json`)")
    entries = queue_from_report(document, str(path), top_k)
    write_queue(Path(queue), entries, str(path))
    return entries
