"""Run every golden case through the retrieval chain and score it, stage by stage.

The chain is the very object `/api/retrieve` uses. Queries go in batches (one embedding call and one store
call per batch, per knowledge tag); each query still sees exactly its own candidates, so batching changes
no result. A case whose retrieval raises is a failed case, not a crashed run.

Per case this records: the metrics at K (see `metrics.CONVENTIONS`) and at every extra cut-off of
`k_values` (from the same final ranking, before its cut to K), what each stage removed and how many of
those removals were relevant, where every expected id that is not in the top K was lost, and the
Recall/MRR/nDCG of the list after each stage.

Latency: the batched run's per-case figure is `batch_latency_ms`; after it, `latency_sample` cases are
run again one at a time (`retrieve_many` with one request, as `/api/retrieve` runs) and timed end to end,
which is what a user waits: `single_latency_ms`.
"""

from __future__ import annotations

import difflib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from app.evaluation.golden.cases import (
    GoldenCase,
    GoldenSet,
    GoldenSetError,
    case_expected_relevance,
    case_relevance_key,
)
from app.evaluation.report.model import Loss, Ranks, RemovedItem, StageStat
from app.evaluation.scoring import metrics
from app.evaluation.scoring.metrics import match_key
from app.retrieval.chain import RetrievalChain, RetrievalRequest
from app.retrieval.stages.bm25 import Bm25Stage
from app.retrieval.stages.rerank import RerankStage
from app.retrieval.types import (
    SCORE_BM25,
    SCORE_DENSE,
    SCORE_FUSED,
    SCORE_RERANK,
    Candidate,
    RetrievalResult,
    RetrievalTrace,
    knowledge_tag_of,
)

log = logging.getLogger("sieve.evaluation")

BATCH_SIZE = 32
NOT_IN_INDEX = "NOT_IN_INDEX"
NOT_RETRIEVED = "NOT_RETRIEVED"
RANKED_OUT = "RANKED_OUT"


@dataclass
class KnownIds:
    """Every id the index holds at each matching level (to tell NOT_IN_INDEX from NOT_RETRIEVED), each
    chunk's document (to roll chunk judgments and evidence up), the documents of each source (to expand
    expectedSources) and the knowledge tags the chunks carry (to catch a misspelt knowledgeTag)."""

    doc: set[str] = field(default_factory=set)
    chunk: set[str] = field(default_factory=set)
    source: set[str] = field(default_factory=set)
    chunk_doc: dict[str, str] = field(default_factory=dict)
    source_docs: dict[str, set[str]] = field(default_factory=dict)
    tags: set[str] = field(default_factory=set)

    @classmethod
    def from_store(cls, store: Any) -> KnownIds:
        """Every id in a store (anything with `iter_all(include_text=False)` yielding chunks)."""
        return cls.from_metadata((c.chunk_id, c.metadata) for c in store.iter_all(include_text=False))

    @classmethod
    def from_metadata(cls, rows: Iterable[tuple[str, dict[str, Any]]]) -> KnownIds:
        known = cls()
        for chunk_id, meta in rows:
            doc_id = str(meta.get("doc_id", ""))
            known.chunk.add(chunk_id)
            known.doc.add(doc_id)
            known.chunk_doc[chunk_id] = doc_id
            if meta.get("source"):
                source = str(meta["source"])
                known.source.add(source)
                known.source_docs.setdefault(source, set()).add(doc_id)
            tag = knowledge_tag_of(meta)
            if tag is not None:
                known.tags.add(tag)
        return known


