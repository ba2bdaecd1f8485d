"""The golden-set audit: what in the golden set itself makes its verdicts less trustworthy.

`audit_golden_set` is a pure function over the golden set, a view of the index (`IndexView`, app/evaluation/
golden/audit/index.py) and the query vectors; `source.run_audit` gathers those from a store and an embedder.
`sieve golden check` and the report's "Golden-set audit" section show the same `Audit`.

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
import unicodedata
from collections.abc import Sequence
from dataclasses import field
from datetime import date

import numpy as np
from pydantic.dataclasses import dataclass as pydantic_dataclass

from app.evaluation.golden.audit.index import (
    CHUNK,
    DOC,
    DOC_OR_CHUNK,
    SOURCE,
    IndexView,
    Ref,
    case_refs,
    judged_docs,
    relevant_docs,
    touched_docs,
)
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
    StaleId,
    Suggestion,
    TagCoverage,
)
from app.retrieval.stages.hard_filter import HardFilterStage
from app.retrieval.types import Candidate, QueryContext, unit_rows
from app.settings import HardFilterSettings

NAME_GUESS_CUTOFF = 0.6
NAME_GUESSES = 3
LISTED_UNTOUCHED = 200  # untouched document ids listed (the count is always exact)
COSINE_BLOCK = 1024  # query rows per block of the pairwise cosine product

FINDING_KINDS = {
    "duplicateQueries": "duplicate queries",
    "nearDuplicateQueries": "near-duplicate queries",
    "staleIds": "stale ids",
    "hardFilterExcluded": "expected but hard-filtered",
    "contentCopies": "content copies",
    "relevantAndForbidden": "relevant and forbidden in one group",
}
# a finding of the evaluation's run, not of `run_audit`: cases whose principal may read none of the chunks
# of an expected id (their losses say ACL_FILTERED); counted when the cases ran scoped
ACL_FILTERED_FINDING = "aclFiltered"
FINDING_LABELS = {**FINDING_KINDS, ACL_FILTERED_FINDING: "expected but out of the principal's scope"}


@pydantic_dataclass(config=RECORD_CONFIG)
class AuditResult(Audit):
    """The audit as run (`sieve golden check --json`): the report's `Audit` and, per case id, {id: content
    hash} of every id the case names that the index holds (doc_sha256 for a document, text_sha256 for a
    chunk) and the recorded hash carried over for a stale one; `attach_audit` moves these into the case
    records."""

    expected_content: dict[str, dict[str, str]] = field(default_factory=dict)


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


def summary_line(audit: Audit) -> str:
    """One line: the findings by kind (or none) and the coverage."""
    if not audit.ran:
        return audit.error or "not run"
    counts = audit.findings
    total = sum(counts.values())
    parts = [f"{FINDING_LABELS.get(k, k)} {n}" for k, n in counts.items() if n]
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
