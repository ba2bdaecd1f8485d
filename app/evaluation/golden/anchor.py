"""`sieve golden anchor`: chunk-id evidence and chunk judgments rewritten as quotes, using the current index.

A chunk id holds only on the chunking that made it; a quote of the chunk's text holds on any chunking of the
same document (app/evaluation/golden/quotes.py). For every case, each chunk id the index holds becomes the
quote of that chunk's text (normalised, as quotes are compared):

* `evidenceChunkIds` -> `evidence` (`[{"docId", "quote"}]`, after any quotes already there);
* each chunk id of an `anyOf` group -> a quote object in its place;
* a `judgments` key that is a chunk id -> `judgedQuotes` (`[{"docId", "quote", "grade"}]`).

Left as they are, and listed: chunk ids the index does not hold (stale: `sieve golden check` says where their
text went; anchor on the index they were written on), chunk ids whose text occurs more than once in their
document (a quote would be ambiguous), and `expectedChunkIds` (they set the case's matching level, chunk
ids; rewriting them would change what the case measures). The rest of each case is kept as it was,
field order included.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.evaluation.golden.cases import GoldenSetError
from app.ingest.ids import looks_like_chunk_id
from app.jsonl import dumps_json, dumps_line

# chunk id -> (its document id, its text normalised): the chunks of the index a golden set names
ChunkTexts = Mapping[str, tuple[str, str]]
# (document id, quote) -> True when the quote occurs exactly once in the document's normalised text
IsUnique = Callable[[str, str], bool]


@dataclass
class AnchorReport:
    """What `anchor_case` did over a golden set: ids rewritten, and those left (stale, ambiguous, and
    expectedChunkIds), each as "case: id"."""

    anchored: int = 0
    cases: int = 0
    stale: list[str] = field(default_factory=list)
    ambiguous: list[str] = field(default_factory=list)
    kept_expected: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"anchored {self.anchored} chunk id(s) as quotes in {self.cases} case(s)"]
        if self.stale:
            out.append(
                f"left as chunk ids, not in the index (stale; `sieve golden check` says where their text "
                f"went): {', '.join(self.stale)}"
            )
        if self.ambiguous:
            out.append(
                f"left as chunk ids, their text occurs twice in its document: {', '.join(self.ambiguous)}"
            )
        if self.kept_expected:
            out.append(
                f"expectedChunkIds kept (they set the matching level): {', '.join(self.kept_expected)}"
            )
        return out


def anchor_case(
    case: dict[str, Any], chunks: ChunkTexts, unique: IsUnique, report: AnchorReport
) -> dict[str, Any]:
    """`case` (a raw case object) with its chunk ids rewritten as quotes (module docstring)."""
    case_id = str(case.get("id"))
    before = report.anchored

    def quote_of(chunk_id: str) -> dict[str, Any] | None:
        found = chunks.get(chunk_id)
        if found is None:
            report.stale.append(f"{case_id}: {chunk_id}")
            return None
        if not unique(*found):
            report.ambiguous.append(f"{case_id}: {chunk_id}")
            return None
        report.anchored += 1
        return {"docId": found[0], "quote": found[1]}

    out = dict(case)
    _anchor_evidence(out, quote_of)
    _anchor_any_of(out, quote_of)
    _anchor_judgments(out, quote_of)
    report.kept_expected += [f"{case_id}: {c}" for c in case.get("expectedChunkIds") or []]
    report.cases += report.anchored > before
    return out


QuoteOf = Callable[[str], "dict[str, Any] | None"]


def _anchor_evidence(case: dict[str, Any], quote_of: QuoteOf) -> None:
    ids = case.get("evidenceChunkIds")
    if not isinstance(ids, list) or not ids:
        return
    kept = []
    for chunk_id in ids:
        quote = quote_of(chunk_id) if isinstance(chunk_id, str) else None
        if quote is None:
            kept.append(chunk_id)
        else:
            _add(case, "evidence", quote)
    _set_or_drop(case, "evidenceChunkIds", kept)


def _anchor_any_of(case: dict[str, Any], quote_of: QuoteOf) -> None:
    groups = case.get("anyOf")
    if isinstance(groups, list):
        case["anyOf"] = [
            [(quote_of(i) or i) if isinstance(i, str) else i for i in group]
            if isinstance(group, list)
            else group
            for group in groups
        ]


def _anchor_judgments(case: dict[str, Any], quote_of: QuoteOf) -> None:
    judgments = case.get("judgments")
    if not isinstance(judgments, dict):
        return
    kept = {}
    for key, grade in judgments.items():
        quote = quote_of(key) if looks_like_chunk_id(key) else None
        if quote is None:
            kept[key] = grade
        else:
            _add(case, "judgedQuotes", {**quote, "grade": grade})
    _set_or_drop(case, "judgments", kept)


def _add(case: dict[str, Any], name: str, item: dict[str, Any]) -> None:
    """Append `item` to the list `case[name]` (made when missing) unless it is there."""
    items = case.setdefault(name, [])
    if item not in items:
        items.append(item)


def _set_or_drop(case: dict[str, Any], name: str, value: list[Any] | dict[str, Any]) -> None:
    if value:
        case[name] = value
    else:
        case.pop(name, None)


def read_raw(path: Path) -> tuple[Any, list[dict[str, Any]], str]:
    """(the file's top-level value, its case objects, its form: "jsonl", "array" or "wrapped"); the file is
    read as `load_golden_set` reads it (call that first: this assumes a valid file)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".jsonl":
        cases = [json.loads(line) for line in text.splitlines() if line.strip()]
        return cases, cases, "jsonl"
    value = json.loads(text)
    if isinstance(value, dict) and "cases" in value:
        return value, value["cases"], "wrapped"
    if isinstance(value, list):
        return value, value, "array"
    raise GoldenSetError(str(path), [f"{path}: cannot anchor a file holding one case object; use an array"])


def render_raw(top: Any, cases: list[dict[str, Any]], form: str) -> str:
    """The golden-set file of `cases`, in the form it was read in."""
    if form == "jsonl":
        return "".join(dumps_line(c) + "\n" for c in cases)
    if form == "wrapped":
        return dumps_json({**top, "cases": cases})
    return dumps_json(cases)


def default_out(path: Path) -> Path:
    """Where the anchored set goes unless told: beside the input, `golden-set.anchored.json`."""
    return path.with_name(f"{path.stem}.anchored{path.suffix}")
