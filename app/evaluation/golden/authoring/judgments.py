"""Judgments from the labelling page, and their merge into the golden set (`sieve golden export`).

The judgments file (default golden_set/judgments.jsonl) is append-only, one JSON object a line:

    {"caseId": "...", "query": "...", "id": "<chunk id>", "docId": "<its document>", "grade": 0..3,
     "who": "...", "at": "2026-01-02T03:04:05Z", "quote": "<the chunk's text>"}

`quote` (optional; the labelling page writes it for every graded chunk) is the chunk's text with its
whitespace runs made one space: the export writes that grade as a `judgedQuotes` entry, which resolves on
any chunking, instead of a `judgments` key of the chunk id, which holds only on this one.

with `"label": "forbidden"` instead of a grade (the chunk's document must never be returned for the query),
or `"label": "noAnswer"` with `"id": null` (nothing in the knowledge base answers the query).

The merge, as pure functions over parsed values:

1. `latest_by_rater`: a rater's later judgment replaces their earlier one of the same slot; a slot is the
   (case, chunk id) pair for grades and "forbidden", the case for "noAnswer". Later = the greater `at`,
   then the later line.
2. `resolve`: per case, what the raters agree on. Conflicts, which are listed and not applied:
   * "grades differ": one chunk graded differently by different raters;
   * "forbidden vs relevant": a document marked forbidden while a chunk of it is graded > 0 (by anyone);
   * "noAnswer vs relevant": "no answer" for a case in which a chunk is graded > 0.
   Forbidden beside a grade 0 is no conflict: both say "not relevant".
3. `merge_case`: the agreed judgments into one case: grades into `judgedQuotes` ({docId, quote, grade},
   for judgments that carry the chunk's quote; a later export replaces the grade of the same passage) or
   else `judgments` (chunk id keys; a later export replaces the grade of the same key), forbidden
   documents into `forbiddenDocIds`, "noAnswer" into `expectNoAnswer: true`. A judgment that contradicts
   the case itself is a conflict too ("against the golden set": forbidding a document the case expects,
   grading an evidence chunk 0, a grade > 0 in an expectNoAnswer case, "noAnswer" for a case that names
   expectations), and so is anything that leaves the case invalid (`GoldenCase`). A draft case that
   receives a grade > 0 or "noAnswer" is promoted (its `draft` field is removed: a scored case).
4. `export`: every case of the golden set, plus the promoted drafts appended in the drafts file's order.
   A draft whose id is already in the golden set was promoted by an earlier export; its judgments merge
   into that case. Judgments of unknown cases, or of a case whose query has changed since, are skipped
   with a warning. `export_files` writes the result; when its cases differ from the file's, the set's
   `datasetVersion` moves on (app/evaluation/golden/authoring/dataset_version.py).

The export is idempotent: the judgments file is never emptied, and exporting it again gives the same set.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from app.evaluation.golden.authoring.dataset_version import next_dataset_version
from app.evaluation.golden.authoring.generate import CaseJson
from app.evaluation.golden.cases import GoldenCase, GoldenSetError, chunk_evidence, parse_golden_set
from app.files import atomic_write_text, change_line
from app.jsonl import (
    append_lines,
    dumps_json,
    encode_line,
    parse_jsonl,
    read_jsonl,
    read_text,
    render_jsonl,
    split_lines,
)

GRADES = (0, 1, 2, 3)
FORBIDDEN = "forbidden"
NO_ANSWER = "noAnswer"
LABELS = (FORBIDDEN, NO_ANSWER)
MAX_WHO_CHARS = 100
MAX_REPORTED_ERRORS = 20


class JudgmentsError(ValueError):
    """An unreadable judgments file; every bad line is named (`file:line: field: problem`)."""

    def __init__(self, path: str, errors: list[str]) -> None:
        self.path = path
        self.errors = errors
        shown = errors[:MAX_REPORTED_ERRORS]
        lines = [f"invalid judgments file {path} ({len(errors)} error{'s' if len(errors) != 1 else ''}):"]
        lines += [f"  - {error}" for error in shown]
        if len(errors) > len(shown):
            lines.append(f"  ... and {len(errors) - len(shown)} more")
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class Judgment:
    """One line of the judgments file. Exactly one of `grade` and `label` is set; `id` and `doc_id` are None
    only for "noAnswer". `line` is the 1-based line in its file (0 when made in memory)."""

    case_id: str
    query: str
    id: str | None
    doc_id: str | None
    grade: int | None
    label: str | None
    who: str
    at: str
    line: int = 0
    quote: str | None = None  # the judged chunk's text (whitespace runs as one space), when recorded

    @property
    def slot(self) -> str | None:
        """What a later judgment by the same rater replaces: the chunk (grades and forbidden), or the case
        itself (None) for noAnswer."""
        return None if self.label == NO_ANSWER else self.id

    @property
    def verdict(self) -> str:
        return self.label if self.label is not None else f"grade {self.grade}"

    def to_json(self) -> dict[str, str | int | None]:
        """The judgment's line: caseId, query, id, docId, its label or grade, who and at."""
        out: dict[str, str | int | None] = {"caseId": self.case_id, "query": self.query, "id": self.id}
        out["docId"] = self.doc_id
        if self.label is not None:
            out["label"] = self.label
        else:
            out["grade"] = self.grade
        out["who"] = self.who
        out["at"] = self.at
        if self.quote is not None:
            out["quote"] = self.quote
        return out


