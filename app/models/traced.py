"""The query model's transformer as a TorchScript trace: a whole forward pass in one call without the GIL.

Why. In eager mode a forward pass of a transformer returns to Python between its operators, hundreds of
times, and every return must take the GIL back. In a server other request threads hold the GIL for their
chain and HTTP work, and each re-take can wait for the interpreter's switch interval (5 ms): beside one
thread running Python an eager batch of queries takes many times as long as alone, a traced one a few
times (docs/benchmarks.md#code-figures). A trace
(`torch.jit.trace`) runs the forward pass in TorchScript's C++ interpreter, which holds the GIL only at its
two ends.

Which. The first module of the SentenceTransformer must be its `Transformer` (a Hugging Face model whose
output is `token_embeddings`), fed by tensors among `input_ids`, `attention_mask`, `token_type_ids`; the
modules after it (pooling, normalisation) run as they do in eager mode. Anything else is not traced.

Safety. A trace records one run of the model and replays its operators, so it can be wrong for inputs
that take another branch. It is made on two texts, then checked on others: batches of 1 and 3, Chinese, and
a text longer than the model's `max_seq_length` (truncated, as eager truncates it). Every checked vector
must have a cosine of at least `TRACE_MIN_COSINE` with the eager model's; otherwise the trace is not used
and queries run eager (`trace_query_model` returns why). Measured on multilingual-e5-small and MiniLM: the
smallest cosine is 0.99999988-1.0 (the trace builds an attention mask where eager skips it for an unpadded
batch).

torch 2.13 calls `torch.jit.trace` deprecated (for `torch.export`, whose programs run operator by operator
in Python again, and `torch.compile`, which needs a C++ compiler at run time); torch is pinned, and a trace
that fails or is refused leaves the eager path.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

# The vectors of the trace and of the eager model must agree this closely on every checked text.
TRACE_MIN_COSINE = 0.99999
# The tensors a text transformer may take; a model fed by any other tensor is not traced.
TRACE_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_TRACE_TEXTS = ["a probe sentence to trace the model", "a second, longer probe sentence: two rows, padded"]
_CHECK_BATCHES = [
    ["one query alone"],
    [
        "出差住宿标准是多少？报销需要哪些票据",
        "short",
        " ".join(["a text far longer than the model's maximum sequence length, cut as eager cuts it"] * 80),
    ],
]


@dataclass
class TracedQueryModel:
    """`model(features)` for text features, with the transformer replaced by its trace."""

    traced: Any  # torch.jit.ScriptModule: (*tensors) -> last hidden state
    inputs: tuple[str, ...]  # the feature keys passed to it, in order
    rest: list[Any]  # the SentenceTransformer's modules after the transformer
    min_cosine: float  # the smallest cosine with the eager model over the checked texts
    seconds: float  # time to trace and check

    def __call__(self, features: dict[str, Any]) -> dict[str, Any]:
        out = dict(features)
        out["token_embeddings"] = self.traced(*(features[k] for k in self.inputs))
        for module in self.rest:
            out = module(out)
        return out


def _last_hidden_state(auto_model: Any, inputs: tuple[str, ...]) -> Any:
    """What is traced: the Hugging Face model's first output (the last hidden state), from the tensors
    named `inputs`, given in that order."""
    import torch

    class LastHiddenState(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = auto_model

        def forward(self, *tensors: Any) -> Any:
            return self.model(**dict(zip(inputs, tensors, strict=True)), return_dict=False)[0]

    return LastHiddenState().eval()


def trace_query_model(model: Any, prompt: str) -> tuple[TracedQueryModel | None, str]:
    """The trace of `model`'s transformer, checked against the eager model on texts with `prompt`, or
    (None, why it is not used)."""
    import torch

    modules = list(model) if hasattr(model, "__iter__") else []
    first = modules[0] if modules else None
    auto_model = getattr(first, "auto_model", None)
    if not isinstance(auto_model, torch.nn.Module):
        kind = type(first).__name__
        return None, f"its first module is {kind}, not a Transformer with a Hugging Face model"
    if not hasattr(model, "preprocess"):
        return None, "its sentence-transformers has no `preprocess` (before version 5)"
    output_name = getattr(first, "module_output_name", "token_embeddings")
    if output_name != "token_embeddings":
        return None, f"its Transformer outputs {output_name!r}, not token embeddings"
    started = time.perf_counter()
    device = getattr(model, "device", None)

    def features_of(texts: list[str]) -> dict[str, Any]:
        features = model.preprocess(texts, prompt=prompt or None)
        return {
            k: v.to(device) if device is not None and isinstance(v, torch.Tensor) else v
            for k, v in features.items()
        }

    example = features_of(_TRACE_TEXTS)
    tensors = [k for k, v in example.items() if isinstance(v, torch.Tensor)]
    unknown = [k for k in tensors if k not in TRACE_INPUTS]
    if unknown or "input_ids" not in tensors:
        return None, f"its tokenizer gives tensors {tensors}, not only {list(TRACE_INPUTS)}"
    inputs = tuple(k for k in TRACE_INPUTS if k in tensors)
    try:
        with torch.inference_mode(), warnings.catch_warnings():
            # the deprecation notice, and the tracer's notes on branches it fixed: the check below decides
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(
                _last_hidden_state(auto_model, inputs),
                tuple(example[k] for k in inputs),
                check_trace=False,
            )
    except Exception as exc:  # any model torch cannot trace: the eager path stays
        return None, f"torch.jit.trace failed: {type(exc).__name__}: {exc}"
    candidate = TracedQueryModel(traced, inputs, modules[1:], min_cosine=float("nan"), seconds=float("nan"))
    worst = 1.0
    try:
        with torch.inference_mode():
            for texts in _CHECK_BATCHES:
                features = features_of(texts)
                eager = _unit(model(dict(features))["sentence_embedding"])
                mine = _unit(candidate(features)["sentence_embedding"])
                worst = min(worst, float(np.min(np.sum(eager * mine, axis=1))))
    except Exception as exc:
        return None, f"the trace failed on a checked text: {type(exc).__name__}: {exc}"
    if not worst >= TRACE_MIN_COSINE:
        why = f"the trace's vectors differ from eager's (smallest cosine {worst:.7f} < {TRACE_MIN_COSINE})"
        return None, why
    return replace(candidate, min_cosine=worst, seconds=time.perf_counter() - started), ""


def _unit(vectors: Any) -> np.ndarray:
    rows = vectors.detach().to("cpu").double().numpy()
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)
