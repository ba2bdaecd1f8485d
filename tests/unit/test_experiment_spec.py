"""The experiment file: keys checked with "did you mean", overlays validated by Settings, axes expanded."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.experiment.spec import (
    ONE_AT_A_TIME_CAVEAT,
    ExperimentFileError,
    expand_axes,
    load_spec,
    settings_keys,
)
from app.settings import Settings, load_settings


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "application.yml"
    path.write_text("rag: {}\n", encoding="utf-8")
    return path


def _spec(tmp_path: Path, text: str, config: Path):
    path = tmp_path / "exp.yml"
    path.write_text(text, encoding="utf-8")
    return load_spec(path, load_settings(config_path=config), config)


def test_every_leaf_key_is_listed_and_sections_are_not() -> None:
    keys = settings_keys()
    assert "rag.ingest.chunk_size" in keys
    assert "rag.chain.bm25.enabled" in keys
    assert "rag.chain.similarity_threshold.per_knowledge_tag" in keys  # a dict-valued key is a leaf
    assert "rag.chain.bm25" not in keys


def test_variants_become_settings_over_the_current_configuration(tmp_path: Path, config: Path) -> None:
    spec = _spec(
        tmp_path, "variants:\n  small: {rag.ingest.chunk_size: 300, chain.bm25.enabled: false}\n", config
    )
    (variant,) = spec.variants
    assert variant.name == "small"
    assert variant.overlay == {"rag.ingest.chunk_size": 300, "rag.chain.bm25.enabled": False}
    assert variant.settings.rag.ingest.chunk_size == 300
    assert variant.settings.rag.chain.bm25.enabled is False
    assert variant.settings.rag.ingest.chunk_overlap == 100  # the rest is the current configuration


def test_a_misspelt_key_says_did_you_mean_before_anything_runs(tmp_path: Path, config: Path) -> None:
    with pytest.raises(ExperimentFileError) as info:
        _spec(tmp_path, "variants:\n  a: {rag.ingest.chunk_sise: 300}\n", config)
    message = str(info.value)
    assert "variant 'a'" in message
    assert "unknown settings key 'rag.ingest.chunk_sise'" in message
    assert "did you mean rag.ingest.chunk_size" in message


def test_a_misspelt_axis_says_did_you_mean(tmp_path: Path, config: Path) -> None:
    with pytest.raises(ExperimentFileError, match="did you mean rag.chain.bm25.enabled"):
        _spec(tmp_path, "axes:\n  rag.chain.bm25.enabeld: [true, false]\n", config)


def test_an_invalid_value_names_the_variant_and_the_key(tmp_path: Path, config: Path) -> None:
    with pytest.raises(ExperimentFileError) as info:
        _spec(
            tmp_path,
            "variants:\n  ok: {rag.ingest.chunk_size: 300}\n  bad: {rag.ingest.chunk_size: 10}\n",
            config,
        )
    assert "variant 'bad'" in str(info.value)
    assert "'rag.ingest.chunk_size'" in str(info.value)
    assert "greater than or equal to 50" in str(info.value)


def test_a_cross_field_rule_is_checked_on_the_merged_settings(tmp_path: Path, config: Path) -> None:
    with pytest.raises(ExperimentFileError, match="variant 'tight'.*chunk_overlap \\(100\\) must be smaller"):
        _spec(tmp_path, "variants:\n  tight: {rag.ingest.chunk_size: 100}\n", config)


@pytest.mark.parametrize(
    "key",
    ["rag.store.path", "rag.store.collection", "rag.evaluate.top_k", "rag.ingest.paths", "rag.server.port"],
)
def test_a_key_shared_by_every_variant_cannot_vary(tmp_path: Path, config: Path, key: str) -> None:
    with pytest.raises(ExperimentFileError, match=f"'{key}' cannot vary in an experiment"):
        _spec(tmp_path, f"variants:\n  a: {{{key}: 1}}\n", config)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("variants: {}\n", "no variant"),
        ("variant: {a: {rag.ingest.chunk_size: 300}}\n", "unknown top-level key"),
        ("variants:\n  base: {rag.ingest.chunk_size: 300}\n", "not 'base'"),
        ("design: random\naxes: {rag.ingest.chunk_size: [300]}\n", "design must be one of"),
        ("axes: {rag.ingest.chunk_size: 300}\n", "must list at least one value"),
        ("- a\n", "expected a mapping"),
    ],
)
def test_a_malformed_file_is_refused(tmp_path: Path, config: Path, text: str, expected: str) -> None:
    with pytest.raises(ExperimentFileError, match=expected):
        _spec(tmp_path, text, config)


def test_a_missing_file_is_named(tmp_path: Path, config: Path) -> None:
    with pytest.raises(ExperimentFileError, match="experiment file not found"):
        load_spec(tmp_path / "nope.yml", load_settings(config_path=config), config)


def test_a_grid_is_every_combination_but_the_base_named_by_what_differs() -> None:
    base = Settings()  # chunk_size 600, bm25 on
    axes = {"rag.ingest.chunk_size": [300, 600], "rag.chain.bm25.enabled": [True, False]}
    assert expand_axes(axes, "grid", base) == {
        "chunk_size=300": {"rag.ingest.chunk_size": 300},
        "chunk_size=300,enabled=False": {"rag.ingest.chunk_size": 300, "rag.chain.bm25.enabled": False},
        "enabled=False": {"rag.chain.bm25.enabled": False},
    }


def test_one_at_a_time_moves_one_axis_and_prints_its_caveat(tmp_path: Path, config: Path) -> None:
    base = Settings()
    axes = {"rag.ingest.chunk_size": [300, 600, 900], "rag.chain.bm25.enabled": [False]}
    assert expand_axes(axes, "one-at-a-time", base) == {
        "chunk_size=300": {"rag.ingest.chunk_size": 300},
        "chunk_size=900": {"rag.ingest.chunk_size": 900},
        "enabled=False": {"rag.chain.bm25.enabled": False},
    }
    spec = _spec(tmp_path, "design: one-at-a-time\naxes: {rag.ingest.chunk_size: [300, 900]}\n", config)
    assert spec.notes == [ONE_AT_A_TIME_CAVEAT]
    assert [v.name for v in spec.variants] == ["chunk_size=300", "chunk_size=900"]


def test_a_variant_named_twice_is_refused(tmp_path: Path, config: Path) -> None:
    text = "variants:\n  chunk_size=300: {rag.ingest.chunk_size: 300}\naxes: {rag.ingest.chunk_size: [300]}\n"
    with pytest.raises(ExperimentFileError, match="named twice"):
        _spec(tmp_path, text, config)


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("name", "current", "variants"),
    [
        (
            "xquad-zh-chunking.yml",
            "rag: {}\n",  # the shipped base: 600, e5-small (left out of the grid)
            {
                "chunk_size=300",
                "chunk_size=300,embedder=all-MiniLM-L6-v2",
                "embedder=all-MiniLM-L6-v2",
                "chunk_size=900",
                "chunk_size=900,embedder=all-MiniLM-L6-v2",
                "chunk_size=500000",
                "chunk_size=500000,embedder=all-MiniLM-L6-v2",
            },
        ),
        (
            "scifact-chunking.yml",
            # the base as docs/benchmarks.md sets it by the environment
            "rag: {models: {embedder: all-MiniLM-L6-v2}, ingest: {chunk_size: 900}}\n",
            {"chunk_size=600", "chunk_size=500000"},
        ),
    ],
)
def test_the_published_benchmark_experiments_load_with_the_variants_docs_show(
    tmp_path: Path, name: str, current: str, variants: set[str]
) -> None:
    config = tmp_path / "application.yml"
    config.write_text(current, encoding="utf-8")
    spec = load_spec(REPO / "config" / "experiments" / name, load_settings(config_path=config), config)
    assert {v.name for v in spec.variants} == variants
