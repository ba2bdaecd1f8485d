"""The retrieval chain's stages, one file each, and the one registry the chain is built from.

`build_stages` makes every stage in `rag.chain` order, which is the field order of `ChainSettings` (and
the order of config/application.yml); there is no other copy of the order. A stage's `name` is its
config key, and `build_stages` refuses a registry that disagrees with the settings model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from app.retrieval.chain import ChainStage
from app.retrieval.stages.bm25 import Bm25Stage, LexicalScorer
from app.retrieval.stages.diversity import DiversityStage
from app.retrieval.stages.fallback import FallbackStage
from app.retrieval.stages.hard_filter import HardFilterStage
from app.retrieval.stages.rerank import PassageScorer, RerankStage
from app.retrieval.stages.similarity_threshold import SimilarityThresholdStage
from app.retrieval.types import Stage
from app.settings import ChainSettings


@dataclass(frozen=True)
class StageDependencies:
    """What the stages are given besides their settings: the injected scorers."""

    lexical: LexicalScorer
    reranker: PassageScorer | None


def _fallback(chain: ChainSettings, deps: StageDependencies) -> FallbackStage:
    # A refill must pass the hard filter's rules even when an earlier stage removed the candidate before the
    # hard filter saw it; with the hard filter off, there are no rules to pass.
    rules = HardFilterStage(chain.hard_filter).reason if chain.hard_filter.enabled else None
    return FallbackStage(chain.fallback, rules)


STAGE_FACTORIES: dict[str, Callable[[ChainSettings, StageDependencies], Stage]] = {
    "similarity_threshold": lambda chain, deps: SimilarityThresholdStage(chain.similarity_threshold),
    "hard_filter": lambda chain, deps: HardFilterStage(chain.hard_filter),
    "bm25": lambda chain, deps: Bm25Stage(chain.bm25, deps.lexical),
    "rerank": lambda chain, deps: RerankStage(chain.rerank, deps.reranker),
    "diversity": lambda chain, deps: DiversityStage(chain.diversity),
    "fallback": _fallback,
}


def stage_order() -> list[str]:
    """The stage names in the order the chain runs them: the keys of `rag.chain`, in order."""
    return list(ChainSettings.model_fields)


def build_stages(
    chain: ChainSettings, lexical: LexicalScorer, reranker: PassageScorer | None
) -> list[ChainStage]:
    """Every stage of `rag.chain`, in its order, each enabled or not as its `enabled` key says."""
    order = stage_order()
    if set(order) != set(STAGE_FACTORIES):
        raise RuntimeError(
            f"stage registry {sorted(STAGE_FACTORIES)} does not match the rag.chain keys {sorted(order)}"
        )
    deps = StageDependencies(lexical, reranker)
    stages: list[ChainStage] = []
    for name in order:
        stage = STAGE_FACTORIES[name](chain, deps)
        if stage.name != name:
            raise RuntimeError(f"stage registered as {name!r} is named {stage.name!r}")
        stages.append(ChainStage(stage, getattr(chain, name).enabled))
    return stages


__all__ = [
    "STAGE_FACTORIES",
    "Bm25Stage",
    "DiversityStage",
    "FallbackStage",
    "HardFilterStage",
    "RerankStage",
    "SimilarityThresholdStage",
    "StageDependencies",
    "build_stages",
    "stage_order",
]
