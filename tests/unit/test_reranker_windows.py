"""The reranker's window logic, with a fake cross-encoder (its score = how often "needle" occurs)."""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.models.reranker import CrossEncoderScorer, window_spans
from tests.fixtures.tiny_models import tiny_tokenizer

MAX_LENGTH = 128
PAIR_SPECIALS = 3  # [CLS] q [SEP] p [SEP]


class FakeTokenizer:
    """The slice of a Hugging Face fast tokenizer the scorer uses, over the tiny WordLevel vocabulary."""

    is_fast = True
    model_max_length = MAX_LENGTH

    def __init__(self):
        self.tok = tiny_tokenizer()

    def __call__(self, text: str, **_: object) -> dict:
        enc = self.tok.encode(text, add_special_tokens=False)
        return {"input_ids": enc.ids, "offset_mapping": enc.offsets}

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return PAIR_SPECIALS if pair else 2

    def count(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False).ids)


class FakeCrossEncoder:
    max_seq_length = MAX_LENGTH

    def __init__(self):
        self.tokenizer = FakeTokenizer()
        self.pairs: list[tuple[str, str]] = []
        self.batches: list[int] = []

    def predict(self, pairs, batch_size: int, show_progress_bar: bool = False) -> list[float]:
        out: list[float] = []
        for start in range(0, len(pairs), batch_size):
            batch = pairs[start : start + batch_size]
            self.batches.append(len(batch))
            self.pairs += batch
            out += [float(passage.split().count("needle")) for _, passage in batch]
        return out


def scorer(window=32, stride=16, max_windows=100, batch_size=4) -> CrossEncoderScorer:
    return CrossEncoderScorer(
        "fake", batch_size, window, stride, max_windows, cross_encoder=FakeCrossEncoder()
    )


def filler(n: int) -> str:
    return " ".join(["filler"] * n)


@pytest.mark.parametrize(
    ("n_tokens", "window", "stride", "max_windows", "expected"),
    [
        (0, 16, 8, 3, [(0, 0)]),
        (10, 16, 8, 3, [(0, 10)]),
        (16, 16, 8, 3, [(0, 16)]),
        (40, 16, 8, 8, [(0, 16), (8, 24), (16, 32), (24, 40)]),
        (41, 16, 8, 8, [(0, 16), (8, 24), (16, 32), (24, 40), (25, 41)]),
        (1000, 16, 8, 3, [(0, 16), (8, 24), (16, 32)]),
        (20, 16, 16, 8, [(0, 16), (4, 20)]),
    ],
)
def test_window_spans(n_tokens, window, stride, max_windows, expected):
    assert window_spans(n_tokens, window, stride, max_windows) == expected


@given(
    n=st.integers(0, 2000),
    window=st.integers(1, 300),
    stride_share=st.floats(0.01, 1.0),
    max_windows=st.integers(1, 20),
)
def test_window_spans_invariants(n, window, stride_share, max_windows):
    stride = max(1, int(window * stride_share))
    spans = window_spans(n, window, stride, max_windows)
    assert 1 <= len(spans) <= max_windows
    assert all(0 <= a <= b <= n for a, b in spans)
    assert all(b - a == min(window, n) for a, b in spans)
    assert spans[0][0] == 0
    # consecutive windows overlap or touch: nothing between them goes unscored
    assert all(nxt[0] <= cur[1] for cur, nxt in zip(spans, spans[1:], strict=False))
    if spans[-1][1] != n:  # the tail is cut only when the window cap was reached
        assert len(spans) == max_windows


def test_relevant_words_in_the_middle_get_the_best_window_score():
    passage = f"{filler(300)} needle needle {filler(300)}"
    windowed = scorer(window=32, stride=16, max_windows=100)
    truncated = scorer(window=32, stride=16, max_windows=1)  # what plain truncation would see

    assert windowed.score("needle", [passage]) == [2.0]
    assert truncated.score("needle", [passage]) == [0.0]


