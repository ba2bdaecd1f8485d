"""The golden set: hand-written queries with the documents, chunks or sources that should answer them.

Accepted files (UTF-8):

* a JSON array of cases: `[{...}, {...}]`;
* a JSON object `{"datasetVersion": "2024-06" | null, "cases": [{...}, ...]}`;
* JSONL, one case object per line (blank lines ignored). A `.jsonl` suffix means JSONL; any other suffix is
  decided by content (an array is JSON, an object with "cases" is the wrapped form, several objects one per
  line are JSONL).

Case fields, camelCase, exactly these names (anything else is an error that names it and suggests the
closest valid name): see `GoldenCase`. Every problem in a file is collected and raised together as one
`GoldenSetError` whose lines each name the file, the place (JSONL `file:line`, JSON `cases[i]`), the case id
when known, and the field.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from app.jsonl import split_lines

MAX_REPORTED_ERRORS = 20

RelevanceKey = Literal["doc", "chunk", "source"]
_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


class GoldenSetError(ValueError):
    """An unreadable or invalid golden set; `errors` holds every problem found (file, place, field)."""

    def __init__(self, path: str, errors: list[str]) -> None:
        self.path = path
        self.errors = errors
        shown = errors[:MAX_REPORTED_ERRORS]
        more = len(errors) - len(shown)
        lines = [f"invalid golden set {path} ({len(errors)} error{'s' if len(errors) != 1 else ''}):"]
        lines += [f"  - {error}" for error in shown]
        if more:
            lines.append(f"  ... and {more} more")
        super().__init__("\n".join(lines))


class EvidenceQuote(BaseModel):
    """A passage of a document that holds (part of) the answer: `{"docId": ..., "quote": ...}`. It is
    resolved on each index to a span of the document's normalised text (app/evaluation/golden/quotes.py),
    so it survives re-chunking where a chunk id does not."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=False)

    doc_id: str = Field(alias="docId")
    quote: str

    @field_validator("doc_id", "quote")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise PydanticCustomError("blank", "must not be empty or blank")
        return value


class JudgedQuote(EvidenceQuote):
    """A judged passage: `{"docId", "quote", "grade"}` (grade 0 = judged not relevant, > 0 relevant), what
    the labelling page records for a chunk, so the judgment resolves on any chunking."""

    grade: float = Field(ge=0.0)


EvidenceItem = str | EvidenceQuote  # a chunk id, or a quote


