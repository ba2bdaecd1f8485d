"""The golden-set audit: what in the golden set itself makes its verdicts less trustworthy.

`audit_golden_set` is a pure function over the golden set, a view of the index (`IndexView`: every chunk's
document, metadata and, where read, text) and the query vectors; `run_audit` gathers those from a store and
an embedder; `audit_section` is what an evaluation calls (it never raises: an audit that could not run says
why). `sieve golden check` and the report's "Golden-set audit" section show the same `Audit`.

Kinds of finding (each one names its cases):

* duplicateQueries: cases whose queries are equal after `normalise_query` (NFKC, casefold, whitespace
  squeezed, trailing punctuation dropped), whatever their groups.
* nearDuplicateQueries: two cases whose query vectors (the configured embedder, with its query prompt) have
  cosine >= `near_duplicate_cosine` (0.95), not already duplicates, and not in one `group`. Two cases of one
  group are paraphrases of one need and are expected to be close: such pairs are listed apart, as
  `paraphrases`, and are not findings.
* staleIds: an id a case names (expectedDocIds, relevance, forbiddenDocIds, judgments, expectedChunkIds,
  evidenceChunkIds, anyOf, passageChunkId, expectedSources) that the index does not hold, with a suggested
  remap: the ids that now carry the content hash recorded for it by the previous report (`expectedContent`
  of its case records), else, without a recorded hash or when nothing carries it any more, the closest names
  by `difflib` (marked as a guess; chunk ids are hashes, so they get no name guess).
* hardFilterExcluded: a relevant document of a case all of whose chunks the hard filter removes for that
  case's query as of `asOf` (its status, effective dates, denied source, text length, or a knowledgeTag the
  document does not carry), by the hard filter stage's own `reason`; a relevant chunk likewise.
* contentCopies: a relevant or forbidden document of a case whose text (`doc_sha256`) other documents carry
  too, with the copies the case does not judge (retrieving one of those scores as not relevant, or slips past
  forbiddenDocIds).
* relevantAndForbidden: a document relevant in one case and forbidden in another case of the same group.

Coverage (counts, not findings): the documents and knowledge tags of the index that no case touches. A case
touches a document when it expects, judges (any grade) or forbids it, or names one of its chunks or its
source; it touches a knowledge tag when it names it as knowledgeTag or touches a document that carries it.

A case's relevant documents: expectedDocIds and relevance/judgments grades > 0 of document ids, the
documents of its expected, evidence and grade > 0 judged chunks, and the documents carrying its
expectedSources.
"""

from __future__ import annotations

import difflib
import json
import logging
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import TypeAdapter
from pydantic.dataclasses import dataclass as pydantic_dataclass

from app.evaluation.golden.cases import GoldenCase, GoldenSet
from app.evaluation.report.model import (
    NEAR_DUPLICATE_COSINE,
    RECORD_CONFIG,
    Audit,
    ContentCopy,
    Coverage,
    DuplicateQuery,
    Excluded,
    QueryPair,
    RelevantAndForbidden,
    Report,
    StaleId,
    Suggestion,
    TagCoverage,
)
from app.evaluation.report.text import md_text
from app.ingest.ids import text_sha256
from app.retrieval.stages.hard_filter import HardFilterStage
from app.retrieval.types import META_DOC_SHA256, Candidate, QueryContext, knowledge_tag_of, unit_rows
from app.settings import HardFilterSettings

log = logging.getLogger("sieve.evaluation")

NAME_GUESS_CUTOFF = 0.6
NAME_GUESSES = 3
LISTED_UNTOUCHED = 200  # untouched document ids listed (the count is always exact)
EMBED_BATCH = 16  # the query batcher's default max batch: less padding than one large batch
COSINE_BLOCK = 1024  # query rows per block of the pairwise cosine product

FINDING_KINDS = {
    "duplicateQueries": "duplicate queries",
    "nearDuplicateQueries": "near-duplicate queries",
    "staleIds": "stale ids",
    "hardFilterExcluded": "expected but hard-filtered",
    "contentCopies": "content copies",
    "relevantAndForbidden": "relevant and forbidden in one group",
}

