"""Run every golden case through the retrieval chain and score it, stage by stage.

The chain is the very object `/api/retrieve` uses. Queries go in batches (one embedding call and one store
call per batch, per knowledge tag); each query still sees exactly its own candidates, so batching changes
no result. A case whose retrieval raises is a failed case, not a crashed run.

Per case this records: the metrics at K (see `metrics.conventions`) and at every extra cut-off of
`k_values` (from the same final ranking, before its cut to K), what each stage removed and how many of
those removals were relevant, where every expected id that is not in the top K was lost, and the
Recall/MRR/nDCG of the list after each stage.

A case is judged as of its own `asOf` when it has one, else as of the run's date: the hard filter's
effective dates (and so which forbidden documents can reach the top K) are those of that day. Queries are
batched per date.

A case runs as the principal `principals` gives it (`golden.principals.case_principals`; none: unscoped).
Every chunk it returns (attached ones included) is checked against that principal with the independent rule
over the stored metadata (`run.access.access_leaks`), and an expected id the principal may read no chunk of
is lost as ACL_FILTERED.

Chunk ids the index does not hold (re-chunked or re-ingested since the case was written) are left out of
every figure and listed (`resolve_case`); a case left with no relevant id is unscorable, not a 0.

Latency: the batched run's per-case figure is `batch_latency_ms`; after it, `latency_sample` cases are
run again one at a time (`retrieve_many` with one request, as `/api/retrieve` runs) and timed end to end,
which is what a user waits: `single_latency_ms`.
"""

from __future__ import annotations

import difflib
import gc
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from app.access.scope import ACCESS, TENANT, Principal
from app.evaluation.golden.cases import (
    EvidenceItem,
    EvidenceQuote,
    GoldenCase,
    GoldenSet,
    GoldenSetError,
    case_expected_relevance,
    case_relevance_key,
)
from app.evaluation.report.model import AccessLeak, LeakProbe, Loss, Ranks, StageStat
from app.evaluation.run.access import ACL_FILTERED, access_leaks, acl_filtered
from app.evaluation.run.evidence import (
    CaseEvidence,
    EvidenceIndex,
    TextSource,
    case_evidence,
    chars_after_stages,
    document_texts,
    evidence_table,
    resolve_quotes,
)
from app.evaluation.scoring import measures, metrics
from app.evaluation.scoring.measures import Ranking
from app.evaluation.scoring.metrics import Gain, Rank, match_key
from app.ingest.ids import looks_like_chunk_id
from app.retrieval.chain import RetrievalChain, RetrievalRequest
from app.retrieval.stages.bm25 import Bm25Stage
from app.retrieval.stages.diversity import DiversityStage
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
from app.store.types import ChunkMetadata

log = logging.getLogger("sieve.evaluation")

BATCH_SIZE = 32
_NO_SCOPE: Mapping[str, Any] = {}
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
    # the chunks' spans, and where the golden set's quotes resolved (`resolve_quotes`)
    evidence: EvidenceIndex = field(default_factory=EvidenceIndex)
    # the normalised texts of documents, to resolve quotes in (None: quotes cannot be resolved)
    texts: TextSource | None = None
    # the stored `tenant` and `access` of each chunk that has either (the leak checks read these, never
    # the filter's decision); a chunk without an entry has no scope
    scopes: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the chunks of each document (for ACL_FILTERED)
    doc_chunks: dict[str, list[str]] = field(default_factory=dict)

    def scope_of(self, candidate: Candidate) -> Mapping[str, Any]:
        """The stored scope of a returned chunk: as read from the store before the run, or the candidate's
        own metadata for a chunk the store did not hold then."""
        if candidate.chunk_id in self.chunk:
            return self.scopes.get(candidate.chunk_id, _NO_SCOPE)
        return candidate.metadata

    def chunks_of(self, key: str, level: str) -> list[str]:
        """The chunks of the index that an id at matching `level` ("doc", "chunk", "source") stands for."""
        if level == "chunk":
            return [key] if key in self.chunk else []
        docs = sorted(self.source_docs.get(key, ())) if level == "source" else [key]
        return [c for d in docs for c in self.doc_chunks.get(d, [])]

    @classmethod
    def from_store(cls, store: Any, record: Any = None) -> KnownIds:
        """Every id in a store (anything with `iter_all(include_text=False)` yielding chunks); documents'
        texts from `record` (the document record), else from the store's chunks (`document_texts`)."""
        known = cls.from_metadata((c.chunk_id, c.metadata) for c in store.iter_all(include_text=False))
        known.texts = document_texts(store, record, known.evidence)
        return known

    @classmethod
    def from_metadata(cls, rows: Iterable[tuple[str, ChunkMetadata]]) -> KnownIds:
        known = cls()
        for chunk_id, meta in rows:
            doc_id = str(meta.get("doc_id", ""))
            known.chunk.add(chunk_id)
            known.doc.add(doc_id)
            known.chunk_doc[chunk_id] = doc_id
            known.evidence.add(chunk_id, doc_id, meta)
            known.doc_chunks.setdefault(doc_id, []).append(chunk_id)
            scope = {key: meta[key] for key in (TENANT, ACCESS) if key in meta}
            if scope:
                known.scopes[chunk_id] = scope
            if meta.get("source"):
                source = str(meta["source"])
                known.source.add(source)
                known.source_docs.setdefault(source, set()).add(doc_id)
            tag = knowledge_tag_of(meta)
            if tag is not None:
                known.tags.add(tag)
        return known


