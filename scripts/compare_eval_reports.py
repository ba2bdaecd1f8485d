"""Are two evaluation reports (or two tune JSON documents) the same apart from the figures a rerun moves?

    python scripts/compare_eval_reports.py BEFORE.json AFTER.json [--tolerance 1e-9] [--score-tolerance 1e-5]

Used to show that a change which moves code around changes no result: run `sieve eval --baseline none` (or
`sieve tune --json ...`) before and after on the same store and compare the two files. Exit 0 when they are
equal, 1 with one line per difference otherwise.

What is ignored, and why:
- keys that are clocks or durations: any key whose name contains `latency` or `duration` or ends in `Ms`
  (`p95Ms`, `costMs`), and `startedAt`, `evaluatedAt`, `asOfRun`; `traceId` (a fresh id per query);
- `run.reportFile`, `run.store` and `audit.previousReport` (where the files and the store were, not what they
  hold); `run.codeVersion` and the `code: a -> b` line of `comparison.differences` (the commit, which any
  change moves);
- within `summary.budget` and a case's `budget`, the latency entries (`p95LatencyMs`), by the rule above.

Numbers are compared with an absolute tolerance (`--tolerance`, default 1e-9); a ranked document's `scores`
(dense, BM25, fused, rerank) with `--score-tolerance` (default 1e-5): the embedder's float arithmetic
differs in the sixth decimal between two runs of the same code (measured: 6 fused scores of 1,340 moved by
1e-6 to 3e-6 between two runs of one commit on the sample base).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

IGNORED_KEYS = {"startedAt", "evaluatedAt", "asOfRun", "traceId"}
IGNORED_PARTS = ("latency", "duration")
IGNORED_PATHS = {"run.reportFile", "run.store", "run.codeVersion", "audit.previousReport"}
CODE_LINE = "code: "


def ignored(path: str, key: str) -> bool:
    lowered = key.lower()
    return (
        key in IGNORED_KEYS
        or key.endswith("Ms")
        or any(part in lowered for part in IGNORED_PARTS)
        or f"{path}.{key}".lstrip(".") in IGNORED_PATHS
    )


def _without_code_line(path: str, items: list[Any]) -> list[Any]:
    if not path.endswith("comparison.differences"):
        return items
    return [item for item in items if not (isinstance(item, str) and item.startswith(CODE_LINE))]


def differences(
    before: Any, after: Any, path: str = "", tolerance: float = 1e-9, score_tolerance: float = 1e-5
) -> Iterator[str]:
    """One line per difference between `before` and `after`, with the JSON path where it is."""
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after)):
            if ignored(path, key):
                continue
            where = f"{path}.{key}".lstrip(".")
            if key not in after:
                yield f"{where}: only in the first"
            elif key not in before:
                yield f"{where}: only in the second"
            else:
                yield from differences(before[key], after[key], where, tolerance, score_tolerance)
    elif isinstance(before, list) and isinstance(after, list):
        before, after = _without_code_line(path, before), _without_code_line(path, after)
        if len(before) != len(after):
            yield f"{path}: {len(before)} items, then {len(after)}"
            return
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            yield from differences(b, a, f"{path}[{i}]", tolerance, score_tolerance)
    elif _number(before) and _number(after):
        limit = score_tolerance if ".scores." in path else tolerance
        if abs(before - after) > limit:
            yield f"{path}: {before!r} -> {after!r}"
    elif before != after:
        yield f"{path}: {_short(before)} -> {_short(after)}"


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--tolerance", type=float, default=1e-9)
    parser.add_argument("--score-tolerance", type=float, default=1e-5)
    args = parser.parse_args(argv)
    found = list(
        differences(
            json.loads(args.before.read_text(encoding="utf-8")),
            json.loads(args.after.read_text(encoding="utf-8")),
            tolerance=args.tolerance,
            score_tolerance=args.score_tolerance,
        )
    )
    for line in found:
        print(line)
    print(f"{len(found)} difference(s) between {args.before} and {args.after}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
