"""TREC qrels and run files: read, write, and score a run the way trec_eval does.

Formats (whitespace-separated, one judgement or result per line, blank lines ignored):

* qrels: `qid iteration docid relevance` — iteration is ignored (usually 0), relevance an integer.
* run:   `qid Q0 docid rank score tag` — like trec_eval, the rank column is ignored: a query's results are
  ordered by score descending, ties broken by docid descending (byte-wise string comparison, which for Python
  strings is the same as code point order). A docid may appear once per query in either file.

`evaluate_run` scores with the functions of `scoring.metrics` and follows trec_eval's default (no `-c`)
for which queries count; see `QUERY_CONVENTION`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from app.evaluation.scoring import measures, metrics

Qrels = dict[str, dict[str, int]]
Run = dict[str, list[tuple[str, float]]]

QUERY_CONVENTION = (
    "Queries scored: those in the qrels with at least one relevant document (grade > 0) that also appear "
    "in the run (trec_eval's default, without -c). A qrels query missing from the run is listed under "
    "'missingFromRun' and left out of the means; with complete=True (trec_eval -c) it scores 0 and counts. "
    "Run queries absent from the qrels, and qrels queries with no relevant document, are ignored (listed "
    "under 'notInQrels' and 'noRelevant'). The aggregate is the arithmetic mean over the scored queries."
)


class TrecFormatError(ValueError):
    """A malformed qrels or run file; the message names file:line and what was expected."""


def _lines(path: str | Path) -> list[tuple[int, list[str]]]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TrecFormatError(f"{path}: cannot read: {exc}") from exc
    return [(number, line.split()) for number, line in enumerate(text.splitlines(), start=1) if line.strip()]


def read_qrels(path: str | Path) -> Qrels:
    """Read a qrels file into {qid: {docid: relevance}}.

    Raises `TrecFormatError` naming file:line for a line without exactly 4 fields, a non-integer relevance
    or a docid judged twice for the same query.
    """
    qrels: Qrels = {}
    first_seen: dict[tuple[str, str], int] = {}
    for number, fields in _lines(path):
        where = f"{path}:{number}"
        if len(fields) != 4:
            raise TrecFormatError(
                f"{where}: expected 4 fields 'qid iteration docid relevance', got {len(fields)}: "
                f"{' '.join(fields)!r}"
            )
        qid, _iteration, docid, rel_text = fields
        try:
            rel = int(rel_text)
        except ValueError:
            raise TrecFormatError(f"{where}: relevance must be an integer, got {rel_text!r}") from None
        if (qid, docid) in first_seen:
            raise TrecFormatError(
                f"{where}: document {docid!r} is judged twice for query {qid!r} "
                f"(first at line {first_seen[qid, docid]})"
            )
        first_seen[qid, docid] = number
        qrels.setdefault(qid, {})[docid] = rel
    return qrels


def trec_order(results: Sequence[tuple[str, float]]) -> list[tuple[str, float]]:
    """Order (docid, score) pairs as trec_eval does: score descending, ties by docid descending."""
    return sorted(results, key=lambda pair: (pair[1], pair[0]), reverse=True)


def read_run(path: str | Path) -> Run:
    """Read a run file into {qid: [(docid, score), ...]}, each list in trec_eval order (`trec_order`).

    The rank column must be an integer but is otherwise ignored, as trec_eval ignores it. Raises
    `TrecFormatError` naming file:line for a line without exactly 6 fields, a non-integer rank, a non-finite
    or non-numeric score, or a docid listed twice for the same query.
    """
    unordered: dict[str, list[tuple[str, float]]] = {}
    first_seen: dict[tuple[str, str], int] = {}
    for number, fields in _lines(path):
        where = f"{path}:{number}"
        if len(fields) != 6:
            raise TrecFormatError(
                f"{where}: expected 6 fields 'qid Q0 docid rank score tag', got {len(fields)}: "
                f"{' '.join(fields)!r}"
            )
        qid, _q0, docid, rank_text, score_text, _tag = fields
        try:
            int(rank_text)
        except ValueError:
            raise TrecFormatError(f"{where}: rank must be an integer, got {rank_text!r}") from None
        try:
            score = float(score_text)
        except ValueError:
            raise TrecFormatError(f"{where}: score must be a number, got {score_text!r}") from None
        if not math.isfinite(score):
            raise TrecFormatError(f"{where}: score must be finite, got {score_text!r}")
        if (qid, docid) in first_seen:
            raise TrecFormatError(
                f"{where}: document {docid!r} is listed twice for query {qid!r} "
                f"(first at line {first_seen[qid, docid]}); trec_eval rejects duplicate documents"
            )
        first_seen[qid, docid] = number
        unordered.setdefault(qid, []).append((docid, score))
    return {qid: trec_order(results) for qid, results in unordered.items()}


def _check_token(value: str, what: str) -> None:
    if not value or any(ch.isspace() for ch in value):
        raise ValueError(
            f"{what} {value!r} cannot be written to a TREC file: it is empty or contains whitespace"
        )


def scores_from_ranking(ranked_ids: Sequence[str]) -> list[tuple[str, float]]:
    """Pair each id with score n - i (n, n-1, ..., 1), so that trec_eval keeps exactly the given order
    whatever the retriever's own scores were (equal scores would otherwise be reordered by docid)."""
    n = len(ranked_ids)
    return [(doc_id, float(n - i)) for i, doc_id in enumerate(ranked_ids)]


