"""The experiment report: one JSON object, and the Markdown and HTML drawn from it, plus the winning overlay.

`experiment.json` holds `variants: [{name, overlay, summary, cost, ...}]` (the base first, overlay {}),
`summary` being the variant's report summary as `sieve eval` writes it and `cost` its `ingestSeconds`,
`chunks`, `storeBytes`, `p50Ms`, `p95Ms` and `contextChars`; each variant's `comparison` with the base
(app/experiment/compare.py) and its Pareto mark; `detectableDifference`, the ceiling check and the winner.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from app.evaluation.report.model import Report
from app.experiment.compare import VariantComparison, compare_with_base, holm_over_family
from app.experiment.run import BASE, ExperimentRun, VariantRun
from app.experiment.verdict import ALPHA, POWER, ceiling, pareto_front
from app.files import atomic_write_text
from app.settings import Settings, merge, nested, read_yaml_config

DETECTABLE_FORMULA = "d = (z_{1-alpha/2} + z_{power}) * sd / sqrt(n), sd of the per-case paired differences"


def experiment_json(run: ExperimentRun, settings: Settings) -> dict[str, Any]:
    """The experiment report's JSON object (the module docstring)."""
    ex, ev = settings.rag.experiment, settings.rag.evaluate
    base = run.runs[0].report
    comparisons = {r.name: compare_with_base(base, r.report, ev.seed) for r in run.runs[1:]}
    holm_over_family(comparisons, ev.alpha)
    front = pareto_front({r.name: _point(r, ex.measure) for r in run.runs})
    rows = [_variant_row(r, comparisons.get(r.name), r.name in front, run.output_dir) for r in run.runs]
    top = ceiling(_base_values(base, ex.measure))
    warnings = [*run.warnings, *(w for w in [top.warning(ex.measure, ex.ceiling_share)] if w)]
    return {
        "name": run.spec.name,
        "file": str(run.spec.path),
        "design": run.spec.design,
        "notes": run.spec.notes,
        "goldenSet": ev.resource_location,
        "k": ev.top_k,
        "measure": ex.measure,
        "alpha": ev.alpha,
        "seconds": round(run.seconds, 3),
        "embedded": run.embedded,
        "embeddingCacheHits": run.cache_hits,
        "variants": rows,
        "detectableDifference": detectable_json(comparisons, ex.measure),
        "ceiling": {"measure": ex.measure, "atOne": top.at_one, "cases": top.cases, "share": top.share},
        "winner": winner(run.runs, comparisons, ex.measure),
        "warnings": warnings,
    }


def _point(run: VariantRun, measure: str) -> tuple[float | None, float | None, float | None]:
    summary = run.report.summary
    quality = summary.figure(measure) if summary is not None else None
    p95, context = run.cost.get("p95Ms"), run.cost.get("contextChars")
    return quality, float(p95) if p95 is not None else None, float(context) if context is not None else None


def _base_values(base: Report, measure: str) -> list[float]:
    return [
        float(v) for c in base.cases if c.scores.metrics and (v := c.scores.metrics.get(measure)) is not None
    ]


def _variant_row(
    run: VariantRun, comparison: VariantComparison | None, pareto: bool, output_dir: Path
) -> dict[str, Any]:
    summary = run.report.summary
    own = [p for p in run.paths if p.name.endswith("-latest.json")]
    return {
        "name": run.name,
        "overlay": run.overlay,
        "index": run.decision,
        "evaluation": "reused" if run.reused else "ran",
        "collection": run.collection,
        "summary": summary.to_json() if summary is not None else {},
        "cost": run.cost,
        "comparison": comparison.to_json() if comparison is not None else None,
        "pareto": pareto,
        "report": str(own[0].relative_to(output_dir)) if own else None,
    }