def test_a_short_passage_is_one_window_with_its_whole_text():
    s = scorer(window=32)
    passage = "the refund policy is 30 days"

    assert s.score("refund", [passage, "needle"]) == [0.0, 1.0]
    assert s.model.pairs == [("refund", passage), ("refund", "needle")]


def test_window_count_is_capped():
    s = scorer(window=32, stride=16, max_windows=3)

    s.score("q", [filler(1000)])

    assert len(s.model.pairs) == 3
    assert all(s.model.tokenizer.count(text) == 32 for _, text in s.model.pairs)


def test_query_and_window_always_fit_the_model():
    s = scorer(window=100, stride=50)
    long_query = filler(200)

    s.score(long_query, [filler(500), "needle"])

    tok = s.model.tokenizer
    assert {tok.count(q) for q, _ in s.model.pairs} == {MAX_LENGTH // 2}  # the query is cut to its share
    for query, text in s.model.pairs:
        assert tok.count(query) + tok.count(text) + PAIR_SPECIALS <= MAX_LENGTH


def test_batching_does_not_change_scores():
    passages = [filler(90) + " needle " + filler(10), "needle needle", "", filler(5), filler(200) + " needle"]
    results = []
    for batch_size in (1, 3, 1000):
        s = scorer(batch_size=batch_size)
        results.append(s.score("q", passages))
        assert max(s.model.batches) <= batch_size

    assert results[0] == results[1] == results[2] == [1.0, 2.0, 0.0, 0.0, 1.0]


def test_no_passages_means_no_model_call():
    s = scorer()

    assert s.score("query", []) == []
    assert s.model.batches == []


def test_model_seconds_accumulates():
    s = scorer()
    s.score("q", ["needle"])

    assert s.model_seconds > 0.0


@pytest.mark.parametrize(
    ("window", "stride", "max_windows", "batch_size"),
    [(16, 17, 8, 4), (16, 0, 8, 4), (0, 1, 8, 4), (16, 8, 0, 4), (16, 8, 8, 0)],
)
def test_invalid_window_settings_are_rejected(window, stride, max_windows, batch_size):
    with pytest.raises(ValueError):
        CrossEncoderScorer("fake", batch_size, window, stride, max_windows, cross_encoder=FakeCrossEncoder())


class BorrowCheckingCrossEncoder(FakeCrossEncoder):
    """Like a Rust fast tokenizer: one user at a time, a second concurrent one fails with "Already borrowed".

    `predict` uses the same tokenizer (as a real CrossEncoder does); each use holds it for a moment so
    that overlapping uses from two threads would collide."""

    def __init__(self):
        super().__init__()
        self.in_use = threading.Lock()
        inner = self.tokenizer

        class Guarded(FakeTokenizer):
            def __call__(tok_self, text: str, **kwargs: object) -> dict:  # noqa: N805
                with self.borrowed():
                    return inner(text, **kwargs)

        self.tokenizer = Guarded()

    @contextlib.contextmanager
    def borrowed(self):
        if not self.in_use.acquire(blocking=False):
            raise RuntimeError("Already borrowed")
        try:
            time.sleep(0.0005)
            yield
        finally:
            self.in_use.release()

    def predict(self, pairs, batch_size: int, show_progress_bar: bool = False) -> list[float]:
        with self.borrowed():
            return super().predict(pairs, batch_size, show_progress_bar)


def test_concurrent_calls_never_use_the_tokenizer_at_the_same_time():
    s = CrossEncoderScorer("fake", 4, 32, 16, 100, cross_encoder=BorrowCheckingCrossEncoder())
    passages = [filler(90) + " needle " + filler(10), "needle needle", "", filler(5)]
    expected = s.score("q", passages)
    start = threading.Barrier(8)

    def worker(_: int) -> list[list[float]]:
        start.wait()
        return [s.score("q", passages) for _ in range(50)]

    with ThreadPoolExecutor(8) as pool:
        results = [r for chunk in pool.map(worker, range(8)) for r in chunk]

    assert results == [expected] * 400
