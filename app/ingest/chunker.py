"""Heading-aware chunking: Markdown sections, split at paragraph, sentence, then word boundaries.

1. Markdown text is split into sections at ATX headings (`#` .. `######`; lines inside ``` or ~~~ fences are
   never headings). Each section carries its heading path, e.g. ("Payroll policy", "Pay dates"); the heading
   lines themselves are not repeated in the chunk text. Plain text is one section with an empty path.
2. Sections are never merged, however small: a chunk's heading path is always true for all of its text.
3. A section longer than `chunk_size` characters is cut into pieces of at most `chunk_size` characters.
   Each cut is placed at the last boundary that fits, preferring, in order: a paragraph break (blank line),
   a sentence end (`.?!` followed by whitespace; `。！？；` anywhere), a word or clause boundary (whitespace,
   `，、：`), and only then a hard cut at `chunk_size`. Paragraph breaks and sentence ends that fill at least
   half the chunk are tried first, so one short paragraph followed by a long one does not leave a tiny chunk.
4. The next piece starts up to `overlap` characters before the cut, at the earliest sentence boundary (else
   word boundary, else exactly `overlap` back) in that window, so the overlap rarely starts mid-word.

Lengths are in characters (code points), which works alike for English and Chinese. A chunk's text is its
piece with surrounding whitespace stripped, so it is never longer than `chunk_size`.

Every chunk records where its text lies in its document: metadata `char_start` and `char_end`, the half-open
span `[char_start, char_end)` of the chunk's text in the document's normalised text (app/ingest/spans.py).
`normalised document text[char_start:char_end]` is the chunk's text normalised, and the spans of one
document's chunks (overlaps included) are comparable across chunk sizes.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

from app.access.scope import ACCESS
from app.ingest.ids import chunk_id, normalise_text, text_sha256
from app.ingest.spans import NormalisedText, Span, normalise_with_offsets
from app.ingest.types import Chunk, Document

# Change whenever the same document could chunk differently, or `embedding_text` could build another string
# from the same title, headings and text: it is part of every chunk id, so stored vectors are then redone.
CHUNK_ID_VERSION = "md-v1"
# What a chunk carries, recorded in its metadata (`chunker`): change it whenever the metadata a chunk is
# written with changes meaning. md-v2 added the character span (CHAR_START, CHAR_END); the text, the embedded
# string and so the id are those of md-v1, so a store written by md-v1 keeps its vectors and gets its spans
# from `sieve store rebuild` (or any ingest of the same files, which rewrites the metadata in place).
CHUNKER_VERSION = "md-v2"

EMBEDDING_SEPARATOR = " › "
# Chunk metadata key: sha256 of the whole normalised document text (ids.text_sha256).
DOC_SHA256 = "doc_sha256"
# Chunk metadata keys: the chunk's text is [CHAR_START, CHAR_END) of its document's normalised text.
CHAR_START = "char_start"
CHAR_END = "char_end"
HEADING_PATH_SEPARATOR = " > "

_PLAIN_SUFFIXES = (".txt", ".jsonl", ".json")

_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")

_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n\s*")
_SENTENCE_END = re.compile(r"[.?!]+[\"')\]”’]*\s+|[。！？；]+[”’」』）)]*\s*")
_WORD_BREAK = re.compile(r"\s+|[，、：]+\s*")


@dataclass(frozen=True)
class Section:
    heading_path: tuple[str, ...]
    text: str  # the body under the heading, stripped; may be empty
    start: int = field(default=0, compare=False)  # where `text` begins in the text it was split from


def split_sections(text: str) -> list[Section]:
    """Markdown text -> sections, in order, each with the heading path of the headings above it.

    A heading of level n closes every open heading of level >= n. Text before the first heading gets the
    empty path. Sections whose body is blank are kept here (callers skip them) so the structure is visible.
    """
    sections: list[Section] = []
    stack: list[tuple[int, str]] = []
    body: list[str] = []
    body_start: int | None = None  # where the body's first non-whitespace character is in `text`
    fence: str | None = None
    offset = 0

    def close() -> None:
        body_text = "\n".join(body).strip()
        sections.append(Section(tuple(title for _, title in stack), body_text, body_start or 0))

    for raw_line in text.splitlines(keepends=True):
        line = raw_line.splitlines()[0]
        line_offset, offset = offset, offset + len(raw_line)
        if fence is None and (heading := _HEADING.match(line)) is not None and not _FENCE.match(line):
            close()
            body, body_start = [], None
            level = len(heading.group(1))
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, normalise_text(heading.group(2) or "")))
            continue
        fence = _next_fence(fence, line)
        body.append(line)
        if body_start is None and line.strip():
            body_start = line_offset + len(line) - len(line.lstrip())
    close()
    return sections


def _next_fence(fence: str | None, line: str) -> str | None:
    """The open fence after `line` (None: outside any): a fence closes with the same character, at least
    as long as its opener."""
    fence_match = _FENCE.match(line)
    if fence is None:
        return fence_match.group(1) if fence_match else None
    closer = fence_match.group(1) if fence_match else ""
    return None if closer[:1] == fence[0] and len(closer) >= len(fence) else fence


def _boundaries(pattern: re.Pattern[str], text: str) -> list[int]:
    """Positions just after each match: where a piece may start (and the previous one end)."""
    return [m.end() for m in pattern.finditer(text) if 0 < m.end() < len(text)]


def split_spans(text: str, chunk_size: int, overlap: int) -> list[tuple[int, int]]:
    """Cut `text` into spans [start, end) of at most `chunk_size` characters.

    Invariants (tested): the first span starts at 0 and the last ends at len(text); each span starts after
    the previous one starts, at or before it ends, and no more than `overlap` characters before it ends. So
    `text[s0:e0] + text[e0:e1] + text[e1:e2] + ...` is `text` again: nothing is lost.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    if not 0 <= overlap < chunk_size:
        raise ValueError(f"overlap must be in [0, chunk_size={chunk_size}), got {overlap}")
    if len(text) <= chunk_size:
        return [(0, len(text))]
    paragraphs = _boundaries(_PARAGRAPH_BREAK, text)
    sentences = _boundaries(_SENTENCE_END, text)
    words = _boundaries(_WORD_BREAK, text)
    carry_levels = (sentences, words)

    spans: list[tuple[int, int]] = []
    start = prev_end = 0
    while len(text) - start > chunk_size:
        limit = start + chunk_size
        end = _cut(paragraphs, sentences, words, start, prev_end, limit, chunk_size)
        spans.append((start, end))
        prev_end = end
        next_start = end
        if overlap:
            window_lo = max(end - overlap, start + 1)
            next_start = next(
                (b for b in (_first_in(level, window_lo, end) for level in carry_levels) if b is not None),
                window_lo,
            )
        start = next_start
    spans.append((start, len(text)))
    return spans


