"""The chain the service really builds (the one the API, the CLI and the evaluation use)."""

from __future__ import annotations

from app.lexical.index import Analyzer, Bm25Index
from app.service import Sieve
from app.settings import ChainSettings, Settings


class NoStore:
    """Building the chain must not touch the store; retrieval is not exercised here."""


class NoEmbedder:
    pass


def test_the_service_chain_runs_the_stages_in_rag_chain_order() -> None:
    settings = Settings()
    settings.rag.chain.rerank.enabled = False
    empty = Bm25Index.build([], [], Analyzer())
    sieve = Sieve(settings, NoEmbedder(), NoStore(), reranker=None, lexical=empty)  # type: ignore[arg-type]
    assert sieve.chain.stage_names == list(ChainSettings.model_fields)
    assert [s.stage.name for s in sieve.chain.stages] == list(ChainSettings.model_fields)
    assert {s.name for s in sieve.chain.stages if not s.enabled} == {"rerank"}
    assert sieve.chain.candidates.lexical is empty


def test_the_candidates_carry_nearest_cosines_only_when_a_diversity_max_cosine_reads_them() -> None:
    empty = Bm25Index.build([], [], Analyzer())

    def nearest(diversity_enabled: bool, max_cosine: float | None) -> bool:
        settings = Settings()
        settings.rag.chain.rerank.enabled = False
        settings.rag.chain.diversity.enabled = diversity_enabled
        settings.rag.chain.diversity.max_cosine = max_cosine
        sieve = Sieve(settings, NoEmbedder(), NoStore(), reranker=None, lexical=empty)  # type: ignore[arg-type]
        return sieve.chain.candidates.nearest

    assert Settings().rag.chain.diversity.max_cosine == 0.97 and nearest(True, 0.97) is True
    assert nearest(True, None) is False
    assert nearest(False, 0.97) is False


class ClosingStore(NoStore):
    def __init__(self, order: list[str]) -> None:
        self.order = order

    def close(self) -> None:
        self.order.append("store")


class ClosingEmbedder(NoEmbedder):
    def __init__(self, order: list[str]) -> None:
        self.order = order

    def close(self) -> None:
        self.order.append("embedder")


def test_closing_the_service_stops_the_embedder_workers_then_the_store() -> None:
    order: list[str] = []
    empty = Bm25Index.build([], [], Analyzer())
    sieve = Sieve(Settings(), ClosingEmbedder(order), ClosingStore(order), reranker=None, lexical=empty)  # type: ignore[arg-type]
    sieve.close()
    assert order == ["embedder", "store"]


class DescribedStore(NoStore):
    description = "embedded Chroma at x"
    name = "sieve"

    def count(self) -> int:
        return 3


class IdentityEmbedder(NoEmbedder):
    def identity(self) -> dict[str, object]:
        return {"name": "e5", "dimension": 384, "checksum": "c"}


def test_describe_carries_every_setting_that_can_move_a_result() -> None:
    from app.evaluation.run.fingerprint import result_settings

    settings = Settings()
    settings.rag.chain.rerank.enabled = False
    settings.rag.models.query_prompt = "query: "
    empty = Bm25Index.build([], [], Analyzer())
    sieve = Sieve(settings, IdentityEmbedder(), DescribedStore(), reranker=None, lexical=empty)  # type: ignore[arg-type]
    described = sieve.describe()
    assert described["settings"] == result_settings(settings.rag)
    assert described["settings"]["models"]["query_prompt"] == "query: "  # type: ignore[index]