class GoldenCase(BaseModel):
    """One golden query.

    Fields (JSON name → attribute):
      id (str, required, unique in the set, non-blank) → id
      query (str, required, non-blank) → query
      knowledgeTag (str | null) → knowledge_tag
      expectedDocIds (list[str]: documents that answer it, grade 1) → expected_doc_ids
      expectedSources (list[str]: source values, e.g. file paths, that answer it) → expected_sources
      expectedChunkIds (list[str]: chunks that answer it) → expected_chunk_ids
      topK (int 1..100 | null: this case's K; null means the evaluation's default K) → top_k
      note (str) → note
      relevance ({docId: grade}: graded judgements for nDCG; keys count as expected documents, a grade <= 0
        marks a judged non-relevant document) → relevance
      forbiddenDocIds (list[str]: must never appear in the top K) → forbidden_doc_ids
      expectNoAnswer (bool: no document answers it; the right result is empty) → expect_no_answer
      tags (list[str]) → tags
      group (str | null: cases sharing it are paraphrases of one need; the report compares them) → group
      judgments ({docOrChunkId: grade}: judgements of any depth; grade 0 = judged not relevant, > 0 relevant;
        a key that is a chunk id in the index judges that chunk, any other key a document) → judgments
      evidenceChunkIds (list[str]: the chunks that together hold the answer: one evidence group) →
        evidence_chunk_ids
      evidence (list[{docId, quote}]: the passages that together hold the answer, as quotes of their
        documents: one evidence group, with evidenceChunkIds when both are given) → evidence
      anyOf (list[list[str | {docId, quote}]]: acceptable evidence groups, each of chunk ids and/or quotes;
        any one whole group answers) → any_of
      judgedQuotes (list[{docId, quote, grade}]: judged passages; each grades what holds it on this index,
        as a judged chunk does) → judged_quotes
      origin ("manual" | "generated" | "log": how the case was made) → origin
      generator (str | null: what made a generated case, e.g. "offline:heading", "llm:qwen2.5") → generator
      passageChunkId (str | null: the chunk a generated case was made from) → passage_chunk_id
      literalness (float 0..1 | null: share of the query's terms that occur in its passage) → literalness
      draft (bool: not yet labelled; a draft case may name no expectation and is not scored) → draft
      set ("core" | "incremental": the stable core set the gate's defaults guard, or the incremental set
        of newer cases, reported apart; default core) → case_set
      risk ("low" | "medium" | "high" | null: what a wrong answer costs; a high-risk case that breaks fails
        the gate) → risk
      owner (str | null: who answers for the case) → owner
      rationale (str: why the case is in the set, what it guards) → rationale
      asOf (str "YYYY-MM-DD" | null: the date the case is judged as of, for the hard filter's effective
        dates and so its forbidden documents; null means the evaluation's date) → as_of
      principal (str | null: the evaluation principal whose view the case tests, a name of
        `rag.access.eval_principals` or "admin"; null: unscoped, or `rag.access.eval_default_principal`
        when access is enabled) → principal

    Identity never comes from the golden set: a case that carries `tenant`, `groups`, `user`, `access` or
    the like (`IDENTITY_KEYS`) is refused, with a message that points at `principal` and
    `rag.access.eval_principals`.

    Rules: a case that is not expectNoAnswer names at least one expectation (expectedDocIds, expectedSources,
    expectedChunkIds, or a relevance grade > 0); an expectNoAnswer case names none; a document may not be both
    expected and forbidden, nor listed in expectedDocIds with a relevance grade <= 0. Types are strict: "5" is
    not a topK, 1 is not a bool.
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, populate_by_name=False)

    id: str
    query: str
    knowledge_tag: str | None = Field(default=None, alias="knowledgeTag")
    expected_doc_ids: list[str] = Field(default_factory=list, alias="expectedDocIds")
    expected_sources: list[str] = Field(default_factory=list, alias="expectedSources")
    expected_chunk_ids: list[str] = Field(default_factory=list, alias="expectedChunkIds")
    top_k: int | None = Field(default=None, alias="topK", ge=1, le=100)
    note: str = ""
    relevance: dict[str, float] = Field(default_factory=dict)
    forbidden_doc_ids: list[str] = Field(default_factory=list, alias="forbiddenDocIds")
    expect_no_answer: bool = Field(default=False, alias="expectNoAnswer")
    tags: list[str] = Field(default_factory=list)
    group: str | None = None
    judgments: dict[str, float] = Field(default_factory=dict)
    evidence_chunk_ids: list[str] = Field(default_factory=list, alias="evidenceChunkIds")
    evidence: list[EvidenceQuote] = Field(default_factory=list)
    any_of: list[list[str | EvidenceQuote]] = Field(default_factory=list, alias="anyOf")
    judged_quotes: list[JudgedQuote] = Field(default_factory=list, alias="judgedQuotes")
    origin: Literal["manual", "generated", "log"] = "manual"
    generator: str | None = None
    passage_chunk_id: str | None = Field(default=None, alias="passageChunkId")
    literalness: float | None = Field(default=None, ge=0.0, le=1.0)
    draft: bool = False
    case_set: Literal["core", "incremental"] = Field(default="core", alias="set")
    risk: Literal["low", "medium", "high"] | None = None
    owner: str | None = None
    rationale: str = ""
    as_of: date | None = Field(default=None, alias="asOf")
    principal: str | None = None

    @field_validator("as_of", mode="before")
    @classmethod
    def _iso_date(cls, value: Any) -> Any:
        if value is None or isinstance(value, date):
            return value
        if isinstance(value, str) and _ISO_DATE.fullmatch(value):
            try:
                return date.fromisoformat(value)
            except ValueError as exc:
                raise PydanticCustomError("date", "not a calendar date: {why}", {"why": str(exc)}) from None
        raise PydanticCustomError("date", 'must be a date written "YYYY-MM-DD", e.g. "2026-12-01"')

    @field_validator("id", "query")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise PydanticCustomError("blank", "must not be empty or blank")
        return value

    @field_validator("group")
    @classmethod
    def _group_not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise PydanticCustomError("blank", "must not be empty or blank (leave group out instead)")
        return value

    @field_validator("principal")
    @classmethod
    def _principal_not_blank(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or value != value.strip()):
            raise PydanticCustomError(
                "blank",
                "must name an evaluation principal (rag.access.eval_principals), without spaces around it",
            )
        return value

    @field_validator("judgments")
    @classmethod
    def _grades_not_negative(cls, value: dict[str, float]) -> dict[str, float]:
        negative = [key for key, grade in value.items() if grade < 0]
        if negative:
            raise PydanticCustomError(
                "grade",
                "grades are 0 (judged not relevant) or more; negative for {ids}",
                {"ids": ", ".join(repr(key) for key in negative)},
            )
        return value

    @field_validator("any_of")
    @classmethod
    def _groups_not_empty(cls, value: list[list[EvidenceItem]]) -> list[list[EvidenceItem]]:
        if any(not group for group in value):
            raise PydanticCustomError("empty_group", "every anyOf group names at least one chunk id or quote")
        return value

    @model_validator(mode="after")
    def _expectations_agree(self) -> GoldenCase:
        """The case's expectations say one thing: no expected result when it expects no answer, at least one
        relevant result otherwise (unless a draft), and no id both expected and graded out or forbidden."""
        self._no_answer_names_no_result()
        self._names_a_relevant_result()
        self._expected_docs_not_graded_out()
        self._evidence_not_judged_out()
        self._forbidden_not_expected()
        return self

    def _no_answer_names_no_result(self) -> None:
        """expectNoAnswer and an expected result contradict each other."""
        named = [
            alias
            for alias, value in (
                ("expectedDocIds", self.expected_doc_ids),
                ("expectedSources", self.expected_sources),
                ("expectedChunkIds", self.expected_chunk_ids),
                ("relevance", self.relevance),
                ("evidenceChunkIds", self.evidence_chunk_ids),
                ("evidence", self.evidence),
                ("anyOf", self.any_of),
                ("judgments (a grade > 0)", {k: g for k, g in self.judgments.items() if g > 0}),
                ("judgedQuotes (a grade > 0)", [q for q in self.judged_quotes if q.grade > 0]),
            )
            if value
        ]
        if self.expect_no_answer and named:
            raise PydanticCustomError(
                "contradiction",
                "expectNoAnswer is true but the case also names expected results in {fields}; "
                "remove one or the other",
                {"fields": ", ".join(named)},
            )

    def _names_a_relevant_result(self) -> None:
        """A case that is neither a no-answer case nor a draft names a relevant result."""
        if not self.expect_no_answer and not self.draft and not self.has_expectation():
            if self.relevance or self.judgments:
                which = " and ".join(
                    n for n, v in (("relevance", self.relevance), ("judgments", self.judgments)) if v
                )
                raise PydanticCustomError(
                    "no_expectation",
                    "{which} gives no grade > 0 and no other expectation is named: "
                    "the case has no relevant result (set expectNoAnswer if that is intended, or draft "
                    "while it is being labelled)",
                    {"which": which},
                )
            raise PydanticCustomError(
                "no_expectation",
                "no expectation: give expectedDocIds, expectedSources, expectedChunkIds, relevance, "
                "judgments, evidence or evidenceChunkIds, or set expectNoAnswer (or draft while labelling)",
            )

    def _expected_docs_not_graded_out(self) -> None:
        """No expectedDocIds entry is graded <= 0 by relevance or judgments."""
        for name, graded in (("relevance", self.relevance), ("judgments", self.judgments)):
            conflicting = [doc for doc in self.expected_doc_ids if doc in graded and graded[doc] <= 0]
            if conflicting:
                raise PydanticCustomError(
                    "contradiction",
                    "expectedDocIds lists {docs} but {field} grades them <= 0 (not relevant)",
                    {"docs": ", ".join(repr(doc) for doc in conflicting), "field": name},
                )

    def _evidence_not_judged_out(self) -> None:
        """No evidence chunk is judged not relevant."""
        evidence = chunk_evidence(self)
        judged_out = sorted(c for c in evidence if c in self.judgments and self.judgments[c] <= 0)
        if judged_out:
            raise PydanticCustomError(
                "contradiction",
                "evidence chunk(s) {ids} are judged not relevant (grade 0) in judgments",
                {"ids": ", ".join(repr(c) for c in judged_out)},
            )

    def _forbidden_not_expected(self) -> None:
        """No forbidden document is also expected."""
        grades = self.relevance_map()
        expected = {doc for doc, grade in grades.items() if grade > 0}
        expected |= {key for key, grade in self.judgments.items() if grade > 0}
        forbidden = [doc for doc in self.forbidden_doc_ids if doc in expected]
        if forbidden:
            raise PydanticCustomError(
                "contradiction",
                "forbiddenDocIds lists {docs}, which the case also expects",
                {"docs": ", ".join(repr(doc) for doc in forbidden)},
            )

    def has_expectation(self) -> bool:
        """True when the case names at least one relevant result (doc, chunk, source, evidence or a
        grade > 0 in relevance or judgments)."""
        return bool(
            self.expected_doc_ids
            or self.expected_sources
            or self.expected_chunk_ids
            or self.evidence_chunk_ids
            or self.evidence
            or self.any_of
            or any(grade > 0 for grade in self.relevance.values())
            or any(grade > 0 for grade in self.judgments.values())
            or any(q.grade > 0 for q in self.judged_quotes)
        )

    def evidence_groups(self) -> list[list[EvidenceItem]]:
        """The acceptable evidence groups, of chunk ids and quotes: each `anyOf` group, then
        `evidenceChunkIds` and `evidence` together as one more group; at chunk level (only
        `expectedChunkIds` named) those chunks are the one group. Any one whole group in the top K answers
        the question."""
        groups: list[list[EvidenceItem]] = [list(group) for group in self.any_of]
        if self.evidence_chunk_ids or self.evidence:
            groups.append([*self.evidence_chunk_ids, *self.evidence])
        if not groups and self.expected_chunk_ids and not (self.expected_doc_ids or self.relevance):
            groups.append(list(self.expected_chunk_ids))
        return groups

    def relevance_map(self) -> dict[str, float]:
        """Document-level judgements: every expectedDocIds entry with grade 1.0, then `relevance` on top
        (its grade wins for a document in both). Grades <= 0 stay in the map as judged non-relevant."""
        grades = dict.fromkeys(self.expected_doc_ids, 1.0)
        grades.update({doc: float(grade) for doc, grade in self.relevance.items()})
        return grades


def chunk_evidence(case: GoldenCase) -> set[str]:
    """The chunk ids among the case's evidence groups (its quotes left out)."""
    return {item for group in case.evidence_groups() for item in group if isinstance(item, str)}