@dataclass
class CaseResult:
    case: GoldenCase
    k: int
    key: str  # "doc" | "chunk" | "source"
    relevance: dict[str, float]
    result: RetrievalResult | None = None
    error: str | None = None
    metrics: dict[str, float] | None = None
    after_stage: dict[str, dict[str, float]] = field(default_factory=dict)
    stage_stats: list[StageStat] = field(default_factory=list)
    lost: list[Loss] = field(default_factory=list)
    forbidden_found: list[str] = field(default_factory=list)
    missing_from_index: list[str] = field(default_factory=list)
    # the counts behind the ratios: expectedCount, hitCount, firstHitRank (metrics.hit_counts)
    counts: dict[str, int | None] = field(default_factory=dict)
    # metrics at each extra cut-off of k_values, from the same final ranking
    at_k: dict[int, dict[str, float]] = field(default_factory=dict)
    single_latency_ms: float | None = None
    # every id at the matching level that carries a judgment (any grade, forbidden ones included)
    judged_ids: set[str] = field(default_factory=set)
    # Judged@K of the top K and its unjudged ids (metrics.judged_at_k)
    judged: float | None = None
    unjudged: list[str] = field(default_factory=list)
    # the metrics at K of the condensed list (unjudged ids removed; metrics.condensed)
    condensed: dict[str, float] | None = None
    # the acceptable evidence groups (chunk ids) and the evidence figures at K
    evidence_groups: list[list[str]] = field(default_factory=list)
    evidence: dict[str, float] | None = None
    evidence_lost: list[Loss] = field(default_factory=list)
    # expectedSources expanded to the documents that carry them (doc-level cases only)
    expanded_sources: dict[str, list[str]] = field(default_factory=dict)

    @property
    def status(self) -> str:
        if self.error is not None:
            return "failed"
        return "noAnswer" if self.case.expect_no_answer else "ok"

    @property
    def latency_ms(self) -> float | None:
        """The batched run's per-case latency (its share of the batch's embedding and store call)."""
        return self.result.latency_ms if self.result else None

    @property
    def trace_id(self) -> str | None:
        """The id of the trace of the run the case is scored on (None when its retrieval failed)."""
        return self.result.trace.trace_id if self.result else None

    @property
    def abstained(self) -> bool:
        return self.result is not None and not self.result.documents


@dataclass
class Evaluation:
    golden: GoldenSet
    default_k: int
    cases: list[CaseResult]
    stage_names: list[str]
    started_at: float
    duration_ms: float
    warnings: list[str] = field(default_factory=list)
    as_of: date | None = None
    k_values: tuple[int, ...] = ()

    @property
    def k_mixed(self) -> bool:
        """True when some case carries its own topK different from the default K."""
        return any(c.k != self.default_k for c in self.cases)


def evaluate(
    chain: RetrievalChain,
    golden: GoldenSet,
    default_k: int,
    known: KnownIds,
    progress: Callable[[int, int], None] | None = None,
    today: date | None = None,
    k_values: Sequence[int] = (),
    latency_sample: int = 0,
) -> Evaluation:
    """Run `golden` through `chain`. `today` is the date the hard filter's effective-date rules use
    (None = the real today); `k_values` are extra cut-offs scored from the same ranking;
    `latency_sample` cases are re-run one at a time for the single-query latency."""
    started = time.time()
    t0 = time.perf_counter()
    as_of = today or date.today()
    ks = tuple(sorted(set(k_values)))
    check_knowledge_tags(golden, known)
    cases = [_prepare(case, default_k, known) for case in golden.cases if not case.draft]
    warnings = _stale_warnings(cases)
    drafts = len(golden.cases) - len(cases)
    if drafts:
        warnings.append(f"{drafts} draft case(s) not scored (label them, then `sieve golden export`)")
    for warning in warnings:
        log.warning("[RetrievalEval] %s", warning)
    total = len(cases)
    done = 0
    for start in range(0, total, BATCH_SIZE):
        batch = cases[start : start + BATCH_SIZE]
        requests = [RetrievalRequest(c.case.query, c.k, c.case.knowledge_tag) for c in batch]

        def finish(i: int, outcome: RetrievalResult | Exception, batch: list[CaseResult] = batch) -> None:
            nonlocal done
            _score(batch[i], outcome, ks)
            done += 1
            _log_case(batch[i], done, total)
            if progress:
                progress(done, total)

        try:
            chain.retrieve_many(requests, today=as_of, on_result=finish)
        except Exception as exc:  # the batch's shared part (embedding, store) failed: every case in it fails
            for item in batch:
                if item.result is None and item.error is None:
                    _score(item, exc, ks)
                    done += 1
                    _log_case(item, done, total)
    duration_ms = (time.perf_counter() - t0) * 1000
    _time_single_queries(chain, cases, latency_sample, as_of)
    return Evaluation(
        golden=golden,
        default_k=default_k,
        cases=cases,
        stage_names=chain.stage_names,
        started_at=started,
        duration_ms=duration_ms,
        warnings=warnings,
        as_of=as_of,
        k_values=ks,
    )


