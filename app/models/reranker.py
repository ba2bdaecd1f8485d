"""The cross-encoder that the rerank stage injects: scores (query, passage) pairs, long passages by windows.

A cross-encoder reads at most its maximum length; truncating a long passage would hide whatever sits after
the cut. So a passage longer than one window is split into overlapping token windows (`window_tokens`
long, starting every `window_stride` tokens, at most `max_windows` of them, the last one aligned to the
passage end when the cap allows), every (query, window) pair is scored, and the passage takes its best
window's score. Window sizes count the model's own tokens, and the query's tokens and the special tokens
are subtracted first, so that query + window always fits the model.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from app.models.embedder import ModelLoadError, load_named_model
from app.settings import RerankSettings

# A query may use at most this share of the model's length; the rest is for the passage window.
MAX_QUERY_SHARE = 0.5
# Tokenizers report a huge sentinel when they know no limit.
_UNKNOWN_LENGTH = 100_000
_FALLBACK_MAX_LENGTH = 512


def window_spans(n_tokens: int, window: int, stride: int, max_windows: int) -> list[tuple[int, int]]:
    """Token spans [start, end) covering `n_tokens`: starts 0, stride, 2*stride, ...; the last window is
    moved back to end at `n_tokens`; at most `max_windows` spans (text after them is not scored).

    A passage that fits in one window is one span (0, n_tokens), also when it is empty.
    """
    if window < 1 or stride < 1 or max_windows < 1:
        raise ValueError(f"window ({window}), stride ({stride}) and max_windows ({max_windows}) must be >= 1")
    if n_tokens <= window:
        return [(0, n_tokens)]
    spans: list[tuple[int, int]] = []
    start = 0
    while len(spans) < max_windows:
        if start + window >= n_tokens:
            spans.append((n_tokens - window, n_tokens))
            break
        spans.append((start, start + window))
        start += stride
    return spans


class CrossEncoderScorer:
    """`score(query, passages)` -> one float per passage, higher = more relevant (the model's scale)."""

    def __init__(
        self,
        model: str,
        batch_size: int = 16,
        window_tokens: int = 256,
        window_stride: int = 192,
        max_windows: int = 8,
        *,
        cross_encoder: Any | None = None,
        device: str = "cpu",
    ):
        """`model` is a CrossEncoder folder or hub id. `cross_encoder` injects an already-built object with
        `predict(pairs, batch_size=..., show_progress_bar=...)`, a fast `tokenizer` and `max_seq_length`
        (tests pass fakes); then `model` is only its name."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1 (got {batch_size})")
        if window_tokens < 1 or max_windows < 1:
            raise ValueError(f"window_tokens ({window_tokens}) and max_windows ({max_windows}) must be >= 1")
        if not 1 <= window_stride <= window_tokens:
            raise ValueError(
                f"window_stride ({window_stride}) must be between 1 and window_tokens ({window_tokens}): "
                "a larger stride leaves text between windows that is never scored"
            )
        self.name = model
        self.batch_size = batch_size
        self.window_tokens = window_tokens
        self.window_stride = window_stride
        self.max_windows = max_windows
        if cross_encoder is None:
            cross_encoder = load_named_model("CrossEncoder", model, "reranker", device)
        self.model = cross_encoder
        self.tokenizer = self.model.tokenizer
        if not getattr(self.tokenizer, "is_fast", False):
            raise ModelLoadError(f"reranker {model!r}: windows need a fast tokenizer (with offsets)")
        self.max_length = _max_length(self.model)
        self.special_tokens = self.tokenizer.num_special_tokens_to_add(pair=True)
        # Wall time spent inside the model's predict calls; benchmarks print it.
        self.model_seconds = 0.0
        self._lock = threading.Lock()

    def windows(self, query: str, passage: str) -> tuple[str, list[str]]:
        """The query as fed (cut to its share of the model's length) and the passage's window texts.

        Uses the shared tokenizer: call it under `self._lock` when other threads may be scoring."""
        query_offsets = self._offsets(query)
        query_budget = int(self.max_length * MAX_QUERY_SHARE)
        if len(query_offsets) > query_budget:
            query_offsets = query_offsets[:query_budget]
            query = query[: query_offsets[-1][1]] if query_offsets else ""
        window = min(self.window_tokens, self.max_length - self.special_tokens - len(query_offsets))
        window = max(window, 1)
        offsets = self._offsets(passage)
        if len(offsets) <= window:
            return query, [passage]
        stride = min(self.window_stride, window)
        spans = window_spans(len(offsets), window, stride, self.max_windows)
        return query, [passage[offsets[start][0] : offsets[end - 1][1]] for start, end in spans]

    def score(self, query: str, passages: list[str]) -> list[float]:
        """Each passage's best window score; [] for no passages."""
        if not passages:
            return []
        pairs: list[tuple[str, str]] = []
        owners: list[int] = []
        # One lock for the windowing and the model: both use the one fast tokenizer, whose truncation and
        # padding `predict` switches on and the windowing switches off. Used by two threads at once it fails
        # with "Already borrowed" (or encodes with the other caller's settings).
        with self._lock:
            for i, passage in enumerate(passages):
                fed_query, texts = self.windows(query, passage)
                pairs += [(fed_query, text) for text in texts]
                owners += [i] * len(texts)
            started = time.perf_counter()
            try:
                raw = self.model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False)
            finally:
                self.model_seconds += time.perf_counter() - started
        best = [float("-inf")] * len(passages)
        for owner, value in zip(owners, _flat_scores(raw), strict=True):
            best[owner] = max(best[owner], value)
        return best

    def _offsets(self, text: str) -> list[tuple[int, int]]:
        if not text:
            return []
        encoded = self.tokenizer(
            text, add_special_tokens=False, return_offsets_mapping=True, truncation=False, verbose=False
        )
        return [(int(a), int(b)) for a, b in encoded["offset_mapping"]]


def _flat_scores(raw: Any) -> list[float]:
    out = []
    for value in raw:
        flat = getattr(value, "reshape", None)
        out.append(float(flat(-1)[0]) if flat is not None else float(value))
    return out


def _max_length(model: Any) -> int:
    for value in (getattr(model, "max_seq_length", None), getattr(model.tokenizer, "model_max_length", None)):
        if isinstance(value, int) and 0 < value < _UNKNOWN_LENGTH:
            return value
    return _FALLBACK_MAX_LENGTH


def load_reranker(settings: RerankSettings, device: str = "cpu") -> CrossEncoderScorer | None:
    """The configured cross-encoder, or None when `settings.model` is None (the stage is then skipped)."""
    if settings.model is None:
        return None
    return CrossEncoderScorer(
        settings.model,
        batch_size=settings.batch_size,
        window_tokens=settings.window_tokens,
        window_stride=settings.window_stride,
        max_windows=settings.max_windows,
        device=device,
    )