def case_relevance_key(case: GoldenCase) -> RelevanceKey:
    """What a retrieved chunk is matched on when scoring `case`:

    * "doc"    — the case names documents (expectedDocIds or relevance): a chunk counts for its document,
                 so two chunks of one expected document are a hit and then a duplicate;
    * "chunk"  — otherwise, when it names expectedChunkIds: the chunk id itself (judgments of chunk ids
                 then count at chunk level, and the expected chunks are the case's evidence);
    * "doc"    — otherwise, when it names judgments, judgedQuotes, evidence, evidenceChunkIds or anyOf:
                 chunks and quotes roll up to their documents (see `runner.resolve_case`);
    * "source" — otherwise (only expectedSources): the chunk's source value.

    An expectNoAnswer case (which names none) is "doc", the level forbiddenDocIds is checked at.
    expectedSources beside document-level expectations are expanded to the documents carrying them.
    """
    if case.expected_doc_ids or case.relevance:
        return "doc"
    if case.expected_chunk_ids:
        return "chunk"
    if case.judgments or case.judged_quotes or case.evidence_chunk_ids or case.evidence or case.any_of:
        return "doc"
    if case.expected_sources:
        return "source"
    return "doc"


def case_expected_relevance(case: GoldenCase) -> dict[str, float]:
    """The judgements to score `case` with, keyed at its `case_relevance_key` level: `relevance_map()` for
    "doc", {chunkId: 1.0} for "chunk", {source: 1.0} for "source"; empty for an expectNoAnswer case."""
    key = case_relevance_key(case)
    if key == "chunk":
        return dict.fromkeys(case.expected_chunk_ids, 1.0)
    if key == "source":
        return dict.fromkeys(case.expected_sources, 1.0)
    return case.relevance_map()


