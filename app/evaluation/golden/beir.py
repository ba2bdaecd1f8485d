"""BEIR datasets as golden sets: `queries.jsonl` + `qrels/<split>.tsv` become golden cases (the corpus,
`corpus.jsonl`, is ingested like any JSONL file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.evaluation.golden.cases import GoldenCase, GoldenSet, GoldenSetError


def load_beir_cases(directory: Path, split: str) -> GoldenSet:
    """BEIR queries + qrels/<split>.tsv as golden cases (graded relevance from the qrels scores)."""
    queries_path = directory / "queries.jsonl"
    qrels_path = directory / "qrels" / f"{split}.tsv"
    for required in (directory / "corpus.jsonl", queries_path, qrels_path):
        if not required.exists():
            raise FileNotFoundError(
                f"{required}: missing (a BEIR directory has corpus.jsonl, queries.jsonl, qrels/)"
            )
    qrels: dict[str, dict[str, float]] = {}
    for number, line in enumerate(qrels_path.read_text(encoding="utf-8").splitlines(), start=1):
        fields = line.split("\t")
        if number == 1 and fields[0] == "query-id":
            continue
        if not line.strip():
            continue
        if len(fields) != 3:
            raise GoldenSetError(
                str(qrels_path), [f"{qrels_path}:{number}: expected 'query-id<TAB>corpus-id<TAB>score'"]
            )
        try:
            grade = float(fields[2])
        except ValueError:
            raise GoldenSetError(
                str(qrels_path), [f"{qrels_path}:{number}: score {fields[2]!r} is not a number"]
            ) from None
        qrels.setdefault(fields[0], {})[fields[1]] = grade
    texts: dict[str, str] = {}
    for number, line in enumerate(queries_path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            texts[str(item["_id"])] = str(item["text"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise GoldenSetError(str(queries_path), [f"{queries_path}:{number}: {exc}"]) from None
    cases = []
    for qid in sorted(qrels, key=_natural):
        if qid not in texts:
            raise GoldenSetError(
                str(qrels_path), [f"{qrels_path}: query {qid!r} has no text in {queries_path}"]
            )
        relevance = {doc: grade for doc, grade in qrels[qid].items()}
        if not any(g > 0 for g in relevance.values()):
            continue
        cases.append(GoldenCase.model_validate({"id": qid, "query": texts[qid], "relevance": relevance}))
    return GoldenSet(
        dataset_version=f"beir:{directory.resolve().name}:{split}", cases=cases, path=str(qrels_path)
    )


def _natural(qid: str) -> tuple[int, Any]:
    return (0, int(qid)) if qid.isdigit() else (1, qid)
