"""The chain stages' settings are validated when settings load: a bad value is a SettingsError naming the key
and where it came from, never a ValueError from a stage after the models have loaded."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.settings import (
    Bm25Settings,
    DiversitySettings,
    HardFilterSettings,
    RerankSettings,
    SettingsError,
    SimilarityThresholdSettings,
    load_settings,
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.upper().startswith("RAG__") or name == "SIEVE_CONFIG":
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no config/application.yml: only what the test sets


@pytest.mark.parametrize(
    ("env", "key", "message"),
    [
        (
            {"RAG__CHAIN__BM25__DENSE_WEIGHT": "0", "RAG__CHAIN__BM25__BM25_WEIGHT": "0"},
            "rag.chain.bm25.bm25_weight",
            "dense_weight and bm25_weight are both 0",
        ),
        (
            {"RAG__CHAIN__HARD_FILTER__DENIED_SOURCES": '["wiki", " "]'},
            "rag.chain.hard_filter.denied_sources.1",
            "blank entry ' ' would match nothing",
        ),
        (
            {"RAG__CHAIN__HARD_FILTER__EXCLUDED_STATUSES": '[""]'},
            "rag.chain.hard_filter.excluded_statuses.0",
            "blank entry '' would match nothing",
        ),
        (
            {"RAG__CHAIN__SIMILARITY_THRESHOLD__PER_KNOWLEDGE_TAG": '{"hr": 1.5}'},
            "rag.chain.similarity_threshold.per_knowledge_tag.hr",
            "less than or equal to 1",
        ),
        (
            {"RAG__CHAIN__SIMILARITY_THRESHOLD__PER_KNOWLEDGE_TAG": '{"hr": NaN}'},
            "rag.chain.similarity_threshold.per_knowledge_tag.hr",
            "finite number",
        ),
        (
            {"RAG__CHAIN__SIMILARITY_THRESHOLD__MIN_DENSE": "nan"},
            "rag.chain.similarity_threshold.min_dense",
            "finite",
        ),
        ({"RAG__CHAIN__BM25__MIN_SCORE": "nan"}, "rag.chain.bm25.min_score", "finite"),
        ({"RAG__CHAIN__BM25__DENSE_WEIGHT": "inf"}, "rag.chain.bm25.dense_weight", "finite"),
        ({"RAG__CHAIN__RERANK__MIN_SCORE": "nan"}, "rag.chain.rerank.min_score", "finite"),
        ({"RAG__CHAIN__DIVERSITY__MAX_COSINE": "nan"}, "rag.chain.diversity.max_cosine", "finite"),
        (
            {"RAG__CHAIN__RERANK__WINDOW_STRIDE": "300"},
            "rag.chain.rerank.window_stride",
            "window_stride (300) must not exceed window_tokens (256)",
        ),
    ],
)
def test_invalid_chain_settings_fail_at_load_naming_key_and_variable(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], key: str, message: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    line = next(x for x in str(info.value).splitlines() if f"'{key}'" in x)
    assert message in line
    assert line.strip().startswith("environment variable RAG__CHAIN__"), line


def test_a_bad_list_entry_in_yaml_is_blamed_on_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "sieve.yml"
    config.write_text(
        "rag:\n  chain:\n    hard_filter:\n      denied_sources: [wiki, '  ']\n", encoding="utf-8"
    )
    monkeypatch.setenv("SIEVE_CONFIG", str(config))
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert f"{config}: 'rag.chain.hard_filter.denied_sources.1': Value error, blank entry '  '" in str(
        info.value
    )


@pytest.mark.parametrize(
    "build",
    [
        lambda: Bm25Settings(dense_weight=0, bm25_weight=0),
        lambda: HardFilterSettings(excluded_statuses=["retired", "\t"]),
        lambda: SimilarityThresholdSettings(per_knowledge_tag={"hr": -1.01}),
        lambda: SimilarityThresholdSettings(per_knowledge_tag={"hr": float("inf")}),
        lambda: DiversitySettings(max_cosine=float("nan")),
        lambda: RerankSettings(min_score=float("-inf")),
    ],
)
def test_the_models_reject_what_a_stage_could_not_use(build) -> None:
    with pytest.raises(ValueError):
        build()


def test_zeroing_the_second_weight_by_assignment_is_rejected_too() -> None:
    settings = Bm25Settings(bm25_weight=0)
    with pytest.raises(ValueError, match="both 0"):
        settings.dense_weight = 0


@pytest.mark.parametrize(
    ("model", "values"),
    [
        (Bm25Settings, {"dense_weight": 0}),
        (Bm25Settings, {"bm25_weight": 0}),
        (SimilarityThresholdSettings, {"min_dense": -1.0, "per_knowledge_tag": {"hr": 1.0, "it": -1.0}}),
        (HardFilterSettings, {"excluded_statuses": [], "denied_sources": [" wiki "]}),
        (DiversitySettings, {"max_cosine": None}),
    ],
)
def test_edge_values_that_still_make_sense_are_accepted(model, values) -> None:
    assert model(**values).model_dump(include=set(values)) == values
