"""Character spans: where a chunk's text (or a golden quote) lies in its document's normalised text.

The normalised text of a document is its text with every character cluster (a character and the combining
marks after it) NFKC-normalised, every run of whitespace collapsed to one space, and both ends stripped:
`ids.normalise_text` done cluster by cluster, so that each character of the original text has a known
place in the result (the two agree on every text whose NFKC form composes no character across clusters).
A span is a half-open pair `[start, end)` of positions in that normalised text; spans from any chunking of
one document are comparable, which is what lets golden evidence written as quotes survive re-chunking.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Span = tuple[int, int]
# (document id, start, end): a span of one document's normalised text
DocSpan = tuple[str, int, int]

# a character and the combining marks that follow it (the Unicode combining-mark blocks, kana voicing marks)
_COMBINING = r"\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f\u3099\u309a"
_CLUSTER = re.compile(rf".[{_COMBINING}]*", re.S)


@dataclass(frozen=True)
class NormalisedText:
    """`text`, the normalised text, and for each character i of the original: `starts[i]`, where its
    normalised form begins, and `ends[i]`, where it ends (a whitespace character collapses to nothing of its
    own: both are the place of the next non-space character)."""

    text: str
    starts: list[int]
    ends: list[int]

    def span_of(self, start: int, end: int) -> Span:
        """The normalised span of the original characters `[start, end)`, which begin and end with a
        non-whitespace character (a stripped chunk's text)."""
        return self.starts[start], self.ends[end - 1]


def normalise_with_offsets(text: str) -> NormalisedText:
    """The normalised text of `text` (module docstring) and where each original character went."""
    out: list[str] = []
    length = 0
    starts = [0] * len(text)
    ends = [0] * len(text)
    pending_space = False
    for match in _CLUSTER.finditer(text):
        lo, hi = match.span()
        piece = unicodedata.normalize("NFKC", match.group())
        if not piece.strip():
            pending_space = length > 0
            starts[lo:hi] = ends[lo:hi] = [length + pending_space] * (hi - lo)
            continue
        core = " ".join(piece.split())  # a cluster that normalises to several words keeps one space each
        if pending_space:
            out.append(" ")
            length += 1
            pending_space = False
        starts[lo:hi] = [length] * (hi - lo)
        length += len(core)
        ends[lo:hi] = [length] * (hi - lo)
        out.append(core)
    return NormalisedText("".join(out), starts, ends)


def normalise(text: str) -> str:
    """The normalised text of `text` (as a quote is compared with a document's)."""
    return normalise_with_offsets(text).text


def covered(spans: Iterable[Span], target: Span) -> int:
    """How many characters of `target` lie in the union of `spans`: |target ∩ ⋃ spans|, each character
    counted once however many spans hold it (overlapping chunks do not count twice)."""
    lo, hi = target
    merged = merge([(max(s, lo), min(e, hi)) for s, e in spans if s < hi and e > lo])
    return sum(e - s for s, e in merged)


def merge(spans: Iterable[Span]) -> list[Span]:
    """The union of `spans` as sorted, disjoint, non-adjacent spans (empty spans dropped)."""
    out: list[Span] = []
    for start, end in sorted(s for s in spans if s[0] < s[1]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def union_length(spans: Sequence[Span]) -> int:
    """|⋃ spans|: the characters the spans hold, each once."""
    return sum(e - s for s, e in merge(spans))


def occurrences(haystack: str, needle: str, limit: int = 2) -> list[int]:
    """The start of each occurrence of `needle` in `haystack` (overlapping ones included), at most
    `limit` of them."""
    found: list[int] = []
    at = haystack.find(needle)
    while at != -1 and len(found) < limit:
        found.append(at)
        at = haystack.find(needle, at + 1)
    return found


def by_document(spans: Iterable[DocSpan]) -> dict[str, list[Span]]:
    """`spans` grouped by document, each document's merged (`merge`)."""
    out: dict[str, list[Span]] = {}
    for doc_id, start, end in spans:
        out.setdefault(doc_id, []).append((start, end))
    return {doc_id: merge(found) for doc_id, found in out.items()}
