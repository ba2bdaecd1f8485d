"""Evidence figures of `sieve eval` reports side by side, and EvidenceHit at several coverage thresholds.

Usage: python scripts/span_figures.py REPORT.json [REPORT.json ...]

For each report (a `retrieval-eval-latest.json`): the cases, the unscorable ones, the evidence summary
(EvidenceRecall, EvidenceHit, EvidenceCharRecall, CharPrecision), the mean context characters, and the
EvidenceHit the coverage rule would give at thresholds 1.0, 0.9, 0.8, 0.5. That last is read off the
per-case EvidenceCharRecall, exact for cases whose best-covered group is one quote (a one-quote group is
returned at threshold t exactly when its character recall is at least t); other cases are left out of it.
"""

from __future__ import annotations

import json
import sys
from statistics import fmean

THRESHOLDS = (1.0, 0.9, 0.8, 0.5)


def one_quote(case: dict) -> bool:
    groups = case.get("evidenceGroups") or []
    return len(groups) == 1 and len(groups[0]) == 1 and groups[0][0].endswith("]")


def figures(path: str) -> dict:
    report = json.load(open(path, encoding="utf-8"))
    s = report["summary"]
    ev = s["evidence"]
    cases = [c for c in report["cases"] if c.get("evidence")]
    single = [c["evidence"]["evidenceCharRecall"] for c in cases if one_quote(c)]
    return {
        "report": path,
        "cases": s["cases"],
        "unscorable": len(s.get("unscorableCaseIds") or []),
        "evidenceCases": ev["cases"],
        "evidenceUnscorable": len(ev.get("unscorable") or []),
        "evidenceRecall": ev.get("evidenceRecall"),
        "evidenceHit": ev.get("evidenceHit"),
        "evidenceCharRecall": ev.get("evidenceCharRecall"),
        "charPrecision": ev.get("charPrecision"),
        "contextChars": s.get("budget", {}).get("contextChars"),
        "recall": s.get("recall"),
        "hitAtCoverage": {
            str(t): (fmean(1.0 if r >= t - 1e-9 else 0.0 for r in single) if single else None)
            for t in THRESHOLDS
        },
        "oneQuoteCases": len(single),
    }


def main(paths: list[str]) -> None:
    for path in paths:
        print(json.dumps(figures(path), indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