# Fields that name ids, the level each id is looked up at ("docOrChunk": a judgments key judges a chunk
# when the index holds a chunk of that id, else a document).
DOC, CHUNK, DOC_OR_CHUNK, SOURCE = "doc", "chunk", "docOrChunk", "source"


# -- the index as the audit sees it -------------------------------------------------------------------


@dataclass
class IndexView:
    """Every chunk's document and metadata, and the texts of the chunks that were read.

    Built by `from_rows` from (chunk id, metadata, text or None) rows; the derived maps: each document's
    chunks (in `position` order), its `doc_sha256` (the chunk metadata written at ingest), the documents of
    each doc_sha256, each read chunk's `text_sha256` and the chunks of each, the documents of each source, and
    each document's knowledge tag."""

    chunk_doc: dict[str, str] = field(default_factory=dict)
    chunk_meta: dict[str, dict[str, Any]] = field(default_factory=dict)
    chunk_text: dict[str, str] = field(default_factory=dict)
    doc_chunks: dict[str, list[str]] = field(default_factory=dict)
    doc_sha: dict[str, str] = field(default_factory=dict)
    docs_by_sha: dict[str, list[str]] = field(default_factory=dict)
    chunk_sha: dict[str, str] = field(default_factory=dict)
    chunks_by_sha: dict[str, list[str]] = field(default_factory=dict)
    source_docs: dict[str, set[str]] = field(default_factory=dict)
    doc_tag: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[str, dict[str, Any], str | None]]) -> IndexView:
        view = cls()
        for chunk_id, meta, text in rows:
            view.chunk_meta[chunk_id] = meta
            if text is not None:
                view.chunk_text[chunk_id] = text
        view._derive()
        return view

    def add_texts(self, texts: dict[str, str]) -> None:
        """Texts read later (of chunks already in the view)."""
        self.chunk_text.update((cid, text) for cid, text in texts.items() if cid in self.chunk_meta)
        self._derive()

    def _derive(self) -> None:
        self.chunk_doc = {cid: str(meta.get("doc_id", "")) for cid, meta in self.chunk_meta.items()}
        chunks: dict[str, list[str]] = {}
        for cid, doc in self.chunk_doc.items():
            chunks.setdefault(doc, []).append(cid)
        self.doc_chunks = {
            doc: sorted(ids, key=lambda c: (_position(self.chunk_meta[c]), c)) for doc, ids in chunks.items()
        }
        self.doc_sha, self.docs_by_sha, self.source_docs, self.doc_tag = {}, {}, {}, {}
        for doc, ids in sorted(self.doc_chunks.items()):
            meta = self.chunk_meta[ids[0]]
            sha = meta.get(META_DOC_SHA256)
            if sha:
                self.doc_sha[doc] = str(sha)
                self.docs_by_sha.setdefault(str(sha), []).append(doc)
            self.doc_tag[doc] = knowledge_tag_of(meta)
            for cid in ids:
                source = self.chunk_meta[cid].get("source")
                if source:
                    self.source_docs.setdefault(str(source), set()).add(doc)
        self.chunk_sha = {cid: text_sha256(text) for cid, text in self.chunk_text.items()}
        self.chunks_by_sha = {}
        for cid, sha in sorted(self.chunk_sha.items()):
            self.chunks_by_sha.setdefault(sha, []).append(cid)

    @property
    def docs(self) -> set[str]:
        return set(self.doc_chunks)

    @property
    def tags(self) -> set[str]:
        return {tag for tag in self.doc_tag.values() if tag is not None}

    def holds(self, ref: Ref) -> str | None:
        """The level `ref.id` resolves to in the index ("doc", "chunk", "source"), or None when stale."""
        if ref.level in (CHUNK, DOC_OR_CHUNK) and ref.id in self.chunk_meta:
            return CHUNK
        if ref.level in (DOC, DOC_OR_CHUNK) and ref.id in self.doc_chunks:
            return DOC
        if ref.level == SOURCE and ref.id in self.source_docs:
            return SOURCE
        return None

    def content_hash(self, ref: Ref) -> str | None:
        """The content hash of what `ref` resolves to: a document's doc_sha256, a chunk's text_sha256."""
        level = self.holds(ref)
        if level == DOC:
            return self.doc_sha.get(ref.id)
        if level == CHUNK:
            return self.chunk_sha.get(ref.id)
        return None


