"""Replay: the chain's stages re-run over recorded candidates, for another configuration, with no model or
store call.

The expensive part of an evaluation is the candidate generation (query embedding, the store's dense search,
BM25 top-N). Every stage after it is a deterministic function of the candidates, their scores, metadata and
vectors. So one real evaluation is recorded (`record`): each case's raw candidate set as the chain saw it
(`RetrievalResult.raw_candidates`, which keep their stored vectors for the cosine checks), the BM25 score of
every candidate, and, when a reranker is loaded, its score for every candidate's text. `replay` then builds
the stages of any `ChainSettings` around recorded scorers and runs them through `RetrievalChain.run_stages`,
the very code `retrieve_many` runs after its candidate generation, and scores each case with
`runner.score_case` and the summary with `build.summary_record`, the evaluation's own functions. A point's
figures are therefore those `sieve eval` reports with that setting (the tests check it to 1e-9).

What a grid reuses between its points, none of which changes a figure: a stage's outcome when the same
case reaches it with the same settings and the same input (`_MemoStage`: chunk ids in order plus where their
scores come from), the hard filter's answer for a chunk, and the candidates' unit vectors and nearest
cosines (`Candidate.unit`, `Candidate.nearest`, computed once when the candidates were generated).

What cannot be replayed: anything that changes the candidates (`retrieval.candidate_k`, `bm25_candidate_k`,
`hybrid`, `tag_post_filter_max`, chunking, the embedder, BM25 `k1`/`b`, the store) and latency (a replayed
point has no real latency: `max_p95_ms` is not checked for it). With a real cross-encoder, the recorded
rerank scores come from one call per case over all candidates; the model's batching pads windows differently
from the head-only call of a live run, which can move a score in its last float digits (ranks change only on
such near-ties).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from statistics import fmean
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel

from app.evaluation.compare.gate import check_gate
from app.evaluation.golden.cases import GoldenCase, GoldenSet
from app.evaluation.report.model import PointFigures, Report, RunInfo, Summary
from app.evaluation.run.build import summary_record
from app.evaluation.run.evidence import CaseEvidence
from app.evaluation.run.runner import CaseResult, Evaluation, case_request, score_case
from app.evaluation.scoring import measures
from app.evaluation.scoring.metrics import Gain
from app.retrieval.candidates import CandidateSet
from app.retrieval.chain import ChainStage, RetrievalChain, RetrievalRequest, RetrievalResult
from app.retrieval.stages import build_stages
from app.retrieval.stages._common import ReplayFacts, Rule
from app.retrieval.stages.bm25 import Bm25Stage
from app.retrieval.stages.rerank import PassageScorer, RerankStage
from app.retrieval.types import SCORE_DENSE, Candidate, QueryContext, Stage, StageOutcome
from app.settings import ChainSettings, EvaluateThresholds

# The figures of a point beside the registry's point measures: counts of its own.
POINT_COUNTS = ("forbiddenHits", "meanResults")


def point_figure_names() -> tuple[str, ...]:
    """The figures of one point, in the order the tables show them: the registry's point measures
    (`measures.POINT`, read at call time, so a measure registered since is one of them), then
    `POINT_COUNTS`."""
    return (*measures.POINT, *POINT_COUNTS)


class ReplayError(RuntimeError):
    """The replay was asked for something it did not record (a bug, never a silent model or store call)."""


@dataclass
class RecordedCase:
    case: GoldenCase
    k: int
    key: str
    relevance: dict[str, float]
    missing_from_index: list[str]
    request: RetrievalRequest
    judged_ids: set[str]
    evidence_groups: list[list[str]]
    candidates: CandidateSet | None  # None: the case failed before its stages ran
    error: str | None = None
    alternatives: list[dict[str, float]] = field(default_factory=list)
    stale_chunk_ids: list[str] = field(default_factory=list)
    unscorable: str | None = None
    as_of: date | None = None  # the date the case is judged as of (its own asOf, else the run's)
    placed: CaseEvidence = field(default_factory=CaseEvidence)  # its evidence as keys, with their spans
    coverage: float = 1.0  # the quotes' coverage rule
    # its expected ids its principal (`request.principal`) may read no chunk of: lost as ACL_FILTERED
    acl_filtered: list[str] = field(default_factory=list)


class RecordedLexical:
    """The BM25 scorer of the replayed `bm25` stage: the scores recorded for every candidate."""

    def __init__(self) -> None:
        self.table: dict[str, dict[str, float]] = {}

    def scores(self, query: str, ids: Sequence[str]) -> dict[str, float]:
        known = self.table.get(query, {})
        try:
            return {i: known[i] for i in ids}
        except KeyError as exc:
            raise ReplayError(
                f"replay: no recorded BM25 score for {exc.args[0]!r} (query {query[:60]!r})"
            ) from None


class RecordedReranker:
    """The scorer of the replayed `rerank` stage: the reranker's recorded score of every candidate's text
    (None for a query the reranker returned no scores for, as the live stage sees it)."""

    def __init__(self, name: str | None) -> None:
        self.name = name
        self.table: dict[str, dict[str, float] | None] = {}

    def score(self, query: str, passages: list[str]) -> list[float] | None:
        if query not in self.table:
            raise ReplayError(f"replay: no recorded rerank scores for query {query[:60]!r}")
        known = self.table[query]
        if known is None:
            return None
        missing = [p for p in passages if p not in known]
        if missing:
            raise ReplayError(f"replay: no recorded rerank score for a passage of query {query[:60]!r}")
        return [known[p] for p in passages]


@dataclass
class Recording:
    """What every replay needs, in memory: per case its candidates, and the recorded scorers."""

    golden: GoldenSet
    default_k: int
    as_of: date
    cases: list[RecordedCase]
    lexical: RecordedLexical
    reranker: RecordedReranker | None
    record_ms: float  # the time spent scoring every candidate with BM25 (and the reranker)
    evaluation_ms: float  # the evaluation the candidates came from
    dense_scores: list[float] = field(default_factory=list)
    # stage outcomes already computed, by stage settings and input (see _MemoStage)
    memo: dict[MemoKey, _Memo] = field(default_factory=dict)
    # the answers of the stages' per-candidate rules (see _cached_rule)
    rule_answers: dict[MemoKey, str | None] = field(default_factory=dict)
    gain: Gain = "linear"  # nDCG's, as the recorded evaluation's

    @property
    def candidates_ms(self) -> float:
        """What it cost to get the candidates into memory: the evaluation plus the extra scoring."""
        return self.evaluation_ms + self.record_ms


def _recorded_case(item: CaseResult, request: RetrievalRequest, cset: CandidateSet | None) -> RecordedCase:
    """`item`'s golden-set facts and its candidates (None: it failed before its stages ran)."""
    return RecordedCase(
        case=item.case,
        k=item.k,
        key=item.key,
        relevance=dict(item.relevance),
        missing_from_index=list(item.missing_from_index),
        request=request,
        judged_ids=set(item.judged_ids),
        evidence_groups=[list(g) for g in item.evidence_groups],
        candidates=cset,
        error=item.error if cset is None else None,
        alternatives=[dict(a) for a in item.alternatives],
        stale_chunk_ids=list(item.stale_chunk_ids),
        unscorable=item.unscorable,
        as_of=item.as_of,
        placed=item.placed,
        coverage=item.coverage,
        acl_filtered=list(item.acl_filtered),
    )


