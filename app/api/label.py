"""The labelling page and its API: `/label` on the server (`sieve serve`) and in `sieve label`.

`GET /label` is the page itself (static, no data in it, so it needs no token); everything it shows or writes
goes through `/api/label/*`, which needs the admin token (`Authorization: Bearer <rag.server.admin_token>`;
`sieve label` makes a one-time token and prints it in the page's URL).

* `GET  /api/label/status`           — ready or not (the models load first), and the default rater name;
* `GET  /api/label/queue`            — the cases to judge, the least judged first (`LabelDesk.queue`);
* `GET  /api/label/cases/{case_id}`  — one case: its pool of candidates (golden/authoring/pool.py) with
                                       the query terms marked, the golden set's judgments and the raters';
* `POST /api/label/judgments`        — one judgment, appended to the judgments file (one line, fsynced).

Files (`rag.label`, or `sieve label`'s flags): the golden set, the drafts (cases from `sieve golden sample`
or `generate`, JSONL), the judgments file, and the queue that `sieve golden pool` writes. The page never
changes the golden set: `sieve golden export` merges the judgments into it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi import Path as FastApiPath
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict

from app.api.bounds import MAX_ID_CHARS, Id, Name
from app.api.deps import require_admin, require_sieve, sieve_state
from app.api.errors import ApiError
from app.api.schemas import error_responses
from app.evaluation.golden.authoring.judgments import (
    NO_ANSWER,
    Judgment,
    JudgmentLog,
    JudgmentsError,
    latest_by_rater,
    make_judgment,
    read_drafts_lenient,
)
from app.evaluation.golden.authoring.pool import (
    BASELINE,
    CURRENT,
    Pool,
    PoolQuery,
    QueueError,
    Ranked,
    baseline_report,
    build_pools,
    highlight,
    read_json,
    read_queue_lenient,
    report_rankings,
    variant_settings,
)
from app.evaluation.golden.cases import GoldenCase, GoldenSetError, case_relevance_key, load_golden_set

if TYPE_CHECKING:
    from app.service import Sieve
    from app.settings import Settings

log = logging.getLogger(__name__)

router = APIRouter()
admin = [Depends(require_admin)]
# unreadable lines shown per file in the answers' `fileProblems` (all are skipped; the log names the first)
MAX_SHOWN_PROBLEMS = 20

# the page runs its own inline script and style, and talks to this server only
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True)
class LabelFiles:
    """Where the labelling page reads and writes; `who` is the rater name the page suggests."""

    golden_set: Path
    drafts: Path
    judgments: Path
    queue: Path
    who: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> LabelFiles:
        label = settings.rag.label
        values: dict[str, Any] = {
            "golden_set": Path(settings.rag.evaluate.resource_location),
            "drafts": Path(label.drafts),
            "judgments": Path(label.judgments),
            "queue": Path(label.queue),
        }
        values.update({k: Path(v) if k != "who" else v for k, v in overrides.items() if v is not None})
        return cls(**values)


@dataclass(frozen=True)
class LabelCase:
    case: GoldenCase
    kind: Literal["golden", "draft"]


class LabelDesk:
    """The labelling state of one app: the files, the judgments log (one lock for every append), and the
    pools, computed once per (case, query, tag, K) and kept until `refresh`. The golden set, the drafts, the
    queue and the judgments are read again at every request: they change under the page's feet (an export,
    another rater, `sieve golden pool`)."""

    def __init__(self, files: LabelFiles) -> None:
        self.files = files
        self.log = JudgmentLog(files.judgments)
        self._pools: dict[tuple[str, str, str | None, int], Pool] = {}
        self._chains: dict[str, Any] | None = None
        self._known: Any = None
        self.baseline_path: str | None = None  # the report the baseline variant came from
        self._lock = threading.Lock()
        self._problems: dict[str, list[str]] = {}
        self._problems_lock = threading.Lock()  # apart: `queued` reads the queue under `_lock` too

    # -- reading the files ---------------------------------------------------------------------------

    def problems(self) -> list[str]:
        """The lines of the drafts, queue and judgments files that could not be read the last time each
        was (`file:line: problem`), at most `MAX_SHOWN_PROBLEMS` of each file."""
        with self._problems_lock:
            return [p for found in self._problems.values() for p in found[:MAX_SHOWN_PROBLEMS]]

    def _note(self, kind: str, problems: list[str]) -> None:
        with self._problems_lock:
            before = self._problems.get(kind, [])
            self._problems[kind] = problems
        if problems and problems != before:
            log.warning(
                "label: %d line(s) of the %s file skipped, the others read; first: %s",
                len(problems),
                kind,
                problems[0],
            )

    def cases(self) -> list[LabelCase]:
        """The golden set's cases, then the drafts not in it (a draft already in it was promoted). A drafts
        line that is not a case is skipped and kept in `problems`."""
        golden = load_golden_set(self.files.golden_set)
        ids = {c.id for c in golden.cases}
        drafts, problems = read_drafts_lenient(self.files.drafts)
        self._note("drafts", problems)
        return [LabelCase(c, "draft" if c.draft else "golden") for c in golden.cases] + [
            LabelCase(c, "draft") for c in drafts if c.id not in ids
        ]

    def queued(self) -> dict[str, list[Ranked]]:
        out: dict[str, list[Ranked]] = {}
        entries, problems = read_queue_lenient(self.files.queue)
        self._note("queue", problems)
        for entry in entries:
            bucket = out.setdefault(entry.case_id, [])
            for ranked in entry.ids:
                if ranked not in bucket:
                    bucket.append(ranked)
        return out

    # -- pools ---------------------------------------------------------------------------------------

    def pools(self, sieve: Sieve, cases: list[LabelCase], refresh: bool = False) -> dict[str, Pool]:
        """Each case's pool, computing those not cached (all of them in one batch per variant)."""
        k_default = sieve.settings.rag.evaluate.top_k
        keys = {
            lc.case.id: (lc.case.id, lc.case.query, lc.case.knowledge_tag, lc.case.top_k or k_default)
            for lc in cases
        }
        with self._lock:
            if refresh:
                self._pools.clear()
                self._known = None
            if self._chains is None:
                self._chains = {
                    name: (sieve.chain if name == CURRENT else sieve.with_settings(s).chain)
                    for name, s in variant_settings(sieve.settings).items()
                }
            if self._known is None:
                from app.evaluation.run.runner import KnownIds

                self._known = KnownIds.from_store(sieve.store)
            missing = [key for key in keys.values() if key not in self._pools]
            if missing:
                self._compute(sieve, missing)
            return {case_id: self._pools[key] for case_id, key in keys.items()}

    def _compute(self, sieve: Sieve, keys: list[tuple[str, str, str | None, int]]) -> None:
        evaluate = sieve.settings.rag.evaluate
        report_path = baseline_report(evaluate.output_dir, evaluate.report_prefix)
        baseline = {}
        if report_path is not None:
            baseline = report_rankings(read_json(report_path) or {})
        self.baseline_path = str(report_path) if report_path else None
        lexical = sieve.lexical

        def best_of(query: str, ids: Sequence[str]) -> str | None:
            scores = lexical.scores(query, ids)
            return max(ids, key=lambda i: (scores.get(i, 0.0), i)) if ids else None

        pools = build_pools(
            [PoolQuery(*key) for key in keys],
            self._chains or {},
            sieve.store,
            baseline=baseline,
            queued=self.queued(),
            best_of=best_of,
            today=evaluate.as_of,
        )
        for key in keys:
            self._pools[key] = pools[key[0]]
        log.info("label: pooled %d case(s) (baseline report: %s)", len(keys), self.baseline_path or "none")

    # -- views ---------------------------------------------------------------------------------------

    def judgments_by_case(self) -> dict[str, list[Judgment]]:
        judgments, problems = self.log.read()
        self._note("judgments", problems)
        out: dict[str, list[Judgment]] = {}
        for j in latest_by_rater(judgments):
            out.setdefault(j.case_id, []).append(j)
        return out

    def case_view(
        self, sieve: Sieve, label_case: LabelCase, pool: Pool, said: list[Judgment], with_text: bool = True
    ) -> dict[str, Any]:
        """One case as the page shows it (see `GET /api/label/cases/{case_id}`); `with_text` False leaves
        the texts out (the queue only counts)."""
        from app.evaluation.run.runner import resolve_case

        case = label_case.case
        grades, judged, _ = resolve_case(case, self._known)
        level = case_relevance_key(case)
        evidence = {c for group in case.evidence_groups() for c in group}
        terms = sieve.analyzer.tokens(case.query)
        by_chunk: dict[str, list[Judgment]] = {}
        for j in said:
            if j.id is not None and j.query == case.query:
                by_chunk.setdefault(j.id, []).append(j)
        items: list[dict[str, Any]] = []
        for chunk in pool.chunks:
            entry = chunk.entry
            key = {"doc": entry.doc_id, "chunk": entry.chunk_id, "source": chunk.source}[level]
            golden_grade = case.judgments.get(entry.chunk_id, grades.get(key))
            in_golden = key in judged or entry.chunk_id in case.judgments
            raters = [_said(j) for j in by_chunk.get(entry.chunk_id, [])]
            items.append(
                {
                    "id": entry.chunk_id,
                    "docId": entry.doc_id,
                    "title": chunk.title,
                    "source": chunk.source,
                    "inIndex": chunk.in_index,
                    "segments": highlight(chunk.text, terms, sieve.analyzer.tokens) if with_text else [],
                    "variants": entry.ranks,
                    "golden": {
                        "judged": in_golden,
                        "grade": golden_grade if in_golden else None,
                        "forbidden": entry.doc_id in case.forbidden_doc_ids,
                        "evidence": entry.chunk_id in evidence,
                    },
                    "judgments": raters,
                    "unjudged": not in_golden and not raters,
                }
            )
        # the chunks the golden set does not judge first, each part in pool order; a judgment made on the
        # page does not move its chunk, so the rater's place in the list holds
        items.sort(key=lambda item: item["golden"]["judged"])
        no_answer = [_said(j) for j in said if j.label == NO_ANSWER and j.query == case.query]
        return {
            "caseId": case.id,
            "query": case.query,
            "knowledgeTag": case.knowledge_tag,
            "kind": label_case.kind,
            "k": pool.query.k,
            "matchOn": level,
            "expectNoAnswer": case.expect_no_answer,
            "noAnswer": no_answer,
            "terms": sorted(set(terms)),
            "variantErrors": pool.errors,
            "baselineReport": self.baseline_path if any(BASELINE in i["variants"] for i in items) else None,
            "items": items,
        }