def write_run(path: str | Path, run: Mapping[str, Sequence[tuple[str, float]]], tag: str) -> None:
    """Write `run` as a TREC run file `qid Q0 docid rank score tag`, queries sorted by qid.

    Each query's results are written in trec_eval order with ranks 1..n, so that reading the file back gives
    the same run. Scores are written with `repr` (round-trip exact). Raises `ValueError` for an id or tag that
    is empty or contains whitespace, a non-finite score, or a docid repeated within a query (trec_eval
    rejects those files; dedupe first, or keep the duplicate-aware metrics from `metrics` for such lists).
    """
    _check_token(tag, "tag")
    lines: list[str] = []
    for qid in sorted(run):
        _check_token(qid, "query id")
        seen: set[str] = set()
        for rank, (docid, score) in enumerate(trec_order(run[qid]), start=1):
            _check_token(docid, "document id")
            if docid in seen:
                raise ValueError(
                    f"query {qid!r}: document {docid!r} appears twice; a TREC run cannot hold it"
                )
            if not math.isfinite(score):
                raise ValueError(f"query {qid!r}: document {docid!r} has a non-finite score {score!r}")
            seen.add(docid)
            lines.append(f"{qid} Q0 {docid} {rank} {float(score)!r} {tag}")
    Path(path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def write_qrels(path: str | Path, qrels: Mapping[str, Mapping[str, float]]) -> None:
    """Write `qrels` as a TREC qrels file `qid 0 docid relevance`, sorted by qid then docid.

    Grades must be integers (trec_eval reads integers); a float grade with a fractional part raises
    `ValueError`, as does an id that is empty or contains whitespace.
    """
    lines: list[str] = []
    for qid in sorted(qrels):
        _check_token(qid, "query id")
        for docid in sorted(qrels[qid]):
            _check_token(docid, "document id")
            grade = qrels[qid][docid]
            if isinstance(grade, bool) or float(grade) != int(grade):
                raise ValueError(
                    f"query {qid!r}: document {docid!r} has grade {grade!r}; TREC qrels need integers"
                )
            lines.append(f"{qid} 0 {docid} {int(grade)}")
    Path(path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")


# The registry's ranking measures a run file is scored on, in the order of `evaluate_run`'s keys.
_MEASURES = ("recall", "ndcg", "mrr", "precision", "hitRate")


def _check_ks(ks: list[int]) -> None:
    if not ks:
        raise ValueError("ks must name at least one cut-off")
    for k in ks:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"every K must be an integer >= 1, got {k!r}")


def evaluate_run(
    qrels: Mapping[str, Mapping[str, float]],
    run: Mapping[str, Sequence[tuple[str, float]]],
    ks: list[int],
    *,
    complete: bool = False,
) -> dict[str, object]:
    """Score a run against qrels at each K in `ks`.

    Each query's results are put in trec_eval order (`trec_order`) and scored with `metrics`:
    `recall@K`, `ndcg@K`, `mrr@K` (recip_rank on the list cut at K), `precision@K`, `hitRate@K`
    (trec_eval `success_K`). Which queries count is `QUERY_CONVENTION`: by default those of the qrels with a
    relevant document that the run answers; with `complete=True` a qrels query missing from the run scores 0.

    Returns {"aggregate": {measure@K: mean}, "perQuery": {qid: {measure@K: value}}, "queries": n scored,
    "missingFromRun": [qid], "noRelevant": [qid], "notInQrels": [qid], "complete": bool,
    "convention": QUERY_CONVENTION}. With no scored query the aggregate values are None.
    Raises `ValueError` for an empty `ks` or a K < 1.
    """
    _check_ks(ks)
    keys = [f"{name}@{k}" for k in ks for name in _MEASURES]

    per_query: dict[str, dict[str, float]] = {}
    missing: list[str] = []
    no_relevant: list[str] = []
    for qid in sorted(qrels):
        relevance = qrels[qid]
        if not metrics.has_relevant(relevance):
            no_relevant.append(qid)
            continue
        if qid not in run:
            missing.append(qid)
            if complete:
                per_query[qid] = dict.fromkeys(keys, 0.0)
            continue
        ranked_ids = [docid for docid, _score in trec_order(run[qid])]
        per_query[qid] = {
            f"{name}@{k}": value
            for k in ks
            for name, value in measures.table(measures.Ranking(ranked_ids, relevance, k), _MEASURES).items()
        }

    aggregate: dict[str, float | None] = {
        key: (sum(values[key] for values in per_query.values()) / len(per_query) if per_query else None)
        for key in keys
    }
    return {
        "aggregate": aggregate,
        "perQuery": per_query,
        "queries": len(per_query),
        "missingFromRun": missing,
        "noRelevant": no_relevant,
        "notInQrels": sorted(qid for qid in run if qid not in qrels),
        "complete": complete,
        "convention": QUERY_CONVENTION,
    }


def export_evaluation(evaluation: Any, directory: Path) -> tuple[Path, Path]:
    """Write the evaluation's run (documents as ranked, first occurrence of each id) and qrels."""
    directory.mkdir(parents=True, exist_ok=True)
    run: dict[str, list[tuple[str, float]]] = {}
    qrels: dict[str, dict[str, float]] = {}
    for c in evaluation.cases:
        if c.result is None or c.metrics is None:
            continue
        ranked = list(dict.fromkeys(metrics.match_key(d, c.key) for d in c.result.documents[: c.k]))
        run[c.case.id] = scores_from_ranking(ranked)
        qrels[c.case.id] = {doc: int(round(g)) for doc, g in c.relevance.items()}
    run_path, qrels_path = directory / "run.trec", directory / "qrels.trec"
    write_run(run_path, run, tag="sieve")
    write_qrels(qrels_path, qrels)
    return run_path, qrels_path