@dataclass(frozen=True)
class CaseScores:
    """What one case's final ranking scores (`score_ranking`): `ranked`, the top K's ranks as matched
    (`rank_key`); `counts`, the counts behind the ratios (expectedCount, hitCount, firstHitRank:
    `metrics.hit_counts`); `metrics`, the case's measure table at K (`measures.HEADLINE`; None for a case
    without a relevant id); `at_k`, the same table at each extra cut-off, from the same final ranking;
    `forbidden_found`, the forbidden documents in the top K; `judged` and `unjudged`, Judged@K and the top
    K's unjudged ids; `condensed`, the `measures.RANKING` table of the condensed list (unjudged ids
    removed); `evidence`, evidenceRecall and evidenceHit at K (None for a case without evidence groups)."""

    ranked: list[Rank]
    counts: dict[str, int | None]
    metrics: dict[str, float] | None
    at_k: dict[int, dict[str, float]]
    forbidden_found: list[str]
    judged: float
    unjudged: list[str]
    condensed: dict[str, float] | None
    evidence: dict[str, float] | None


@dataclass(frozen=True)
class TraceAnalysis:
    """What one case's trace tells (`analyse_trace`): each stage's statistics, the `measures.AFTER_STAGE`
    table of the list after each stage, where each relevant id not in the top K was lost, and where each
    evidence chunk went when no evidence group is whole in the top K."""

    stage_stats: list[StageStat]
    after_stage: dict[str, dict[str, float]]
    lost: list[Loss]
    evidence_lost: list[Loss]


