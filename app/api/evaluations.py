"""`POST /api/evaluations/runs`: the request that may adjust one run's settings (the evaluation's one model
of a run's overrides, narrowed to the baselines a server reads itself) and the outcome it answers with
(`render.lines.EvaluationRunResponse`: what `sieve eval` prints)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from app.evaluation.compare.overrides import EvaluationOverrides
from app.evaluation.render.lines import EvaluationGate, EvaluationRunResponse


class EvaluationRunRequest(EvaluationOverrides):
    """One run's changes to the server's `rag.evaluate`; a field left out keeps the server's setting."""

    baseline: Literal["previous-passing", "previous", "none"] | None = Field(
        None, description="the baseline to compare with; default rag.evaluate.baseline"
    )


__all__ = ["EvaluationGate", "EvaluationRunRequest", "EvaluationRunResponse"]