def latency_sample_indices(total: int, sample: int) -> list[int]:
    """Which cases are timed one at a time: `sample` indices spread evenly over `total` cases,
    i = floor(j · total / sample) for j = 0..sample-1 (every case when sample >= total)."""
    if sample <= 0 or total <= 0:
        return []
    if sample >= total:
        return list(range(total))
    return [j * total // sample for j in range(sample)]


def _time_single_queries(chain: Any, cases: list[CaseResult], sample: int, today: date) -> None:
    for i in latency_sample_indices(len(cases), sample):
        item = cases[i]
        if item.error is not None:
            continue
        request = RetrievalRequest(item.case.query, item.k, item.case.knowledge_tag)
        t0 = time.perf_counter()
        outcome = chain.retrieve_many([request], today=today)
        elapsed = (time.perf_counter() - t0) * 1000
        if outcome and not isinstance(outcome[0], BaseException):
            item.single_latency_ms = round(elapsed, 3)


def resolve_case(
    case: GoldenCase, known: KnownIds
) -> tuple[dict[str, float], set[str], dict[str, list[str]]]:
    """The grades `case` is scored with at its `case_relevance_key` level, every id judged at that level,
    and the expansion of its expectedSources. The rules:

    * doc level: expectedDocIds (grade 1), then `relevance`, then `judgments` of document ids (a later
      source's grade wins). A judged chunk (a `judgments` key that is a chunk id in the index) grades its
      document with the highest grade among the document's judged chunks, unless the document is graded
      itself; an evidence chunk makes its document relevant (grade 1) the same way. expectedSources beside
      document expectations add every document that carries the source (grade 1, unless graded).
      Judged: every graded document (grade 0 included) and forbiddenDocIds.
    * chunk level: expectedChunkIds (grade 1), then the `judgments` of chunk ids. Judged: those and the
      evidence chunks.
    * source level: expectedSources (grade 1). Judged: the same.

    An evidence chunk that is not in the index keeps its own id as a relevant document placeholder, so the
    case still scores (0) and says NOT_IN_INDEX instead of vanishing from the averages.
    """
    key = case_relevance_key(case)
    expanded: dict[str, list[str]] = {}
    if key == "source":
        grades = case_expected_relevance(case)
        return grades, set(grades), expanded
    if key == "chunk":
        grades = dict.fromkeys(case.expected_chunk_ids, 1.0)
        grades.update({i: float(g) for i, g in case.judgments.items() if i in known.chunk})
        evidence = {c for group in case.evidence_groups() for c in group}
        return grades, set(grades) | evidence, expanded
    grades = case.relevance_map()
    own = {i: float(g) for i, g in case.judgments.items() if i not in known.chunk}
    grades.update(own)
    graded_directly = set(grades)
    rolled: dict[str, float] = {}
    for chunk, grade in case.judgments.items():
        if chunk in known.chunk:
            doc = known.chunk_doc[chunk]
            rolled[doc] = max(rolled.get(doc, 0.0), float(grade))
    for group in case.evidence_groups():
        for chunk in group:
            doc = known.chunk_doc.get(chunk, chunk)
            rolled[doc] = max(rolled.get(doc, 0.0), 1.0)
    if case.expected_sources and (case.expected_doc_ids or case.relevance or case.judgments):
        for source in case.expected_sources:
            docs = sorted(known.source_docs.get(source, ()))
            expanded[source] = docs
            for doc in docs:
                rolled[doc] = max(rolled.get(doc, 0.0), 1.0)
    for doc, grade in rolled.items():
        if doc not in graded_directly:
            grades[doc] = grade
    return grades, set(grades) | set(case.forbidden_doc_ids), expanded


def _prepare(case: GoldenCase, default_k: int, known: KnownIds) -> CaseResult:
    key = case_relevance_key(case)
    relevance, judged, expanded = resolve_case(case, known)
    pool = {"doc": known.doc, "chunk": known.chunk, "source": known.source}[key]
    missing = sorted(i for i, grade in relevance.items() if grade > 0 and i not in pool)
    missing += [s for s, docs in expanded.items() if not docs]
    groups = case.evidence_groups()
    missing += sorted({c for g in groups for c in g if c not in known.chunk} - set(missing))
    return CaseResult(
        case,
        case.top_k or default_k,
        key,
        relevance,
        missing_from_index=missing,
        judged_ids=judged,
        evidence_groups=groups,
        expanded_sources=expanded,
    )


def check_knowledge_tags(golden: GoldenSet, known: KnownIds) -> None:
    """A knowledgeTag no chunk of the index carries is a golden-set error (it would silently score 0 as
    NOT_RETRIEVED), with the closest tag suggested. Skipped while the index is empty."""
    if not known.chunk:
        return
    errors = []
    for case in golden.cases:
        tag = case.knowledge_tag
        if tag is None or tag in known.tags:
            continue
        same = [t for t in sorted(known.tags) if t.casefold() == tag.casefold()]
        close = same or difflib.get_close_matches(tag, sorted(known.tags), n=1, cutoff=0.5)
        hint = (
            f'; did you mean "{close[0]}"?' if close else f"; the index has: {', '.join(sorted(known.tags))}"
        )
        errors.append(
            f'{golden.path}: case {case.id!r}: field "knowledgeTag": no chunk in the index carries '
            f"knowledge tag {tag!r}{hint}"
        )
    if errors:
        raise GoldenSetError(golden.path, errors)


def _stale_warnings(cases: list[CaseResult]) -> list[str]:
    return [
        f"case {c.case.id}: expected {c.key} id(s) not in the index: {', '.join(c.missing_from_index)} "
        f"(stale golden set after re-chunking or re-ingest?)"
        for c in cases
        if c.missing_from_index
    ]


def final_ranking(outcome: RetrievalResult) -> list[Candidate]:
    """The chain's final list before its cut to topK (the list after the last stage), as candidates."""
    trace = outcome.trace
    last = trace.stages[-1].name if trace.stages else "candidates"
    by_id = {c.chunk_id: c for c in outcome.raw_candidates}
    for c in outcome.documents:
        by_id.setdefault(c.chunk_id, c)
    ids = trace.ranked_after.get(last)
    if ids is None:
        return list(outcome.documents)
    return [by_id[cid] for cid in ids if cid in by_id]


def _score(item: CaseResult, outcome: RetrievalResult | Exception, k_values: Sequence[int] = ()) -> None:
    if isinstance(outcome, Exception):
        item.error = f"{type(outcome).__name__}: {outcome}"
        return
    ranked = _score_ranking(item, outcome, k_values)
    _score_trace(item, outcome, ranked)


def _score_ranking(item: CaseResult, outcome: RetrievalResult, k_values: Sequence[int]) -> list[str]:
    """What the final ranking scores: the counts, the metrics at K (and at each of `k_values`) and the
    forbidden documents in the top K. Returns the top K's matching keys (the trace reads them too)."""
    item.result = outcome
    key, k, relevance = item.key, item.k, item.relevance
    ranked = [match_key(c, key) for c in outcome.documents][:k]
    texts = [c.text for c in outcome.documents][:k]
    item.counts = metrics.hit_counts(ranked, relevance, k)
    if metrics.has_relevant(relevance):
        item.metrics = metrics.case_metrics(ranked, relevance, k, texts)
        if k_values:
            full = final_ranking(outcome)
            full_keys = [match_key(c, key) for c in full]
            full_texts = [c.text for c in full]
            item.at_k = {kk: metrics.case_metrics(full_keys, relevance, kk, full_texts) for kk in k_values}
    forbidden = set(item.case.forbidden_doc_ids)
    item.forbidden_found = sorted({c.doc_id for c in outcome.documents[:k] if c.doc_id in forbidden})
    item.judged = metrics.judged_at_k(ranked, item.judged_ids, k)
    item.unjudged = metrics.unjudged_at_k(ranked, item.judged_ids, k)
    if metrics.has_relevant(relevance):
        full_keys = [match_key(c, key) for c in final_ranking(outcome)]
        kept = metrics.condensed(full_keys, item.judged_ids)
        item.condensed = {
            name: fn(kept, relevance, k)
            for name, fn in (
                ("recall", metrics.recall_at_k),
                ("hitRate", metrics.hit_rate_at_k),
                ("mrr", metrics.mrr_at_k),
                ("ndcg", metrics.ndcg_at_k),
                ("precision", metrics.precision_at_k),
            )
        }
    if item.evidence_groups:
        chunks = [c.chunk_ids_with_attached() for c in outcome.documents[:k]]
        item.evidence = {
            "evidenceRecall": metrics.evidence_recall_at_k(chunks, item.evidence_groups, k),
            "evidenceHit": metrics.evidence_hit_at_k(chunks, item.evidence_groups, k),
        }
    return ranked


def _score_trace(item: CaseResult, outcome: RetrievalResult, ranked: list[str]) -> None:
    """What the trace scores: each stage's statistics, the metrics of the list after each stage, and where
    each missed relevant id was lost (`ranked`: the top K's matching keys, from `_score_ranking`)."""
    key, k, relevance = item.key, item.k, item.relevance
    relevant = metrics.relevant_ids(relevance)
    by_chunk = {c.chunk_id: match_key(c, key) for c in outcome.raw_candidates}
    trace = outcome.trace
    # every list of the trace as matching keys, and as a set, once (the stage rows, the metrics after each
    # stage and the losses all read them)
    if key == "chunk":  # a chunk id is its own matching key
        keys_after = dict(trace.ranked_after)
    else:
        keys_after = {
            name: [by_chunk.get(cid, cid) for cid in ids] for name, ids in trace.ranked_after.items()
        }
    present_after = {name: set(keys) for name, keys in keys_after.items()}
    no_list: set[str] = set()
    before = present_after.get("candidates", no_list)
    for stage in trace.stages:
        after = present_after.get(stage.name, no_list)
        # a relevant id the stage made disappear; dropping a second chunk of a document that stays is no loss
        removed_relevant = len((before - after) & relevant)
        before = after
        flags = [by_chunk.get(r.chunk_id) in relevant for r in stage.removed]
        item.stage_stats.append(
            StageStat(
                name=stage.name,
                enabled=stage.enabled,
                skipped=stage.skipped,
                input=stage.input_count,
                output=stage.output_count,
                removed=len(stage.removed),
                removed_relevant=removed_relevant,
                removed_relevant_chunks=sum(flags),
                added=len(stage.added),
                latency_ms=stage.latency_ms,
                removed_items=[
                    RemovedItem(chunk_id=r.chunk_id, doc_id=r.doc_id, reason=r.reason, relevant=flag)
                    for r, flag in zip(stage.removed, flags, strict=True)
                ],
            )
        )
    if metrics.has_relevant(relevance):
        # the metrics read a list's first K keys only, and consecutive stages often leave those alone
        by_head: dict[tuple[str, ...], dict[str, float]] = {}
        for name, keys in keys_after.items():
            head = tuple(keys[:k])
            if head not in by_head:
                by_head[head] = {
                    "recall": metrics.recall_at_k(head, relevance, k),
                    "mrr": metrics.mrr_at_k(head, relevance, k),
                    "ndcg": metrics.ndcg_at_k(head, relevance, k),
                    "judged": metrics.judged_at_k(head, item.judged_ids, k),
                }
            item.after_stage[name] = dict(by_head[head])
    positions = candidate_positions(trace)
    key_positions = positions if key == "chunk" else best_positions(positions, by_chunk)
    item.lost = _with_ranks(
        _where_lost(item, outcome, by_chunk, relevant, ranked, present_after), key_positions
    )
    if item.evidence is not None and item.evidence["evidenceHit"] < 1.0:
        # where each evidence chunk that is not in the top K went, at chunk level
        chunk_after = {name: set(ids) for name, ids in trace.ranked_after.items()}
        identity = {c.chunk_id: c.chunk_id for c in outcome.raw_candidates}
        wanted = {c for group in item.evidence_groups for c in group}
        top_chunks = [i for c in outcome.documents[:k] for i in c.chunk_ids_with_attached()]
        item.evidence_lost = _with_ranks(
            _where_lost(item, outcome, identity, wanted, top_chunks, chunk_after), positions
        )


def candidate_positions(trace: RetrievalTrace) -> dict[str, dict[str, int]]:
    """The candidate lists of `Ranks` in a trace, each as chunk id -> 1-based position (a chunk listed twice
    keeps its first): `dense` and `bm25` the searches' hits (`search_hits`), `fused` the list after the bm25
    stage and `rerank` the list after the rerank stage, each only when its search or stage ran (a stage
    enabled and not skipped)."""
    lists = {name: ids for name, ids in trace.search_hits.items() if name in (SCORE_DENSE, SCORE_BM25)}
    ran = {s.name for s in trace.stages if s.enabled and s.skipped is None}
    for name, stage in ((SCORE_FUSED, Bm25Stage.name), (SCORE_RERANK, RerankStage.name)):
        if stage in ran and stage in trace.ranked_after:
            lists[name] = trace.ranked_after[stage]
    out: dict[str, dict[str, int]] = {}
    for name, ids in lists.items():
        positions: dict[str, int] = {}
        for position, chunk_id in enumerate(ids, start=1):
            positions.setdefault(chunk_id, position)
        out[name] = positions
    return out


def best_positions(
    positions: dict[str, dict[str, int]], by_chunk: dict[str, str]
) -> dict[str, dict[str, int]]:
    """`candidate_positions` by matching key (`by_chunk`: chunk id -> its document, source, ...): in each
    list, the position of the key's best placed chunk."""
    out: dict[str, dict[str, int]] = {}
    for name, chunks in positions.items():
        best: dict[str, int] = {}
        for chunk_id, position in chunks.items():
            key = by_chunk.get(chunk_id, chunk_id)
            if position < best.get(key, position + 1):
                best[key] = position
        out[name] = best
    return out


def ranks_of(positions: dict[str, dict[str, int]], item: str) -> Ranks:
    """An item's `Ranks` from `candidate_positions` (or `best_positions`, for a matching key)."""

    def at(name: str) -> int | None:
        return positions.get(name, {}).get(item)

    return Ranks(dense=at(SCORE_DENSE), bm25=at(SCORE_BM25), fused=at(SCORE_FUSED), rerank=at(SCORE_RERANK))


def _with_ranks(losses: list[Loss], positions: dict[str, dict[str, int]]) -> list[Loss]:
    for loss in losses:
        loss.ranks = ranks_of(positions, loss.id)
    return losses


def score_case(
    item: CaseResult,
    outcome: RetrievalResult | Exception,
    k_values: Sequence[int] = (),
    trace: bool = True,
) -> None:
    """Score one case's outcome into `item` exactly as `evaluate` does (the replay scores its points so).

    `trace=False` scores the final ranking only (`counts`, `metrics`, `at_k`, `forbidden_found`, and the
    result, which tells an abstention), with the same functions: every figure of the summary that reads
    nothing else comes out the same, while `stage_stats`, `after_stage` and `lost` stay empty. That is
    what a grid point of `sieve tune` shows, at a fraction of the cost."""
    if trace or isinstance(outcome, Exception):
        _score(item, outcome, k_values)
    else:
        _score_ranking(item, outcome, k_values)


def _where_lost(
    item: CaseResult,
    outcome: RetrievalResult,
    by_chunk: dict[str, str],
    relevant: set[str],
    top_k: list[str],
    present_after: dict[str, set[str]],
) -> list[Loss]:
    """For each relevant id not in the top K: NOT_IN_INDEX, NOT_RETRIEVED, REMOVED_BY_<stage> (with the
    reason of the removal that made it vanish for good), or RANKED_OUT (it survived every stage, below K).
    `present_after`: the matching keys in the list after each stage, by stage name."""
    trace = outcome.trace
    stage_order = [s.name for s in trace.stages]
    present_after = {name: present_after.get(name, set()) for name in stage_order}
    final = present_after[stage_order[-1]] if stage_order else {by_chunk[c] for c in by_chunk}
    raw = set(by_chunk.values())
    lost = []
    for wanted in sorted(relevant - set(top_k)):
        if wanted in item.missing_from_index:
            lost.append(Loss(id=wanted, where=NOT_IN_INDEX, stage="", reason="not in the index"))
        elif wanted not in raw:
            lost.append(
                Loss(
                    id=wanted,
                    where=NOT_RETRIEVED,
                    stage="",
                    reason="not among the vector or BM25 candidates",
                )
            )
        elif wanted in final:
            lost.append(
                Loss(
                    id=wanted,
                    where=RANKED_OUT,
                    stage="",
                    reason=f"survived every stage but ranked below K={item.k}",
                )
            )
        else:
            stage, reason = _vanished_at(wanted, trace, by_chunk, present_after, stage_order)
            lost.append(Loss(id=wanted, where=f"REMOVED_BY_{stage}", stage=stage, reason=reason))
    return lost


def _vanished_at(wanted, trace, by_chunk, present_after, stage_order) -> tuple[str, str]:
    present = True
    culprit, reason = stage_order[-1], "removed"
    for stage in trace.stages:
        now = wanted in present_after[stage.name]
        if present and not now:
            culprit = stage.name
            reasons = [r.reason for r in stage.removed if by_chunk.get(r.chunk_id) == wanted]
            reason = reasons[0] if reasons else "removed"
        present = now
    return culprit, reason


def _log_case(item: CaseResult, done: int, total: int) -> None:
    if item.error is not None:
        log.error(
            "[RetrievalEval] case failed [%d/%d] caseId=%s, error=%s", done, total, item.case.id, item.error
        )
        return
    k = item.k
    latency = f"{item.latency_ms:.0f}ms"
    trace_id = item.trace_id
    if item.metrics is None:
        got = len(item.result.documents) if item.result else 0
        verdict = "abstained" if got == 0 else f"answered {got} docs"
        log.info(
            "[RetrievalEval] case done [%d/%d] caseId=%s, traceId=%s, noAnswer=%s, latency=%s",
            done,
            total,
            item.case.id,
            trace_id,
            verdict,
            latency,
        )
        return
    m = item.metrics
    log.info(
        "[RetrievalEval] case done [%d/%d] caseId=%s, traceId=%s, Recall@%d=%.2f, MRR=%.2f, nDCG@%d=%.2f, "
        "latency=%s",
        done,
        total,
        item.case.id,
        trace_id,
        k,
        m["recall"],
        m["mrr"],
        k,
        m["ndcg"],
        latency,
    )