def _record_rerank(
    reranker: RecordedReranker, scorer: PassageScorer, query: str, raw: list[Candidate]
) -> None:
    """The reranker's score of every distinct candidate text of `query`, added to what is recorded (None
    once the reranker returned no scores for the query)."""
    texts = list(dict.fromkeys(c.text for c in raw))
    values = scorer.score(query, texts) if texts else []
    previous = reranker.table.get(query, {})
    if values is None or previous is None:
        reranker.table[query] = None
    else:
        scores = dict(zip(texts, (float(v) for v in values), strict=True))
        reranker.table[query] = {**previous, **scores}


def record(evaluation: Evaluation, chain: RetrievalChain) -> Recording:
    """Record the candidates of `evaluation` (a run of `chain`) and score each of them with the chain's BM25
    index and reranker, once, so any configuration of the stages can be replayed from memory."""
    t0 = time.perf_counter()
    lexical_index = next((s.stage.index for s in chain.stages if isinstance(s.stage, Bm25Stage)), None)
    scorer = next((s.stage.scorer for s in chain.stages if isinstance(s.stage, RerankStage)), None)
    lexical = RecordedLexical()
    reranker = RecordedReranker(getattr(scorer, "name", None)) if scorer is not None else None
    cases: list[RecordedCase] = []
    dense: list[float] = []
    for item in evaluation.cases:
        request = case_request(item)  # its principal too: the recorded candidates are of its scope
        result = item.result
        cset = None
        if result is not None:
            raw = list(result.raw_candidates)
            cset = CandidateSet(raw, dict(result.trace.candidate_origins), dict(result.trace.search_hits))
            dense += [c.scores[SCORE_DENSE] for c in raw if SCORE_DENSE in c.scores]
            ids = [c.chunk_id for c in raw]
            known = lexical.table.setdefault(request.query, {})
            if lexical_index is not None and ids:
                known.update(lexical_index.scores(request.query, ids))
            else:
                known.update(dict.fromkeys(ids, 0.0))
            if reranker is not None and scorer is not None:
                _record_rerank(reranker, scorer, request.query, raw)
        cases.append(_recorded_case(item, request, cset))
    return Recording(
        golden=evaluation.golden,
        default_k=evaluation.default_k,
        as_of=evaluation.as_of or date.today(),
        cases=cases,
        lexical=lexical,
        reranker=reranker,
        record_ms=(time.perf_counter() - t0) * 1000,
        evaluation_ms=evaluation.duration_ms,
        dense_scores=dense,
        gain=evaluation.gain,
    )