def utc_now() -> str:
    """The `at` of a new judgment: UTC, ISO 8601, to the millisecond, with a Z."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def make_judgment(
    case_id: str,
    query: str,
    chunk_id: str | None,
    doc_id: str | None,
    grade: int | None = None,
    label: str | None = None,
    who: str = "",
    at: str | None = None,
    quote: str | None = None,
) -> Judgment:
    """A validated judgment (the labelling API's write); ValueError names the bad field."""
    return _validated(
        {
            "caseId": case_id,
            "query": query,
            "id": chunk_id,
            "docId": doc_id,
            **({"grade": grade} if label is None else {"label": label}),
            "who": who,
            "at": at or utc_now(),
            **({"quote": quote} if quote is not None else {}),
        },
        0,
    )


def _validated(value: Any, line: int) -> Judgment:
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    known = {"caseId", "query", "id", "docId", "grade", "label", "who", "at", "quote"}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r} (fields: {', '.join(sorted(known))})")
    for name in ("caseId", "query", "who", "at"):
        text = value.get(name)
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{name}: must be a non-blank string (got {text!r})")
    if len(value["who"]) > MAX_WHO_CHARS:
        raise ValueError(f"who: at most {MAX_WHO_CHARS} characters")
    _parse_at(value["at"])
    has_grade, has_label = "grade" in value, "label" in value
    if has_grade == has_label:
        raise ValueError('give exactly one of "grade" (0, 1, 2, 3) and "label" ("forbidden", "noAnswer")')
    grade = value.get("grade")
    label = value.get("label")
    if has_grade and (isinstance(grade, bool) or not isinstance(grade, int) or grade not in GRADES):
        raise ValueError(f"grade: must be one of 0, 1, 2, 3 (got {grade!r})")
    if has_label and label not in LABELS:
        raise ValueError(f'label: must be "forbidden" or "noAnswer" (got {label!r})')
    chunk_id, doc_id, quote = value.get("id"), value.get("docId"), value.get("quote")
    if quote is not None and (not isinstance(quote, str) or not quote.strip()):
        raise ValueError(f"quote: must be a non-blank string when given (got {quote!r})")
    if label == NO_ANSWER:
        chunk_id = doc_id = quote = None
    else:
        for name, text in (("id", chunk_id), ("docId", doc_id)):
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"{name}: must be a non-blank string (got {text!r})")
    return Judgment(
        case_id=value["caseId"],
        query=value["query"],
        id=chunk_id,
        doc_id=doc_id,
        grade=grade if has_grade else None,
        label=label,
        who=value["who"].strip(),
        at=value["at"],
        line=line,
        quote=quote,
    )