def detectable_json(comparisons: dict[str, VariantComparison], measure: str) -> dict[str, Any]:
    """The smallest difference the golden set can detect (`verdict.detectable_difference`), per variant and
    measure; `value` is the largest over the variants of `measure`'s (the pair with the most spread: a
    smaller true difference may go unseen there)."""
    by_variant = {
        name: {m: t.detectable for m, t in c.tests.items()} for name, c in comparisons.items() if c.tests
    }
    by_measure: dict[str, float | None] = {}
    for name in sorted({m for v in by_variant.values() for m in v}):
        values = [d for v in by_variant.values() if (d := v.get(name)) is not None]
        by_measure[name] = max(values) if values else None
    paired = max((c.paired_cases for c in comparisons.values()), default=0)
    return {
        "measure": measure,
        "value": by_measure.get(measure),
        "alpha": ALPHA,
        "power": POWER,
        "pairedCases": paired,
        "formula": DETECTABLE_FORMULA,
        "byMeasure": by_measure,
        "byVariant": by_variant,
    }


def winner(runs: list[VariantRun], comparisons: dict[str, VariantComparison], measure: str) -> dict[str, Any]:
    """The variant with the best `measure` among those significantly better than the base on it (Holm)
    and significantly worse on no gated measure; the base when there is none."""
    better = []
    for run in runs[1:]:
        tests = comparisons[run.name].tests
        up = measure in tests and tests[measure].significant and tests[measure].delta > 0
        down = any(t.significant and t.delta < 0 for t in tests.values())
        if up and not down:
            better.append((tests[measure].variant, -float(run.cost.get("p95Ms") or 0.0), run))
    if not better:
        return {
            "name": BASE,
            "overlay": {},
            "reason": f"no variant is significantly better than the base on {measure} (Holm over variants "
            "x measures) without a significant drop elsewhere: keep the current configuration",
        }
    value, _, best = max(better, key=lambda b: (b[0], b[1]))
    test = comparisons[best.name].tests[measure]
    return {
        "name": best.name,
        "overlay": best.overlay,
        "reason": f"{measure} {test.base:.4f} -> {value:.4f} ({test.delta:+.4f}, pHolm {test.p_holm:.4g}), "
        "no significant drop on another measure",
    }


def winner_yaml(chosen: dict[str, Any], config_path: Path | None) -> str:
    """The configuration file that applies the winner: the current YAML (`config_path`) with its overlay,
    for `SIEVE_CONFIG=<this file>` (which replaces config/application.yml)."""
    current = read_yaml_config(config_path) if config_path is not None else {}
    overlay = merge(*(nested(k, v) for k, v in chosen["overlay"].items()))
    header = [
        f"# sieve experiment: the winner is '{chosen['name']}': {chosen['reason']}",
        f"# use it with SIEVE_CONFIG=<this file> (it is {config_path or 'the defaults'} with the overlay)",
    ]
    if any(k.startswith(("rag.ingest.", "rag.models.", "rag.store.hnsw")) for k in chosen["overlay"]):
        header.append(
            "# index settings change: run `sieve store rebuild` once this file is the configuration"
        )
    body = yaml.safe_dump(merge(current, overlay), sort_keys=False, allow_unicode=True)
    return "\n".join(header) + "\n" + body


def winner_env(chosen: dict[str, Any]) -> str:
    """The same overlay as environment variables (RAG__INGEST__CHUNK_SIZE=300), one a line."""
    lines = []
    for key, value in chosen["overlay"].items():
        text = value if isinstance(value, str) else json.dumps(value)
        lines.append(f"{key.upper().replace('.', '__')}={text}")
    return "\n".join(lines) + ("\n" if lines else "")


def write_experiment(data: dict[str, Any], output_dir: Path, config_path: Path | None) -> list[Path]:
    """Write experiment.json, experiment.md, experiment.html, winner.yml and winner.env; their paths."""
    from app.experiment.render import experiment_html, experiment_markdown

    files = {
        "experiment.json": json.dumps(data, ensure_ascii=False, indent=2) + "\n",
        "experiment.md": experiment_markdown(data),
        "experiment.html": experiment_html(data),
        "winner.yml": winner_yaml(data["winner"], config_path),
        "winner.env": winner_env(data["winner"]),
    }
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in files.items():
        atomic_write_text(output_dir / name, text)
        paths.append(output_dir / name)
    return paths