class _NoEmbedder:
    def embed_queries(self, texts: list[str]) -> Any:
        raise ReplayError("replay: the embedder must not be called")


class _NoCandidates:
    def generate_many(self, *args: Any, **kwargs: Any) -> Any:
        raise ReplayError("replay: the store must not be called")


MEMO_LIMIT = 200_000  # stage outcomes (and rule answers) kept per recording; past it, stages just run

_SOURCE_NUMBERS = itertools.count()  # each score-writing outcome's source number, never reused

# Where a list's scores come from: ("raw", query, tag) for the raw candidates, else a score-writing
# outcome's number (see `_Lineage`).
Source = tuple[str, str, str | None] | int
MemoKey = tuple[object, ...]


@dataclass(frozen=True)
class _Memo:
    """A stage outcome kept for reuse: the ids it kept and added, the outcome, the source of its scores."""

    kept_ids: list[str]
    added_ids: list[str]
    outcome: StageOutcome
    source: Source | None


@dataclass
class _Lineage:
    """Where the list the next stage receives comes from, for the case the chain is running.

    `source` names the scores its candidates carry: ("raw", query, tag) for the raw candidates the chain
    hands its first stage, else the number of the score-writing stage outcome they came from. Within one
    source a chunk id always carries the same scores, so (chunk ids in order, source) is the whole content
    of a list.
    """

    ctx: QueryContext | None = None
    last: list[Candidate] | None = None
    source: Source | None = None
    # rows only: how many documents the case's final list must hold (its top K), else None (see _MemoStage)
    need: int | None = None


@runtime_checkable
class Declaring(Protocol):
    """A stage that declares what its replay needs (every stage of `build_stages` does)."""

    def replay_facts(self) -> ReplayFacts: ...


def replay_facts(stage: Stage) -> ReplayFacts:
    """What `stage` declares for the replay (`ReplayFacts`); a stage that declares nothing is taken to write
    scores, so its outcome is reused only for the very list it was given."""
    return stage.replay_facts() if isinstance(stage, Declaring) else ReplayFacts(writes_scores=True)