def _position(meta: dict[str, Any]) -> int:
    try:
        return int(meta.get("position", 0))
    except (TypeError, ValueError):
        return 0


# -- what a case names ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ref:
    """One id a case names: the field it is in, the id, the level it is looked up at, and whether it is
    relevant (grade > 0), judged not relevant, forbidden, or only named (passageChunkId)."""

    field: str
    id: str
    level: str
    role: str  # "relevant" | "notRelevant" | "forbidden" | "named"


def case_refs(case: GoldenCase) -> list[Ref]:
    """Every id `case` names, field by field, in the case's order."""
    refs = [Ref("expectedDocIds", i, DOC, "relevant") for i in case.expected_doc_ids]
    refs += [
        Ref("relevance", i, DOC, "relevant" if g > 0 else "notRelevant") for i, g in case.relevance.items()
    ]
    refs += [Ref("forbiddenDocIds", i, DOC, "forbidden") for i in case.forbidden_doc_ids]
    refs += [
        Ref("judgments", i, DOC_OR_CHUNK, "relevant" if g > 0 else "notRelevant")
        for i, g in case.judgments.items()
    ]
    refs += [Ref("expectedChunkIds", i, CHUNK, "relevant") for i in case.expected_chunk_ids]
    refs += [Ref("evidenceChunkIds", i, CHUNK, "relevant") for i in case.evidence_chunk_ids]
    refs += [Ref(f"anyOf[{n}]", i, CHUNK, "relevant") for n, group in enumerate(case.any_of) for i in group]
    if case.passage_chunk_id:
        refs.append(Ref("passageChunkId", case.passage_chunk_id, CHUNK, "named"))
    refs += [Ref("expectedSources", i, SOURCE, "relevant") for i in case.expected_sources]
    return refs


def _ref_docs(ref: Ref, index: IndexView) -> list[str]:
    """The documents `ref` stands for in the index (none when stale)."""
    level = index.holds(ref)
    if level == DOC:
        return [ref.id]
    if level == CHUNK:
        return [index.chunk_doc[ref.id]]
    if level == SOURCE:
        return sorted(index.source_docs[ref.id])
    return []


def relevant_docs(case: GoldenCase, index: IndexView) -> list[str]:
    """The case's relevant documents in the index, as `runner.resolve_case` grades them: a document's own
    grade (expectedDocIds 1, then relevance, then a judgments key that is not a chunk id; the later wins)
    when it has one, else relevant when one of its expected, evidence or grade > 0 judged chunks, or a source
    the case expects, belongs to it. In the order first named."""
    direct = case.relevance_map()
    direct.update({key: float(g) for key, g in case.judgments.items() if key not in index.chunk_meta})
    out = dict.fromkeys(doc for doc, grade in direct.items() if grade > 0 and doc in index.doc_chunks)
    for ref in case_refs(case):
        if ref.role == "relevant" and index.holds(ref) in (CHUNK, SOURCE):
            out.update(dict.fromkeys(doc for doc in _ref_docs(ref, index) if doc not in direct))
    return list(out)


def touched_docs(case: GoldenCase, index: IndexView) -> set[str]:
    """Every document of the index that `case` expects, judges (any grade), forbids, or names a chunk or
    source of."""
    return {doc for ref in case_refs(case) for doc in _ref_docs(ref, index)}


def judged_docs(case: GoldenCase, index: IndexView) -> set[str]:
    """The documents `case` grades or forbids, directly or through one of their chunks (passageChunkId
    aside: naming the passage a question was made from judges nothing)."""
    return {doc for ref in case_refs(case) if ref.role != "named" for doc in _ref_docs(ref, index)}


