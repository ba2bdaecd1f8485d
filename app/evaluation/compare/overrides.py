"""One run's changes to `rag.evaluate`: K, the baseline and the gate's levels. The one table of them: the
request body of `POST /api/evaluations/runs` is this model (camelCase keys), and `sieve eval` builds its
flags from it (`--min-recall` for `min_recall`) and sends it to a server as this model's JSON."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from app.settings import EvaluateSettings

# the fields that set a key of rag.evaluate.thresholds (the others set rag.evaluate's own key)
THRESHOLDS = ("min_recall", "min_hit_rate", "min_mrr", "min_ndcg", "max_duplicate_rate", "max_p95_ms")


class EvaluationOverrides(BaseModel):
    """One run's changes to the server's `rag.evaluate`; a field left out keeps the server's setting."""

    model_config = ConfigDict(extra="forbid", strict=True, alias_generator=to_camel, validate_by_name=False)

    top_k: int | None = Field(None, ge=1, le=100, description="K for the metrics; default rag.evaluate.top_k")
    baseline: str | None = Field(
        None, description="the baseline to compare with; default rag.evaluate.baseline"
    )
    min_recall: float | None = Field(None, ge=0.0, le=1.0, description="rag.evaluate.thresholds.min_recall")
    min_hit_rate: float | None = Field(
        None, ge=0.0, le=1.0, description="rag.evaluate.thresholds.min_hit_rate"
    )
    min_mrr: float | None = Field(None, ge=0.0, le=1.0, description="rag.evaluate.thresholds.min_mrr")
    min_ndcg: float | None = Field(None, ge=0.0, le=1.0, description="rag.evaluate.thresholds.min_ndcg")
    max_duplicate_rate: float | None = Field(
        None, ge=0.0, le=1.0, description="rag.evaluate.thresholds.max_duplicate_rate"
    )
    max_p95_ms: float | None = Field(None, gt=0.0, description="rag.evaluate.thresholds.max_p95_ms")

    def apply(self, settings: EvaluateSettings) -> EvaluateSettings:
        """`settings` with this run's fields set (validated as the YAML would be)."""
        data = settings.model_dump()
        for name, value in self.given().items():
            if name in THRESHOLDS:
                data["thresholds"][name] = value
            else:
                data[name] = value
        return EvaluateSettings.model_validate(data)

    def given(self) -> dict[str, int | float | str]:
        """The fields this run sets, by field name (the rag.evaluate or rag.evaluate.thresholds key)."""
        return {name: value for name, value in self if value is not None}


def setting_key(name: str) -> str:
    """The full settings key a field of `EvaluationOverrides` sets: `rag.evaluate.thresholds.min_recall`."""
    return f"rag.evaluate.thresholds.{name}" if name in THRESHOLDS else f"rag.evaluate.{name}"


def flag(name: str) -> str:
    """The `sieve eval` flag of a field: `--min-recall` for `min_recall`."""
    return "--" + name.replace("_", "-")
