"""The query model as a TorchScript trace (app/models/traced.py), on the real packaged models: the default
e5 and MiniLM are traced, their query vectors are the eager model's, and a trace that fails or disagrees
leaves queries on the eager path."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app.models import load_embedder
from app.models.traced import TRACE_MIN_COSINE, trace_query_model
from app.settings import ModelsSettings

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def golden_queries() -> list[str]:
    cases = json.loads((REPO / "golden_set" / "golden-set.json").read_text(encoding="utf-8"))
    return [case["query"] for case in cases["cases"]]


def test_default_e5_queries_are_traced_and_equal_the_eager_model(real_embedder, e5_settings):
    eager = load_embedder(e5_settings.model_copy(update={"trace_queries": False}))
    queries = golden_queries() + ["x", "年假 " * 400, "How do I reset my password? " * 60]

    traced_vectors = real_embedder.embed_queries(queries)
    eager_vectors = eager.embed_queries(queries)

    assert real_embedder.query_model is not None
    assert real_embedder.query_mode.startswith("traced (TorchScript, smallest cosine to eager ")
    assert eager.query_model is None and eager.query_mode == "eager (rag.models.trace_queries is off)"
    assert traced_vectors.dtype == np.float32 and traced_vectors.shape == (len(queries), 384)
    cosines = np.sum(traced_vectors.astype(float) * eager_vectors.astype(float), axis=1)
    assert cosines.min() >= TRACE_MIN_COSINE
    # one query alone and in a batch of all: the trace takes any batch size and length
    assert float(real_embedder.embed_queries([queries[0]])[0] @ traced_vectors[0]) >= TRACE_MIN_COSINE


@pytest.fixture(scope="module")
def minilm():
    return load_embedder(ModelsSettings(embedder="all-MiniLM-L6-v2", trace_queries=False)).model


def test_minilm_is_traced_too(minilm):
    traced, why = trace_query_model(minilm, "")

    assert why == "" and traced is not None
    assert traced.inputs[:2] == ("input_ids", "attention_mask")
    assert traced.min_cosine >= TRACE_MIN_COSINE


def test_a_trace_whose_vectors_differ_from_eager_is_not_used(minilm, monkeypatch):
    import torch

    real_trace = torch.jit.trace

    def skewed(module, example, **kwargs):
        traced = real_trace(module, example, **kwargs)
        return lambda *tensors: traced(*tensors) + 0.05 * torch.arange(traced(*tensors).shape[-1])

    monkeypatch.setattr(torch.jit, "trace", skewed)
    traced, why = trace_query_model(minilm, "")

    assert traced is None
    assert why.startswith("the trace's vectors differ from eager's (smallest cosine ")
    assert why.endswith(f" < {TRACE_MIN_COSINE})")


def test_a_model_torch_cannot_trace_stays_eager(monkeypatch):
    import torch

    def refuse(*args, **kwargs):
        raise RuntimeError("unsupported operator")

    monkeypatch.setattr(torch.jit, "trace", refuse)
    embedder = load_embedder(ModelsSettings(embedder="all-MiniLM-L6-v2"))
    eager = load_embedder(ModelsSettings(embedder="all-MiniLM-L6-v2", trace_queries=False))

    assert embedder.query_model is None
    refused = "torch.jit.trace failed: RuntimeError: unsupported operator"
    assert embedder.query_mode == f"eager: not traced, {refused}"
    query = ["how long is a refund"]
    assert np.array_equal(embedder.embed_queries(query), eager.embed_queries(query))


def test_a_model_without_a_transformer_first_is_not_traced():
    class Pooling:
        pass

    traced, why = trace_query_model([Pooling()], "")

    assert traced is None
    assert why == "its first module is Pooling, not a Transformer with a Hugging Face model"


def test_a_model_without_preprocess_is_not_traced(minilm):
    class BeforeVersion5(list):  # its modules, but no `preprocess` (sentence-transformers before 5)
        pass

    traced, why = trace_query_model(BeforeVersion5(minilm), "")

    assert traced is None
    assert why == "its sentence-transformers has no `preprocess` (before version 5)"
