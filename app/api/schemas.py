"""Request and response shapes of the HTTP API (camelCase on the wire).

The answer to a retrieval, which `sieve query --json` prints too, is app/retrieve_response.py.
"""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from app.api.bounds import (
    MAX_DOCUMENTS,
    MAX_REPORTED_PROBLEMS,
    Id,
    Tag,
    Text,
    Title,
    metadata_problem,
)
from app.api.errors import safe_text
from app.store import metadata_key_problem, metadata_value_problem, unicode_problem


class RetrieveRequest(BaseModel):
    # strict: the schema's types exactly: `"topK": true` or `"debug": "yes"` is a 422, not coerced
    model_config = ConfigDict(extra="forbid", strict=True)

    query: Text = Field(..., description="the question; not blank, at most rag.retrieval.max_query_chars")
    topK: int | None = Field(
        None, ge=1, le=100, description="how many documents; default rag.retrieval.top_k"
    )
    knowledgeTag: Tag | None = Field(
        None, description="only chunks with this `knowledge` metadata; at most MAX_TAG_CHARS (256) characters"
    )
    debug: bool = Field(False, description="add every removed id with its reason to each stage")

    @field_validator("query")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("query must not be blank")
        return value


class DocumentIn(BaseModel):
    """A document; every other key is scalar metadata. Metadata keys must be non-empty and not reserved by the
    store (see `app.store.metadata_key_problem`); strings anywhere must be valid Unicode. Bounds:
    `app.api.bounds` (the text's is rag.ingest.max_document_chars)."""

    model_config = ConfigDict(extra="allow")

    id: Id
    title: Title = ""
    text: Text = Field(..., min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode_keys_and_values(cls, data: Any) -> Any:
        # before pydantic reads them: it turns a key it cannot decode into an error for the whole document
        if isinstance(data, dict):
            problems = []
            for key, value in data.items():
                if isinstance(key, str) and (problem := unicode_problem(key)):
                    problems.append(_problem(f"field name {problem}", (safe_text(key),), safe_text(key)))
                elif isinstance(value, str) and (problem := unicode_problem(value)):
                    problems.append(_problem(problem, (key,), value))
            if problems:
                raise ValidationError.from_exception_data("DocumentIn", problems)
        return data

    @model_validator(mode="after")
    def _valid_metadata(self) -> DocumentIn:
        extra = self.model_extra or {}
        problems = []
        for key, value in extra.items():
            problem = (
                metadata_problem(key, value) or metadata_key_problem(key) or metadata_value_problem(value)
            )
            if problem:
                problems.append(_problem(problem, (key,), value))
        if problems:
            # a ValidationError raised here keeps each problem's location: documents.<i>.<key>
            raise ValidationError.from_exception_data("DocumentIn", problems)
        return self


class DocumentsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    documents: list[DocumentIn] = Field(..., min_length=1, max_length=MAX_DOCUMENTS)

    @model_validator(mode="after")
    def _unique_ids(self) -> DocumentsRequest:
        first: dict[str, int] = {}
        problems = []
        for i, doc in enumerate(self.documents):
            if doc.id in first:
                problems.append(
                    _problem(
                        f"duplicate id (also documents.{first[doc.id]}.id); "
                        "ids must be unique within a request",
                        ("documents", i, "id"),
                        doc.id,
                    )
                )
            else:
                first[doc.id] = i
        if problems:
            raise ValidationError.from_exception_data("DocumentsRequest", problems)
        return self


def _problem(message: str, loc: tuple[str | int, ...], value: Any) -> InitErrorDetails:
    # the message goes in as a template argument, so braces in it are kept as they are
    error = PydanticCustomError("invalid_document", "{problem}", {"problem": message})
    return InitErrorDetails(type=error, loc=loc, input=value)


class IngestResponse(BaseModel):
    documents: int
    chunks: int
    added: int
    updated: int = Field(description="metadata rewritten, text and vector unchanged")
    unchanged: int
    deleted: int
    errors: list[str]


class JobAccepted(BaseModel):
    job: str = Field(description="the job id; GET /api/jobs/{job} shows its progress and result")


class DocumentDeleted(BaseModel):
    id: str
    documents: int = Field(description="1 when the document record held it, else 0")
    chunks: int = Field(description="its chunks deleted from the index")


class FieldProblem(BaseModel):
    field: str = Field(..., description="where in the request: `query`, `documents.3.id`, `body`")
    message: str


class ErrorResponse(BaseModel):
    """The body of every error answer."""

    error: str = Field(..., description="what went wrong, in one line")
    fields: list[FieldProblem] | None = Field(
        None, description=f"the request fields at fault (422), the first {MAX_REPORTED_PROBLEMS}"
    )
    count: int | None = Field(
        None, description="422: how many problems the request has (`fields` shows some)"
    )
    limit: int | None = Field(None, description="413: rag.server.max_body_bytes, the largest body taken")
    requestId: str | None = Field(
        None,
        description="500, 503 and 507: the id the error (a traceback, the store's reason) is logged under",
    )


class ReadyResponse(BaseModel):
    status: str = Field(..., description="ready | starting | failed | unavailable")
    reason: str | None = Field(
        None, description="why not ready: the startup phase, its error, or the store's"
    )
    evaluationProgress: str | None = None
    unindexed: str | None = Field(
        None,
        description="ready, but documents of the document record are not indexed (not served): how many, "
        "which and why (the reconciliation tries again at the next start and after the next write job)",
    )


ERROR_DESCRIPTIONS = {
    401: "missing or wrong token (`Authorization: Bearer ...`)",
    403: "not allowed: writes need rag.server.admin_token to be configured and given",
    404: "no such resource",
    409: "another write or evaluation is running",
    413: "the request body is larger than rag.server.max_body_bytes",
    422: f"invalid request: `fields` names the fields at fault (the first {MAX_REPORTED_PROBLEMS}), `count` "
    "how many there are",
    429: "too many retrievals at once (rag.server.max_concurrent_retrievals, max_queued_retrievals, "
    "queue_timeout_ms): retry after the `Retry-After` header's seconds",
    500: "internal error: the traceback is logged under `requestId`",
    503: "not ready yet, or the vector store is unreachable",
    507: "insufficient storage: the write would leave less than rag.store.min_free_mb free where Sieve "
    "writes, or ran out of space; nothing of it was acknowledged. Send it again once space is freed",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a route: these statuses, each answered with an `ErrorResponse`."""
    return {s: {"model": ErrorResponse, "description": ERROR_DESCRIPTIONS[s]} for s in statuses}


# what a route can answer besides success, by kind of route: queries; writes; reads of admin resources
# (reports, jobs), which need the admin token too
READ_ERRORS = error_responses(401, 413, 422, 429, 500, 503)
WRITE_ERRORS = error_responses(401, 403, 409, 413, 422, 500, 503, 507)
REPORT_ERRORS = error_responses(401, 403, 404, 500)
JOB_ERRORS = error_responses(401, 403, 404, 422, 500)
# a route whose success is not JSON (the HTML report): FastAPI would give a `model` its media type, so the
# JSON error body is declared by reference (ErrorResponse is in the components through the other routes)
HTML_REPORT_ERRORS: dict[int | str, dict[str, Any]] = {
    s: {
        "description": ERROR_DESCRIPTIONS[s],
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
    }
    for s in (401, 403, 404, 500)
}  # 422: a path parameter FastAPI could not read
