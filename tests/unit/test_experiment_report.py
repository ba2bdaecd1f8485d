"""The winner, its overlay as a config file and as environment variables, and the embedding cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml

from app.experiment.compare import MeasureTest, VariantComparison, holm_over_family
from app.experiment.embed_cache import CachedEmbedder
from app.experiment.report import winner, winner_env, winner_yaml
from app.experiment.run import VariantRun
from app.settings import load_settings


def _test(base: float, variant: float, p: float) -> MeasureTest:
    return MeasureTest(base, variant, variant - base, 0.1, None, p, True, 0.05)


def _run(name: str, overlay: dict[str, Any], p95: float = 30.0) -> VariantRun:
    return VariantRun(name, overlay, "base", "sieve", None, [], {"p95Ms": p95})  # type: ignore[arg-type]


def test_holm_runs_over_every_variant_and_measure() -> None:
    comparisons = {
        "a": VariantComparison(10, {"ndcg": _test(0.5, 0.6, 0.01), "recall": _test(0.5, 0.5, 0.04)}),
        "b": VariantComparison(10, {"ndcg": _test(0.5, 0.4, 0.03)}),
    }
    holm_over_family(comparisons, alpha=0.05)
    # sorted 0.01, 0.03, 0.04 -> 3*0.01, max(0.03, 2*0.03), max(0.06, 1*0.04)
    assert comparisons["a"].tests["ndcg"].p_holm == 3 * 0.01
    assert comparisons["b"].tests["ndcg"].p_holm == 2 * 0.03
    assert comparisons["a"].tests["recall"].p_holm == 2 * 0.03
    assert [comparisons["a"].tests["ndcg"].significant, comparisons["b"].tests["ndcg"].significant] == [
        True,
        False,
    ]


def _significant(test: MeasureTest) -> MeasureTest:
    test.p_holm, test.significant = test.p_value, test.p_value < 0.05
    return test


def test_the_winner_is_significantly_better_and_worse_on_nothing() -> None:
    runs = [_run("base", {}), _run("up", {"rag.ingest.chunk_size": 300}), _run("mixed", {"k": 1})]
    comparisons = {
        "up": VariantComparison(10, {"ndcg": _significant(_test(0.5, 0.7, 0.01))}),
        "mixed": VariantComparison(
            10, {"ndcg": _significant(_test(0.5, 0.9, 0.001)), "recall": _significant(_test(0.5, 0.3, 0.01))}
        ),
    }
    chosen = winner(runs, comparisons, "ndcg")
    assert chosen["name"] == "up"
    assert chosen["overlay"] == {"rag.ingest.chunk_size": 300}
    assert "0.5000 -> 0.7000" in chosen["reason"]


def test_without_a_significant_gain_the_base_wins() -> None:
    runs = [_run("base", {}), _run("up", {"rag.ingest.chunk_size": 300})]
    comparisons = {"up": VariantComparison(10, {"ndcg": _significant(_test(0.5, 0.7, 0.2))})}
    chosen = winner(runs, comparisons, "ndcg")
    assert (chosen["name"], chosen["overlay"]) == ("base", {})


def test_the_winner_yaml_is_the_current_config_with_the_overlay(tmp_path: Path) -> None:
    config = tmp_path / "application.yml"
    config.write_text("rag:\n  ingest:\n    chunk_overlap: 80\n  chain:\n    bm25:\n      k1: 1.5\n")
    chosen = {
        "name": "small",
        "overlay": {"rag.ingest.chunk_size": 300, "rag.chain.bm25.enabled": False},
        "reason": "r",
    }
    written = tmp_path / "winner.yml"
    written.write_text(winner_yaml(chosen, config))
    assert "sieve store rebuild" in written.read_text()  # an index setting changed
    settings = load_settings(config_path=written)  # what SIEVE_CONFIG=winner.yml applies
    assert settings.rag.ingest.chunk_size == 300
    assert settings.rag.ingest.chunk_overlap == 80
    assert settings.rag.chain.bm25.enabled is False
    assert settings.rag.chain.bm25.k1 == 1.5
    assert yaml.safe_load(written.read_text())["rag"]["ingest"] == {"chunk_overlap": 80, "chunk_size": 300}


def test_the_winner_env_sets_the_same_keys(monkeypatch, tmp_path: Path) -> None:
    chosen = {
        "name": "x",
        "overlay": {"rag.ingest.chunk_size": 300, "rag.chain.bm25.enabled": False},
        "reason": "r",
    }
    text = winner_env(chosen)
    assert text == "RAG__INGEST__CHUNK_SIZE=300\nRAG__CHAIN__BM25__ENABLED=false\n"
    for line in text.splitlines():
        name, value = line.split("=", 1)
        monkeypatch.setenv(name, value)
    config = tmp_path / "empty.yml"
    config.write_text("rag: {}\n")
    settings = load_settings(config_path=config)
    assert (settings.rag.ingest.chunk_size, settings.rag.chain.bm25.enabled) == (300, False)


class _Counting:
    def __init__(self) -> None:
        self.asked: list[str] = []

    def embed_passages(self, texts, show_progress=False, on_progress=None, should_stop=None):
        self.asked.extend(texts)
        return np.array([[float(len(t)), 1.0] for t in texts], dtype=np.float32)


def test_the_embedding_cache_embeds_each_text_once_per_model_and_prompt(tmp_path: Path) -> None:
    inner = _Counting()
    identity = {"name": "m", "dimension": 2, "checksum": "c"}
    first = CachedEmbedder(inner, identity, "passage: ", tmp_path)
    vectors = first.embed_passages(["aa", "b"])
    first.close()
    again = CachedEmbedder(inner, identity, "passage: ", tmp_path)  # a later run, another variant
    mixed = again.embed_passages(["b", "ccc", "aa"])
    assert inner.asked == ["aa", "b", "ccc"]
    assert (again.hits, again.misses) == (2, 1)
    np.testing.assert_array_equal(mixed, np.array([[1, 1], [3, 1], [2, 1]], dtype=np.float32))
    np.testing.assert_array_equal(vectors, np.array([[2, 1], [1, 1]], dtype=np.float32))
    other_prompt = CachedEmbedder(inner, identity, "", tmp_path)
    other_prompt.embed_passages(["aa"])
    other_model = CachedEmbedder(inner, {**identity, "checksum": "d"}, "passage: ", tmp_path)
    other_model.embed_passages(["aa"])
    assert inner.asked == ["aa", "b", "ccc", "aa", "aa"]


def test_seeded_vectors_stand_in_for_the_model(tmp_path: Path) -> None:
    inner = _Counting()
    identity = {"name": "m", "dimension": 2, "checksum": "c"}
    cache = CachedEmbedder(inner, identity, "passage: ", tmp_path)
    stored = np.array([9.0, 9.0], dtype=np.float32)
    assert cache.seed([("kept", stored), ("kept", stored)]) == 1
    assert cache.seed([("kept", stored)]) == 0  # already held
    vectors = cache.embed_passages(["kept", "new"])
    assert inner.asked == ["new"]
    np.testing.assert_array_equal(vectors[0], stored)


def test_the_reported_detectable_difference_is_the_largest_over_the_variants() -> None:
    from app.experiment.report import detectable_json

    def test(d: float | None) -> MeasureTest:
        return MeasureTest(0.5, 0.5, 0.0, None, None, 1.0, True, d)

    comparisons = {
        "a": VariantComparison(63, {"ndcg": test(0.03), "recall": test(None)}),
        "b": VariantComparison(63, {"ndcg": test(0.05), "recall": test(0.01)}),
        "empty": VariantComparison(0),
    }
    dd = detectable_json(comparisons, "ndcg")
    assert (dd["value"], dd["byMeasure"], dd["pairedCases"]) == (0.05, {"ndcg": 0.05, "recall": 0.01}, 63)
    assert dd["byVariant"] == {"a": {"ndcg": 0.03, "recall": None}, "b": {"ndcg": 0.05, "recall": 0.01}}
    assert (dd["alpha"], dd["power"]) == (0.05, 0.8)
    assert detectable_json({}, "ndcg")["value"] is None