# -- findings ------------------------------------------------------------------------------------------


@pydantic_dataclass(config=RECORD_CONFIG)
class AuditResult(Audit):
    """The audit as run (`sieve golden check --json`): the report's `Audit` and, per case id, {id: content
    hash} of every id the case names that the index holds (doc_sha256 for a document, text_sha256 for a
    chunk) and the recorded hash carried over for a stale one; `attach_audit` moves these into the case
    records."""

    expected_content: dict[str, dict[str, str]] = field(default_factory=dict)


def audit_json(audit: Audit) -> dict[str, Any]:
    """The audit's JSON (`sieve golden check --json`): its model dump by alias."""
    return TypeAdapter(type(audit)).dump_python(audit, mode="json", by_alias=True)


def normalise_query(text: str) -> str:
    """NFKC, casefold, every run of whitespace squeezed to one space, then trailing punctuation (Unicode
    category P*) and whitespace dropped: "  When's  PAYDAY？ " -> "when's payday"."""
    folded = " ".join(unicodedata.normalize("NFKC", text).casefold().split())
    end = len(folded)
    while end and (folded[end - 1].isspace() or unicodedata.category(folded[end - 1]).startswith("P")):
        end -= 1
    return folded[:end]


def duplicate_queries(cases: Sequence[GoldenCase]) -> list[DuplicateQuery]:
    """Sets of two or more cases whose `normalise_query` texts are equal, in golden-set order."""
    by_text: dict[str, list[str]] = {}
    for case in cases:
        by_text.setdefault(normalise_query(case.query), []).append(case.id)
    return [DuplicateQuery(text, ids) for text, ids in by_text.items() if len(ids) > 1]


def near_duplicate_pairs(vectors: np.ndarray, threshold: float) -> list[tuple[int, int, float]]:
    """Every pair (i, j), i < j, of rows of `vectors` whose cosine u_i · u_j >= `threshold` (u = the row
    scaled to length 1; a row of no length pairs with nothing), with that cosine; in (i, j) order.
    Computed a block of rows at a time, so memory stays COSINE_BLOCK x n."""
    rows = np.asarray(vectors, dtype=float)
    if rows.ndim != 2 or len(rows) < 2:
        return []
    units = np.nan_to_num(unit_rows(rows), nan=0.0)
    pairs: list[tuple[int, int, float]] = []
    for start in range(0, len(units), COSINE_BLOCK):
        block = units[start : start + COSINE_BLOCK] @ units.T
        for offset, row in enumerate(block):
            i = start + offset
            for j in np.nonzero(row[i + 1 :] >= threshold)[0]:
                pairs.append((i, i + 1 + int(j), float(row[i + 1 + int(j)])))
    return pairs


def query_pairs(
    cases: Sequence[GoldenCase], vectors: np.ndarray, threshold: float
) -> tuple[list[QueryPair], list[QueryPair]]:
    """(near duplicates, paraphrases): the `near_duplicate_pairs` of the cases' query vectors (row i is
    cases[i]'s query) whose normalised texts differ; a pair of one group is a paraphrase, any other pair a
    near duplicate. Cosines rounded to 4 decimals."""
    near: list[QueryPair] = []
    paraphrases: list[QueryPair] = []
    for i, j, cosine in near_duplicate_pairs(vectors, threshold):
        a, b = cases[i], cases[j]
        if normalise_query(a.query) == normalise_query(b.query):
            continue  # a duplicate, listed as one
        same_group = a.group is not None and a.group == b.group
        pair = QueryPair([a.id, b.id], [a.query, b.query], round(cosine, 4), a.group if same_group else None)
        (paraphrases if same_group else near).append(pair)
    return near, paraphrases


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