def _parse_at(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"at: not an ISO 8601 time (got {text!r})") from None
    if moment.tzinfo is None:
        raise ValueError(f"at: must name its time zone, e.g. a trailing Z for UTC (got {text!r})")
    return moment


def read_judgments(text: str, path: str | Path) -> tuple[list[Judgment], list[str]]:
    """Every readable judgment of a judgments file's `text`, in line order (blank lines skipped), and one
    `file:line: problem` for each line that is not one: a bad line never hides the others."""
    parsed = parse_jsonl(text, path)
    out: list[Judgment] = []
    for number, value in parsed.values:
        try:
            out.append(_validated(value, number))
        except ValueError as exc:
            parsed.refuse(number, str(exc))
    return out, parsed.messages()


def parse_judgments(text: str, path: str | Path) -> list[Judgment]:
    """Every judgment of a judgments file's `text`, in line order; blank lines are skipped. Raises
    `JudgmentsError` with every bad line (`file:line: problem`): `sieve golden export` merges all of a
    file or none of it."""
    judgments, errors = read_judgments(text, path)
    if errors:
        raise JudgmentsError(str(path), errors)
    return judgments


def load_judgments(path: str | Path) -> list[Judgment]:
    """The judgments at `path`; a missing file holds none. JudgmentsError names every bad line."""
    text = _read(path)
    return [] if text is None else parse_judgments(text, path)


def load_judgments_lenient(path: str | Path) -> tuple[list[Judgment], list[str]]:
    """The readable judgments at `path` and the problems of the others (`read_judgments`); a missing file
    holds none. JudgmentsError only when the file cannot be read at all."""
    text = _read(path)
    return ([], []) if text is None else read_judgments(text, path)


def _read(path: str | Path) -> str | None:
    try:
        return read_text(path)
    except OSError as exc:
        raise JudgmentsError(str(path), [f"{path}: cannot read: {exc}"]) from None


# -- resolution -------------------------------------------------------------------------------------------


def latest_by_rater(judgments: Iterable[Judgment]) -> list[Judgment]:
    """Per (case, slot, rater), the latest judgment: the greatest `at`, ties by file order (the later line,
    then the later position in `judgments`). Returned in input order."""
    best: dict[tuple[str, str | None, str], tuple[tuple[datetime, int, int], Judgment]] = {}
    for position, j in enumerate(judgments):
        key = (j.case_id, j.slot, j.who)
        rank = (_parse_at(j.at), j.line, position)
        if key not in best or rank >= best[key][0]:
            best[key] = (rank, j)
    return [j for _, j in sorted(best.values(), key=lambda item: item[0][1:])]


ConflictKind = Literal[
    "grades differ", "forbidden vs relevant", "noAnswer vs relevant", "against the golden set"
]


@dataclass(frozen=True)
class Conflict:
    """Judgments of one case that are not applied, and why."""

    case_id: str
    id: str | None  # the chunk, the document (forbidden vs relevant), or None (the case)
    kind: ConflictKind
    judgments: tuple[Judgment, ...]
    detail: str = ""

    def message(self) -> str:
        said = "; ".join(f"{j.who}: {j.verdict}" + (f" ({j.id})" if j.id else "") for j in self.judgments)
        what = f"case {self.case_id!r}" + (f", {self.id!r}" if self.id else "")
        return f"{what}: {self.kind}" + (f" ({self.detail})" if self.detail else "") + f": {said}"