def _cut(
    paragraphs: list[int],
    sentences: list[int],
    words: list[int],
    start: int,
    prev_end: int,
    limit: int,
    chunk_size: int,
) -> int:
    """Where the piece starting at `start` ends. A cut must add new text, past the previous cut.

    Order of preference: a paragraph break, then a sentence end, filling at least half the chunk (so one
    short paragraph does not leave a tiny chunk); then the later of any paragraph break or sentence end (a
    whole sentence beats a fuller chunk); then a word boundary; then the hard limit.
    """
    half = max(prev_end, start + chunk_size // 2)
    floor = max(prev_end, start)
    for found in (_last_in(paragraphs, half, limit), _last_in(sentences, half, limit)):
        if found is not None:
            return found
    anywhere = [b for b in (_last_in(paragraphs, floor, limit), _last_in(sentences, floor, limit)) if b]
    if anywhere:
        return max(anywhere)
    word = _last_in(words, floor, limit)
    return word if word is not None else limit


def _last_in(positions: list[int], lo: int, hi: int) -> int | None:
    """The largest position p with lo < p <= hi."""
    i = bisect.bisect_right(positions, hi)
    return positions[i - 1] if i and positions[i - 1] > lo else None


def _first_in(positions: list[int], lo: int, hi: int) -> int | None:
    """The smallest position p with lo <= p < hi."""
    i = bisect.bisect_left(positions, lo)
    return positions[i] if i < len(positions) and positions[i] < hi else None


def is_markdown(doc: Document) -> bool:
    """Documents from .txt and .jsonl files are plain text; everything else (Markdown files, documents
    built in code with no origin) is read as Markdown."""
    return not doc.origin.lower().endswith(_PLAIN_SUFFIXES)


def chunk_document(
    doc: Document,
    chunk_size: int,
    overlap: int,
    min_chunk_chars: int = 1,
    *,
    markdown: bool | None = None,
) -> list[Chunk]:
    """Chunks of `doc`, in order, positions 0.. across the whole document.

    `markdown=None` decides by `is_markdown(doc)`. Chunks whose stripped text is shorter than
    `min_chunk_chars` are dropped (with the default 1, only empty ones), and positions stay consecutive.
    Chunk metadata = the document's scalar metadata (None dropped, lists comma-joined but for the `access`
    list, kept a list of strings, dates as ISO strings)
    + doc_id, title, position, heading_path (joined with " > "), doc_sha256 (`text_sha256` of the whole
    document text, so copies of a document under another id can be recognised) and char_start/char_end (the
    chunk's span in the document's normalised text), all scalars (and the one list) as Chroma takes them.
    """
    if min_chunk_chars < 1:
        raise ValueError(f"min_chunk_chars must be at least 1, got {min_chunk_chars}")
    use_markdown = is_markdown(doc) if markdown is None else markdown
    sections = split_sections(doc.text) if use_markdown else [_plain_section(doc.text)]
    base_metadata: dict[str, Any] = {
        k: v for k, v in ((k, _stored(k, v)) for k, v in doc.metadata.items()) if v is not None
    }
    base_metadata.update({"doc_id": doc.doc_id, "title": doc.title, DOC_SHA256: text_sha256(doc.text)})
    document = normalise_with_offsets(doc.text)

    chunks: list[Chunk] = []
    for section in sections:
        for text, span in _section_pieces(section, document, chunk_size, overlap):
            if len(text) < min_chunk_chars:
                continue
            position = len(chunks)
            metadata = {**base_metadata, "position": position, **_place(section, span)}
            chunks.append(
                Chunk(
                    chunk_id=chunk_id(
                        doc.doc_id, CHUNK_ID_VERSION, position, section.heading_path, text, title=doc.title
                    ),
                    doc_id=doc.doc_id,
                    text=text,
                    position=position,
                    heading_path=section.heading_path,
                    metadata=metadata,
                )
            )
    return chunks


def _place(section: Section, span: Span) -> dict[str, Any]:
    """The metadata that says where a chunk lies: its heading path (joined) and its span."""
    return {
        "heading_path": HEADING_PATH_SEPARATOR.join(section.heading_path),
        CHAR_START: span[0],
        CHAR_END: span[1],
    }


def _plain_section(text: str) -> Section:
    """A plain-text document as one section: its stripped text, from its first non-whitespace character."""
    return Section((), text.strip(), len(text) - len(text.lstrip()))


def _section_pieces(
    section: Section, document: NormalisedText, chunk_size: int, overlap: int
) -> list[tuple[str, Span]]:
    """(text, span) of each piece of `section`: the piece stripped, and its span in the document's
    normalised text (`document`). The section's text is its lines joined with "\\n", which normalises
    like the document's own line breaks, so a place in it maps to the document through the section start."""
    if not section.text:
        return []
    within = normalise_with_offsets(section.text)
    origin = document.starts[section.start]
    pieces: list[tuple[str, Span]] = []
    for start, end in split_spans(section.text, chunk_size, overlap):
        piece = section.text[start:end]
        text = piece.strip()
        if not text:
            pieces.append((text, (origin, origin)))
            continue
        first = start + len(piece) - len(piece.lstrip())
        lo, hi = within.span_of(first, first + len(text))
        pieces.append((text, (origin + lo, origin + hi)))
    return pieces


def stored_chunk(stored_id: str, text: str, metadata: dict[str, Any]) -> Chunk:
    """A chunk as the store gives it back (its id, text and the metadata `chunk_document` wrote), rebuilt
    as a `Chunk`: what `embedding_text` reads to give the text its vector and BM25 entry were made from."""
    heading = str(metadata.get("heading_path", ""))
    return Chunk(
        chunk_id=stored_id,
        doc_id=str(metadata.get("doc_id", "")),
        text=text,
        position=int(metadata.get("position", 0)),
        heading_path=tuple(p for p in heading.split(HEADING_PATH_SEPARATOR) if p),
        metadata=metadata,
    )


def embedding_text(chunk: Chunk, title: str | None = None) -> str:
    """ "title › h1 › h2\\n\\ntext": the one string both the embedder and BM25 see for a chunk.

    `title` defaults to the chunk's metadata title. Empty parts are skipped, and a heading equal to the part
    before it is skipped too (a Markdown file's `# Title` heading usually repeats its title).
    """
    if title is None:
        title = str(chunk.metadata.get("title", ""))
    parts: list[str] = []
    for part in (title, *chunk.heading_path):
        part = normalise_text(part)
        if part and (not parts or parts[-1] != part):
            parts.append(part)
    header = EMBEDDING_SEPARATOR.join(parts)
    return f"{header}\n\n{chunk.text}" if header else chunk.text


def _stored(key: str, value: Any) -> Any:
    """A document's metadata value as its chunks carry it: the `access` list as a list of strings (Chroma
    matches it with `$contains`; joined, `group:a,group:b` would be one name), every other value `_scalar`."""
    if key == ACCESS and isinstance(value, list | tuple):
        return [str(v) for v in value] or None
    return _scalar(value)


def _scalar(value: Any) -> str | int | float | bool | None:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        return ",".join(str(_scalar(v)) for v in value if v is not None)
    return str(value)