class _MemoStage:
    """A stage whose outcome is reused when the same case reaches it again with the same settings and the
    same input, as a grid often does (two thresholds that remove the same candidates leave every later stage
    the same list). The stages are deterministic functions of their settings, the query and their input, so a
    reused outcome is the outcome.

    The key of the input is its chunk ids in order plus its lineage's score source (see `_Lineage`), plus
    the chunk ids of the removals the stage reads (`ReplayFacts.reads_removals`), which is exact and costs a
    tuple of ids, where hashing every score of every candidate cost more than many a stage. A reused outcome
    of a stage that only drops or reorders is rebuilt from this input's own objects (and the raw candidates,
    for refills); a score-writing stage's is its stored objects, which stages never modify.

    `prefix_floor` (rows only, for a stage that declares `prefix_stable`, when every stage after it declares
    `passes_from`): such a stage run over the first n candidates keeps exactly the first candidates the whole
    walk keeps. When a case needs only its top K (`_Lineage.need`), a walk over a prefix that keeps at least
    max(K, `prefix_floor`) candidates (`prefix_floor` = the largest `passes_from` after it) gives the same
    final top K: no later stage changes a list that long. The prefix starts at twice that and doubles until
    it keeps enough or is the whole input. Its outcome is the stage's outcome for that prefix, so the memo
    stays exact for every replay; only the trace of such a point is short (it is not scored)."""

    def __init__(
        self,
        stage: Stage,
        memo: dict[MemoKey, _Memo],
        settings_key: str,
        lineage: _Lineage,
        prefix_floor: int | None = None,
    ) -> None:
        facts = replay_facts(stage)
        self.stage = stage
        self.name = stage.name
        self.memo = memo
        self.settings_key = settings_key
        self.lineage = lineage
        self.prefix_floor = prefix_floor
        self.writes_scores = facts.writes_scores
        self.passes_through = facts.passes_through
        self.reads_removals = facts.reads_removals

    def run(self, query: QueryContext, candidates: list[Candidate]) -> StageOutcome:
        lineage = self.lineage
        if lineage.ctx is not query:  # a new case: the chain hands its first stage the raw candidates
            lineage.ctx, lineage.source = query, ("raw", query.text, query.knowledge_tag)
        elif candidates is not lineage.last:
            raise ReplayError(f"replay: stage {self.name} was not given the previous stage's list")
        if self.passes_through:
            outcome = self.stage.run(query, candidates)
            lineage.last = outcome.kept  # the same candidates, so the same source of scores
            return outcome
        if self.prefix_floor is not None and lineage.need is not None:
            outcome = self._run_prefix(query, candidates, max(lineage.need, self.prefix_floor))
        else:
            outcome = self._run(query, candidates)
        lineage.last = outcome.kept
        return outcome

    def _run_prefix(self, query: QueryContext, candidates: list[Candidate], enough: int) -> StageOutcome:
        """The stage over the shortest doubling prefix of `candidates` that keeps `enough` (see above)."""
        size = 2 * max(enough, 1)
        while True:
            outcome = self._run(query, candidates[:size])
            if len(outcome.kept) >= enough or size >= len(candidates):
                return outcome
            size *= 2

    def _run(self, query: QueryContext, candidates: list[Candidate]) -> StageOutcome:
        lineage = self.lineage
        barred = tuple(
            r.chunk_id for stage in self.reads_removals for r in query.removed_by_stage.get(stage, [])
        )
        key = (
            self.name,
            self.settings_key,
            query.text,
            query.knowledge_tag,
            query.today,
            tuple(c.chunk_id for c in candidates),
            lineage.source,
            barred,
        )
        hit = self.memo.get(key)
        if hit is None:
            outcome = self.stage.run(query, candidates)
            source = next(_SOURCE_NUMBERS) if self.writes_scores else lineage.source
            if len(self.memo) < MEMO_LIMIT:
                kept_ids = [c.chunk_id for c in outcome.kept]
                added_ids = [c.chunk_id for c in outcome.added]
                self.memo[key] = _Memo(kept_ids, added_ids, outcome, source)
        else:
            outcome, source = self._reused(hit, query, candidates), hit.source
        lineage.source = source
        return outcome

    def _reused(self, hit: _Memo, query: QueryContext, candidates: list[Candidate]) -> StageOutcome:
        """A kept outcome for this input: its own objects for a score-writing stage, else rebuilt from the
        input's objects (and the raw candidates, for the ones it added)."""
        old = hit.outcome
        if self.writes_scores:
            return StageOutcome(
                list(old.kept), list(old.removed), list(old.added), old.skipped, old.score_key
            )
        given = {c.chunk_id: c for c in candidates}
        raw = {c.chunk_id: c for c in query.raw_candidates} if hit.added_ids else {}
        return StageOutcome(
            kept=[given[i] if i in given else raw[i] for i in hit.kept_ids],
            removed=list(old.removed),
            added=[raw[i] for i in hit.added_ids],
            skipped=old.skipped,
            score_key=old.score_key,
        )


