"""Retrieval metrics as pure functions: plain inputs, a float out, the definition in each docstring.

Conventions shared by every ranking metric below (also exposed as `CONVENTIONS` for reports):

* `ranked_ids` is the list exactly as the retriever returned it, best first. It is cut at K first
  (`ranked_ids[:k]`); nothing below K is ever looked at. K larger than the list just keeps the whole list.
* `relevance` maps an id to its grade. A grade <= 0 means "judged not relevant" and counts like an
  unjudged id. The relevant set R is `{id : relevance[id] > 0}`.
* A relevant id counts once, at its first position in the top K. A later copy of it (a duplicate) earns
  nothing, but it keeps occupying its position: it pushes the ids below it down and, for Precision@K, it
  is one of the K slots.
* A case whose relevant set R is empty has no defined Recall, HitRate, MRR, nDCG, Precision or Top-1
  (trec_eval and ranx leave such queries out as well). Those functions raise `UndefinedMetricError`
  (a `ValueError`); the caller checks `has_relevant(relevance)` first and leaves the case out of its averages.
  `duplicate_rate_at_k` does not depend on relevance and is always defined.
* `k` must be an int >= 1, else `ValueError`.

Without duplicates in the top K every value equals trec_eval's on the list cut at K
(`recall_K`, `ndcg_cut_K`, `P_K`, `success_K`, and `recip_rank`), for integer grades (trec_eval's default
relevance level 1 is the same as "grade > 0" when grades are integers).
tests/unit/test_metrics_pytrec.py checks it.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

CONVENTIONS = (
    "Metric conventions: the ranked list is cut at K first, as returned; a relevant id counts once, "
    "at its first position, and a duplicate earns nothing but keeps occupying its position; relevance "
    "grade <= 0 is not relevant; nDCG uses gain = grade and discount log2(rank + 1), with the ideal ranking "
    "built from all judged relevant documents sorted by grade (binary when no grades are given); "
    "Precision@K divides by K even when fewer than K results come back; the duplicate rate counts a repeated "
    "id and also the same normalised text under another id; cases with no relevant document "
    "are excluded from the averages; latency percentiles use the nearest-rank method (an observed value, "
    "never interpolated). Without duplicates every figure equals trec_eval's recall_K, ndcg_cut_K, P_K, "
    "success_K and recip_rank on the list cut at K."
)


class UndefinedMetricError(ValueError):
    """The metric has no value for this case: it has no relevant document."""


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")


def relevant_ids(relevance: Mapping[str, float]) -> set[str]:
    """The relevant set R = {id : relevance[id] > 0}."""
    return {doc_id for doc_id, grade in relevance.items() if grade > 0}


def has_relevant(relevance: Mapping[str, float]) -> bool:
    """True when the case has at least one relevant id (grade > 0), i.e. its ranking metrics are defined."""
    return any(grade > 0 for grade in relevance.values())


def _require_relevant(relevance: Mapping[str, float]) -> set[str]:
    relevant = relevant_ids(relevance)
    if not relevant:
        raise UndefinedMetricError(
            "the case has no relevant document (no grade > 0); the metric is undefined"
        )
    return relevant


def _first_hits(ranked_ids: Sequence[str], relevant: set[str], k: int) -> list[int]:
    """1-based ranks, within the top K, of the first occurrence of each relevant id, ascending."""
    seen: set[str] = set()
    ranks: list[int] = []
    for rank, doc_id in enumerate(ranked_ids[:k], start=1):
        if doc_id in relevant and doc_id not in seen:
            ranks.append(rank)
        seen.add(doc_id)
    return ranks


def recall_at_k(ranked_ids: Sequence[str], relevance: Mapping[str, float], k: int) -> float:
    """Recall@K = |R ∩ set(ranked_ids[:k])| / |R|.

    R is the set of ids with grade > 0. Each relevant id counts once however often it appears.
    Raises `UndefinedMetricError` when R is empty.
    """
    _check_k(k)
    relevant = _require_relevant(relevance)
    return len(_first_hits(ranked_ids, relevant, k)) / len(relevant)


def hit_rate_at_k(ranked_ids: Sequence[str], relevance: Mapping[str, float], k: int) -> float:
    """HitRate@K = 1 if any relevant id is in ranked_ids[:k], else 0 (trec_eval `success_K`).

    Raises `UndefinedMetricError` when R is empty.
    """
    _check_k(k)
    relevant = _require_relevant(relevance)
    return 1.0 if _first_hits(ranked_ids, relevant, k) else 0.0


def mrr_at_k(ranked_ids: Sequence[str], relevance: Mapping[str, float], k: int) -> float:
    """Reciprocal rank @K = 1 / r, r the 1-based rank of the first relevant id in ranked_ids[:k]; 0 if none.

    Averaged over cases by the caller, this is MRR@K (trec_eval `recip_rank` on the list cut at K).
    Raises `UndefinedMetricError` when R is empty.
    """
    _check_k(k)
    relevant = _require_relevant(relevance)
    hits = _first_hits(ranked_ids, relevant, k)
    return 1.0 / hits[0] if hits else 0.0


def ndcg_at_k(ranked_ids: Sequence[str], relevance: Mapping[str, float], k: int) -> float:
    """nDCG@K = DCG@K / IDCG@K.

    DCG@K  = Σ_{rank=1..K} gain(ranked_ids[rank-1]) / log2(rank + 1), where gain(id) = relevance[id] if
             the grade is > 0 and this is the id's first position in the list, else 0 (unjudged,
             non-relevant and duplicate ids gain 0 but keep their position).
    IDCG@K = the same sum over the grades > 0 of *all* judged relevant ids, sorted descending and cut at K
             (not only those retrieved; this is trec_eval's `ndcg_cut_K`).
    With only grade-1 judgements (expected ids without grades) this is binary nDCG.
    Raises `UndefinedMetricError` when R is empty.
    """
    _check_k(k)
    relevant = _require_relevant(relevance)
    dcg = 0.0
    for rank in _first_hits(ranked_ids, relevant, k):
        dcg += relevance[ranked_ids[rank - 1]] / math.log2(rank + 1)
    ideal_gains = sorted((relevance[doc_id] for doc_id in relevant), reverse=True)[:k]
    idcg = sum(gain / math.log2(rank + 1) for rank, gain in enumerate(ideal_gains, start=1))
    return dcg / idcg


def precision_at_k(ranked_ids: Sequence[str], relevance: Mapping[str, float], k: int) -> float:
    """Precision@K = |R ∩ set(ranked_ids[:k])| / K.

    The denominator is K even when fewer than K ids came back (trec_eval `P_K`); a duplicate takes one of
    the K slots without counting again. Raises `UndefinedMetricError` when R is empty.
    """
    _check_k(k)
    relevant = _require_relevant(relevance)
    return len(_first_hits(ranked_ids, relevant, k)) / k


def top1_accuracy(ranked_ids: Sequence[str], relevance: Mapping[str, float]) -> float:
    """Top-1 accuracy = 1 if ranked_ids[0] is relevant, else 0 (0 for an empty list); equals HitRate@1.

    Raises `UndefinedMetricError` when R is empty.
    """
    return hit_rate_at_k(ranked_ids, relevance, 1)


def normalised_text(text: str) -> str:
    """Text as the duplicate rate compares it: case-folded, every run of whitespace one space, stripped."""
    return " ".join(text.split()).casefold()


def duplicate_rate_at_k(ranked_ids: Sequence[str], k: int, texts: Sequence[str] | None = None) -> float:
    """Duplicate rate@K = (number of positions in ranked_ids[:k] that duplicate a position higher up) / n,
    n = len(ranked_ids[:k]) = min(K, len(ranked_ids)).

    A position duplicates a higher one when its id already appeared, or, when `texts` (aligned with
    `ranked_ids`) is given, when its `normalised_text` already appeared: a content duplicate, the same
    text under another id (a mirrored page) counts too. An empty text is never a content duplicate.
    `[c1, c1, c2]` at K=2 is 1/2; ids `[a, b]` with equal texts is 1/2. An empty list has no positions
    and no duplicates: 0.0. Independent of relevance, so always defined.
    """
    _check_k(k)
    top = ranked_ids[:k]
    if not top:
        return 0.0
    if texts is None:
        return (len(top) - len(set(top))) / len(top)
    seen_ids: set[str] = set()
    seen_texts: set[str] = set()
    duplicates = 0
    for doc_id, text in zip(top, texts[: len(top)], strict=True):
        norm = normalised_text(text)
        if doc_id in seen_ids or (norm and norm in seen_texts):
            duplicates += 1
        seen_ids.add(doc_id)
        if norm:
            seen_texts.add(norm)
    return duplicates / len(top)


def case_metrics(
    ranked_ids: Sequence[str],
    relevance: Mapping[str, float],
    k: int,
    texts: Sequence[str] | None = None,
) -> dict[str, float]:
    """All per-case ranking metrics at K, keyed recall, hitRate, mrr, ndcg, precision, top1Accuracy,
    duplicateRate. Each follows the function of the same name above (`texts`, aligned with `ranked_ids`,
    lets the duplicate rate count content duplicates).

    Raises `UndefinedMetricError` when the case has no relevant id (check `has_relevant` first).
    """
    _check_k(k)
    _require_relevant(relevance)
    return {
        "recall": recall_at_k(ranked_ids, relevance, k),
        "hitRate": hit_rate_at_k(ranked_ids, relevance, k),
        "mrr": mrr_at_k(ranked_ids, relevance, k),
        "ndcg": ndcg_at_k(ranked_ids, relevance, k),
        "precision": precision_at_k(ranked_ids, relevance, k),
        "top1Accuracy": top1_accuracy(ranked_ids, relevance),
        "duplicateRate": duplicate_rate_at_k(ranked_ids, k, texts),
    }


def hit_counts(ranked_ids: Sequence[str], relevance: Mapping[str, float], k: int) -> dict[str, int | None]:
    """The counts behind the ratios of one case: expectedCount = |R|, hitCount = |R ∩ set(ranked_ids[:k])|
    (each relevant id once), firstHitRank = the 1-based rank of the first relevant id in the top K (None
    when there is none). Defined for an empty R too (0, 0, None)."""
    _check_k(k)
    relevant = relevant_ids(relevance)
    hits = _first_hits(ranked_ids, relevant, k)
    return {"expectedCount": len(relevant), "hitCount": len(hits), "firstHitRank": hits[0] if hits else None}


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile by the nearest-rank method: with the n values sorted ascending as v_1..v_n,
    P_p = v_r, r = max(1, ceil(p / 100 * n)).

    So P_0 = min, P_100 = max, and the result is always an observed value (a latency somebody actually
    waited), never an interpolation. Example: p95 of 1..20 is v_19 = 19; p50 of [1, 2, 3, 4] is v_2 = 2.
    Raises `ValueError` for an empty sequence, a NaN value or p outside [0, 100].
    """
    if not values:
        raise ValueError("percentile of an empty sequence is undefined")
    if not 0 <= p <= 100:
        raise ValueError(f"p must be within [0, 100], got {p!r}")
    ordered = sorted(values)
    if any(math.isnan(v) for v in ordered):
        raise ValueError("percentile values must not be NaN")
    # Round before ceil so that e.g. 0.95 * 20 = 19.000000000000004 stays rank 19.
    rank = max(1, math.ceil(round(p / 100 * len(ordered), 9)))
    return float(ordered[rank - 1])


def latency_summary(values: Sequence[float]) -> dict[str, float]:
    """{"p50": percentile(values, 50), "p95": percentile(values, 95), "max": max(values)}, nearest-rank.

    Units are whatever the caller passes (the runner uses milliseconds). Raises `ValueError` when empty.
    """
    return {
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "max": percentile(values, 100),
    }


def judged_at_k(ranked_ids: Sequence[str], judged: Collection[str], k: int) -> float:
    """Judged@K = |{i <= K : ranked_ids[i] in J}| / K, J the set of ids that carry a judgment of any grade
    (0 included: "judged not relevant" is a judgment).

    As ir_measures' `Judged@k`: the denominator is K even when fewer than K results come back, and a
    duplicate counts at each of its positions (it is judged when its id is). Defined for every case,
    relevant ids or not. Example: top 4 = [a, x, b, y], J = {a, b}, K = 4 -> 2/4."""
    _check_k(k)
    return sum(1 for i in ranked_ids[:k] if i in judged) / k


def unjudged_at_k(ranked_ids: Sequence[str], judged: Collection[str], k: int) -> list[str]:
    """The distinct ids of the top K that carry no judgment, in rank order."""
    _check_k(k)
    seen: list[str] = []
    for i in ranked_ids[:k]:
        if i not in judged and i not in seen:
            seen.append(i)
    return seen


def condensed(ranked_ids: Sequence[str], judged: Collection[str]) -> list[str]:
    """The condensed list (Sakai 2007; ir_measures' `judged_only`): `ranked_ids` with every unjudged id
    removed and the rest moved up, order kept. A metric of it at K scores the first K judged results, so
    an unjudged document neither earns nor costs anything."""
    return [i for i in ranked_ids if i in judged]


def evidence_recall_at_k(
    ranked_chunks: Sequence[Sequence[str]], groups: Sequence[Collection[str]], k: int
) -> float:
    """EvidenceRecall@K = max over the acceptable evidence groups G_j of |G_j ∩ T| / |G_j|, T the chunk ids
    the top K returns: how much of the best-covered way of answering is there (1.0: one whole group is).

    Each rank of `ranked_chunks` is the chunk ids that rank returns: its chunk, then the chunks the diversity
    stage attached to it (`attach_per_document`); the cut is at K ranks. Groups are sets of chunk ids (anyOf:
    any one group answers). Raises `UndefinedMetricError` without a group. Example: groups [{a, b}, {c}],
    top 2 = [[a], [x]] -> max(1/2, 0/1) = 0.5; top 1 = [[x, c]] -> 1/1."""
    _check_k(k)
    if not groups or any(not g for g in groups):
        raise UndefinedMetricError("the case names no evidence group")
    top = {chunk for rank in ranked_chunks[:k] for chunk in rank}
    return max(len(set(g) & top) / len(set(g)) for g in groups)


def evidence_hit_at_k(
    ranked_chunks: Sequence[Sequence[str]], groups: Sequence[Collection[str]], k: int
) -> float:
    """EvidenceHit@K = 1 when some acceptable evidence group is wholly among the chunks the top K returns,
    else 0 (the answer can be read from the top K). Equals 1 exactly when `evidence_recall_at_k` is 1."""
    return 1.0 if evidence_recall_at_k(ranked_chunks, groups, k) == 1.0 else 0.0


def match_key(candidate: Any, key: str) -> str:
    """The id a retrieved document is matched on for a case's `matchOn` (`key`): its `chunk_id` for
    "chunk", its `source` for "source", else its `doc_id`."""
    if key == "chunk":
        return str(candidate.chunk_id)
    if key == "source":
        return str(candidate.source)
    return str(candidate.doc_id)