def suggest(ref: Ref, index: IndexView, recorded: dict[str, str]) -> tuple[Suggestion | None, str]:
    """The remap of stale `ref`: the ids that carry its recorded content hash now (at its level: documents
    by doc_sha256, chunks by text_sha256; a judgments key either), else the closest names by difflib
    (ratio >= NAME_GUESS_CUTOFF, at most NAME_GUESSES; none for chunk ids, which are hashes), with a note."""
    sha = recorded.get(ref.id)
    if sha is not None:
        ids: list[str] = []
        if ref.level in (DOC, DOC_OR_CHUNK):
            ids += index.docs_by_sha.get(sha, [])
        if ref.level in (CHUNK, DOC_OR_CHUNK):
            ids += index.chunks_by_sha.get(sha, [])
        if ids:
            return Suggestion(ids, "contentHash", False), "same content now under " + ", ".join(ids)
        why = "its recorded content is in no document or chunk now (changed or removed)"
    else:
        why = "no content hash recorded for it by the previous report"
    if ref.level == CHUNK:
        return None, why + "; chunk ids carry no name to guess from"
    pool = sorted(index.source_docs if ref.level == SOURCE else index.docs)
    close = difflib.get_close_matches(ref.id, pool, n=NAME_GUESSES, cutoff=NAME_GUESS_CUTOFF)
    if close:
        return Suggestion(close, "name", True), why + "; a guess by name: " + ", ".join(close)
    return None, why + "; no similar name"


def stale_ids(cases: Sequence[GoldenCase], index: IndexView, recorded: dict[str, str]) -> list[StaleId]:
    """Every id a case names that the index does not hold, once per case (`field` lists every field that
    names it, e.g. "expectedDocIds, relevance"), with `suggest`'s remap."""
    out = []
    for case in cases:
        stale: dict[str, list[Ref]] = {}
        for ref in case_refs(case):
            if index.holds(ref) is None:
                stale.setdefault(ref.id, []).append(ref)
        for refs in stale.values():
            suggestion, note = suggest(refs[0], index, recorded)
            fields = ", ".join(dict.fromkeys(r.field for r in refs))
            out.append(StaleId(case.id, fields, refs[0].id, refs[0].level, suggestion, note))
    return out


def expected_content(case: GoldenCase, index: IndexView, recorded: dict[str, str]) -> dict[str, str]:
    """{id: content hash} of every id `case` names (sources aside): the index's hash when it holds the id
    (and its hash is known), else the hash `recorded` for it, so a remap survives later runs."""
    out: dict[str, str] = {}
    for ref in case_refs(case):
        if ref.level == SOURCE or ref.id in out:
            continue
        sha = index.content_hash(ref) if index.holds(ref) else recorded.get(ref.id)
        if sha is not None:
            out[ref.id] = sha
    return out


def hard_filter_excluded(
    cases: Sequence[GoldenCase], index: IndexView, settings: HardFilterSettings, as_of: date
) -> list[Excluded]:
    """Relevant documents (and relevant chunks of documents not reported) that the hard filter stage's
    `reason` removes for the case's query (its knowledgeTag, its own asOf else `as_of`): a document when it
    removes every chunk of it. With the hard filter disabled only the knowledge-tag rule applies (candidates
    are taken among the chunks of the query's tag whatever the stages do)."""
    if not settings.enabled:
        settings = HardFilterSettings(
            excluded_statuses=[], check_effective_dates=False, denied_sources=[], min_text_chars=0
        )
    stage = HardFilterStage(settings)
    out = []
    for case in cases:
        query = QueryContext(text=case.query, knowledge_tag=case.knowledge_tag, today=case.as_of or as_of)

        def reason(chunk_id: str, query: QueryContext = query) -> str | None:
            candidate = Candidate(
                chunk_id,
                index.chunk_doc[chunk_id],
                index.chunk_text.get(chunk_id, ""),
                index.chunk_meta[chunk_id],
            )
            return stage.reason(query, candidate)

        reported: set[str] = set()
        for doc in relevant_docs(case, index):
            reasons = [reason(cid) for cid in index.doc_chunks[doc]]
            if all(r is not None for r in reasons):
                out.append(Excluded(case.id, doc, DOC, list(dict.fromkeys(r for r in reasons if r))))
                reported.add(doc)
        for ref in case_refs(case):
            if (
                ref.role == "relevant"
                and index.holds(ref) == CHUNK
                and index.chunk_doc[ref.id] not in reported
            ):
                why = reason(ref.id)
                if why is not None:
                    out.append(Excluded(case.id, ref.id, CHUNK, [why]))
    return out