def _said(j: Judgment) -> dict[str, Any]:
    out: dict[str, Any] = {"who": j.who, "at": j.at}
    if j.label is not None:
        out["label"] = j.label
    else:
        out["grade"] = j.grade
    return out


def label_desk(request: Request) -> LabelDesk:
    """The app's desk: made on first use from `rag.label` unless the app was given one (`sieve label`)."""
    desk = getattr(request.app.state, "label_desk", None)
    if desk is None:
        desk = LabelDesk(LabelFiles.from_settings(sieve_state(request).settings))
        request.app.state.label_desk = desk
    return desk


def _read_cases(desk: LabelDesk) -> list[LabelCase]:
    try:
        return desk.cases()
    except (GoldenSetError, JudgmentsError, QueueError) as exc:
        raise ApiError(422, str(exc)) from None


def _judgments(desk: LabelDesk) -> dict[str, list[Judgment]]:
    try:
        return desk.judgments_by_case()
    except JudgmentsError as exc:
        raise ApiError(422, str(exc)) from None


def _pools(desk: LabelDesk, sieve: Sieve, cases: list[LabelCase], refresh: bool = False) -> dict[str, Pool]:
    try:
        return desk.pools(sieve, cases, refresh)
    except QueueError as exc:
        raise ApiError(422, str(exc)) from None


