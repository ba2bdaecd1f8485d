"""A case's evidence on this index: chunk ids and quotes as one kind of item, and what a ranking returns.

An evidence group holds chunk ids and quotes (`GoldenCase.evidence_groups`). On an index each item becomes a
key: a chunk id stays itself; a quote resolved to the span `[start, end)` of its document's normalised text
becomes "docId[start:end]" (`quotes.quote_key`). A chunk id is returned when a returned chunk (or a chunk
attached to one) is that chunk; a quote when the returned chunks' spans cover it (`quotes.is_returned`, the
coverage rule). EvidenceRecall and EvidenceHit then read the keys returned; the character figures read the
spans (app/evaluation/scoring/characters.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.evaluation.golden.cases import EvidenceItem, EvidenceQuote, GoldenCase, GoldenSet, GoldenSetError
from app.evaluation.golden.quotes import QuoteProblem, find_quote, is_returned, quote_key
from app.evaluation.scoring import characters, metrics
from app.ingest.chunker import CHAR_END, CHAR_START, DOC_SHA256
from app.ingest.ids import text_sha256
from app.ingest.spans import DocSpan, Span, by_document, normalise
from app.store import StoreError

# document ids -> their normalised texts on this index (those it can tell)
TextSource = Callable[[Sequence[str]], dict[str, str]]


@dataclass
class EvidenceIndex:
    """What the index tells of evidence: each chunk's span (chunks that carry one), each document's chunks,
    and where each quote of the golden set resolved (`resolve_quotes`)."""

    spans: dict[str, DocSpan] = field(default_factory=dict)
    doc_chunks: dict[str, list[str]] = field(default_factory=dict)
    quotes: dict[tuple[str, str], Span] = field(default_factory=dict)
    doc_hashes: dict[str, str] = field(default_factory=dict)  # `ids.text_sha256` of each document's text

    def add(self, chunk_id: str, doc_id: str, meta: Mapping[str, Any]) -> None:
        self.doc_chunks.setdefault(doc_id, []).append(chunk_id)
        if isinstance(meta.get(DOC_SHA256), str):
            self.doc_hashes[doc_id] = str(meta[DOC_SHA256])
        span = chunk_span(doc_id, meta)
        if span is not None:
            self.spans[chunk_id] = span

    def holders(self, quote: DocSpan) -> list[str]:
        """The chunks of this index whose span overlaps `quote`, in document order."""
        doc_id, start, end = quote
        found = [(self.spans[c][1], c) for c in self.doc_chunks.get(doc_id, ()) if c in self.spans]
        return [c for s, c in sorted(found) if s < end and self.spans[c][2] > start]


def chunk_span(doc_id: str, meta: Mapping[str, Any]) -> DocSpan | None:
    """(doc id, char_start, char_end) of a chunk's metadata, None when it carries no span (an old store)."""
    start, end = meta.get(CHAR_START), meta.get(CHAR_END)
    if isinstance(start, int) and isinstance(end, int):
        return doc_id, start, end
    return None