@dataclass
class CaseVerdict:
    """What the raters agree on for one case: `grades` {chunk id: grade}, `forbidden` {doc id: the
    judgments marking it}, `no_answer`, and each judged chunk's document (`doc_of`). `sources` holds the
    judgments behind each applied decision (for conflicts found later, against the case)."""

    case_id: str
    query: str
    grades: dict[str, int] = field(default_factory=dict)
    forbidden: dict[str, list[Judgment]] = field(default_factory=dict)
    no_answer: list[Judgment] = field(default_factory=list)
    doc_of: dict[str, str] = field(default_factory=dict)
    sources: dict[str, list[Judgment]] = field(default_factory=dict)


def resolve(judgments: Iterable[Judgment]) -> tuple[dict[str, CaseVerdict], list[Conflict]]:
    """The agreed judgments per case and the conflicts between raters (see the module docstring). Takes
    every judgment as read; `latest_by_rater` is applied first."""
    latest = latest_by_rater(judgments)
    by_case: dict[str, list[Judgment]] = {}
    for j in latest:
        by_case.setdefault(j.case_id, []).append(j)
    verdicts: dict[str, CaseVerdict] = {}
    conflicts: list[Conflict] = []
    for case_id, items in by_case.items():
        verdict = CaseVerdict(case_id, items[-1].query)
        per_chunk: dict[str, list[Judgment]] = {}
        for j in items:
            if j.label == NO_ANSWER:
                verdict.no_answer.append(j)
            else:
                chunk = j.id or ""
                per_chunk.setdefault(chunk, []).append(j)
                verdict.doc_of[chunk] = j.doc_id or ""
        graded: dict[str, list[Judgment]] = {}
        forbidding: dict[str, list[Judgment]] = {}
        for chunk, said in per_chunk.items():
            grades = [j for j in said if j.grade is not None]
            if len({j.grade for j in grades}) > 1:
                conflicts.append(Conflict(case_id, chunk, "grades differ", tuple(grades)))
            elif grades:
                graded[chunk] = grades
            for j in said:
                if j.label == FORBIDDEN:
                    forbidding.setdefault(j.doc_id or "", []).append(j)
        relevant_by_doc: dict[str, list[Judgment]] = {}
        for chunk, said in per_chunk.items():
            for j in said:
                if j.grade:
                    relevant_by_doc.setdefault(verdict.doc_of[chunk], []).append(j)
        for doc, marks in forbidding.items():
            if doc in relevant_by_doc:
                conflicts.append(
                    Conflict(case_id, doc, "forbidden vs relevant", (*marks, *relevant_by_doc[doc]))
                )
                for j in relevant_by_doc[doc]:
                    graded.pop(j.id or "", None)
            else:
                verdict.forbidden[doc] = marks
        relevant = [g for grades in graded.values() for g in grades if g.grade]
        if verdict.no_answer and relevant:
            conflicts.append(Conflict(case_id, None, "noAnswer vs relevant", (*verdict.no_answer, *relevant)))
            verdict.no_answer = []
            for j in relevant:
                graded.pop(j.id or "", None)
        for chunk, grades in graded.items():
            verdict.grades[chunk] = int(grades[0].grade or 0)
            verdict.sources[chunk] = grades
        verdicts[case_id] = verdict
    return verdicts, conflicts


# -- merging into a case ----------------------------------------------------------------------------------


@dataclass
class CaseMerge:
    """One case after the merge: its JSON object, what was applied, and the conflicts against it."""

    case: CaseJson
    applied: int = 0
    promoted: bool = False
    conflicts: list[Conflict] = field(default_factory=list)


