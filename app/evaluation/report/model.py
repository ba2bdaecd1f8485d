"""The report as one typed object: `Report` and the records it is made of, pydantic models whose JSON keys are
the camelCase of their fields (`p_adjusted` -> `pAdjusted`, `ci95` stays). The report JSON is
`Report.to_json()` (`model_dump(by_alias=True)`), and a report file is read back with
`Report.model_validate_json`, so the files, the comparison and the renderers share one shape.
`SCHEMA_VERSION` is the JSON's `schemaVersion`.

Every record is a `Model` (camelCase JSON keys). `Model` and `RemovedItem` live in `app.records`, below
both the evaluation and the serving answer that shares them, and are importable from here as before. Apart
from that module it imports nothing from the rest of the app.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import field as dataclass_field
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.dataclasses import dataclass as pydantic_dataclass

from app.records import Model, RemovedItem

SCHEMA_VERSION = 3


class Ranks(Model):
    """Where an item stood in each candidate list of its case's retrieval: a 1-based position, None when the
    item was not in that list or the list was not made. Each list is in the order of the score of the same
    name, so a rank sits beside that score:

    * `dense`: among the dense search's hits (the nearest `candidate_k` chunks, cosine descending as the
      store answered) that became candidates; None for every item when the dense search did not run
      (`candidate_k: 0`).
    * `bm25`: among the BM25 search's hits (the lexical top `bm25_candidate_k`, BM25 score descending, ties
      by chunk id) that became candidates; None for every item without hybrid candidates.
    * `fused`: in the list after the bm25 stage (fused score descending), which holds the candidates that
      passed the stages before it; None when the stage is off or the item was removed before or by it.
    * `rerank`: in the list after the rerank stage (its first `top_n` by cross-encoder score, then the rest
      as they came, in fused order); None when the stage is off or skipped (no reranker model), or the item
      was removed before or by it.

    Positions count chunks: a document's other chunks take places in a list too. The item is a chunk (a
    ranked document's own chunk, an evidence chunk) or, for a lost document or source, the best placed of
    its chunks in each list (each list's own, so two ranks may be of different chunks). Read off the trace
    the chain recorded (`RetrievalTrace.search_hits`, `ranked_after`), nothing re-run."""

    dense: int | None = None
    bm25: int | None = None
    fused: int | None = None
    rerank: int | None = None


class Loss(Model):
    """Where one expected id that is not in the top K was lost (`where`: NOT_IN_INDEX, ACL_FILTERED (the
    case's principal may read none of its chunks), NOT_RETRIEVED, REMOVED_BY_<stage> with `stage` and the
    removal's `reason`, or RANKED_OUT), and its `ranks` in the candidate lists (all None when it was never a
    candidate)."""

    id: str
    where: str
    stage: str
    reason: str
    ranks: Ranks = Field(default_factory=Ranks)


class AccessLeak(Model):
    """A chunk a principal may not read (`app.access.scope.may_read` over the chunk's stored metadata) that
    the chain returned for a case run as that principal: at `rank` of its answer, the ranked chunk itself or
    (`attached`) one the diversity stage attached to it; `probe` when found by the leak probe (the case run
    again as another evaluation principal)."""

    case: str
    principal: str
    chunk_id: str
    doc_id: str
    rank: int
    attached: bool = False
    probe: bool = False

    def describe(self) -> str:
        what = "attached chunk" if self.attached else "chunk"
        where = f"doc {self.doc_id}, rank {self.rank}"
        return f"case {self.case} as {self.principal}: {what} {self.chunk_id} ({where})"


class AclFiltered(Model):
    """A case whose expected ids its principal may read none of the chunks of (`where` ACL_FILTERED)."""

    case: str
    principal: str
    ids: list[str]


class LeakProbe(Model):
    """The leak probe: every case run again as every other evaluation principal (`runs` = cases x
    principals, minus its own), each returned or attached chunk checked against the probing principal;
    `leaks` found (none, normally), `errors` the probe runs whose retrieval failed."""

    principals: list[str] = Field(default_factory=list)
    runs: int = 0
    leaks: list[AccessLeak] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    duration_ms: float = 0.0


class AccessSection(Model):
    """The report's `access` (None when no case ran scoped and no evaluation principal is defined): whether
    access is enabled, the default principal, the evaluation principals' scopes (`Principal.describe()`), how
    many cases ran as each (`(unscoped)` for none), the leaks of the cases' own runs, the cases whose
    expected ids their principal may not read (ACL_FILTERED), and the leak probe (None: not run)."""

    enabled: bool = False
    default_principal: str | None = None
    principals: dict[str, dict[str, JsonValue]] = Field(default_factory=dict)
    cases_by_principal: dict[str, int] = Field(default_factory=dict)
    leaks: list[AccessLeak] = Field(default_factory=list)
    acl_filtered: list[AclFiltered] = Field(default_factory=list)
    probe: LeakProbe | None = None


class StageStat(Model):
    """What one stage did for one case (report JSON: a case's `filterStats` entry)."""

    name: str
    enabled: bool = True
    skipped: str | None = None
    input: int = 0
    output: int = 0
    removed: int = 0
    removed_relevant: int = 0  # expected ids the stage made disappear from the list
    removed_relevant_chunks: int = 0  # removed chunks of expected ids (a second chunk of a kept document too)
    added: int = 0
    latency_ms: float = 0.0
    removed_items: list[RemovedItem] = Field(default_factory=list)


class StageRow(Model):
    """One row of the report's per-stage table, over all cases (`afterStage`: mean Recall/MRR/nDCG of
    the list after the stage, cut at K)."""

    name: str
    enabled: bool = True
    skipped: str | None = None
    removed: int = 0
    removed_relevant: int = 0
    added: int = 0
    latency_ms: float | None = None
    after_stage: dict[str, float | None] = Field(default_factory=dict)


class MetricComparison(Model):
    """One measure over the paired cases: the means, the mean difference with its bootstrap CI, the raw
    sign-flip p-value, and, for a measure the gate tests, the p-value adjusted over the gate's family of
    measures (`adjustment` names the method) and whether that is below alpha. `exact`: both p-values were
    enumerated over every sign pattern; else Monte Carlo, `p_error` the standard error of the adjusted p
    and `near_alpha` whether it lies within 3 of them of alpha (another seed could decide otherwise)."""

    baseline: float
    current: float
    delta: float
    ci95: tuple[float, float] | None
    p_value: float
    p_adjusted: float | None = None
    adjustment: str | None = None
    exact: bool = True
    p_error: float | None = None
    near_alpha: bool = False
    significant: bool = False


class CaseDelta(Model):
    id: str
    delta: float


class RenamedCase(Model):
    """A case paired by content: `id` now, `baseline_id` in the baseline (the same `caseSha256`)."""

    id: str
    baseline_id: str


class ChangedCase(Model):
    """A case left out of the pairing because what it asks changed (its own topK), with the reason."""

    id: str
    reason: str


class CaseChanges(Model):
    fixed: list[str] = Field(default_factory=list)
    broken: list[str] = Field(default_factory=list)
    # broken cases whose baseline hit rested on a document the current golden set no longer judges relevant
    # (the labels changed, not the chain): named, never counted as regressions
    broken_by_relabelling: list[str] = Field(default_factory=list)
    improved: list[CaseDelta] = Field(default_factory=list)
    worsened: list[CaseDelta] = Field(default_factory=list)
    only_in_baseline: list[str] = Field(default_factory=list)
    only_in_current: list[str] = Field(default_factory=list)
    # broken or worsened cases whose drop may come from unjudged documents (compare.unverified_reason)
    unverified: list[str] = Field(default_factory=list)
    # broken or worsened cases judged too thinly (Judged@K < compare.JUDGED_FLOOR) for the condensed lists
    # to tell: regressions, with the new documents to judge
    thinly_judged: list[str] = Field(default_factory=list)
    # paired by content under a new id
    renamed: list[RenamedCase] = Field(default_factory=list)
    # paired by id, left out of the pairing (their own topK changed)
    changed: list[ChangedCase] = Field(default_factory=list)
    # no-answer cases that abstained in the baseline and answer now (broken), and the other way (fixed)
    abstention_broken: list[str] = Field(default_factory=list)
    abstention_fixed: list[str] = Field(default_factory=list)


class UnjudgedAccount(Model):
    """How much of what the change brought into the top K nobody has judged: over the paired scored
    cases, `new_in_top_k` = Σ |top K now − top K before| (distinct ids at the case's matching level) and
    `new_unjudged` = how many of those carry no judgment in the current golden set."""

    new_in_top_k: int
    new_unjudged: int
    headline: str


class BeforeAfter(Model):
    """One figure of the baseline and of this run (a count stays an int)."""

    baseline: int | float | None
    current: int | float | None


class StageDelta(Model):
    name: str
    removed_relevant: BeforeAfter
    recall_after: BeforeAfter


# rag.models, rag.ingest, rag.store, rag.retrieval and rag.chain as the fingerprint keeps them: section ->
# setting -> its value as JSON (a setting of rag.chain is itself a tree: `bm25` -> {"enabled": true, ...})
RunSettings = dict[str, dict[str, JsonValue]]


class ServiceDescription(BaseModel):
    """What a report header says of the service (`Sieve.describe()`, typed once by the adapter): models,
    store, the retrieval and chain settings as dumped, and `settings`, every setting that can move a result
    (`result_settings`, for the fingerprint)."""

    model_config = ConfigDict(frozen=True)

    embedder: dict[str, object]
    reranker: str | None
    store: str
    collection: str
    chunks: int
    retrieval: dict[str, object]
    chain: dict[str, dict[str, object]]
    settings: RunSettings


def _unset(value: object) -> bool:
    """A fingerprint field without a value: left out of the JSON, as a report that never recorded it."""
    return value is None


class CorpusFingerprint(Model):
    """The chunks the store held: how many, and the SHA-256 of their sorted ids joined by newlines; and,
    when some chunk carries an access scope, `scopesSha256`: the SHA-256 of the sorted lines "<chunk id>
    <tab> <its tenant and access as canonical JSON>" of the scoped chunks (who may read what; a chunk id
    does not change with it)."""

    chunks: int
    sha256: str
    scopes_sha256: str | None = Field(None, exclude_if=_unset)


class EmbedderIdentity(Model):
    """The embedder as the vector store records it (`Embedder.identity`)."""

    name: str | None = None
    dimension: int | None = None
    checksum: str | None = None


class RunModels(Model):
    """The models a run used, as the service described them: the embedder's identity and the reranker's
    name (None: no reranker, the rerank stage is skipped)."""

    embedder: EmbedderIdentity | str | None = None
    reranker: str | None = None


class RunFingerprint(Model):
    """What exactly was run (`run.fingerprint.run_fingerprint`): the golden set's, the corpus's, the chain's
    and the settings' hashes, the embedder, `settings` (every setting that can move a result), K, asOf,
    nDCG's gain, the code version and when it was evaluated. A report's `run` holds these keys beside its
    header; a field without a value (a report written before it was recorded) is left out of the JSON."""

    golden_set_sha256: str | None = Field(None, exclude_if=_unset)
    corpus_fingerprint: CorpusFingerprint | None = Field(None, exclude_if=_unset)
    embedder: EmbedderIdentity | str | None = Field(None, exclude_if=_unset)
    chain_sha256: str | None = Field(None, exclude_if=_unset)
    settings_sha256: str | None = Field(None, exclude_if=_unset)
    settings: RunSettings | None = Field(None, exclude_if=_unset)
    k: int | None = Field(None, exclude_if=_unset)
    code_version: str | None = Field(None, exclude_if=_unset)
    evaluated_at: str | None = Field(None, exclude_if=_unset)
    as_of: str | None = Field(None, exclude_if=_unset)
    gain: str | None = Field(None, exclude_if=_unset)


class BaselineRef(Model):
    """The baseline a comparison read: its file, when it was evaluated, its run's fingerprint (without the
    settings tree, which the baseline file keeps), and how it was chosen (`kind`: pinned, last passing,
    previous, a file; `note`: the sentence the log prints)."""

    path: str
    evaluated_at: str | None
    run: RunFingerprint
    kind: str | None = None
    note: str | None = None


class CaseDetail(Model):
    """A fixed, broken or worsened case in a comparison: the top 3 document ids before and now with their
    fused scores, the ids new in the top K and those of them nobody judged, and whether the drop is verified
    (`why` says why not)."""

    query: str | None
    before: list[str]
    now: list[str]
    before_fused: list[float | None] = Field(default_factory=list)
    now_fused: list[float | None] = Field(default_factory=list)
    new_in_top_k: list[str]
    new_unjudged: list[str]
    verified: bool
    why: str


class CaseFigures(Model):
    """A case on one side only (removed from the golden set since the baseline, or added): its figures in
    the run that has it, whether that run failed it (Recall@K < 1 or an error), whether it was hard there
    (failed, or nDCG@K < 1: not ranked ideally) and, for a removed case, the reason the golden set gives for
    retiring it (None: removed without one)."""

    id: str
    set: str = "core"
    risk: str | None = None
    status: str = "ok"
    metrics: dict[str, float] | None = None
    failed: bool = False
    hard: bool = False
    retired_reason: str | None = None
    # set for a case still in the golden set that the baseline scored and this run cannot: why, and the
    # way back
    left_scoring: str | None = None
    way_back: str | None = None


class CompositionRow(Model):
    """One measure over every scored case of each run (`baseline_all`, `current_all`: the summaries'
    figures) beside the same over the paired cases only (`baseline_common`, `current_common`);
    `composition` = (current_all − baseline_all) − (current_common − baseline_common): the part of the
    change that comes from cases added to or removed from the golden set."""

    baseline_all: float | None
    current_all: float | None
    baseline_common: float | None
    current_common: float | None
    composition: float | None


class SegmentComparison(Model):
    """A segment's paired difference on one measure (`kind`: tag, knowledgeTag, risk or set), with its
    sign-flip p-value and the Holm-adjusted one over the segments of 10 or more paired cases compared on
    that measure (`p_holm` None for a smaller segment: shown, never tested)."""

    kind: str
    name: str
    metric: str
    paired_cases: int
    baseline: float
    current: float
    delta: float
    p_value: float
    p_holm: float | None = None
    significant: bool = False


class Comparison(Model):
    """This run against its baseline. `comparable`: some case could be paired (else nothing was checked);
    `paired_cases` the paired cases scored on both sides, `paired_no_answer` the paired no-answer cases;
    `k` the runs' K they were compared at (the smaller of the two; a case with its own topK keeps it),
    `notes` how (a cut to the common K)."""

    baseline: BaselineRef
    comparable: bool
    differences: list[str]
    paired_cases: int
    metrics: dict[str, MetricComparison]
    cases: CaseChanges
    stages: list[StageDelta]
    case_details: dict[str, CaseDetail] = Field(default_factory=dict)
    unjudged: UnjudgedAccount | None = None
    # the same paired statistics on the condensed lists (unjudged documents removed)
    condensed_metrics: dict[str, MetricComparison] = Field(default_factory=dict)
    # mean Judged@K (this run) of the broken and worsened cases: how far their condensed figures can tell
    judged_of_regressions: float | None = None
    # the paired statistics per golden-set part ("core", "incremental") when the set has both
    by_set: dict[str, dict[str, MetricComparison]] = Field(default_factory=dict)
    removed_cases: list[CaseFigures] = Field(default_factory=list)
    added_cases: list[CaseFigures] = Field(default_factory=list)
    # per measure: every case vs the paired cases, and what the added and removed cases explain
    composition: dict[str, CompositionRow] = Field(default_factory=dict)
    # the cost beside the quality: p95Ms, duplicateRate, contextChars, candidates, modelCalls
    budget: dict[str, BeforeAfter] = Field(default_factory=dict)
    segments: list[SegmentComparison] = Field(default_factory=list)
    paired_no_answer: int = 0
    k: int | None = None
    notes: list[str] = Field(default_factory=list)
    # the baseline's cases that count for the floor of a check: scored, or no-answer
    baseline_scored: int = 0


class GateFailure(Model):
    """A gate check that did not hold: its name, the figure (None: it could not be computed), the limit and
    the check described."""

    check: str
    actual: float | None
    limit: float
    message: str


class SegmentDelta(Model):
    paired_cases: int
    metrics: dict[str, dict[str, float]]  # metric -> {"delta", "pValue"} (uncorrected, exploratory)
    exploratory: bool = True


class Segment(Model):
    kind: str  # "tag" | "knowledgeTag" | "language"
    name: str
    cases: int
    small: bool
    metrics: dict[str, float | None]
    delta: SegmentDelta | None = None


class Group(Model):
    name: str
    cases: list[str]
    hit_rate: float | None
    ndcg_min: float | None
    ndcg_max: float | None
    spread: float | None
    same_top1: bool


class RankedDocument(Model):
    """One document of a case's final top K (`matched`: the first hit of an expected id; `rank`: its place in
    the top K; `ranks`: its chunk's places in the candidate lists before)."""

    rank: int = 0
    doc_id: str
    chunk_id: str = ""
    source: str = ""
    title: str = ""
    scores: dict[str, float] = Field(default_factory=dict)
    ranks: Ranks = Field(default_factory=Ranks)
    origin: list[str] = Field(default_factory=list)
    matched: bool = False
    reason: str = ""  # "relevant (grade 1)", "duplicate of a higher-ranked hit", "FORBIDDEN", "not relevant"
    snippet: str = ""  # the first SNIPPET_CHARS characters of the chunk's text
    attached: list[str] = Field(
        default_factory=list
    )  # chunk ids the diversity stage attached to it (its document's further chunks)


class CaseBudget(Model):
    context_chars: int
    candidates: int
    model_calls: int


class CaseSpec(Model):
    """What the golden case says of itself: its id and query, its tags and group, where it came from (origin,
    generator, passage, literalness), its hash, the documents it forbids, whether it expects no answer, and
    its set, risk, owner and rationale."""

    id: str
    query: str
    knowledge_tag: str | None = None
    note: str | None = None
    tags: list[str] = Field(default_factory=list)
    group: str | None = None
    language: str = ""
    origin: str = ""  # manual | generated | log
    generator: str | None = None
    passage_chunk_id: str | None = None
    literalness: float | None = None
    case_sha256: str = ""
    forbidden_doc_ids: list[str] = Field(default_factory=list)
    expect_no_answer: bool = False
    case_set: str = Field("core", alias="set")  # core | incremental
    risk: str | None = None  # low | medium | high
    owner: str | None = None
    rationale: str = ""
    # the case's own `principal` (left out of the JSON when it names none)
    principal: str | None = Field(None, exclude_if=_unset)


class CaseResolution(Model):
    """The case as resolved against the index: its K and matching level, the ids it grades, those the index
    does not hold, its evidence groups, its sources expanded to documents, its date and alternatives, and why
    it has no figures (`unscorable`)."""

    top_k: int
    match_on: str = ""
    expected: dict[str, float] = Field(default_factory=dict)
    missing_from_index: list[str] = Field(default_factory=list)
    evidence_groups: list[list[str]] = Field(default_factory=list)
    expanded_sources: dict[str, list[str]] = Field(default_factory=dict)
    # per expected id, the content hash the golden-set audit recorded (stale ids are remapped with it)
    expected_content: dict[str, str] = Field(default_factory=dict)
    # the date the case was judged as of (its own asOf, else the run's)
    as_of: str | None = None
    # why a case that names expectations has no figures (status "unscorable"), else None
    unscorable: str | None = None
    # one relevance map per alternative evidence group, when the case has two or more (figures: the best)
    alternatives: list[dict[str, float]] = Field(default_factory=list)
    # the evaluation principal the case ran as: its own `principal`, else rag.access.eval_default_principal
    # with access enabled; None (left out of the JSON): unscoped, everything readable
    run_as: str | None = Field(None, exclude_if=_unset)


class CaseOutcome(Model):
    """What the chain did for the case: its status and error, the candidates and documents it returned,
    whether it abstained, its latencies, whether the fallback was used, its trace id (None when the retrieval
    failed), its ranking and what the answer cost."""

    status: str = "ok"
    error: str | None = None
    original_count: int | None = None
    final_count: int | None = None
    abstained: bool | None = None
    latency_ms: float | None = None
    single_latency_ms: float | None = None
    fallback_used: bool | None = None
    trace_id: str | None = None
    ranked_documents: list[RankedDocument] = Field(default_factory=list)
    # what the case's answer cost: characters handed on (top K with attached chunks), candidates before the
    # stages, model calls (the query embedding and each cross-encoder pair)
    budget: CaseBudget | None = None


class CaseMeasures(Model):
    """What the case's final ranking scores: the measure table at K (None: no relevant id), the same at each
    extra cut-off, the counts behind the ratios, the forbidden documents found, Judged@K, the condensed
    table and the evidence figures."""

    metrics: dict[str, float] | None = None
    at_k: dict[str, dict[str, float]] = Field(default_factory=dict)
    expected_count: int = 0
    hit_count: int | None = None
    first_hit_rank: int | None = None
    forbidden_found: list[str] = Field(default_factory=list)
    judged: float | None = None  # Judged@K of the top K (metrics.judged_at_k)
    unjudged: list[str] = Field(default_factory=list)  # the top K's ids that carry no judgment
    condensed: dict[str, float] | None = None  # metrics at K of the condensed (judged-only) list
    evidence: dict[str, float] | None = None  # evidenceRecall, evidenceHit at K
    # returned or attached chunks the case's principal may not read (left out of the JSON when none)
    access_leaks: list[AccessLeak] | None = Field(None, exclude_if=_unset)


class CaseAnalysis(Model):
    """What the case's trace tells: each stage's statistics, the measures of the list after each stage, and
    where the relevant ids and the evidence chunks not in the top K were lost."""

    filter_stats: list[StageStat] = Field(default_factory=list)
    after_stage: dict[str, dict[str, float]] = Field(default_factory=dict)
    lost: list[Loss] = Field(default_factory=list)
    evidence_lost: list[Loss] = Field(default_factory=list)


_CASE_PARTS: dict[str, type[Model]] = {
    "case": CaseSpec,
    "resolved": CaseResolution,
    "outcome": CaseOutcome,
    "scores": CaseMeasures,
    "analysis": CaseAnalysis,
}

# the order of a case's keys in the report JSON, as reports have always written them; a field added to a part
# and not listed here comes after these, in the parts' order
_CASE_KEY_ORDER = (
    "id query knowledgeTag topK note tags group language origin generator passageChunkId literalness "
    "caseSha256 matchOn expected forbiddenDocIds expectNoAnswer status error metrics atK expectedCount "
    "hitCount firstHitRank originalCount finalCount abstained latencyMs singleLatencyMs fallbackUsed traceId "
    "rankedDocuments filterStats afterStage lost forbiddenFound missingFromIndex judged unjudged condensed "
    "evidenceGroups evidence evidenceLost expandedSources set risk owner rationale budget expectedContent "
    "asOf unscorable alternatives"
).split()


def _key_position(part: type[Model]) -> dict[str, int]:
    """Each field of `part`, by alias and by name, at its key's place in `_CASE_KEY_ORDER` (after them all
    when it is not listed)."""
    places = {key: i for i, key in enumerate(_CASE_KEY_ORDER)}
    return {
        key: places.get(info.alias or name, len(places))
        for name, info in part.model_fields.items()
        for key in (name, info.alias or name)
    }


_KEY_POSITION = {key: place for part in _CASE_PARTS.values() for key, place in _key_position(part).items()}
_KEY_PART = {key: name for name, part in _CASE_PARTS.items() for key in _key_position(part)}


class CaseRecord(Model):
    """One golden case as the report shows it, composed of its parts: what the golden case says (`case`),
    the case as resolved against the index (`resolved`), what the chain did (`outcome`), what its ranking
    scores (`scores`) and what its trace tells (`analysis`). Its JSON is one flat object of the parts' keys
    (in `_CASE_KEY_ORDER`), and a flat object is read back into the parts."""

    case: CaseSpec
    resolved: CaseResolution
    outcome: CaseOutcome = Field(default_factory=CaseOutcome)
    scores: CaseMeasures = Field(default_factory=CaseMeasures)
    analysis: CaseAnalysis = Field(default_factory=CaseAnalysis)

    @model_validator(mode="before")
    @classmethod
    def _split(cls, data: object) -> object:
        """A flat object (a report's case, or flat keyword arguments) split into its parts; a key of no part
        stays at the top, for validation to refuse or ignore as before."""
        if not isinstance(data, Mapping) or any(part in data for part in _CASE_PARTS):
            return data
        parts: dict[str, dict[str, object]] = {part: {} for part in _CASE_PARTS}
        rest: dict[str, object] = {}
        for key, value in data.items():
            if key in _KEY_PART:
                parts[_KEY_PART[key]][key] = value
            else:
                rest[key] = value
        return {**rest, **parts}

    @model_serializer(mode="wrap")
    def _flatten(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """The parts' dumps merged into one flat object, its keys in `_CASE_KEY_ORDER`."""
        dumped = handler(self)
        flat: dict[str, object] = {}
        for part in _CASE_PARTS:
            flat.update(dumped.get(part, {}))
        return dict(sorted(flat.items(), key=lambda item: _KEY_POSITION.get(item[0], len(_KEY_POSITION))))


class SummaryCounts(Model):
    """The counts behind the summary's ratios: the scored cases, those with a relevant document in the top K
    (`hits`), and the relevant ids found in the top K over those expected (`relevant_found`,
    `relevant_total`)."""

    scored_cases: int = 0
    hits: int = 0
    relevant_found: int = 0
    relevant_total: int = 0


class NoAnswerFigures(Model):
    """Over the no-answer cases that ran: their number, the share that returned nothing and the share that
    returned documents (None without such a case)."""

    cases: int = 0
    correct_abstention_rate: float | None = None
    false_answer_rate: float | None = None


def _field_name(model: type[BaseModel], key: str) -> str:
    """The field of `model` whose JSON key is `key` (`hitRate` -> `hit_rate`), else `key` (an extra)."""
    return next((name for name, info in model.model_fields.items() if info.alias == key), key)


class EvidenceFigures(Model):
    """Over the cases that name evidence (chunk ids or quotes) and ran: their number, the mean
    EvidenceRecall and EvidenceHit, the mean EvidenceCharRecall and CharPrecision over those whose evidence
    has character spans (`char_cases` of them), where the evidence chunks of the unanswered ones were lost
    (`lost_by`), and the cases none of whose groups the index holds whole (`unscorable`: no evidence
    figure)."""

    cases: int = 0
    evidence_recall: float | None = None
    evidence_hit: float | None = None
    char_cases: int = 0
    evidence_char_recall: float | None = None
    char_precision: float | None = None
    lost_by: dict[str, int] = Field(default_factory=dict)
    unscorable: list[str] = Field(default_factory=list)


# The measures whose run figure sits in a group of the summary, not at its top: key -> (group, field).
_GROUPED_FIGURES = {
    "correctAbstention": ("no_answer", "correct_abstention_rate"),
    "falseAnswerRate": ("no_answer", "false_answer_rate"),
    "evidenceRecall": ("evidence", "evidence_recall"),
    "evidenceHit": ("evidence", "evidence_hit"),
    "evidenceCharRecall": ("evidence", "evidence_char_recall"),
    "charPrecision": ("evidence", "char_precision"),
}


class Summary(Model):
    """The run's headline figures: macro means over the scored cases (those with relevant documents);
    no-answer cases, forbidden hits and where expected ids were lost are counted apart. Each headline
    measure of the registry (`scoring.measures.HEADLINE`) is a figure under its key: those below as fields,
    a measure registered beyond them as an extra figure of the same shape; `figure` reads any measure's run
    figure by its key."""

    model_config = ConfigDict(extra="allow")

    cases: int = 0
    succeeded: int = 0
    failed: int = 0
    scored_cases: int = 0
    recall: float | None = None
    hit_rate: float | None = None
    mrr: float | None = None
    ndcg: float | None = None
    precision: float | None = None
    top1_accuracy: float | None = None
    duplicate_rate: float | None = None
    counts: SummaryCounts = Field(default_factory=SummaryCounts)
    k_mixed: bool = False
    at_k: dict[str, dict[str, float | None]] = Field(default_factory=dict)
    latency_ms: dict[str, float] | None = None  # single-query retrieve() over the timed sample
    latency_sample_cases: int = 0
    batch_latency_ms: dict[str, float] | None = None
    no_answer: NoAnswerFigures = Field(default_factory=NoAnswerFigures)
    forbidden: dict[str, int] = Field(default_factory=dict)
    expected_missing_from_index: int = 0
    lost_by: dict[str, int] = Field(default_factory=dict)
    failed_case_ids: list[str] = Field(default_factory=list)
    # cases left out of every figure because every expectation they name is a chunk id not in the index
    unscorable_case_ids: list[str] = Field(default_factory=list)
    judged: float | None = None  # mean Judged@K over the scored cases
    unjudged_in_top_k: int = 0  # distinct (case, id) pairs in the scored cases' top K with no judgment
    # mean metrics of the condensed lists (recall, hitRate, mrr, ndcg, precision)
    condensed: dict[str, float | None] = Field(default_factory=dict)
    evidence: EvidenceFigures = Field(default_factory=EvidenceFigures)
    # means over the cases that ran: contextChars, candidates, modelCalls (CaseBudget)
    budget: dict[str, float] = Field(default_factory=dict)

    def figure(self, key: str) -> float | None:
        """The run's figure of the measure with JSON key `key`: a headline field or extra, or the rate of
        its group (`noAnswer`, `evidence`) for a measure taken over the no-answer cases or the evidence
        groups; None when it has none."""
        if key in _GROUPED_FIGURES:
            group, name = _GROUPED_FIGURES[key]
            value = getattr(getattr(self, group), name)
        else:
            value = getattr(self, _field_name(type(self), key), None)
        return value if isinstance(value, float) else None


class GateCheckRecord(Model):
    """One gate check as the report keeps it (`message`: the check described, as the log prints it)."""

    name: str
    metric: str
    op: str
    threshold: float
    value: float | None
    passed: bool
    severity: Literal["fail", "warn"] = "fail"
    message: str = ""
    means: str = ""  # what the check holds, in words (gate.MEANS)


class Gate(Model):
    """The gate's verdict: `passed` when no check of severity "fail" failed; `warnings` are the checks that
    did not hold but only warn."""

    passed: bool = True
    checks: list[GateCheckRecord] = Field(default_factory=list)
    failures: list[GateFailure] = Field(default_factory=list)
    warnings: list[GateFailure] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class RunInfo(Model):
    """What was run: the models, store and chain (`run_header`), the fingerprint (`run_fingerprint`: golden
    set, corpus, embedder, chain and settings hashes) and the timing. The fields below are the ones the
    renderers and the comparison read; the other keys of the header and the fingerprint (`settings`,
    `settingsSha256`, `embedder`, `retrieval`, `chain`, ...) are kept as they come."""

    model_config = ConfigDict(extra="allow")

    models: RunModels = Field(default_factory=RunModels)
    store: str | None = None
    chunks: int | None = None
    chain_summary: str | None = None  # the enabled stages: "similarity_threshold → hard_filter → ..."
    chain_settings: str | None = None  # the chain's settings in one line
    golden_set_sha256: str | None = None
    corpus_fingerprint: CorpusFingerprint | None = None
    chain_sha256: str | None = None
    started_at: str | None = None
    evaluated_at: str | None = None
    duration_ms: float | None = None
    golden_set: str | None = None
    dataset_version: str | int | None = None
    k: int | None = None
    k_values: list[int] = Field(default_factory=list)
    as_of: str | None = None
    gain: str | None = None  # nDCG's gain, "linear" | "exponential" (None: a report from before the choice)
    conventions: str | None = None
    code_version: str | None = None
    report_file: str | None = None
    retired: list[dict[str, str]] = Field(default_factory=list)  # the golden set's [{id, reason}]


# -- the golden-set audit (`golden.audit`) -----------------------------------------------------------------

NEAR_DUPLICATE_COSINE = 0.95

# The audit's records are pydantic dataclasses (built positionally by the audit) with camelCase JSON keys.
RECORD_CONFIG = ConfigDict(alias_generator=to_camel, populate_by_name=True)


@pydantic_dataclass(frozen=True, config=RECORD_CONFIG)
class DuplicateQuery:
    normalised: str
    cases: list[str]


@pydantic_dataclass(frozen=True, config=RECORD_CONFIG)
class QueryPair:
    cases: list[str]  # two case ids, in golden-set order
    queries: list[str]
    cosine: float
    group: str | None = None  # set for a paraphrase pair (both cases of this group)


@pydantic_dataclass(frozen=True, config=RECORD_CONFIG)
class Suggestion:
    """Where a stale id's content went (`by` "contentHash": the ids now carrying the hash the previous
    report recorded for it) or, `by` "name" and `guess` true, the closest names by difflib."""

    ids: list[str]
    by: str  # "contentHash" | "name"
    guess: bool


@pydantic_dataclass(frozen=True, config=RECORD_CONFIG)
class StaleId:
    case: str
    field: str
    id: str
    level: str
    suggestion: Suggestion | None
    note: str  # why this suggestion, or why none


@pydantic_dataclass(frozen=True, config=RECORD_CONFIG)
class Excluded:
    case: str
    id: str
    level: str  # "doc" | "chunk"
    reasons: list[str]  # the hard filter's reasons, one per distinct reason over the chunks


@pydantic_dataclass(frozen=True, config=RECORD_CONFIG)
class ContentCopy:
    case: str
    id: str
    role: str  # "relevant" | "forbidden"
    copies: list[str]
    unjudged_copies: list[str]


@pydantic_dataclass(frozen=True, config=RECORD_CONFIG)
class RelevantAndForbidden:
    group: str
    id: str
    relevant_in: list[str]
    forbidden_in: list[str]


@pydantic_dataclass(frozen=True, config=RECORD_CONFIG)
class TagCoverage:
    tag: str
    documents: int
    untouched_documents: int
    cases: int


@pydantic_dataclass(frozen=True, config=RECORD_CONFIG)
class Coverage:
    documents: int
    untouched_count: int
    untouched_documents: list[str]  # at most golden.audit.LISTED_UNTOUCHED, sorted
    tags: list[TagCoverage]
    untouched_tags: list[str]


@pydantic_dataclass(config=RECORD_CONFIG)
class Audit:
    """The audit of one golden set against one index as the report keeps it (report JSON `audit`): `ran`
    false with `error` saying why when it could not run; `findings`: kind -> number of findings."""

    ran: bool
    error: str | None = None
    golden_set: str | None = None
    cases: int = 0
    as_of: str | None = None
    near_duplicate_cosine: float = NEAR_DUPLICATE_COSINE
    embedder: str | None = None
    previous_report: str | None = None  # where recorded content hashes came from (or why none)
    findings: dict[str, int] = dataclass_field(default_factory=dict)
    duplicate_queries: list[DuplicateQuery] = dataclass_field(default_factory=list)
    near_duplicate_queries: list[QueryPair] = dataclass_field(default_factory=list)
    paraphrases: list[QueryPair] = dataclass_field(default_factory=list)
    stale_ids: list[StaleId] = dataclass_field(default_factory=list)
    hard_filter_excluded: list[Excluded] = dataclass_field(default_factory=list)
    content_copies: list[ContentCopy] = dataclass_field(default_factory=list)
    relevant_and_forbidden: list[RelevantAndForbidden] = dataclass_field(default_factory=list)
    coverage: Coverage | None = None
    summary: str = ""
    # the cases whose expected ids their principal may read no chunk of (ACL_FILTERED), from the run:
    # only in an evaluation report whose cases ran scoped (`findings["aclFiltered"]` then counts them)
    acl_filtered: list[AclFiltered] = dataclass_field(default_factory=list)

    @property
    def total_findings(self) -> int:
        return sum(self.findings.values())


# -- the threshold sweep (`tune.grid.threshold_sweep`) -----------------------------------------------------


# a replayed chain setting's value, as the settings model typed it
ParamValue = bool | int | float | str | None


class PointFigures(Model):
    """A chain setting's figures over the replayed cases (`tune.replay.point_metrics`): each point measure
    of the registry (`scoring.measures.POINT`) under its key, the summary's figure of it (those below as
    fields, a measure registered beyond them as an extra figure), `forbiddenHits` counted, `meanResults` the
    mean number of documents returned per case that ran, and the counts behind correctAbstention; `figure`
    reads any of them by its key."""

    model_config = ConfigDict(extra="allow")

    recall: float | None
    hit_rate: float | None
    mrr: float | None
    ndcg: float | None
    correct_abstention: float | None
    false_answer_rate: float | None
    forbidden_hits: int
    mean_results: float | None
    correct_abstentions: int
    no_answer_cases: int

    def figure(self, key: str) -> float | None:
        """The figure with JSON key `key` (`hitRate`, `forbiddenHits`, a registered measure's key), field or
        extra, as a float; None when it is undefined or there is none."""
        value = getattr(self, _field_name(type(self), key), None)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class SweepPoint(Model):
    """A point of the sweep (`point`: parameter -> value) and its figures."""

    point: dict[str, ParamValue]
    metrics: PointFigures


class SweepRow(Model):
    """One replayed point: its parameters, figures, the gate's verdict on them and whether no other point
    is at least as good on both nDCG and correct abstention and strictly better on one (`pareto`)."""

    params: dict[str, ParamValue]
    metrics: PointFigures
    passes_gate: bool
    pareto: bool


class SweepRecommendation(Model):
    """`best`: the highest nDCG passing the gate; `abstention`: the most correct abstentions passing the
    gate within the tolerance of the current recall and nDCG; each None when no point qualifies."""

    best: SweepPoint | None
    abstention: SweepPoint | None


class SweepCost(Model):
    """What the sweep cost in ms: recording the candidates, replaying one point, one real evaluation."""

    candidates: float
    per_point: float
    real_evaluation: float


class Sweep(Model):
    """The threshold sweep (`tune.grid.threshold_sweep`): `param` replayed over the values of `grid`, one
    row per point, the recommendations and the current setting."""

    param: str
    grid: dict[str, list[ParamValue]]
    rows: list[SweepRow]
    recommendation: SweepRecommendation
    cost_ms: SweepCost
    current: SweepPoint


WORST_CASES = 20


def worst_cases(cases: list[CaseRecord], limit: int = WORST_CASES) -> list[CaseRecord]:
    """The cases to look at first, worst first, at most `limit`: failed ones, then no-answer cases that
    answered, then by nDCG and recall; a case with a forbidden document in its top K, or an access leak, is
    always listed. A case
    that found everything at rank 1 (nDCG 1) and no-answer cases that abstained are not listed."""

    def badness(c: CaseRecord) -> tuple[float, float, str]:
        if c.outcome.status == "failed":
            return (-1.0, 0.0, c.case.id)
        if c.case.expect_no_answer:
            return (0.0 if not c.outcome.abstained else 2.0, 0.0, c.case.id)
        m = c.scores.metrics or {}
        return (m.get("ndcg", 0.0), m.get("recall", 0.0), c.case.id)

    bad = [c for c in cases if badness(c)[0] < 1.0 or c.scores.forbidden_found or c.scores.access_leaks]
    return sorted(bad, key=badness)[:limit]


class OriginFigures(Model):
    """One origin's cases (manual, generated, log): how many, how many are scored (have metrics), and the
    mean per-case figure of the compared metric over the scored ones, an extra key named after the metric
    (`ndcg`; None when none is scored)."""

    model_config = ConfigDict(extra="allow")

    cases: int
    scored: int


class GeneratedVsManual(Model):
    """The generated cases' mean `metric` against the manual ones' over the scored cases of each side
    (`delta` = generated - manual): different queries, an unpaired difference of means, no test of
    significance."""

    metric: str
    generated: float
    manual: float
    delta: float
    generated_cases: int
    manual_cases: int


class Origins(Model):
    """How generated cases score against manual ones (`run.segments.origin_comparison`): the figures of
    each origin present, and the comparison, None unless both sides have scored cases."""

    by_origin: dict[str, OriginFigures]
    generated_vs_manual: GeneratedVsManual | None


class BaselineUpdate(Model):
    """Whether this run became the last passing baseline (`<prefix>-passing.json`), and why or why not."""

    promoted: bool
    reason: str


class Report(Model):
    """The evaluation report. `status` "invalid": the golden set could not be read, nothing ran (`error`
    says why, `summary` is None). `comparison` is None without a usable baseline (`baselineNote` says why);
    `sweep` is the threshold sweep (`tune.grid.threshold_sweep`), `audit` the golden-set audit without
    its per-case content hashes (`golden.audit.attach_audit` moves them into the cases' `expectedContent`),
    both None when not run; `access` the access-scope checks (leaks, the leak probe), None when no case ran
    scoped; `cases` always holds every case."""

    schema_version: int = SCHEMA_VERSION
    status: Literal["ok", "invalid"] = "ok"
    error: str | None = None
    run: RunInfo
    summary: Summary | None = None
    comparison: Comparison | None = None
    baseline_note: str | None = None
    gate: Gate = Field(default_factory=Gate)
    baseline_update: BaselineUpdate | None = None
    sweep: Sweep | None = None
    audit: Audit | None = None
    access: AccessSection | None = None
    stages: list[StageRow] = Field(default_factory=list)
    segments: list[Segment] = Field(default_factory=list)
    origins: Origins | None = None
    groups: list[Group] = Field(default_factory=list)
    candidate_origins: dict[str, int] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    cases: list[CaseRecord] = Field(default_factory=list)


def report_text(report: Report) -> str:
    """The report file's text: the JSON by alias, indented by 2, non-ASCII as is, ending in a newline."""
    return json.dumps(report.to_json(), ensure_ascii=False, indent=2) + "\n"