def document_texts(store: Any, record: Any, index: EvidenceIndex) -> TextSource:
    """Where quotes are looked up: each document's normalised text from the document record when the record
    holds the very text the index was made from (same `text_sha256`), else rebuilt from the index's own
    chunks laid at their spans (a heading line, in no chunk, is then a gap no quote matches across)."""

    def texts(doc_ids: Sequence[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for doc in _recorded(record, doc_ids):
            if index.doc_hashes.get(doc.doc_id) in (None, text_sha256(doc.text)):
                out[doc.doc_id] = normalise(doc.text)
        for doc_id in (d for d in doc_ids if d not in out):
            out[doc_id] = _from_chunks(store.get(index.doc_chunks.get(doc_id, []), include_embeddings=False))
        return out

    return texts


def _recorded(record: Any, doc_ids: Sequence[str]) -> list[Any]:
    """The record's documents of `doc_ids`; none when there is no record or it cannot be read (the chunks
    then tell the texts)."""
    if record is None:
        return []
    try:
        return list(record.get(list(doc_ids)))
    except StoreError:
        return []


def _from_chunks(chunks: Sequence[Any]) -> str:
    """A document's normalised text as its chunks hold it: each chunk's text normalised at its span, the
    characters no chunk holds as NUL (never in a quote, so no quote matches across a gap)."""
    placed = [(c.metadata.get(CHAR_START), normalise(c.text)) for c in chunks]
    placed = [(s, t) for s, t in placed if isinstance(s, int)]
    text = ["\0"] * max((s + len(t) for s, t in placed), default=0)
    for start, chunk_text in placed:
        text[start : start + len(chunk_text)] = chunk_text
    return "".join(text)


def quoted(golden: GoldenSet) -> list[tuple[GoldenCase, EvidenceQuote]]:
    """Every quote of the scored cases (drafts left out), with its case: evidence, anyOf, judgedQuotes."""
    out: list[tuple[GoldenCase, EvidenceQuote]] = []
    for case in golden.cases:
        if case.draft:
            continue
        items = [i for g in case.evidence_groups() for i in g if isinstance(i, EvidenceQuote)]
        out += [(case, q) for q in [*items, *case.judged_quotes]]
    return out


def resolve_quotes(
    golden: GoldenSet, index: EvidenceIndex, texts: TextSource | None, coverage: float = 1.0
) -> None:
    """Resolve every quote of `golden` on this index into `index.quotes`. A quote whose document the index
    does not hold stays unresolved (a real miss: it scores 0, as a missing document does). Raises
    `GoldenSetError` naming the file, case and quote of each quote found nowhere in its document's text,
    found twice or more, or found where no ranking could return it: even all of its document's chunks
    together do not cover `coverage` of it (it lies in a heading line, or the chunks carry no span)."""
    wanted = quoted(golden)
    docs = sorted({q.doc_id for _, q in wanted if q.doc_id in index.doc_chunks})
    if not wanted or not docs:
        return
    if texts is None:
        raise GoldenSetError(golden.path, [f"{golden.path}: quotes need the documents' texts: none given"])
    documents = texts(docs)
    problems: list[QuoteProblem] = []
    for case, quote in wanted:
        text = documents.get(quote.doc_id)
        if text is None:
            continue
        found = find_quote(text, quote.quote)
        if isinstance(found, str):
            why: str | None = found
        else:
            why = _unreachable(index, (quote.doc_id, found[0], found[1]), coverage)
            index.quotes[(quote.doc_id, quote.quote)] = found
        if why is not None:
            problems.append(QuoteProblem(case.id, quote.doc_id, quote.quote, why))
    if problems:
        raise GoldenSetError(golden.path, [p.message(golden.path) for p in problems])


def _unreachable(index: EvidenceIndex, quote: DocSpan, coverage: float) -> str | None:
    """Why no ranking on this index could return `quote` (all of its document's chunks together cover
    less than `coverage` of it), or None."""
    doc_id, start, end = quote
    spans = [index.spans[c][1:] for c in index.doc_chunks.get(doc_id, ()) if c in index.spans]
    if is_returned({doc_id: spans}, quote, coverage):
        return None
    if not spans:
        return (
            f"found at characters {start}-{end}, but the document's chunks carry no character span "
            "(indexed before chunker md-v2): run `sieve store rebuild`"
        )
    return (
        f"found at characters {start}-{end}, but even all of the document's chunks together cover less than "
        f"rag.evaluate.evidence_coverage={coverage:g} of it (a heading line is in no chunk): no ranking "
        "could return it; quote the text under the heading"
    )


@dataclass
class CaseEvidence:
    """One case's evidence on this index: its groups as keys, each key's document, the span of each key
    that has one (quotes, and chunks carrying a span), the chunks that hold each quote (to say where it was
    lost), and the quotes the index cannot place (their document is not in it)."""

    groups: list[list[str]] = field(default_factory=list)
    docs: dict[str, str] = field(default_factory=dict)
    spans: dict[str, DocSpan] = field(default_factory=dict)
    holders: dict[str, list[str]] = field(default_factory=dict)
    unplaced: list[str] = field(default_factory=list)

    def group_spans(self) -> list[list[DocSpan]]:
        """The spans of each group whose every item has one (the character figures read these)."""
        return [[self.spans[k] for k in g] for g in self.groups if all(k in self.spans for k in g)]


def case_evidence(
    groups: Sequence[Sequence[EvidenceItem]], chunk_doc: Mapping[str, str], index: EvidenceIndex
) -> CaseEvidence:
    """The keys, documents and spans of `groups` (usable groups: their chunk ids are in the index)."""
    out = CaseEvidence()
    for group in groups:
        out.groups.append([_key(item, chunk_doc, index, out) for item in group])
    return out


def _key(item: EvidenceItem, chunk_doc: Mapping[str, str], index: EvidenceIndex, out: CaseEvidence) -> str:
    if isinstance(item, str):
        out.docs[item] = chunk_doc[item]
        if item in index.spans:
            out.spans[item] = index.spans[item]
        return item
    span = index.quotes.get((item.doc_id, item.quote))
    if span is None:
        key = f"{item.doc_id}[unplaced: {item.quote[:40]}]"
        out.docs[key] = item.doc_id
        out.unplaced.append(key)
        return key
    key = quote_key(item.doc_id, span)
    out.docs[key] = item.doc_id
    out.spans[key] = (item.doc_id, *span)
    out.holders[key] = index.holders(out.spans[key])
    return key


def returned_spans(documents: Sequence[Any]) -> list[DocSpan]:
    """The spans of the returned candidates and the chunks attached to them (those that carry one)."""
    out = []
    for doc in documents:
        for chunk in (doc, *doc.attached):
            span = chunk_span(chunk.doc_id, chunk.metadata)
            if span is not None:
                out.append(span)
    return out


def returned_keys(evidence: CaseEvidence, documents: Sequence[Any], coverage: float) -> set[str]:
    """The evidence keys the returned `documents` (the top K) return: their chunk ids and attached ones, and
    the quotes whose span they cover by the coverage rule."""
    ids = {i for d in documents for i in d.chunk_ids_with_attached()}
    got = by_document(returned_spans(documents))
    covered = {
        key
        for key, span in evidence.spans.items()
        if key in evidence.holders and is_returned(got, span, coverage)
    }
    return ids | covered


def evidence_table(evidence: CaseEvidence, documents: Sequence[Any], coverage: float) -> dict[str, float]:
    """evidenceRecall and evidenceHit of the top K `documents`, and, when the evidence has spans,
    evidenceCharRecall and charPrecision (`characters.best_group_chars`)."""
    returned = returned_keys(evidence, documents, coverage)
    table = {
        "evidenceRecall": metrics.evidence_recall(returned, evidence.groups),
        "evidenceHit": metrics.evidence_hit(returned, evidence.groups),
    }
    groups = evidence.group_spans()
    if any(groups):
        recall, precision = characters.best_group_chars(returned_spans(documents), groups)
        table["evidenceCharRecall"] = recall
        table["charPrecision"] = precision
    return table


STAGE_CHAR_KEYS = ("evidenceCharRecall", "charPrecision", "contextChars")


def chars_after_stages(
    evidence: CaseEvidence, ranked_after: Mapping[str, Sequence[str]], by_id: Mapping[str, Any], k: int
) -> dict[str, dict[str, float]]:
    """Per list of the trace (`ranked_after`: stage name -> chunk ids), its top K's character figures:
    contextChars (`characters.context_chars`) and, when the evidence has spans, evidenceCharRecall and
    charPrecision (`characters.best_group_chars`). `by_id`: chunk id -> its candidate (a returned one
    carries its attached chunks)."""
    groups = evidence.group_spans()
    out: dict[str, dict[str, float]] = {}
    for name, ids in ranked_after.items():
        top = [by_id[i] for i in ids[:k] if i in by_id]
        row = {"contextChars": float(characters.context_chars(c.text for d in top for c in (d, *d.attached)))}
        if any(groups):
            row["evidenceCharRecall"], row["charPrecision"] = characters.best_group_chars(
                returned_spans(top), groups
            )
        out[name] = row
    return out