def merge_case(
    raw: Mapping[str, Any], verdict: CaseVerdict, doc_of: Mapping[str, str] | None = None
) -> CaseMerge:
    """`raw` (a valid case object, as in the file) with `verdict` applied: see the module docstring.
    `doc_of` maps chunk ids to their documents beyond the verdict's own (the chunks of earlier judgments),
    so a document whose chunk the case already grades relevant is not forbidden. The field order of `raw`
    is kept; new fields go at the end."""
    check = _Against(GoldenCase.model_validate(dict(raw)), verdict, {**(doc_of or {}), **verdict.doc_of})
    grades = check.grades()
    forbidden = check.forbidden(grades)
    no_answer = check.no_answer()
    out = json.loads(json.dumps(dict(raw)))  # a deep copy, the same JSON types
    if grades:
        _merge_grades(out, grades, verdict, check.doc_of)
    new_forbidden = [d for d in forbidden if d not in check.forbidden_docs]
    if new_forbidden:
        out["forbiddenDocIds"] = [*(out.get("forbiddenDocIds") or []), *new_forbidden]
    if no_answer:
        out["expectNoAnswer"] = True
    promoted = check.case.draft and (no_answer or any(g > 0 for g in grades.values()))
    if promoted:
        out.pop("draft", None)
    applied = len(grades) + len(forbidden) + int(no_answer)
    try:
        GoldenCase.model_validate(out)
    except ValidationError as exc:
        said = [j for js in verdict.sources.values() for j in js]
        said += [j for js in verdict.forbidden.values() for j in js] + verdict.no_answer
        reason = "; ".join(e["msg"] for e in exc.errors())
        conflict = Conflict(check.case.id, None, "against the golden set", tuple(said), reason)
        return CaseMerge(dict(raw), conflicts=[*check.conflicts, conflict])
    return CaseMerge(out, applied=applied, promoted=promoted, conflicts=check.conflicts)


def _merge_grades(
    out: dict[str, Any], grades: Mapping[str, int], verdict: CaseVerdict, doc_of: Mapping[str, str]
) -> None:
    """Write `grades` into the case `out`: a grade whose judgments carry the chunk's quote as a
    `judgedQuotes` entry (replacing the grade of the same passage), any other under its chunk id in
    `judgments` (replacing the grade of the same key)."""
    quoted = {c: q for c in grades if (q := _quote(verdict.sources.get(c, []))) is not None}
    plain = {c: g for c, g in grades.items() if c not in quoted}
    if plain:
        out["judgments"] = {**(out.get("judgments") or {}), **plain}
    if quoted:
        entries = [{"docId": doc_of.get(c, ""), "quote": q, "grade": grades[c]} for c, q in quoted.items()]
        passages = {(e["docId"], e["quote"]) for e in entries}
        kept = [e for e in out.get("judgedQuotes") or [] if (e.get("docId"), e.get("quote")) not in passages]
        out["judgedQuotes"] = [*kept, *entries]


def _quote(said: Sequence[Judgment]) -> str | None:
    """The chunk's quote the judgments of one chunk recorded (the latest that has one)."""
    return next((j.quote for j in reversed(said) if j.quote is not None), None)


