"""Retrieval metrics as pure functions: plain inputs, a float out, the definition in each docstring.

Conventions shared by every ranking metric below (also exposed as `CONVENTIONS` for reports):

* `ranked_ids` is the list exactly as the retriever returned it, best first. It is cut at K first
  (`ranked_ids[:k]`); nothing below K is ever looked at. K larger than the list just keeps the whole list.
* A rank is one id, or a tuple of the ids it returns when a result holds several (at chunk level: its chunk,
  then the chunks the diversity stage attached to it). A rank returns each of its ids: a relevant id is found
  at the first rank that returns it. The ranks that hold one id each are the usual ranked list.
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
* nDCG's gain is the grade (`"linear"`, trec_eval's) or 2^grade − 1 (`"exponential"`, Burges et al. 2005);
  the discount is log2(position + 1) either way.
* A case with alternative evidence groups (anyOf) has one relevance map per alternative; its figures are
  `best_alternative`'s: each figure the best over the alternatives.

Without duplicates in the top K every value equals trec_eval's on the list cut at K
(`recall_K`, `ndcg_cut_K`, `P_K`, `success_K`, and `recip_rank`), for integer grades (trec_eval's default
relevance level 1 is the same as "grade > 0" when grades are integers).
tests/unit/test_metrics_pytrec.py checks it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Literal

# A rank of a ranked list: one id, or the ids one result returns (its chunk and the chunks attached to it).
Rank = str | tuple[str, ...]
Gain = Literal["linear", "exponential"]
GAINS: tuple[Gain, ...] = ("linear", "exponential")
_GAIN_TEXT = {"linear": "gain = grade", "exponential": "gain = 2^grade - 1"}


def conventions(gain: Gain = "linear") -> str:
    """The conventions every report states, with its nDCG gain."""
    return (
        "Metric conventions: the ranked list is cut at K first, as returned; a relevant id counts once, "
        "at its first position, and a duplicate earns nothing but keeps occupying its position; at chunk "
        "level a rank also returns the chunks attached to it; relevance grade <= 0 is not relevant; "
        f"nDCG uses {_GAIN_TEXT[gain]} and discount log2(rank + 1), with the ideal ranking built from all "
        "judged relevant documents sorted by grade (binary when no grades are given); evidence groups "
        "(anyOf) are alternatives: each figure is the best over them; chunk ids the index does not hold are "
        "left out of every figure; Precision@K divides by K even when fewer than K results come back; the "
        "duplicate rate counts a repeated id and also the same normalised text under another id; cases "
        "with no relevant document are excluded from the averages; latency percentiles use the "
        "nearest-rank method (an observed value, never interpolated). Without duplicates every figure "
        "equals trec_eval's recall_K, ndcg_cut_K (with linear gain), P_K, success_K and recip_rank on the "
        "list cut at K."
    )


CONVENTIONS = conventions("linear")


class UndefinedMetricError(ValueError):
    """The metric has no value for this case: it has no relevant document."""


def check_k(k: int) -> None:
    """Refuse a cut-off that is not an int >= 1 (`ValueError`)."""
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


def rank_ids(rank: Rank) -> tuple[str, ...]:
    """The ids a rank returns: itself for one id, else the tuple (its own id first)."""
    return (rank,) if isinstance(rank, str) else rank


def _found(
    ranked_ids: Sequence[Rank], relevance: Mapping[str, float], relevant: set[str], k: int
) -> list[tuple[int, str]]:
    """(rank, id) of each relevant id at the first rank within the top K that returns it, in rank order;
    the ids one rank returns first, best grade first (then as the rank lists them)."""
    seen: set[str] = set()
    found: list[tuple[int, str]] = []
    for rank, item in enumerate(ranked_ids[:k], start=1):
        if isinstance(item, str):  # one id, the usual rank: what the general case below makes of it
            if item in relevant and item not in seen:
                found.append((rank, item))
            seen.add(item)
            continue
        new = [i for i in dict.fromkeys(rank_ids(item)) if i in relevant and i not in seen]
        new.sort(key=lambda i: -relevance[i])
        found += [(rank, i) for i in new]
        seen.update(rank_ids(item))
    return found


def _first_hits(ranked_ids: Sequence[Rank], relevant: set[str], k: int) -> list[int]:
    """1-based ranks, within the top K, of the first occurrence of each relevant id, ascending (a rank that
    returns several relevant ids appears once per id)."""
    return [rank for rank, _ in _found(ranked_ids, dict.fromkeys(relevant, 1.0), relevant, k)]


def _positions(
    ranked_ids: Sequence[Rank], relevance: Mapping[str, float], relevant: set[str], k: int
) -> list[tuple[int, str]]:
    """(position, id) of the relevant ids the top K returns, as nDCG and Precision@K place them: in the order
    `_found` gives, each at its rank or right after the position placed before it, whichever is later, and
    only positions <= K. A rank that returns several relevant ids spends one position on each; with one id
    per rank the position is the rank."""
    out: list[tuple[int, str]] = []
    last = 0
    for rank, doc_id in _found(ranked_ids, relevance, relevant, k):
        last = max(rank, last + 1)
        if last > k:
            break
        out.append((last, doc_id))
    return out


def recall_at_k(ranked_ids: Sequence[Rank], relevance: Mapping[str, float], k: int) -> float:
    """Recall@K = |R ∩ T| / |R|, T the ids the top K ranks return (`ranked_ids[:k]`, each rank's ids).

    R is the set of ids with grade > 0. Each relevant id counts once however often it appears. A rank that
    returns several ids (a chunk and its attached chunks) counts each: for one evidence group this is
    `evidence_recall_at_k`. Raises `UndefinedMetricError` when R is empty.
    """
    check_k(k)
    relevant = _require_relevant(relevance)
    return len(_first_hits(ranked_ids, relevant, k)) / len(relevant)


def hit_rate_at_k(ranked_ids: Sequence[Rank], relevance: Mapping[str, float], k: int) -> float:
    """HitRate@K = 1 if the top K returns a relevant id, else 0 (trec_eval `success_K`).

    Raises `UndefinedMetricError` when R is empty.
    """
    check_k(k)
    relevant = _require_relevant(relevance)
    return 1.0 if _first_hits(ranked_ids, relevant, k) else 0.0


def mrr_at_k(ranked_ids: Sequence[Rank], relevance: Mapping[str, float], k: int) -> float:
    """Reciprocal rank @K = 1 / r, r the 1-based rank of the first rank in ranked_ids[:k] that returns a
    relevant id; 0 if none.

    Averaged over cases by the caller, this is MRR@K (trec_eval `recip_rank` on the list cut at K).
    Raises `UndefinedMetricError` when R is empty.
    """
    check_k(k)
    relevant = _require_relevant(relevance)
    hits = _first_hits(ranked_ids, relevant, k)
    return 1.0 / hits[0] if hits else 0.0


def gain_of(grade: float, gain: Gain = "linear") -> float:
    """The gain of a relevant grade: the grade itself ("linear", trec_eval's `ndcg_cut`) or 2^grade − 1
    ("exponential", which weighs a highly relevant document far above a partly relevant one). Both give 1
    for grade 1, so binary judgments score the same either way."""
    if gain == "linear":
        return grade
    if gain == "exponential":
        return 2.0**grade - 1.0
    raise ValueError(f"gain must be one of {', '.join(GAINS)}, got {gain!r}")


def ndcg_at_k(
    ranked_ids: Sequence[Rank], relevance: Mapping[str, float], k: int, gain: Gain = "linear"
) -> float:
    """nDCG@K = DCG@K / IDCG@K.

    DCG@K  = Σ_{position p=1..K} gain(id at p) / log2(p + 1), gain = `gain_of(relevance[id], gain)` for a
             relevant id (grade > 0) at the first rank that returns it, else 0 (unjudged, non-relevant and
             duplicate ids gain 0 but keep their position). With one id per rank the position is the rank; a
             rank that returns several relevant ids places them at consecutive positions from its rank
             (`_positions`), so DCG never exceeds IDCG.
    IDCG@K = the same sum over the gains of *all* judged relevant ids, sorted descending and cut at K
             (not only those retrieved; this is trec_eval's `ndcg_cut_K` for linear gain).
    With only grade-1 judgements (expected ids without grades) this is binary nDCG, whichever the gain.
    Raises `UndefinedMetricError` when R is empty.
    """
    check_k(k)
    relevant = _require_relevant(relevance)
    dcg = sum(
        gain_of(relevance[doc_id], gain) / math.log2(position + 1)
        for position, doc_id in _positions(ranked_ids, relevance, relevant, k)
    )
    ideal_gains = sorted((gain_of(relevance[doc_id], gain) for doc_id in relevant), reverse=True)[:k]
    idcg = sum(g / math.log2(rank + 1) for rank, g in enumerate(ideal_gains, start=1))
    return dcg / idcg


def precision_at_k(ranked_ids: Sequence[Rank], relevance: Mapping[str, float], k: int) -> float:
    """Precision@K = |R ∩ set(ranked_ids[:k])| / K.

    The denominator is K even when fewer than K ids came back (trec_eval `P_K`); a duplicate takes one of
    the K slots without counting again. A rank that returns several relevant ids fills one slot per id from
    its rank on, as nDCG places them (`_positions`), so Precision@K stays <= 1. Raises
    `UndefinedMetricError` when R is empty.
    """
    check_k(k)
    relevant = _require_relevant(relevance)
    return len(_positions(ranked_ids, relevance, relevant, k)) / k


def top1_accuracy(ranked_ids: Sequence[Rank], relevance: Mapping[str, float]) -> float:
    """Top-1 accuracy = 1 if the first rank returns a relevant id, else 0 (0 for an empty list); equals
    HitRate@1.

    Raises `UndefinedMetricError` when R is empty.
    """
    return hit_rate_at_k(ranked_ids, relevance, 1)


@functools.lru_cache(maxsize=4096)  # pure; the top K's texts recur at every cut-off and in every run
def normalised_text(text: str) -> str:
    """Text as the duplicate rate compares it: case-folded, every run of whitespace one space, stripped."""
    return " ".join(text.split()).casefold()


def duplicate_rate_at_k(ranked_ids: Sequence[Rank], k: int, texts: Sequence[str] | None = None) -> float:
    """Duplicate rate@K = (number of positions in ranked_ids[:k] that duplicate a position higher up) / n,
    n = len(ranked_ids[:k]) = min(K, len(ranked_ids)). A rank is compared by its own id (the first of its
    ids; attached chunks are not ranks of their own).

    A position duplicates a higher one when its id already appeared, or, when `texts` (aligned with
    `ranked_ids`) is given, when its `normalised_text` already appeared: a content duplicate, the same
    text under another id (a mirrored page) counts too. An empty text is never a content duplicate.
    `[c1, c1, c2]` at K=2 is 1/2; ids `[a, b]` with equal texts is 1/2. An empty list has no positions
    and no duplicates: 0.0. Independent of relevance, so always defined.
    """
    check_k(k)
    top = [rank_ids(item)[0] for item in ranked_ids[:k]]
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


RelevanceMaps = Mapping[str, float] | Sequence[Mapping[str, float]]


def alternatives_of(relevance: RelevanceMaps) -> list[Mapping[str, float]]:
    """A case's relevance maps: one map is the one alternative."""
    return [relevance] if isinstance(relevance, Mapping) else list(relevance)


def has_relevant_alternative(relevance: RelevanceMaps) -> bool:
    """True when some alternative has a relevant id, i.e. the case's figures are defined."""
    return any(has_relevant(a) for a in alternatives_of(relevance))


def best_alternative(
    measure: Callable[..., float],
    ranked_ids: Sequence[Rank],
    relevance: RelevanceMaps,
    k: int,
    **options: Any,
) -> float:
    """max_j measure(ranked_ids, R_j, k) over the alternatives R_1..R_n that have a relevant id.

    A case whose evidence groups are alternatives (anyOf: any one group answers) has one relevance map per
    group, each with the case's other expectations; whichever way of answering the ranking serves best is
    what each figure reports, as `evidence_recall_at_k` takes the best-covered group. With one map this is
    `measure` itself. `options` go to `measure` (nDCG's `gain`). Example: alternatives {a: 1} and {b: 1},
    ranking [a, x]: Recall = max(1/1, 0/1) = 1; all-required {a: 1, b: 1} would give 1/2.
    Raises `UndefinedMetricError` when no alternative has a relevant id.
    """
    alternatives = alternatives_of(relevance)
    if len(alternatives) == 1 and has_relevant(alternatives[0]):  # the usual case: the max of one value
        return measure(ranked_ids, alternatives[0], k, **options)
    usable = [r for r in alternatives if has_relevant(r)]
    if not usable:
        raise UndefinedMetricError(
            "the case has no relevant document (no grade > 0); the metric is undefined"
        )
    return max(measure(ranked_ids, r, k, **options) for r in usable)


def counted_alternative(ranked_ids: Sequence[Rank], relevance: RelevanceMaps, k: int) -> int:
    """The index of the alternative the case's counts and losses are told against: the one with the highest
    Recall@K (the first on a tie); 0 when none has a relevant id."""
    alternatives = alternatives_of(relevance)
    recalls = [recall_at_k(ranked_ids, r, k) if has_relevant(r) else -1.0 for r in alternatives]
    return recalls.index(max(recalls)) if recalls else 0


def hit_counts(ranked_ids: Sequence[Rank], relevance: RelevanceMaps, k: int) -> dict[str, int | None]:
    """The counts behind the ratios of one case: expectedCount = |R|, hitCount = |R ∩ T| (T the ids the top K
    returns; each relevant id once), for R the `counted_alternative` (so hitCount / expectedCount is the
    case's Recall@K); firstHitRank = the 1-based rank of the first rank that returns an id relevant in some
    alternative (None when there is none; 1 / firstHitRank is the case's MRR). Defined for an empty R too
    (0, 0, None)."""
    check_k(k)
    alternatives = alternatives_of(relevance)
    relevant = (
        relevant_ids(alternatives[counted_alternative(ranked_ids, alternatives, k)])
        if alternatives
        else set()
    )
    hits = _first_hits(ranked_ids, relevant, k)
    anywhere = set().union(*(relevant_ids(r) for r in alternatives)) if alternatives else set()
    first = _first_hits(ranked_ids, anywhere, k)
    return {
        "expectedCount": len(relevant),
        "hitCount": len(hits),
        "firstHitRank": first[0] if first else None,
    }


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


def _is_judged(rank: Rank, judged: Collection[str]) -> bool:
    if isinstance(rank, str):  # one id, the usual rank: what the general case below makes of it
        return rank in judged
    return any(i in judged for i in rank)


def judged_at_k(ranked_ids: Sequence[Rank], judged: Collection[str], k: int) -> float:
    """Judged@K = |{i <= K : ranked_ids[i] in J}| / K, J the set of ids that carry a judgment of any grade
    (0 included: "judged not relevant" is a judgment); a rank that returns several ids is judged when one
    of them is.

    As ir_measures' `Judged@k`: the denominator is K even when fewer than K results come back, and a
    duplicate counts at each of its positions (it is judged when its id is). Defined for every case,
    relevant ids or not. Example: top 4 = [a, x, b, y], J = {a, b}, K = 4 -> 2/4."""
    check_k(k)
    return sum(1 for i in ranked_ids[:k] if _is_judged(i, judged)) / k


def unjudged_at_k(ranked_ids: Sequence[Rank], judged: Collection[str], k: int) -> list[str]:
    """The distinct ids of the top K ranks that carry no judgment, in rank order (a rank by its own id)."""
    check_k(k)
    seen: list[str] = []
    for item in ranked_ids[:k]:
        own = rank_ids(item)[0]
        if not _is_judged(item, judged) and own not in seen:
            seen.append(own)
    return seen


def condensed(ranked_ids: Sequence[Rank], judged: Collection[str]) -> list[Rank]:
    """The condensed list (Sakai 2007; ir_measures' `judged_only`): `ranked_ids` with every unjudged rank
    removed and the rest moved up, order kept. A metric of it at K scores the first K judged results, so
    an unjudged document neither earns nor costs anything."""
    return [i for i in ranked_ids if _is_judged(i, judged)]


def evidence_recall(returned: Collection[str], groups: Sequence[Collection[str]]) -> float:
    """EvidenceRecall = max over the acceptable evidence groups G_j of |G_j ∩ T| / |G_j|, T the evidence
    items the top K returns (`returned`): chunk ids, and the quotes its chunks cover (app/evaluation/run/
    evidence.py). How much of the best-covered way of answering is there (1.0: one whole group is). Raises
    `UndefinedMetricError` without a group. Example: groups [{a, b}, {c}], T = {a, x} -> max(1/2, 0/1)."""
    if not groups or any(not g for g in groups):
        raise UndefinedMetricError("the case names no evidence group")
    return max(len(set(g) & set(returned)) / len(set(g)) for g in groups)


def evidence_hit(returned: Collection[str], groups: Sequence[Collection[str]]) -> float:
    """EvidenceHit = 1 when some acceptable evidence group is wholly among the items the top K returns, else
    0 (the answer can be read from the top K). Equals 1 exactly when `evidence_recall` is 1."""
    return 1.0 if evidence_recall(returned, groups) == 1.0 else 0.0


def evidence_recall_at_k(
    ranked_chunks: Sequence[Sequence[str]], groups: Sequence[Collection[str]], k: int
) -> float:
    """EvidenceRecall@K = `evidence_recall` of T, the chunk ids the top K returns.

    Each rank of `ranked_chunks` is the chunk ids that rank returns: its chunk, then the chunks the diversity
    stage attached to it (`attach_per_document`); the cut is at K ranks. Groups are sets of chunk ids (anyOf:
    any one group answers). Raises `UndefinedMetricError` without a group. Example: groups [{a, b}, {c}],
    top 2 = [[a], [x]] -> max(1/2, 0/1) = 0.5; top 1 = [[x, c]] -> 1/1."""
    check_k(k)
    return evidence_recall({chunk for rank in ranked_chunks[:k] for chunk in rank}, groups)


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
