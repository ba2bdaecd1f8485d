"""Character-level figures of one ranking: how much of the evidence's text the top K puts in front of a
reader, and at what cost in text.

Every figure reads spans of documents' normalised texts (app/ingest/spans.py): `returned`, the spans of the
chunks the top K returns (attached chunks included), and `evidence`, the spans of one evidence group (its
quotes, or its chunks' spans). Spans are merged per document first, so overlapping chunks and a text
returned twice count once; spans of different documents never meet.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from app.ingest.spans import DocSpan, by_document, covered


def covered_chars(returned: Iterable[DocSpan], evidence: Iterable[DocSpan]) -> int:
    """|E ∩ R|: the evidence characters inside the returned text, each once (E and R the unions of the
    evidence and returned spans, per document)."""
    got = by_document(returned)
    return sum(
        covered(got.get(doc_id, ()), span)
        for doc_id, spans in by_document(evidence).items()
        for span in spans
    )


def total_chars(spans: Iterable[DocSpan]) -> int:
    """|⋃ spans|: the characters the spans hold, each once."""
    return sum(end - start for spans_of in by_document(spans).values() for start, end in spans_of)


def evidence_char_recall(returned: Sequence[DocSpan], evidence: Sequence[DocSpan]) -> float:
    """EvidenceCharRecall = |E ∩ R| / |E|: the share of the evidence's characters the top K returns.
    Example: evidence [100, 220), returned [0, 200) -> (200 - 100) / 120. Raises `ValueError` for empty
    evidence."""
    total = total_chars(evidence)
    if total == 0:
        raise ValueError("evidence character recall of no evidence characters is undefined")
    return covered_chars(returned, evidence) / total


def char_precision(returned: Sequence[DocSpan], evidence: Sequence[DocSpan]) -> float:
    """CharPrecision = |E ∩ R| / |R|: the share of the returned characters that are evidence (a big chunk
    cannot win by overlap alone). 0.0 when nothing is returned (no evidence in front of the reader).
    Example: evidence [100, 220), returned [0, 200) -> (200 - 100) / 200."""
    total = total_chars(returned)
    return covered_chars(returned, evidence) / total if total else 0.0


def best_group_chars(returned: Sequence[DocSpan], groups: Sequence[Sequence[DocSpan]]) -> tuple[float, float]:
    """(EvidenceCharRecall, CharPrecision) of the evidence group with the highest character recall (the
    first on a tie): the best-covered way of answering, as EvidenceRecall takes. Groups without a span are
    skipped; raises `ValueError` when none has one."""
    usable = [g for g in groups if total_chars(g)]
    if not usable:
        raise ValueError("no evidence group has a character span")
    recalls = [evidence_char_recall(returned, g) for g in usable]
    best = usable[recalls.index(max(recalls))]
    return max(recalls), char_precision(returned, best)


def context_chars(texts: Iterable[str]) -> int:
    """ContextChars = Σ len(text) over the texts the top K hands a reader (each returned chunk and its
    attached chunks; overlapping chunks count in full, as a model reads them in full)."""
    return sum(len(text) for text in texts)