def content_copies(cases: Sequence[GoldenCase], index: IndexView) -> list[ContentCopy]:
    """Each relevant or forbidden document of a case that shares its doc_sha256 with other documents, with
    those copies and the ones the case does not judge."""
    out = []
    for case in cases:
        judged = judged_docs(case, index)
        named = [(doc, "relevant") for doc in relevant_docs(case, index)]
        named += [
            (doc, "forbidden") for doc in dict.fromkeys(case.forbidden_doc_ids) if doc in index.doc_chunks
        ]
        for doc, role in named:
            sha = index.doc_sha.get(doc)
            copies = [d for d in index.docs_by_sha.get(sha, []) if d != doc] if sha else []
            if copies:
                out.append(ContentCopy(case.id, doc, role, copies, [d for d in copies if d not in judged]))
    return out


def relevant_and_forbidden(cases: Sequence[GoldenCase], index: IndexView) -> list[RelevantAndForbidden]:
    """Per group, each document relevant in one of its cases and forbidden in another (by group, then id)."""
    groups: dict[str, list[GoldenCase]] = {}
    for case in cases:
        if case.group is not None:
            groups.setdefault(case.group, []).append(case)
    out = []
    for name, members in sorted(groups.items()):
        relevant: dict[str, list[str]] = {}
        forbidden: dict[str, list[str]] = {}
        for case in members:
            for doc in relevant_docs(case, index):
                relevant.setdefault(doc, []).append(case.id)
            for doc in dict.fromkeys(case.forbidden_doc_ids):
                forbidden.setdefault(doc, []).append(case.id)
        for doc in sorted(set(relevant) & set(forbidden)):
            out.append(RelevantAndForbidden(name, doc, relevant[doc], forbidden[doc]))
    return out


def coverage(cases: Sequence[GoldenCase], index: IndexView) -> Coverage:
    """The documents no case touches (`touched_docs`) and, per knowledge tag of the index, its documents,
    its untouched documents and the cases touching it (naming it as knowledgeTag or touching a document
    that carries it)."""
    touched_by = {case.id: touched_docs(case, index) for case in cases}
    touched = set().union(*touched_by.values()) if touched_by else set()
    untouched = sorted(index.docs - touched)
    tags = []
    for tag in sorted(index.tags):
        docs = {d for d, t in index.doc_tag.items() if t == tag}
        touching = [c.id for c in cases if c.knowledge_tag == tag or touched_by[c.id] & docs]
        tags.append(TagCoverage(tag, len(docs), len(docs - touched), len(touching)))
    return Coverage(
        documents=len(index.docs),
        untouched_count=len(untouched),
        untouched_documents=untouched[:LISTED_UNTOUCHED],
        tags=tags,
        untouched_tags=[t.tag for t in tags if t.cases == 0],
    )