class RetiredCase(BaseModel):
    """A case taken out of the golden set on purpose: its id and why (`retired: [{id, reason}]` at the top
    of the file). A case the baseline failed may leave the set only so; the comparison names it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: str
    reason: str

    @field_validator("id", "reason")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise PydanticCustomError("blank", "must not be empty or blank")
        return value


@dataclass(frozen=True)
class GoldenSet:
    dataset_version: str | None
    cases: list[GoldenCase]
    path: str
    retired: list[RetiredCase] = field(default_factory=list)


_FIELD_NAMES = [field.alias or name for name, field in GoldenCase.model_fields.items()]

# Keys that would say who reads, in any spelling (compared with `_squash`): a case never carries an identity;
# it names an evaluation principal (`principal`), defined in the evaluation's configuration. (`group` is
# not one: it is the paraphrase group of a case.)
IDENTITY_KEYS = frozenset(
    {
        "tenant",
        "tenantid",
        "tenants",
        "groups",
        "groupids",
        "user",
        "userid",
        "username",
        "users",
        "subject",
        "subjectid",
        "department",
        "departments",
        "access",
        "acl",
        "role",
        "roles",
        "scope",
        "identity",
        "readers",
        "token",
    }
)


def _squash(text: str) -> str:
    return text.replace("_", "").replace("-", "").lower()


def identity_key_message(name: str) -> str:
    """Why a case may not carry the identity key `name`, and what to write instead."""
    return (
        f'field "{name}" is not allowed: a golden case carries no identity (tenant, groups, user, access); '
        "whose view it tests comes from the evaluation principal it names (principal: NAME), defined in "
        "rag.access.eval_principals in the evaluation's configuration, never from the data file"
    )


_TOP_LEVEL_NAMES = ["datasetVersion", "cases", "retired"]


def _did_you_mean(name: str, valid: list[str]) -> str:
    for candidate in valid:
        if _squash(candidate) == _squash(name):
            return f'; did you mean "{candidate}"?'
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    if close:
        return f'; did you mean "{close[0]}"?'
    return f"; valid fields: {', '.join(valid)}"


def _short(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else json.dumps(value)
    except (ValueError, RecursionError):  # nested too deeply to show
        text = f"({_json_type(value)} nested too deeply to show)"
    return text if len(text) <= 60 else text[:57] + "..."


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _loc_text(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _describe(error: Any) -> str:
    loc = tuple(error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        name = str(loc[-1])
        if len(loc) == 1 and _squash(name) in IDENTITY_KEYS:
            return identity_key_message(name)
        return f'unknown field "{name}"' + _did_you_mean(name, _FIELD_NAMES)
    if kind == "missing":
        return f'field "{_loc_text(loc)}": required field is missing'
    if not loc:
        return error["msg"]
    got = "null" if error["input"] is None else f"{_json_type(error['input'])} {_short(error['input'])}"
    return f'field "{_loc_text(loc)}": {error["msg"]} (got {got})'


@dataclass
class _RawCase:
    where: str  # "file:line" for JSONL, "file: cases[i]" for JSON
    value: Any
    parse_error: str | None = None  # a JSONL line that is not JSON, reported in line order

    def label(self) -> str:
        case_id = self.value.get("id") if isinstance(self.value, dict) else None
        return f"{self.where} (id {case_id!r})" if isinstance(case_id, str) else self.where


def _json_error(path: str, exc: json.JSONDecodeError, line: int | None = None) -> str:
    return f"{path}:{line if line is not None else exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}"


def _unreadable_json(where: str, exc: ValueError | RecursionError) -> str:
    """The message for JSON that json.loads refused with something other than a JSONDecodeError: nesting
    deeper than the parser's recursion limit, an integer longer than Python converts."""
    reason = "nested too deeply to read" if isinstance(exc, RecursionError) else str(exc)
    return f"{where}: invalid JSON: {reason}"


