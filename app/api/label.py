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

from importlib import resources
from typing import TYPE_CHECKING, Annotated, Literal

from fastapi import APIRouter, Depends, Request
from fastapi import Path as FastApiPath
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict

from app.api.bounds import MAX_ID_CHARS, Id, Name
from app.api.deps import require_admin, require_sieve, sieve_state
from app.api.errors import ApiError
from app.api.schemas import error_responses
from app.evaluation.golden.authoring.judgments import NO_ANSWER, Judgment, JudgmentsError, make_judgment
from app.evaluation.golden.authoring.pool import Pool, QueueError
from app.evaluation.golden.cases import GoldenSetError
from app.label_desk import LabelCase, LabelDesk, LabelFiles

if TYPE_CHECKING:
    from app.service import Sieve

router = APIRouter()
admin = [Depends(require_admin)]

# the page runs its own inline script and style, and talks to this server only
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


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
    doc_id = quote = None
    if body.label != NO_ANSWER:
        stored = sieve.store.chunks([body.id or ""])
        if body.id not in stored:
            raise ApiError(422, f"id: no chunk {body.id!r} in the index", field="id")
        chunk = stored[body.id or ""]
        doc_id = str(chunk.metadata.get("doc_id", ""))
        # a grade records the chunk's text as its quote, so the export's judgment resolves on any chunking
        quote = " ".join(chunk.text.split()) if body.grade is not None and chunk.text.strip() else None
    try:
        judgment = make_judgment(
            found.case.id,
            found.case.query,
            None if body.label == NO_ANSWER else body.id,
            doc_id,
            grade=body.grade,
            label=body.label,
            who=body.who.strip(),
            quote=quote,
        )
        desk.log.append(judgment)  # checks that the line reads back before writing it
    except ValueError as exc:
        raise ApiError(422, f"the judgment cannot be stored: {exc}") from None
    view = desk.case_view(sieve, found, pool, _judgments(desk).get(found.case.id, []))
    return JSONResponse({**view, "fileProblems": desk.problems()})
