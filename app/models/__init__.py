"""Models: the embedder, the cross-encoder reranker and packaged-weights resolution.

The only package that imports torch or sentence_transformers (lazily, when a model is loaded).
"""

from app.models.e5_convert import E5ConversionError, ensure_e5_folder
from app.models.embedder import Embedder, EmbeddingInterrupted, ModelLoadError, load_embedder
from app.models.reranker import CrossEncoderScorer, load_reranker, window_spans

__all__ = [
    "CrossEncoderScorer",
    "E5ConversionError",
    "Embedder",
    "EmbeddingInterrupted",
    "ModelLoadError",
    "ensure_e5_folder",
    "load_embedder",
    "load_reranker",
    "window_spans",
]