# -- routes --------------------------------------------------------------------------------------------------


@router.get("/label", tags=["labelling"], response_class=HTMLResponse, include_in_schema=False)
def label_page() -> HTMLResponse:
    """The labelling page (static; it asks for the admin token and sends it with every API call)."""
    page = resources.files("app.api").joinpath("static/label.html").read_text(encoding="utf-8")
    return HTMLResponse(page, headers=PAGE_HEADERS)


@router.get(
    "/api/label/status", tags=["labelling"], dependencies=admin, responses=error_responses(401, 403, 500)
)
def label_status(request: Request) -> JSONResponse:
    """`ready` (models loaded, index open), what startup is doing meanwhile, and the suggested rater."""
    state = sieve_state(request)
    desk = label_desk(request)
    return JSONResponse(
        {
            "ready": bool(state.ready and state.sieve is not None),
            "phase": state.error or state.phase,
            "who": desk.files.who,
            "files": {
                "goldenSet": str(desk.files.golden_set),
                "drafts": str(desk.files.drafts),
                "judgments": str(desk.files.judgments),
                "queue": str(desk.files.queue),
            },
        }
    )


@router.get(
    "/api/label/queue",
    tags=["labelling"],
    dependencies=admin,
    responses=error_responses(401, 403, 422, 500, 503),
)
def label_queue(request: Request, refresh: bool = False) -> JSONResponse:
    """The cases to judge: every draft, every queued case (`sieve golden pool`), and every golden-set case
    whose pool holds a chunk the golden set does not judge. Cases with unjudged chunks (judged neither in
    the golden set nor in the judgments file) come first: queued, then drafts, then the rest, each in file
    order. `refresh=true` computes the pools again (after an ingest or a configuration change)."""
    unknown = sorted(set(request.query_params) - {"refresh"})
    if unknown:
        raise ApiError(422, f"unknown query parameter {unknown[0]!r} (only refresh)", field=unknown[0])
    sieve = require_sieve(request)
    desk = label_desk(request)
    cases = _read_cases(desk)
    pools = _pools(desk, sieve, cases, refresh)
    said = _judgments(desk)
    queued = desk.queued()
    rows = []
    for position, label_case in enumerate(cases):
        view = desk.case_view(
            sieve, label_case, pools[label_case.case.id], said.get(label_case.case.id, []), with_text=False
        )
        open_items = sum(1 for i in view["items"] if not i["golden"]["judged"])
        is_queued = label_case.case.id in queued
        if label_case.kind == "golden" and not open_items and not is_queued:
            continue
        unjudged = sum(1 for i in view["items"] if i["unjudged"])
        rows.append(
            (
                (unjudged == 0, not is_queued, label_case.kind != "draft", position),
                {
                    "caseId": view["caseId"],
                    "query": view["query"],
                    "kind": view["kind"],
                    "queued": is_queued,
                    "pool": len(view["items"]),
                    "unjudged": unjudged,
                    "judgedHere": sum(1 for i in view["items"] if i["judgments"]),
                    "noAnswer": bool(view["noAnswer"]),
                },
            )
        )
    rows.sort(key=lambda row: row[0])
    return JSONResponse(
        {
            "cases": [row for _, row in rows],
            "baselineReport": desk.baseline_path,
            "fileProblems": desk.problems(),
        }
    )