def _split_jsonl(path: str, text: str) -> list[_RawCase]:
    raw: list[_RawCase] = []
    for number, line in split_lines(text):
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raw.append(_RawCase(f"{path}:{number}", None, _json_error(path, exc, number)))
            continue
        except (ValueError, RecursionError) as exc:
            raw.append(_RawCase(f"{path}:{number}", None, _unreadable_json(f"{path}:{number}", exc)))
            continue
        raw.append(_RawCase(f"{path}:{number}", value))
    return raw


def _deepest_line(text: str) -> int:
    """The 1-based line where JSON `text` reaches its deepest nesting (strings skipped)."""
    depth = deepest = 0
    line = deepest_line = 1
    in_string = escaped = False
    for char in text:
        if char == "\n":
            line += 1
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > deepest:
                deepest, deepest_line = depth, line
        elif char in "]}":
            depth -= 1
    return deepest_line


def _looks_like_jsonl(text: str) -> bool:
    first = next((line for _, line in split_lines(text)), "")
    try:
        return isinstance(json.loads(first), dict)
    except (ValueError, RecursionError):
        return False


def _surrogate_problem(value: Any) -> str | None:
    """Where `value` holds a string that is not valid Unicode (a lone surrogate, from a JSON "\\ud800"
    escape), or None. Iterative, so any depth the parser accepted is fine."""
    stack: list[tuple[tuple[int | str, ...], Any]] = [((), value)]
    while stack:
        loc, item = stack.pop()
        texts = [(loc, item)] if isinstance(item, str) else []
        if isinstance(item, dict):
            texts += [((*loc, "(a field name)"), key) for key in item if isinstance(key, str)]
            stack.extend(((*loc, key), child) for key, child in item.items())
        elif isinstance(item, list):
            stack.extend(((*loc, index), child) for index, child in enumerate(item))
        for where, text in texts:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                at = f'field "{_loc_text(where)}": ' if where else ""
                return (
                    f"{at}not valid Unicode: a lone surrogate U+{ord(text[exc.start]):04X} "
                    f"(a \\u{ord(text[exc.start]):04x} escape without its pair)"
                )
    return None