@dataclass
class CaseResult:
    """One golden case of a run, in one shape: the case resolved against the index (its grades, judged
    ids, evidence groups, alternatives and stale ids, set by `_prepare`), the chain's outcome (`result`, the
    ranking and its trace, or `error`), and what pure functions made of it: `scores` (`score_ranking`) and
    `analysis` (`analyse_trace`). The figures are read through the properties below."""

    case: GoldenCase
    k: int
    key: str  # "doc" | "chunk" | "source"
    # every id the case grades at its level, over all its alternatives (what the report shows as expected)
    relevance: dict[str, float]
    result: RetrievalResult | None = None
    error: str | None = None
    scores: CaseScores | None = None
    analysis: TraceAnalysis | None = None
    missing_from_index: list[str] = field(default_factory=list)
    single_latency_ms: float | None = None
    # every id at the matching level that carries a judgment (any grade, forbidden ones included)
    judged_ids: set[str] = field(default_factory=set)
    # the acceptable evidence groups (chunk ids)
    evidence_groups: list[list[str]] = field(default_factory=list)
    # expectedSources expanded to the documents that carry them (doc-level cases only)
    expanded_sources: dict[str, list[str]] = field(default_factory=dict)
    # one relevance map per alternative evidence group (`case_alternatives`); empty: `relevance` alone
    alternatives: list[dict[str, float]] = field(default_factory=list)
    # the chunk ids the case names that the index does not hold: left out of every figure
    stale_chunk_ids: list[str] = field(default_factory=list)
    # why the case has no figures although it names expectations (every one is stale), else None
    unscorable: str | None = None
    # the date the case is judged as of: its own asOf, else the run's
    as_of: date | None = None
    # its evidence groups as keys on this index, with their spans (quotes resolved)
    placed: CaseEvidence = field(default_factory=CaseEvidence)
    # the share of a quote's characters the returned chunks must cover (`quotes.is_returned`)
    coverage: float = 1.0
    # the principal the case runs as (None: unscoped, everything readable)
    principal: Principal | None = None
    # its expected ids (at its level) of which the principal may read no chunk: lost as ACL_FILTERED
    acl_filtered: list[str] = field(default_factory=list)
    # the returned or attached chunks the principal may not read (`access.access_leaks`)
    leaks: list[AccessLeak] = field(default_factory=list)

    @property
    def metrics(self) -> dict[str, float] | None:
        return self.scores.metrics if self.scores else None

    @property
    def counts(self) -> dict[str, int | None]:
        return self.scores.counts if self.scores else {}

    @property
    def at_k(self) -> dict[int, dict[str, float]]:
        return self.scores.at_k if self.scores else {}

    @property
    def forbidden_found(self) -> list[str]:
        return self.scores.forbidden_found if self.scores else []

    @property
    def judged(self) -> float | None:
        return self.scores.judged if self.scores else None

    @property
    def unjudged(self) -> list[str]:
        return self.scores.unjudged if self.scores else []

    @property
    def condensed(self) -> dict[str, float] | None:
        return self.scores.condensed if self.scores else None

    @property
    def evidence(self) -> dict[str, float] | None:
        return self.scores.evidence if self.scores else None

    @property
    def stage_stats(self) -> list[StageStat]:
        return self.analysis.stage_stats if self.analysis else []

    @property
    def after_stage(self) -> dict[str, dict[str, float]]:
        return self.analysis.after_stage if self.analysis else {}

    @property
    def lost(self) -> list[Loss]:
        return self.analysis.lost if self.analysis else []

    @property
    def evidence_lost(self) -> list[Loss]:
        return self.analysis.evidence_lost if self.analysis else []

    @property
    def status(self) -> str:
        if self.error is not None:
            return "failed"
        if self.unscorable is not None:
            return "unscorable"
        return "noAnswer" if self.case.expect_no_answer else "ok"

    @property
    def relevance_maps(self) -> list[dict[str, float]]:
        """The relevance maps the figures are the best over: one per alternative."""
        return self.alternatives or [self.relevance]

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
    gain: Gain = "linear"
    # the cases' principals, by case id, as the run was given them (empty: every case unscoped)
    principals: Mapping[str, Principal | None] = field(default_factory=dict)
    # the leak probe's result (`probe.leak_probe`), set by the session; None: not run
    probe: LeakProbe | None = None

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
    gain: Gain = "linear",
    coverage: float = 1.0,
    principals: Mapping[str, Principal | None] | None = None,
) -> Evaluation:
    """Run `golden` through `chain`, each case as its principal in `principals` (by case id; absent:
    unscoped; `golden.principals.case_principals`). `today` is the date the hard filter's effective-date
    rules use (None = the real today) for every case without its own `asOf`; `k_values` are extra
    cut-offs scored from the same ranking; `latency_sample` cases are re-run one at a time for the
    single-query latency; `gain` is nDCG's (`metrics.gain_of`); `coverage` the quotes' coverage rule
    (`quotes.is_returned`).
    Raises `GoldenSetError` for a knowledge tag no chunk carries and a quote that does not resolve."""
    started = time.time()
    t0 = time.perf_counter()
    as_of = today or date.today()
    ks = tuple(sorted(set(k_values)))
    check_golden_against_index(golden, known, coverage)
    principals = dict(principals or {})
    cases = [
        _prepare(case, default_k, known, case.as_of or as_of, coverage, principals.get(case.id))
        for case in golden.cases
        if not case.draft
    ]
    warnings = _run_warnings(golden, cases)
    with cyclic_gc_paused():
        _run_batches(chain, cases, as_of, ks, gain, progress, known)
    duration_ms = (time.perf_counter() - t0) * 1000
    _time_single_queries(chain, cases, latency_sample)
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
        gain=gain,
        principals=principals,
    )


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """The cyclic garbage collector paused for the block (then as it was before). An evaluation, or a replay
    of one, allocates many short-lived objects and none in a reference cycle (reference counting frees
    them), while each collection would walk everything the run keeps, and now and then the whole heap (a
    loaded model's objects included), for nothing (docs/benchmarks.md, "Evaluation cost")."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _run_warnings(golden: GoldenSet, cases: list[CaseResult]) -> list[str]:
    """The run's warnings (stale chunk ids, draft cases left out), each logged once."""
    warnings = _stale_warnings(cases)
    drafts = len(golden.cases) - len(cases)
    if drafts:
        warnings.append(f"{drafts} draft case(s) not scored (label them, then `sieve golden export`)")
    for warning in warnings:
        log.warning("[RetrievalEval] %s", warning)
    return warnings


def _run_batches(
    chain: RetrievalChain,
    cases: list[CaseResult],
    as_of: date,
    ks: tuple[int, ...],
    gain: Gain,
    progress: Callable[[int, int], None] | None,
    known: KnownIds | None = None,
) -> None:
    """Retrieve and score every case, batch by batch (`_batches`), each as its principal, logging each as
    it finishes; with `known`, each answer's chunks are checked for leaks against their stored scope."""
    total = len(cases)
    done = 0
    for day, batch in _batches(cases, as_of):
        requests = [case_request(c) for c in batch]

        def finish(i: int, outcome: RetrievalResult | Exception, batch: list[CaseResult] = batch) -> None:
            nonlocal done
            _score(batch[i], outcome, ks, gain)
            if known is not None and not isinstance(outcome, Exception):
                item = batch[i]
                item.leaks = access_leaks(item.case.id, item.principal, outcome.documents, known.scope_of)
            done += 1
            _log_case(batch[i], done, total)
            if progress:
                progress(done, total)

        try:
            chain.retrieve_many(requests, today=day, on_result=finish)
        except Exception as exc:  # the batch's shared part (embedding, store) failed: every case in it fails
            for item in batch:
                if item.result is None and item.error is None:
                    _score(item, exc, ks, gain)
                    done += 1
                    _log_case(item, done, total)


