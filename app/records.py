"""The camelCase records that serving and the evaluation both show, kept below both so the serving answer
(`app.retrieve_response`) never depends on the evaluation: `Model`, the base of every such record, and
`RemovedItem`, one removal as the API's debug view and the report show it.

A leaf: it imports nothing from the rest of the app. The evaluation report model re-exports both
(`app.evaluation.report.model`), so its callers keep their imports.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class Model(BaseModel):
    """A record with camelCase JSON keys (also for a plain `model_dump` and in API responses), read by alias
    or by field name."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, serialize_by_alias=True)

    def to_json(self) -> dict[str, Any]:
        """The record's JSON: `model_dump(mode="json", by_alias=True)`."""
        return self.model_dump(mode="json", by_alias=True)


class RemovedItem(Model):
    """A candidate a stage removed, with the stage's reason (`dense=0.21 < 0.30`) and whether it was one of
    the case's expected ids (`relevant`; None outside an evaluation). The one type of a removal as the report
    and the API's debug view show it (the chain's own record is `app.retrieval.types.Removal`)."""

    chunk_id: str
    doc_id: str
    reason: str
    relevant: bool | None = None