def _safe(text: str) -> str:
    """`text` with lone surrogates escaped, so that a message can be printed and written as UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _retired(path: str, value: Any, errors: list[str]) -> list[RetiredCase]:
    """The top-level `retired` list: `[{"id": ..., "reason": ...}]`, each entry checked."""
    if not isinstance(value, list):
        errors.append(
            f'{path}: field "retired": must be an array of {{"id", "reason"}} objects '
            f"(got {_json_type(value)})"
        )
        return []
    out: list[RetiredCase] = []
    for index, item in enumerate(value):
        try:
            out.append(RetiredCase.model_validate(item))
        except ValidationError as exc:
            for error in exc.errors():
                loc = ("retired", index, *error["loc"])
                if error["type"] == "extra_forbidden":
                    errors.append(
                        f'{path}: field "{_loc_text(loc)}": unknown field; valid fields: id, reason'
                    )
                elif error["type"] == "missing":
                    errors.append(f'{path}: field "{_loc_text(loc)}": required field is missing')
                else:
                    errors.append(f'{path}: field "{_loc_text(loc)}": {error["msg"]}')
    return out


def _split_json(
    path: str, document: Any, errors: list[str], retired: list[RetiredCase]
) -> tuple[str | None, list[_RawCase]]:
    version: str | None = None
    if isinstance(document, dict):
        for key in document:
            if key not in _TOP_LEVEL_NAMES:
                errors.append(
                    f'{path}: unknown top-level field "{key}"' + _did_you_mean(key, _TOP_LEVEL_NAMES)
                )
        raw_version = document.get("datasetVersion")
        if raw_version is not None and not isinstance(raw_version, str):
            errors.append(
                f'{path}: field "datasetVersion": must be a string or null '
                f"(got {_json_type(raw_version)} {_short(raw_version)})"
            )
        else:
            version = raw_version
        if "retired" in document:
            retired.extend(_retired(path, document["retired"], errors))
        if "cases" not in document:
            errors.append(
                f'{path}: field "cases" is missing: expected {{"datasetVersion": ..., "cases": [...]}}'
            )
            return version, []
        document = document["cases"]
        if not isinstance(document, list):
            errors.append(
                f'{path}: field "cases": must be an array of case objects (got {_json_type(document)})'
            )
            return version, []
    elif not isinstance(document, list):
        errors.append(
            f'{path}: expected a JSON array of cases or an object with "cases", got {_json_type(document)}'
        )
        return None, []
    return version, [_RawCase(f"{path}: cases[{index}]", value) for index, value in enumerate(document)]


def parse_golden_set(text: str, path: str | Path) -> GoldenSet:
    """Parse golden-set `text`; `path` names the source in messages and picks JSONL by its `.jsonl` suffix.

    Raises `GoldenSetError` with every problem found.
    """
    path = str(path)
    errors: list[str] = []
    retired: list[RetiredCase] = []
    version, raw = _split_cases(text, path, errors, retired)
    cases, first_position = _validate_cases(raw, errors)
    errors.extend(_retired_conflicts(path, retired, first_position))
    if not errors and not cases:
        errors.append(f"{path}: the golden set is empty: it has no cases")
    if errors:
        raise GoldenSetError(path, [_safe(error) for error in errors])
    return GoldenSet(dataset_version=version, cases=cases, path=path, retired=retired)


def _split_cases(
    text: str, path: str, errors: list[str], retired: list[RetiredCase]
) -> tuple[str | None, list[_RawCase]]:
    """(datasetVersion, the raw cases) of the file's text: JSONL by suffix or by its look, else one JSON
    document (an array of cases, an object with "cases", or a single case). Raises `GoldenSetError` when the
    text is not JSON at all."""
    if path.lower().endswith(".jsonl"):
        return None, _split_jsonl(path, text)
    if not text.strip():
        return None, []
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data" and _looks_like_jsonl(text):
            return None, _split_jsonl(path, text)
        raise GoldenSetError(path, [_json_error(path, exc)]) from None
    except (ValueError, RecursionError) as exc:
        if _looks_like_jsonl(text):  # one line of a JSONL file is too deep: report that line
            return None, _split_jsonl(path, text)
        line = _deepest_line(text) if isinstance(exc, RecursionError) else None
        where = f"{path}:{line}" if line else path
        raise GoldenSetError(path, [_unreadable_json(where, exc)]) from None
    if isinstance(document, dict) and "cases" not in document and ("id" in document or "query" in document):
        # A one-line JSONL file: a single case object.
        return None, [_RawCase(f"{path}:{text[: text.index('{')].count(chr(10)) + 1}", document)]
    return _split_json(path, document, errors, retired)


def _validate_cases(raw: list[_RawCase], errors: list[str]) -> tuple[list[GoldenCase], dict[str, str]]:
    """The cases that validate, and where each case id first appears; every problem goes to `errors`
    (unparsable lines, non-objects, broken Unicode, duplicate ids, invalid fields)."""
    cases: list[GoldenCase] = []
    first_position: dict[str, str] = {}
    for item in raw:
        if item.parse_error is not None:
            errors.append(item.parse_error)
            continue
        if not isinstance(item.value, dict):
            errors.append(f"{item.where}: expected a case object, got {_json_type(item.value)}")
            continue
        unicode_problem = _surrogate_problem(item.value)
        if unicode_problem:
            errors.append(f"{item.label()}: {unicode_problem}")
            continue
        case_id = item.value.get("id")
        if isinstance(case_id, str):
            if case_id in first_position:
                errors.append(
                    f'{item.label()}: field "id": duplicate id {case_id!r}, also at {first_position[case_id]}'
                )
            else:
                first_position[case_id] = item.where
        try:
            cases.append(GoldenCase.model_validate(item.value))
        except ValidationError as exc:
            errors.extend(f"{item.label()}: {_describe(error)}" for error in exc.errors())
    return cases, first_position


def _retired_conflicts(path: str, retired: list[RetiredCase], active: dict[str, str]) -> list[str]:
    """A retired id must not also be an active case, nor be retired twice."""
    errors = []
    seen: set[str] = set()
    for index, item in enumerate(retired):
        if item.id in active:
            errors.append(
                f'{path}: field "retired[{index}].id": case {item.id!r} is retired but still in the set '
                f"(at {active[item.id]}); remove the case or its retirement"
            )
        if item.id in seen:
            errors.append(f'{path}: field "retired[{index}].id": {item.id!r} is retired twice')
        seen.add(item.id)
    return errors


def load_golden_set(path: str | Path) -> GoldenSet:
    """Read and validate the golden set at `path` (JSON array, {"datasetVersion", "cases"} object, or JSONL).

    Raises `GoldenSetError` naming the file for an unreadable file and for every invalid case.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GoldenSetError(str(path), [f"{path}: cannot read the golden set: {exc}"]) from exc
    return parse_golden_set(text, path)