def audit_golden_set(
    golden: GoldenSet,
    index: IndexView,
    vectors: np.ndarray,
    hard_filter: HardFilterSettings,
    as_of: date,
    recorded: dict[str, str] | None = None,
    near_duplicate_cosine: float = NEAR_DUPLICATE_COSINE,
) -> AuditResult:
    """Every finding and the coverage of `golden` against `index`; row i of `vectors` is the query vector
    of golden.cases[i]; `recorded`: the content hashes the previous report recorded (`previous_content`)."""
    cases = golden.cases
    if len(vectors) != len(cases):
        raise ValueError(f"{len(vectors)} query vectors for {len(cases)} cases")
    recorded = recorded or {}
    near, paraphrases = query_pairs(cases, vectors, near_duplicate_cosine)
    audit = AuditResult(
        ran=True,
        golden_set=golden.path,
        cases=len(cases),
        as_of=as_of.isoformat(),
        near_duplicate_cosine=near_duplicate_cosine,
        duplicate_queries=duplicate_queries(cases),
        near_duplicate_queries=near,
        paraphrases=paraphrases,
        stale_ids=stale_ids(cases, index, recorded),
        hard_filter_excluded=hard_filter_excluded(cases, index, hard_filter, as_of),
        content_copies=content_copies(cases, index),
        relevant_and_forbidden=relevant_and_forbidden(cases, index),
        coverage=coverage(cases, index),
        expected_content={case.id: expected_content(case, index, recorded) for case in cases},
    )
    audit.findings = {kind: len(getattr(audit, _attr(kind))) for kind in FINDING_KINDS}
    audit.summary = summary_line(audit)
    return audit


def _attr(kind: str) -> str:
    return "".join("_" + ch.lower() if ch.isupper() else ch for ch in kind)


# -- gathering from a store and an embedder -----------------------------------------------------------


@dataclass(frozen=True)
class AuditSource:
    """What the audit reads besides the golden set: the store (`iter_all`, `get`), the embedder
    (`embed_queries`, which applies its query prompt, and `name`) and the hard filter's settings."""

    store: Any
    embedder: Any
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


def load_index(store: Any, golden: GoldenSet, recorded: dict[str, str]) -> IndexView:
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
            for doc in _ref_docs(ref, index):
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


def previous_report_path(settings: Any) -> Path:
    """The previous report an audit reads recorded content hashes from: `<output_dir>/<prefix>-latest.json`
    of `settings` (`EvaluateSettings`), as it is before this run writes its own."""
    return Path(settings.output_dir) / f"{settings.report_prefix}-latest.json"


def audit_section(golden: GoldenSet, source: AuditSource | None, settings: Any) -> AuditResult:
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
        record.expected_content = dict(audit.expected_content.get(record.id, {}))
    report.audit = Audit(**{f.name: getattr(audit, f.name) for f in fields(Audit)})


# -- rendering -----------------------------------------------------------------------------------------


def summary_line(audit: Audit) -> str:
    """One line: the findings by kind (or none) and the coverage."""
    if not audit.ran:
        return audit.error or "not run"
    counts = audit.findings
    total = sum(counts.values())
    parts = [f"{FINDING_KINDS[k]} {n}" for k, n in counts.items() if n]
    head = f"{total} finding{'s' if total != 1 else ''}" + (f" ({', '.join(parts)})" if parts else "")
    cov = audit.coverage
    tail = (
        f"; untouched by any case: {cov.untouched_count if cov else 0} of {cov.documents if cov else 0} "
        f"documents, {len(cov.untouched_tags) if cov else 0} of {len(cov.tags) if cov else 0} knowledge tags"
    )
    para = audit.paraphrases
    if para:
        tail += f"; {len(para)} paraphrase pair{'s' if len(para) != 1 else ''} within a group (expected)"
    return head + tail


def finding_lines(audit: Audit) -> list[tuple[str, list[str]]]:
    """(heading, one line per finding) for each kind of finding, in FINDING_KINDS order."""
    threshold = audit.near_duplicate_cosine
    return [
        (
            "Duplicate queries (same text once normalised)",
            [f"{', '.join(d.cases)}: {d.normalised!r}" for d in audit.duplicate_queries],
        ),
        (
            f"Near-duplicate queries (cosine >= {threshold:g}, not of one group)",
            [
                f"{p.cases[0]}, {p.cases[1]}: cosine {p.cosine:.4f}: {p.queries[0]!r} / {p.queries[1]!r}"
                for p in audit.near_duplicate_queries
            ],
        ),
        (
            "Stale ids (not in the index)",
            [f"{s.case}: {s.field} {s.id!r}: {s.note}" for s in audit.stale_ids],
        ),
        (
            f"Relevant but removed by the hard filter as of {audit.as_of}",
            [f"{e.case}: {e.level} {e.id}: {'; '.join(e.reasons)}" for e in audit.hard_filter_excluded],
        ),
        (
            "Content copies under other ids (same doc_sha256)",
            [
                f"{c.case}: {c.role} {c.id} = {', '.join(c.copies)}"
                + (f" (not judged in the case: {', '.join(c.unjudged_copies)})" if c.unjudged_copies else "")
                for c in audit.content_copies
            ],
        ),
        (
            "Relevant in one case, forbidden in another of the same group",
            [
                f"group {r.group}: {r.id} relevant in {', '.join(r.relevant_in)}, "
                f"forbidden in {', '.join(r.forbidden_in)}"
                for r in audit.relevant_and_forbidden
            ],
        ),
    ]


