"""Golden evidence written as quotes: resolved to a span of its document's normalised text on this index.

A quote (`{"docId": "hr-payroll-en", "quote": "on the 10th of each month"}`) is normalised as documents are
(app/ingest/spans.py: NFKC, whitespace runs to one space, stripped) and looked up in its document's
normalised text: it must occur there exactly once. Found nowhere, or twice or more (ambiguous: lengthen it),
is a golden-set error naming the file, the case and the quote. Its span `[start, end)` is then compared
with the spans the returned chunks carry (`returned`), whatever the chunking.

Coverage rule: a quote is returned by a ranking when the union of the spans of the chunks the top K returns
(attached chunks included) covers at least `coverage` of its characters:
|span ∩ ⋃ returned spans of its document| >= coverage · |span| (`rag.evaluate.evidence_coverage`, default
1.0: every character of the quote is in front of the reader).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from app.ingest.spans import DocSpan, Span, covered, normalise, occurrences


@dataclass(frozen=True)
class QuoteProblem:
    """Why a quote does not resolve: its case, document, quote and what is wrong."""

    case_id: str
    doc_id: str
    quote: str
    why: str

    def message(self, path: str) -> str:
        return f"{path}: case {self.case_id!r}: quote {self.quote!r} of document {self.doc_id!r}: {self.why}"


def find_quote(document: str, quote: str) -> Span | str:
    """The span of `quote` in `document` (a normalised text), or why there is none: "not found in ..." or
    "ambiguous: ..." when it occurs twice or more."""
    needle = normalise(quote)
    if not needle:
        return "the quote is blank"
    found = occurrences(document, needle, limit=2)
    if not found:
        return "not found in the document's text on this index"
    if len(found) > 1:
        return (
            f"ambiguous: found at characters {found[0]} and {found[1]} of the document's normalised text "
            "(lengthen the quote so it occurs once)"
        )
    return found[0], found[0] + len(needle)


def quote_key(doc_id: str, span: Span) -> str:
    """How a resolved quote stands in an evidence group and the report: "docId[start:end]"."""
    return f"{doc_id}[{span[0]}:{span[1]}]"


def is_returned(returned: Mapping[str, Sequence[Span]], quote: DocSpan, coverage: float) -> bool:
    """The coverage rule (module docstring): |quote ∩ ⋃ returned[doc]| >= coverage · |quote|, with a
    tolerance of 1e-9 so that `coverage` = 1.0 means every character. `returned`: document id -> the spans
    of its chunks the ranking returns."""
    doc_id, start, end = quote
    length = end - start
    got = covered(returned.get(doc_id, ()), (start, end))
    return got >= math.ceil(coverage * length - 1e-9)
