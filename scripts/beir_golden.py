"""A BEIR split as a golden set file, so that `sieve experiment` (it reads `rag.evaluate.resource_location`)
can run on it: one case per query of `qrels/<split>.tsv`, its relevance the qrels grades (the same cases
`sieve eval --beir DIR --split S` builds). The file goes under target/: the data is for measuring only.

    python scripts/beir_golden.py ../shared/datasets/xquad-zh test target/beir/xquad-zh-test.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from app.evaluation.golden.beir import load_beir_cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("split")
    parser.add_argument("output", type=Path)
    args = parser.parse_args()
    golden = load_beir_cases(args.directory, args.split)
    cases = [{"id": c.id, "query": c.query, "relevance": c.relevance} for c in golden.cases]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    document = {"datasetVersion": golden.dataset_version, "cases": cases}
    args.output.write_text(json.dumps(document, ensure_ascii=False, indent=1), encoding="utf-8")
    print(f"{args.output}: {len(cases)} cases from {args.directory} {args.split}")


if __name__ == "__main__":
    main()
