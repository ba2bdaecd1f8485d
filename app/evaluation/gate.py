"""The quality gate: thresholds on the summary figures. Every threshold left unset is not checked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.settings import EvaluateThresholds

# threshold field -> (summary key, comparison)
_CHECKS = {
    "min_recall": ("recall", ">="),
    "min_hit_rate": ("hitRate", ">="),
    "min_mrr": ("mrr", ">="),
    "min_ndcg": ("ndcg", ">="),
    "max_duplicate_rate": ("duplicateRate", "<="),
    "max_p95_ms": ("latencyMs.p95", "<="),
}


@dataclass(frozen=True)
class GateCheck:
    name: str
    metric: str
    op: str
    threshold: float
    value: float | None
    passed: bool

    def describe(self) -> str:
        shown = "n/a" if self.value is None else f"{self.value:.4f}"
        return f"{self.name}: {self.metric}={shown}, needs {self.op} {self.threshold}"


def check_gate(summary: dict[str, Any], thresholds: EvaluateThresholds) -> list[GateCheck]:
    """One check per threshold that is set. A figure that could not be computed (no case had relevant
    documents, so there is no recall) fails its check: a gate never passes on missing evidence."""
    checks = []
    for name, (metric, op) in _CHECKS.items():
        threshold = getattr(thresholds, name)
        if threshold is None:
            continue
        value = _lookup(summary, metric)
        passed = value is not None and (value >= threshold if op == ">=" else value <= threshold)
        checks.append(GateCheck(name, metric, op, float(threshold), value, passed))
    return checks


def _lookup(summary: dict[str, Any], dotted: str) -> float | None:
    node: Any = summary
    for part in dotted.split("."):
        if not isinstance(node, dict) or node.get(part) is None:
            return None
        node = node[part]
    return float(node)