class _Against:
    """A case's verdict checked against what the case already says: each part of the verdict that
    contradicts the case becomes a conflict ("against the golden set") and is left out."""

    def __init__(self, case: GoldenCase, verdict: CaseVerdict, doc_of: Mapping[str, str]):
        self.case = case
        self.verdict = verdict
        self.doc_of = doc_of
        self.conflicts: list[Conflict] = []
        self.evidence = chunk_evidence(case) | set(case.expected_chunk_ids)
        self.forbidden_docs = set(case.forbidden_doc_ids)

    def against(self, key: str | None, said: Sequence[Judgment], detail: str) -> None:
        self.conflicts.append(Conflict(self.case.id, key, "against the golden set", tuple(said), detail))

    def grades(self) -> dict[str, int]:
        """The chunk grades that agree with the case: not 0 for its evidence, not > 0 when it expects no
        answer (and the verdict does not say no answer) or forbids the chunk's document."""
        case, verdict = self.case, self.verdict
        grades: dict[str, int] = {}
        for chunk, grade in verdict.grades.items():
            said = verdict.sources.get(chunk, [])
            doc = self.doc_of.get(chunk, "")
            if grade == 0 and chunk in self.evidence:
                self.against(chunk, said, "graded 0, but the case names this chunk as its evidence")
            elif grade > 0 and case.expect_no_answer and not verdict.no_answer:
                self.against(chunk, said, "graded > 0, but the case expects no answer")
            elif grade > 0 and doc in self.forbidden_docs:
                self.against(chunk, said, f"graded > 0, but the case forbids its document {doc!r}")
            else:
                grades[chunk] = grade
        return grades

    def forbidden(self, grades: Mapping[str, int]) -> list[str]:
        """The documents marked forbidden that the case (with the accepted `grades`) does not expect."""
        case = self.case
        expected_docs = {d for d, g in case.relevance_map().items() if g > 0}
        expected_docs |= {k for k, g in case.judgments.items() if g > 0}
        relevant_chunks = {c for c, g in case.judgments.items() if g > 0} | self.evidence
        relevant_chunks |= {c for c, g in grades.items() if g > 0}
        relevant_docs = expected_docs | {self.doc_of[c] for c in relevant_chunks if c in self.doc_of}
        forbidden: list[str] = []
        for doc, marks in self.verdict.forbidden.items():
            if doc in relevant_docs:
                self.against(doc, marks, "forbidden, but the case expects this document")
            else:
                forbidden.append(doc)
        return forbidden

    def no_answer(self) -> bool:
        """Whether "no answer" applies: said, and the case names no expected result (or already expects
        no answer)."""
        no_answer = bool(self.verdict.no_answer)
        if no_answer and self.case.has_expectation() and not self.case.expect_no_answer:
            self.against(None, self.verdict.no_answer, "no answer, but the case names expected results")
            no_answer = False
        return no_answer


# -- the export ---------------------------------------------------------------------------------------------


@dataclass
class ExportResult:
    cases: list[CaseJson]  # the new golden set's case objects, in order
    applied: int  # judgments applied (grades, forbidden documents, noAnswer)
    promoted: list[str]  # draft case ids promoted into the golden set
    conflicts: list[Conflict]
    warnings: list[str]


def export(
    golden_cases: Sequence[Mapping[str, Any]],
    draft_cases: Sequence[Mapping[str, Any]],
    judgments: Iterable[Judgment],
) -> ExportResult:
    """The golden set's case objects with `judgments` merged in, and the promoted drafts appended (see the
    module docstring). Pure: the caller reads and writes the files."""
    judgments = list(judgments)
    doc_of = {x.id: x.doc_id for x in judgments if x.id is not None and x.doc_id}
    verdicts, conflicts = resolve(judgments)
    golden_ids = {str(c["id"]) for c in golden_cases}
    drafts = {str(c["id"]): c for c in draft_cases if str(c["id"]) not in golden_ids}
    warnings: list[str] = []
    queries = {str(c["id"]): str(c["query"]) for c in [*golden_cases, *drafts.values()]}
    for case_id, judged in list(verdicts.items()):
        if case_id not in queries:
            warnings.append(f"case {case_id!r} is neither in the golden set nor in the drafts: skipped")
            del verdicts[case_id]
        elif judged.query != queries[case_id]:
            warnings.append(
                f"case {case_id!r}: its query changed since it was judged ({judged.query!r} -> "
                f"{queries[case_id]!r}): its judgments are skipped (judge it again)"
            )
            del verdicts[case_id]
    cases: list[CaseJson] = []
    applied = 0
    promoted: list[str] = []
    for raw in golden_cases:
        verdict = verdicts.get(str(raw["id"]))
        if verdict is None:
            cases.append(dict(raw))
            continue
        merged = merge_case(raw, verdict, doc_of)
        cases.append(merged.case)
        applied += merged.applied
        conflicts += merged.conflicts
        if merged.promoted:
            promoted.append(str(merged.case["id"]))
    for case_id, raw in drafts.items():
        verdict = verdicts.get(case_id)
        if verdict is None:
            continue
        merged = merge_case(raw, verdict, doc_of)
        conflicts += merged.conflicts
        if merged.promoted:
            cases.append(merged.case)
            applied += merged.applied
            promoted.append(case_id)
    return ExportResult(cases, applied, promoted, conflicts, warnings)