def paraphrase_lines(audit: Audit) -> tuple[str, list[str]]:
    """(heading, lines) of the paraphrase pairs: information, not findings."""
    threshold = audit.near_duplicate_cosine
    return (
        f"Paraphrases of one group at cosine >= {threshold:g} (expected; not findings)",
        [f"group {p.group}: {p.cases[0]}, {p.cases[1]}: cosine {p.cosine:.4f}" for p in audit.paraphrases],
    )


def coverage_lines(audit: Audit) -> list[str]:
    """The coverage in lines: untouched documents (listed), then one line per knowledge tag."""
    cov = audit.coverage or Coverage(0, 0, [], [], [])
    listed = cov.untouched_documents
    more = cov.untouched_count - len(listed)
    lines = [
        f"{cov.untouched_count} of {cov.documents} documents no case touches"
        + (": " + ", ".join(listed) if listed else "")
        + (f" ... and {more} more" if more > 0 else "")
    ]
    lines += [
        f"knowledge tag {t.tag}: {t.documents} documents, {t.untouched_documents} untouched, {t.cases} cases"
        for t in cov.tags
    ]
    if cov.untouched_tags:
        lines.append("knowledge tags no case touches: " + ", ".join(cov.untouched_tags))
    return lines


def audit_text(audit: Audit) -> str:
    """The plain text `sieve golden check` prints: the findings grouped by kind (with case ids), the
    paraphrases, the coverage, and the one-line summary last."""
    if not audit.ran:
        return f"golden-set audit {summary_line(audit)}\n"
    lines = [
        f"golden-set audit of {audit.golden_set} ({audit.cases} cases) as of {audit.as_of}; embedder "
        f"{audit.embedder}; recorded hashes: {audit.previous_report}",
        "",
    ]
    for heading, items in [*finding_lines(audit), paraphrase_lines(audit)]:
        lines.append(f"{heading}: {len(items)}")
        lines += [f"  {item}" for item in items]
    lines.append("Coverage:")
    lines += [f"  {line}" for line in coverage_lines(audit)]
    lines += ["", "summary: " + summary_line(audit)]
    return "\n".join(lines) + "\n"


def audit_markdown(audit: Audit | None) -> list[str]:
    """The report's "Golden-set audit" section, led by a blank line (nothing when the report has no
    `audit`)."""
    if audit is None:
        return []
    out = ["", "## Golden-set audit", ""]
    if not audit.ran:
        return [*out, f"The audit {summary_line(audit)}."]
    out.append(
        f"{summary_line(audit)}. As of {audit.as_of}; near duplicates at cosine >= "
        f"{audit.near_duplicate_cosine:g} with {audit.embedder}; stale-id "
        f"remaps from {audit.previous_report}. Findings are information: they fail no gate."
    )
    for heading, items in [*finding_lines(audit), paraphrase_lines(audit)]:
        if items:
            out += ["", f"**{heading}** ({len(items)})", ""] + [f"- {_md(item)}" for item in items]
    out += ["", "**Coverage**", ""] + [f"- {_md(line)}" for line in coverage_lines(audit)]
    return out


def _md(text: str) -> str:
    """A finding's line (it names case ids, queries and document ids) made safe for the Markdown report."""
    return md_text(text.replace("\n", " ")).replace("|", "\\|")