@router.get(
    "/api/label/cases/{case_id}",
    tags=["labelling"],
    dependencies=admin,
    responses=error_responses(401, 403, 404, 422, 500, 503),
)
def label_case(
    case_id: Annotated[str, FastApiPath(max_length=MAX_ID_CHARS)], request: Request
) -> JSONResponse:
    """One case: its pool (each chunk with the variants that returned it and at which rank, its text as
    segments marking the query's BM25 terms, the golden set's judgment of it and each rater's latest one),
    the chunks the golden set does not judge first, and the raters' "no answer" marks."""
    sieve = require_sieve(request)
    desk = label_desk(request)
    found = _find(desk, case_id)
    pool = _pools(desk, sieve, [found])[found.case.id]
    view = desk.case_view(sieve, found, pool, _judgments(desk).get(found.case.id, []))
    return JSONResponse({**view, "fileProblems": desk.problems()})


def _find(desk: LabelDesk, case_id: str, field: str = "case_id") -> LabelCase:
    for label_case in _read_cases(desk):
        if label_case.case.id == case_id:
            return label_case
    raise ApiError(404, f"no case {case_id!r} in the golden set or the drafts", field=field)


class JudgmentRequest(BaseModel):
    """One judgment: a `grade` 0-3 or a `label` ("forbidden" needs the chunk `id`; "noAnswer" is about the
    query, no id)."""

    model_config = ConfigDict(extra="forbid")

    caseId: Id
    id: Id | None = None
    grade: Literal[0, 1, 2, 3] | None = None
    label: Literal["forbidden", "noAnswer"] | None = None
    who: Name


@router.post(
    "/api/label/judgments",
    tags=["labelling"],
    dependencies=admin,
    responses=error_responses(401, 403, 404, 413, 422, 500, 503),
)
def add_judgment(body: JudgmentRequest, request: Request) -> JSONResponse:
    """Append one judgment to the judgments file (one line: caseId, query, id, docId, grade or label, who,
    at) and answer with the case as `GET /api/label/cases/{case_id}` shows it now."""
    sieve = require_sieve(request)
    desk = label_desk(request)
    if (body.grade is None) == (body.label is None):
        raise ApiError(
            422, 'give exactly one of "grade" (0-3) and "label" ("forbidden", "noAnswer")', field="grade"
        )
    if body.label != NO_ANSWER and body.id is None:
        raise ApiError(422, "id: the chunk being judged is required (only noAnswer has none)", field="id")
    found = _find(desk, body.caseId, field="caseId")
    pool = _pools(desk, sieve, [found])[found.case.id]
    doc_id = None
    if body.label != NO_ANSWER:
        pooled = {c.entry.chunk_id: c.entry.doc_id for c in pool.chunks}
        doc_id = pooled.get(body.id or "")
        if not doc_id:
            stored = sieve.store.chunks([body.id or ""])
            if body.id not in stored:
                raise ApiError(422, f"id: no chunk {body.id!r} in the index", field="id")
            doc_id = str(stored[body.id or ""].metadata.get("doc_id", ""))
    try:
        judgment = make_judgment(
            found.case.id,
            found.case.query,
            None if body.label == NO_ANSWER else body.id,
            doc_id,
            grade=body.grade,
            label=body.label,
            who=body.who.strip(),
        )
        desk.log.append(judgment)  # checks that the line reads back before writing it
    except ValueError as exc:
        raise ApiError(422, f"the judgment cannot be stored: {exc}") from None
    view = desk.case_view(sieve, found, pool, _judgments(desk).get(found.case.id, []))
    return JSONResponse({**view, "fileProblems": desk.problems()})