def case_request(item: CaseResult) -> RetrievalRequest:
    """The chain request of a case: its query, K, knowledge tag and principal."""
    return RetrievalRequest(item.case.query, item.k, item.case.knowledge_tag, item.principal)


def _batches(cases: list[CaseResult], as_of: date) -> list[tuple[date, list[CaseResult]]]:
    """The cases in batches of at most BATCH_SIZE that share the date they are judged as of (their own, else
    `as_of`; dates in the order they first occur, cases in golden-set order within a date)."""
    by_day: dict[date, list[CaseResult]] = {}
    for item in cases:
        by_day.setdefault(item.as_of or as_of, []).append(item)
    return [
        (day, dated[start : start + BATCH_SIZE])
        for day, dated in by_day.items()
        for start in range(0, len(dated), BATCH_SIZE)
    ]


def latency_sample_indices(total: int, sample: int) -> list[int]:
    """Which cases are timed one at a time: `sample` indices spread evenly over `total` cases,
    i = floor(j · total / sample) for j = 0..sample-1 (every case when sample >= total)."""
    if sample <= 0 or total <= 0:
        return []
    if sample >= total:
        return list(range(total))
    return [j * total // sample for j in range(sample)]


def _time_single_queries(chain: Any, cases: list[CaseResult], sample: int) -> None:
    for i in latency_sample_indices(len(cases), sample):
        item = cases[i]
        if item.error is not None:
            continue
        request = case_request(item)
        t0 = time.perf_counter()
        outcome = chain.retrieve_many([request], today=item.as_of)
        elapsed = (time.perf_counter() - t0) * 1000
        if outcome and not isinstance(outcome[0], BaseException):
            item.single_latency_ms = round(elapsed, 3)


def usable_groups(case: GoldenCase, known: KnownIds) -> list[list[EvidenceItem]]:
    """The case's evidence groups (`GoldenCase.evidence_groups`) whose every chunk the index holds. A group
    with a chunk the index does not hold is left out whole: the chunks that together held the answer are no
    longer all known, so no figure can say the answer was found with them. A quote never makes a group
    unusable: it resolves on any chunking (and one whose document is not in the index is a real miss)."""
    return [
        group
        for group in case.evidence_groups()
        if all(not isinstance(c, str) or c in known.chunk for c in group)
    ]


def stale_chunk_ids(case: GoldenCase, known: KnownIds) -> list[str]:
    """The chunk ids `case` scores with that the index does not hold, sorted: its evidence groups' chunks,
    its expectedChunkIds at chunk level, and the `judgments` keys shaped like a chunk id
    (`ids.looks_like_chunk_id`) that are no document of the index either (`_stale_judgment`). They are
    left out of every figure (see `resolve_case`)."""
    named = [c for group in case.evidence_groups() for c in group if isinstance(c, str)]
    if case_relevance_key(case) == "chunk":
        named += case.expected_chunk_ids
    named += [key for key in case.judgments if _stale_judgment(key, known)]
    return sorted({c for c in named if c not in known.chunk})


def _stale_judgment(key: str, known: KnownIds) -> bool:
    """A `judgments` key that has the shape of a chunk id and that the index holds neither as a chunk nor as
    a document: a chunk re-chunked away, not a document."""
    return looks_like_chunk_id(key) and key not in known.chunk and key not in known.doc


def _grades(
    case: GoldenCase, known: KnownIds, groups: list[list[EvidenceItem]]
) -> tuple[dict[str, float], dict[str, list[str]]]:
    """`case`'s grades at its level with evidence `groups` (chunks the index holds), and its expectedSources
    expanded to documents (see `resolve_case`)."""
    key = case_relevance_key(case)
    expanded: dict[str, list[str]] = {}
    if key == "source":
        return case_expected_relevance(case), expanded
    if key == "chunk":
        return _chunk_grades(case, known, groups), expanded
    grades = case.relevance_map()
    own = {
        i: float(g)
        for i, g in case.judgments.items()
        if i not in known.chunk and not _stale_judgment(i, known)
    }
    grades.update(own)
    graded_directly = set(grades)
    rolled: dict[str, float] = {}
    judged = [(known.chunk_doc[c], float(g)) for c, g in case.judgments.items() if c in known.chunk]
    judged += [(q.doc_id, q.grade) for q in case.judged_quotes]
    judged += [(_item_doc(item, known), 1.0) for group in groups for item in group]
    for doc, grade in judged:
        rolled[doc] = max(rolled.get(doc, 0.0), grade)
    if case.expected_sources and (case.expected_doc_ids or case.relevance or case.judgments):
        for source in case.expected_sources:
            docs = sorted(known.source_docs.get(source, ()))
            expanded[source] = docs
            for doc in docs:
                rolled[doc] = max(rolled.get(doc, 0.0), 1.0)
    for doc, grade in rolled.items():
        if doc not in graded_directly:
            grades[doc] = grade
    return grades, expanded


def _item_doc(item: EvidenceItem, known: KnownIds) -> str:
    """The document of an evidence item: a chunk's, or the one a quote names."""
    return known.chunk_doc[item] if isinstance(item, str) else item.doc_id


def _chunk_grades(case: GoldenCase, known: KnownIds, groups: list[list[EvidenceItem]]) -> dict[str, float]:
    """Chunk-level grades: expectedChunkIds (1), the judgments of chunk ids, each judged quote's grade on
    the chunks that hold part of it (the highest), then the evidence chunks and the chunks holding an
    evidence quote (1 unless judged)."""
    grades = {c: 1.0 for c in case.expected_chunk_ids if c in known.chunk}
    grades.update({i: float(g) for i, g in case.judgments.items() if i in known.chunk})
    for quote in case.judged_quotes:
        for chunk in _quote_holders(quote, known):
            grades[chunk] = max(grades.get(chunk, 0.0), quote.grade)
    for item in (i for group in groups for i in group):
        for chunk in [item] if isinstance(item, str) else _quote_holders(item, known):
            grades.setdefault(chunk, 1.0)
    return grades


def _quote_holders(quote: EvidenceQuote, known: KnownIds) -> list[str]:
    """The chunks of this index that hold part of a resolved quote (none for an unresolved one)."""
    span = known.evidence.quotes.get((quote.doc_id, quote.quote))
    return known.evidence.holders((quote.doc_id, *span)) if span is not None else []


def resolve_case(
    case: GoldenCase, known: KnownIds
) -> tuple[dict[str, float], set[str], dict[str, list[str]]]:
    """The grades `case` is scored with at its `case_relevance_key` level (over all its alternatives), every
    id judged at that level, and the expansion of its expectedSources. The rules:

    * doc level: expectedDocIds (grade 1), then `relevance`, then `judgments` of document ids (a later
      source's grade wins). A judged chunk (a `judgments` key that is a chunk id in the index) grades its
      document with the highest grade among the document's judged chunks, unless the document is graded
      itself; an evidence chunk makes its document relevant (grade 1) the same way. expectedSources beside
      document expectations add every document that carries the source (grade 1, unless graded).
      Judged: every graded document (grade 0 included) and forbiddenDocIds.
    * chunk level: expectedChunkIds (grade 1), then the `judgments` of chunk ids, then the evidence chunks
      (grade 1 unless judged). Judged: the same.
    * source level: expectedSources (grade 1). Judged: the same.

    A chunk id the index does not hold (`stale_chunk_ids`: an evidence, expectedChunkIds or chunk-shaped
    judgments id, stale after re-chunking or re-ingest) is left out: it grades nothing, and an evidence
    group holding one is left out whole (`usable_groups`). A document or source the index does not hold
    keeps its grade: the answer is missing from the index, a real miss that scores 0.
    """
    grades, expanded = _grades(case, known, usable_groups(case, known))
    if case_relevance_key(case) == "doc":
        return grades, set(grades) | set(case.forbidden_doc_ids), expanded
    return grades, set(grades), expanded


def case_alternatives(case: GoldenCase, known: KnownIds) -> list[dict[str, float]]:
    """The relevance maps of a case whose evidence groups are alternatives: with two or more usable groups
    (`usable_groups`; anyOf, evidenceChunkIds as one more), one map per group, each `_grades` with the
    case's other expectations and that group alone; else the one map of `resolve_case`. Each figure of the
    case is the best over them (`metrics.best_alternative`)."""
    groups = usable_groups(case, known)
    if len(groups) < 2:
        return [_grades(case, known, groups)[0]]
    return [_grades(case, known, [group])[0] for group in groups]


def _prepare(
    case: GoldenCase,
    default_k: int,
    known: KnownIds,
    as_of: date,
    coverage: float = 1.0,
    principal: Principal | None = None,
) -> CaseResult:
    key = case_relevance_key(case)
    relevance, judged, expanded = resolve_case(case, known)
    alternatives = case_alternatives(case, known)
    stale = stale_chunk_ids(case, known)
    placed = case_evidence(usable_groups(case, known), known.chunk_doc, known.evidence)
    pool = {"doc": known.doc, "chunk": known.chunk, "source": known.source}[key]
    missing = sorted(i for i, grade in relevance.items() if grade > 0 and i not in pool)
    missing += [s for s, docs in expanded.items() if not docs]
    missing += [c for c in [*stale, *placed.unplaced] if c not in missing]
    wanted = {i for grades in [relevance, *alternatives] for i in metrics.relevant_ids(grades) if i in pool}
    hidden = acl_filtered(principal, wanted, lambda i: known.chunks_of(i, key), known.scopes)
    unscorable = None
    if not case.expect_no_answer and not metrics.has_relevant_alternative(alternatives):
        unscorable = "every expectation it names is a chunk id not in the index: " + ", ".join(stale)
    return CaseResult(
        case,
        case.top_k or default_k,
        key,
        relevance,
        missing_from_index=missing,
        judged_ids=judged,
        evidence_groups=placed.groups,
        expanded_sources=expanded,
        alternatives=alternatives if len(alternatives) > 1 else [],
        stale_chunk_ids=stale,
        unscorable=unscorable,
        as_of=as_of,
        placed=placed,
        coverage=coverage,
        principal=principal,
        acl_filtered=hidden,
    )


def check_golden_against_index(golden: GoldenSet, known: KnownIds, coverage: float = 1.0) -> None:
    """The golden-set errors only the index can tell: a knowledge tag no chunk carries
    (`check_knowledge_tags`), a quote found nowhere in its document, ambiguously, or where no ranking could
    return it under the coverage rule (`resolve_quotes`, which also resolves every quote into
    `known.evidence`)."""
    check_knowledge_tags(golden, known)
    resolve_quotes(golden, known.evidence, known.texts, coverage)


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
    warnings = []
    for c in cases:
        missing = [i for i in c.missing_from_index if i not in c.stale_chunk_ids]
        if missing:
            warnings.append(
                f"case {c.case.id}: expected {c.key} id(s) not in the index: {', '.join(missing)} "
                f"(stale golden set after re-chunking or re-ingest?)"
            )
        if c.unscorable is not None:
            warnings.append(
                f"case {c.case.id}: not scored: {c.unscorable} (`sieve golden check` says where they went)"
            )
        elif c.stale_chunk_ids:
            warnings.append(
                f"case {c.case.id}: chunk id(s) not in the index, left out of every figure: "
                f"{', '.join(c.stale_chunk_ids)} (stale after re-chunking or re-ingest? `sieve golden check` "
                "says where they went)"
            )
    return warnings


def final_ranking(outcome: RetrievalResult) -> list[Candidate]:
    """The chain's final list before its cut to topK (the list after the last stage), as candidates: the
    returned documents themselves for the top K (they carry what the diversity stage attached to them),
    the raw candidates below."""
    trace = outcome.trace
    last = trace.stages[-1].name if trace.stages else "candidates"
    by_id = {c.chunk_id: c for c in outcome.raw_candidates}
    by_id.update((c.chunk_id, c) for c in outcome.documents)
    ids = trace.ranked_after.get(last)
    if ids is None:
        return list(outcome.documents)
    return [by_id[cid] for cid in ids if cid in by_id]


def rank_key(candidate: Candidate, key: str) -> Rank:
    """What one rank is matched on (`match_key`), and at chunk level the chunks the diversity stage attached
    to it too (a tuple: its own id first), as EvidenceHit reads a rank. A document or source rank is its
    key alone: an attached chunk belongs to the same document."""
    if key == "chunk" and candidate.attached:
        return tuple(candidate.chunk_ids_with_attached())
    return match_key(candidate, key)


def _returned_ids(ranked: Sequence[Rank]) -> list[str]:
    """Every id the ranks return, in order (`rank_ids` of each)."""
    out: list[str] = []
    for item in ranked:  # a hot path (every list of every trace): `rank_ids` inlined
        if isinstance(item, str):
            out.append(item)
        else:
            out.extend(item)
    return out


def _score(
    item: CaseResult,
    outcome: RetrievalResult | Exception,
    k_values: Sequence[int] = (),
    gain: Gain = "linear",
) -> None:
    if isinstance(outcome, Exception):
        item.error = f"{type(outcome).__name__}: {outcome}"
        return
    item.result = outcome
    item.scores = score_ranking(item, outcome, k_values, gain)
    item.analysis = analyse_trace(item, outcome, item.scores, gain)


def score_ranking(
    item: CaseResult, outcome: RetrievalResult, k_values: Sequence[int], gain: Gain = "linear"
) -> CaseScores:
    """What the final ranking of `outcome` scores for the case `item` resolves: the counts, the measure
    tables at K (and at each of `k_values`, and of the condensed list), the judged share and the forbidden
    documents and evidence in the top K."""
    key, k, maps = item.key, item.k, item.relevance_maps
    ranked = [rank_key(c, key) for c in outcome.documents][:k]
    texts = [c.text for c in outcome.documents][:k]
    forbidden = set(item.case.forbidden_doc_ids)
    table, at_k, condensed = None, {}, None
    if metrics.has_relevant_alternative(maps):
        table = measures.table(Ranking(ranked, maps, k, texts, gain), measures.HEADLINE)
        full = final_ranking(outcome)
        full_keys = [rank_key(c, key) for c in full]
        full_texts = [c.text for c in full]
        at_k = {
            kk: measures.table(Ranking(full_keys, maps, kk, full_texts, gain), measures.HEADLINE)
            for kk in k_values
        }
        kept = metrics.condensed(full_keys, item.judged_ids)
        condensed = measures.table(Ranking(kept, maps, k, gain=gain), measures.RANKING)
    return CaseScores(
        ranked=ranked,
        counts=metrics.hit_counts(ranked, maps, k),
        metrics=table,
        at_k=at_k,
        forbidden_found=sorted({c.doc_id for c in outcome.documents[:k] if c.doc_id in forbidden}),
        judged=metrics.judged_at_k(ranked, item.judged_ids, k),
        unjudged=metrics.unjudged_at_k(ranked, item.judged_ids, k),
        condensed=condensed,
        evidence=_evidence(item, outcome) if item.evidence_groups else None,
    )


def _evidence(item: CaseResult, outcome: RetrievalResult) -> dict[str, float]:
    """evidenceRecall and evidenceHit of the chunks the top K returns (attached ones included), the quotes
    they cover, and the character figures (`evidence.evidence_table`)."""
    return evidence_table(item.placed, outcome.documents[: item.k], item.coverage)


def _keys_after(
    item: CaseResult, outcome: RetrievalResult, by_chunk: dict[str, str]
) -> dict[str, list[Rank]]:
    """Every list of the trace as ranks matched (`rank_key`). At chunk level the lists from the diversity
    stage on carry the attachments of the returned documents (the top K's: the chain returns no others)."""
    trace = outcome.trace
    if item.key != "chunk":
        # a stage that changed nothing leaves the list before it: its ranks are the same list (read only)
        out: dict[str, list[Rank]] = {}
        ids_before: list[str] | None = None
        keys: list[Rank] = []
        for name, ids in trace.ranked_after.items():
            if ids != ids_before:
                ids_before, keys = ids, [by_chunk.get(cid, cid) for cid in ids]
            out[name] = keys
        return out
    attached = {c.chunk_id: rank_key(c, "chunk") for c in outcome.documents if c.attached}
    names = [stage.name for stage in trace.stages]
    since = names[names.index(DiversityStage.name) :] if DiversityStage.name in names else []
    return {
        name: [attached.get(cid, cid) for cid in ids] if name in since else list(ids)
        for name, ids in trace.ranked_after.items()
    }


def analyse_trace(
    item: CaseResult, outcome: RetrievalResult, scores: CaseScores, gain: Gain = "linear"
) -> TraceAnalysis:
    """What the trace of `outcome` tells for the case `item` resolves: each stage's statistics, the measures
    of the list after each stage, and where each missed relevant id (and evidence chunk) was lost
    (`scores`: what its final ranking scored, `score_ranking`)."""
    by_chunk = {c.chunk_id: match_key(c, item.key) for c in outcome.raw_candidates}
    # every list of the trace as ranks matched, and as a set of the ids it returns, once (the stage rows, the
    # measures after each stage and the losses all read them)
    keys_after = _keys_after(item, outcome, by_chunk)
    # a rank is one id unless the case matches chunks and a returned document carries attached ones
    one_id_each = item.key != "chunk" or not any(c.attached for c in outcome.documents)
    present_after = _present_after(keys_after, one_id_each)
    stats = _stage_stats(outcome.trace, by_chunk, metrics.relevant_ids(item.relevance), present_after)
    after = (
        _after_stage(item, keys_after, gain) if metrics.has_relevant_alternative(item.relevance_maps) else {}
    )
    by_id = {c.chunk_id: c for c in outcome.raw_candidates} | {c.chunk_id: c for c in outcome.documents}
    for name, chars in chars_after_stages(item.placed, outcome.trace.ranked_after, by_id, item.k).items():
        after[name] = {**after.get(name, {}), **chars}
    lost, evidence_lost = _locate_losses(item, outcome, scores, by_chunk, present_after)
    return TraceAnalysis(stage_stats=stats, after_stage=after, lost=lost, evidence_lost=evidence_lost)


def _present_after(keys_after: dict[str, list[Rank]], one_id_each: bool = False) -> dict[str, set[str]]:
    """The set of ids each list of `keys_after` returns; one set for lists that are one object (read only).
    `one_id_each`: every rank is one id (no tuple), so a list's set is the set of its ranks."""
    out: dict[str, set[str]] = {}
    keys_before: list[Rank] | None = None
    present: set[str] = set()
    for name, keys in keys_after.items():
        if keys is not keys_before:
            keys_before = keys
            present = set(keys) if one_id_each else set(_returned_ids(keys))  # type: ignore[arg-type]
        out[name] = present
    return out


def _stage_stats(
    trace: RetrievalTrace, by_chunk: dict[str, str], relevant: set[str], present_after: dict[str, set[str]]
) -> list[StageStat]:
    """Each stage's row for one case: its counts, and which of its removals were relevant."""
    no_list: set[str] = set()
    before = present_after.get("candidates", no_list)
    rows = []
    for stage in trace.stages:
        after = present_after.get(stage.name, no_list)
        # a relevant id the stage made disappear; dropping a second chunk of a document that stays is no loss
        # (the relevant ids are few, the lists long: each relevant id is looked up, no set difference made)
        gone = 0 if after is before else sum(1 for i in relevant if i in before and i not in after)
        before = after
        flags = [by_chunk.get(r.chunk_id) in relevant for r in stage.removed]
        # the removed items as field dicts: StageStat's validation makes them RemovedItems in one call, a
        # third faster than one model each (about 40 removals a case with one chunk per document)
        items = [
            {"chunk_id": r.chunk_id, "doc_id": r.doc_id, "reason": r.reason, "relevant": flag}
            for r, flag in zip(stage.removed, flags, strict=True)
        ]
        rows.append(
            StageStat(
                name=stage.name,
                enabled=stage.enabled,
                skipped=stage.skipped,
                input=stage.input_count,
                output=stage.output_count,
                removed=len(stage.removed),
                removed_relevant=gone,
                removed_relevant_chunks=sum(flags),
                added=len(stage.added),
                latency_ms=stage.latency_ms,
                removed_items=items,
            )
        )
    return rows


def _after_stage(
    item: CaseResult, keys_after: dict[str, list[Rank]], gain: Gain
) -> dict[str, dict[str, float]]:
    """The `AFTER_STAGE` measures of the list after each stage, at the case's K."""
    # the measures read a list's first K keys only, and consecutive stages often leave those alone
    by_head: dict[tuple[Rank, ...], dict[str, float]] = {}
    out = {}
    for name, keys in keys_after.items():
        head = tuple(keys[: item.k])
        if head not in by_head:
            ranking = Ranking(head, item.relevance_maps, item.k, gain=gain, judged=item.judged_ids)
            by_head[head] = measures.table(ranking, measures.AFTER_STAGE)
        out[name] = dict(by_head[head])
    return out


def _locate_losses(
    item: CaseResult,
    outcome: RetrievalResult,
    scores: CaseScores,
    by_chunk: dict[str, str],
    present_after: dict[str, set[str]],
) -> tuple[list[Loss], list[Loss]]:
    """Where each relevant id not in the top K was lost, and each evidence chunk when no group was found
    whole, with their ranks in the candidate lists."""
    trace, k, maps, ranked = outcome.trace, item.k, item.relevance_maps, scores.ranked
    # the ids lost are those of the alternative the counts tell (its relevant ids not in the top K)
    counted = metrics.relevant_ids(maps[metrics.counted_alternative(ranked, maps, k)])
    lost = _where_lost(item, outcome, by_chunk, counted, _returned_ids(ranked), present_after)
    evidence_lost: list[Loss] = []
    if scores.evidence is not None and scores.evidence["evidenceHit"] < 1.0:
        # where each evidence chunk that is not in the top K went, at chunk level
        chunk_after = {name: set(ids) for name, ids in trace.ranked_after.items()}
        identity = {c.chunk_id: c.chunk_id for c in outcome.raw_candidates}
        holders = item.placed.holders
        wanted = {h for group in item.evidence_groups for c in group for h in holders.get(c, [c])}
        top_chunks = [i for c in outcome.documents[:k] for i in c.chunk_ids_with_attached()]
        evidence_lost = _where_lost(item, outcome, identity, wanted, top_chunks, chunk_after)
    if not lost and not evidence_lost:  # nothing to give ranks to (most cases)
        return lost, evidence_lost
    positions = candidate_positions(trace)
    key_positions = positions if item.key == "chunk" else best_positions(positions, by_chunk)
    return _with_ranks(lost, key_positions), _with_ranks(evidence_lost, positions)


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
    gain: Gain = "linear",
) -> None:
    """Score one case's outcome into `item` exactly as `evaluate` does (the replay scores its points so).

    `trace=False` scores the final ranking only (`scores`, and the result, which tells an abstention), with
    the same functions: every figure of the summary that reads nothing else comes out the same, while
    `analysis` (stage statistics, after-stage figures, losses) stays None. That is what a grid point of
    `sieve tune` shows, at a fraction of the cost. `gain` is nDCG's."""
    if trace or isinstance(outcome, Exception):
        _score(item, outcome, k_values, gain)
    else:
        item.result = outcome
        item.scores = score_ranking(item, outcome, k_values, gain)


def _where_lost(
    item: CaseResult,
    outcome: RetrievalResult,
    by_chunk: dict[str, str],
    relevant: set[str],
    top_k: list[str],
    present_after: dict[str, set[str]],
) -> list[Loss]:
    """For each relevant id not in the top K: NOT_IN_INDEX, ACL_FILTERED (the case's principal may read
    none of its chunks), NOT_RETRIEVED, REMOVED_BY_<stage> (with the reason of the removal that made it
    vanish for good), or RANKED_OUT (it survived every stage, below K).
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
        elif wanted in item.acl_filtered:
            name = item.principal.name if item.principal is not None else ""
            reason = f"principal {name} may read none of its chunks (their tenant and access)"
            lost.append(Loss(id=wanted, where=ACL_FILTERED, stage="", reason=reason))
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
    if item.unscorable is not None:
        log.info(
            "[RetrievalEval] case done [%d/%d] caseId=%s, traceId=%s, not scored: %s",
            done,
            total,
            item.case.id,
            trace_id,
            item.unscorable,
        )
        return
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