# -- the golden-set file, its format kept ----------------------------------------------------------------


@dataclass(frozen=True)
class GoldenDocument:
    """A golden-set file's case objects and how it is written: "object" ({"datasetVersion", "cases"}),
    "array" or "jsonl"; `indent` of the JSON forms (None = one line); `top` the object's other keys."""

    kind: Literal["object", "array", "jsonl"]
    cases: list[CaseJson]
    indent: int | None = 2
    top: CaseJson = field(default_factory=dict)


def read_golden_document(text: str, path: str | Path) -> GoldenDocument:
    """The case objects of a golden-set file, with its layout. The file must be a valid golden set (checked
    with `parse_golden_set`, which raises GoldenSetError)."""
    parse_golden_set(text, path)
    if str(path).lower().endswith(".jsonl"):
        return GoldenDocument("jsonl", [json.loads(line) for _, line in split_lines(text)])
    try:
        document = json.loads(text)
    except ValueError:
        return GoldenDocument("jsonl", [json.loads(line) for _, line in split_lines(text)])
    indent = _indent_of(text)
    if isinstance(document, list):
        return GoldenDocument("array", document, indent)
    if "cases" not in document:  # one case object on one line: JSONL
        return GoldenDocument("jsonl", [document])
    top = {k: v for k, v in document.items() if k != "cases"}
    return GoldenDocument("object", document["cases"], indent, top)


def _dataset_version(document: GoldenDocument) -> str | None:
    """The file's datasetVersion (a string or null, as the golden set is validated); None without one."""
    version = document.top.get("datasetVersion") if document.kind == "object" else None
    return version if isinstance(version, str) else None


def _indent_of(text: str) -> int | None:
    for line in text.split("\n")[1:]:
        stripped = line.lstrip(" ")
        if stripped and len(stripped) < len(line):
            return len(line) - len(stripped)
    return None


def render_golden_document(document: GoldenDocument, cases: Sequence[Mapping[str, Any]]) -> str:
    """`cases` written in `document`'s layout (UTF-8 text, not ASCII-escaped, ending in a newline)."""
    if document.kind == "jsonl":
        return render_jsonl(cases)
    value: Any = list(cases) if document.kind == "array" else {**document.top, "cases": list(cases)}
    if "datasetVersion" in document.top:  # keep its place: first
        value = {"datasetVersion": document.top["datasetVersion"], **value}
    return dumps_json(value, document.indent)


def read_drafts(path: str | Path) -> list[CaseJson]:
    """The case objects of the drafts file; a missing or empty file holds none. It must be a valid golden
    set otherwise (GoldenSetError naming file and line)."""
    try:
        text = read_text(path)
    except OSError as exc:
        raise GoldenSetError(str(path), [f"{path}: cannot read the drafts: {exc}"]) from None
    if text is None or not text.strip():
        return []
    return read_golden_document(text, path).cases


def read_drafts_lenient(path: str | Path) -> tuple[list[GoldenCase], list[str]]:
    """The valid draft cases of the drafts file (JSONL), and one `file:line: problem` for each line that is
    not one: the labelling page shows the others. GoldenSetError only when the file cannot be read."""
    try:
        parsed = read_jsonl(path)
    except OSError as exc:
        raise GoldenSetError(str(path), [f"{path}: cannot read the drafts: {exc}"]) from None
    cases = []
    for number, value in parsed.values:
        try:
            cases.append(GoldenCase.model_validate(value))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "case"
            parsed.refuse(number, f"not a case: {where}: {first.get('msg', 'invalid')}")
    return cases, parsed.messages()