def _cached_rule(rule: Rule, settings_key: str, answers: dict[MemoKey, str | None]) -> Rule:
    """A stage's per-candidate rule (`ReplayFacts.rule`), each answer kept: within one recording a chunk id
    stands for one chunk (its metadata and text), so the answer depends only on the settings, the query's
    tag and date and the chunk id. The stage's own loop still asks for every candidate it is given."""

    def reason(query: QueryContext, candidate: Candidate) -> str | None:
        key = ("rule", settings_key, query.knowledge_tag, query.today, candidate.chunk_id)
        if key in answers:
            return answers[key]
        why = rule(query, candidate)
        if len(answers) < MEMO_LIMIT:
            answers[key] = why
        return why

    return reason


def _settings_json(chain_settings: ChainSettings, name: str) -> str:
    settings: BaseModel = getattr(chain_settings, name)
    return settings.model_dump_json()


def _prefix_floor(facts: list[ReplayFacts], i: int) -> int | None:
    """`_MemoStage.prefix_floor` for the i-th stage: None unless it is prefix-stable and every stage after it
    leaves a long enough list as it is."""
    if not facts[i].prefix_stable:
        return None
    after = [f.passes_from for f in facts[i + 1 :]]
    if any(n is None for n in after):
        return None
    return max((n for n in after if n is not None), default=0)


def _memoised(
    stages: list[ChainStage], chain_settings: ChainSettings, recording: Recording, lineage: _Lineage
) -> list[ChainStage]:
    """`stages` wrapped for reuse (`_MemoStage`), their per-candidate rules cached."""
    out = []
    facts = [replay_facts(item.stage) for item in stages]
    for i, (item, own) in enumerate(zip(stages, facts, strict=True)):
        stage = item.stage
        if own.rule is not None and own.with_rule is not None:
            rule_key = _settings_json(chain_settings, own.rule_key)
            stage = own.with_rule(_cached_rule(own.rule, rule_key, recording.rule_answers))
        key = "".join(_settings_json(chain_settings, name) for name in (item.name, *own.reads))
        memo_stage = _MemoStage(stage, recording.memo, key, lineage, _prefix_floor(facts, i))
        out.append(ChainStage(memo_stage, item.enabled))
    return out


