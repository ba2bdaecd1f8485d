"""The RetrievalQualityFilter stages, one file each; `STAGE_ORDER` is the order the chain runs them in."""

from app.retrieval.stages.bm25 import Bm25Stage
from app.retrieval.stages.diversity import DiversityStage
from app.retrieval.stages.fallback import FallbackStage
from app.retrieval.stages.hard_filter import HardFilterStage
from app.retrieval.stages.rerank import RerankStage
from app.retrieval.stages.similarity_threshold import SimilarityThresholdStage

STAGE_ORDER = ["similarity_threshold", "hard_filter", "bm25", "rerank", "diversity", "fallback"]

__all__ = [
    "STAGE_ORDER",
    "Bm25Stage",
    "DiversityStage",
    "FallbackStage",
    "HardFilterStage",
    "RerankStage",
    "SimilarityThresholdStage",
]