class JudgmentLog:
    """The judgments file, appended to by the labelling page through `app.jsonl.append_lines`: one line
    per judgment, one `write`, fsynced, under a lock held across threads and processes, so concurrent raters
    never interleave or lose a line. `read` is lenient (`load_judgments_lenient`): a line edited into
    nonsense by hand is reported, and the other judgments still count."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def append(self, judgment: Judgment) -> None:
        """Append `judgment`, checked first: its line must read back as the same judgment (ValueError
        otherwise, and nothing is written)."""
        line = encode_line(judgment.to_json())
        parsed = parse_jsonl(line.decode("utf-8"), self.path)
        if parsed.problems or len(parsed.values) != 1:
            raise ValueError(f"the judgment does not make one line: {parsed.messages()}")
        if replace(_validated(parsed.values[0][1], 0), line=judgment.line) != judgment:
            raise ValueError("the judgment does not read back as written")
        append_lines(self.path, [judgment.to_json()])

    def read(self) -> tuple[list[Judgment], list[str]]:
        return load_judgments_lenient(self.path)


@dataclass
class ExportOutcome:
    result: ExportResult
    out: Path
    written: bool  # False: the merged set is the file as it was (nothing new to apply)
    golden: Path  # the golden set read (`out` too, unless --out named another file)
    cases_before: int
    added: int  # cases the golden set did not hold (promoted drafts)
    changed: int  # cases it held whose object the merge changed
    version_before: str | None
    version_after: str | None

    def file_line(self) -> str:
        """`wrote golden_set/golden-set.json (67 -> 68 cases; 1 added, 2 changed; datasetVersion 2026-12-03.1
        -> 2026-12-04.1)`, or `unchanged: ...`."""
        details = [f"from {self.golden}"] if self.out != self.golden else []
        moved = [f"{n} {what}" for n, what in ((self.added, "added"), (self.changed, "changed")) if n]
        if moved or self.written:
            details.append(", ".join(moved) if moved else "no case changed")
        if self.version_before != self.version_after:
            details.append(f"datasetVersion {self.version_before} -> {self.version_after}")
        elif self.version_before is not None:
            details.append(f"datasetVersion {self.version_before}")
        after = len(self.result.cases)
        return change_line(self.out, self.written, self.cases_before, after, "case", *details)


def export_files(
    golden_path: str | Path,
    drafts_path: str | Path,
    judgments_path: str | Path,
    out: str | Path | None = None,
    today: date | None = None,
) -> ExportOutcome:
    """`sieve golden export`: merge the judgments file into the golden set (`export`) and write it to `out`
    (default: the golden set itself), in the golden set's layout. When the merged cases differ from the
    golden set's, its datasetVersion moves on (`next_dataset_version` on `today`, default the local date);
    otherwise it is kept. The new text is validated as a golden set first and replaces the file all at once,
    so a failure leaves the old file whole. Raises GoldenSetError (golden set, drafts, or a merge that does
    not validate) and JudgmentsError."""
    golden_path = Path(golden_path)
    try:
        text = golden_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GoldenSetError(
            str(golden_path), [f"{golden_path}: cannot read the golden set: {exc}"]
        ) from None
    document = read_golden_document(text, golden_path)
    result = export(document.cases, read_drafts(drafts_path), load_judgments(judgments_path))
    before = {str(c["id"]): c for c in document.cases}
    added = sum(1 for c in result.cases if str(c["id"]) not in before)
    changed = sum(1 for c in result.cases if str(c["id"]) in before and c != before[str(c["id"])])
    version = _dataset_version(document)
    new_version = next_dataset_version(version, today or date.today()) if added or changed else version
    if new_version != version:
        document = replace(document, top={**document.top, "datasetVersion": new_version})
    new_text = render_golden_document(document, result.cases)
    parse_golden_set(new_text, golden_path)  # the layout is the golden set's, whatever out is called
    target = Path(out) if out is not None else golden_path
    written = not (target == golden_path and new_text == text)
    if written:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(target, new_text, keep_mode=True)
    return ExportOutcome(
        result, target, written, golden_path, len(document.cases), added, changed, version, new_version
    )