def replay(recording: Recording, chain_settings: ChainSettings, trace: bool = True) -> Evaluation:
    """The evaluation `chain_settings` would give on the recorded candidates: stages only.

    `trace=False` scores each case's final ranking only (`runner.score_case`'s rows path): the figures of
    `point_metrics` and `passes_gate` are the same, the per-stage statistics and losses are left out. A
    grid (`tune.run_grid`) replays so; its results' traces may be short (see `_MemoStage`)."""
    t0 = time.perf_counter()
    lineage = _Lineage()
    built = build_stages(chain_settings, recording.lexical, recording.reranker)
    stages = _memoised(built, chain_settings, recording, lineage)
    chain = RetrievalChain(_NoEmbedder(), _NoCandidates(), stages)  # type: ignore[arg-type]
    cases: list[CaseResult] = []
    for rc in recording.cases:
        item = CaseResult(
            rc.case,
            rc.k,
            rc.key,
            dict(rc.relevance),
            missing_from_index=list(rc.missing_from_index),
            judged_ids=set(rc.judged_ids),
            evidence_groups=[list(g) for g in rc.evidence_groups],
            alternatives=[dict(a) for a in rc.alternatives],
            stale_chunk_ids=list(rc.stale_chunk_ids),
            unscorable=rc.unscorable,
            as_of=rc.as_of or recording.as_of,
            placed=rc.placed,
            coverage=rc.coverage,
            principal=rc.request.principal,
            acl_filtered=list(rc.acl_filtered),
        )
        if rc.candidates is None:
            item.error = rc.error or "failed before its stages ran"
        else:
            lineage.need = None if trace else rc.k
            try:
                # the registry's stages never write into a candidate: no defensive copies of the raw ones
                outcome: RetrievalResult | Exception = chain.run_stages(
                    rc.request, rc.candidates, rc.as_of or recording.as_of, copy_raw=False
                )
            except ReplayError:
                raise
            except Exception as exc:  # as retrieve_many: one case's failure is that case's
                outcome = exc
            score_case(item, outcome, trace=trace, gain=recording.gain)
        cases.append(item)
    elapsed = (time.perf_counter() - t0) * 1000
    return Evaluation(
        golden=recording.golden,
        default_k=recording.default_k,
        cases=cases,
        stage_names=chain.stage_names,
        started_at=time.time(),
        duration_ms=elapsed,
        as_of=recording.as_of,
        gain=recording.gain,
    )


def point_metrics(evaluation: Evaluation, summary: Summary | None = None) -> PointFigures:
    """A point's figures, from `build.summary_record` (the evaluation's summary; pass it when it is made
    already): each point measure of the registry (`measures.POINT`) under its key, as the summary gives it
    (`Summary.figure`), plus the counts.

    meanResults = mean number of documents returned per case that ran (no-answer cases included);
    correctAbstentions / noAnswerCases: the counts behind correctAbstention.
    """
    s = summary if summary is not None else summary_record(evaluation)
    ran = [c.result for c in evaluation.cases if c.result is not None]
    no_answer = [c for c in evaluation.cases if c.case.expect_no_answer and c.error is None]
    return PointFigures.model_validate(
        {key: s.figure(key) for key in measures.POINT}
        | {
            "forbiddenHits": s.forbidden["hits"],
            "meanResults": fmean(len(result.documents) for result in ran) if ran else None,
            "correctAbstentions": sum(1 for c in no_answer if c.abstained),
            "noAnswerCases": len(no_answer),
        }
    )


def passes_gate(
    evaluation: Evaluation, thresholds: EvaluateThresholds, summary: Summary | None = None
) -> bool:
    """The configured gate's level and safety checks on a replayed point. Latency is not replayed, so
    `max_p95_ms` is left out; regressions need a baseline run and are not checked either."""
    summary = summary if summary is not None else summary_record(evaluation)
    point = Report(run=RunInfo(), summary=summary)
    return check_gate(point, thresholds.model_copy(update={"max_p95_ms": None}), "replay").passed


def pareto_front(points: list[PointFigures]) -> list[bool]:
    """For each point's figures: True when no other point is at least as good on both nDCG and correct
    abstention and strictly better on one (a missing figure counts as the worst)."""

    def pair(m: PointFigures) -> tuple[float, float]:
        return (
            m.ndcg if m.ndcg is not None else float("-inf"),
            m.correct_abstention if m.correct_abstention is not None else float("-inf"),
        )

    pairs = [pair(m) for m in points]
    out = []
    for a in pairs:
        dominated = any(b[0] >= a[0] and b[1] >= a[1] and (b[0] > a[0] or b[1] > a[1]) for b in pairs)
        out.append(not dominated)
    return out
