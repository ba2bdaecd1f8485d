"""The chain with fakes: stage order, the trace, disabled stages, fallbackUsed, the topK cut, batches."""

from __future__ import annotations

import re
from datetime import date

import numpy as np
import pytest

from app.retrieval.candidates import CandidateSet
from app.retrieval.chain import ChainStage, RetrievalChain, RetrievalRequest
from app.retrieval.stages import FallbackStage
from app.retrieval.types import Candidate, QueryContext, Removal, StageOutcome
from app.settings import FallbackSettings

TODAY = date(2024, 5, 1)


def cand(chunk_id: str, dense: float) -> Candidate:
    return Candidate(chunk_id, f"doc-{chunk_id}", f"text {chunk_id}", {}, None, {"dense": dense})


class FakeEmbedder:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        return np.ones((len(texts), 4), dtype=np.float32)


class FakeCandidates:
    """Gives every query the same raw candidates (c0 best ... cN-1 worst)."""

    def __init__(self, n: int = 6) -> None:
        self.raw = [cand(f"c{i}", 0.9 - 0.1 * i) for i in range(n)]
        self.calls: list[tuple[list[str], list[str | None]]] = []

    def generate_many(self, queries, embeddings, knowledge_tags, principals=None):
        self.calls.append((list(queries), list(knowledge_tags)))
        return [
            CandidateSet(
                list(self.raw),
                {"dense": len(self.raw), "bm25": 0, "both": 0},
                {"dense": ids(self.raw), "bm25": ids(self.raw)[::-1]},
            )
            for _ in queries
        ]


class Recorder:
    """A stage that logs its call and keeps what `keep` says (everything by default)."""

    def __init__(self, name: str, log: list[str], keep=lambda ids: ids, fail_on: str | None = None):
        self.name = name
        self.log = log
        self.keep = keep
        self.fail_on = fail_on

    def run(self, query: QueryContext, candidates: list[Candidate]) -> StageOutcome:
        self.log.append(self.name)
        if self.fail_on is not None and query.text == self.fail_on:
            raise RuntimeError(f"{self.name} failed on {query.text!r}")
        wanted = set(self.keep([c.chunk_id for c in candidates]))
        kept = [c for c in candidates if c.chunk_id in wanted]
        removed = [Removal(c.chunk_id, c.doc_id, f"{self.name} said no") for c in candidates if c not in kept]
        for c in kept:
            c.scores[self.name] = 1.0  # stages write scores into candidates; the raw list must not see them
        return StageOutcome(kept=kept, removed=removed, score_key=self.name)


def chain_of(*stages: ChainStage, n: int = 6) -> tuple[RetrievalChain, FakeEmbedder, FakeCandidates]:
    embedder, candidates = FakeEmbedder(), FakeCandidates(n)
    return RetrievalChain(embedder, candidates, list(stages)), embedder, candidates  # type: ignore[arg-type]


def ids(candidates: list[Candidate]) -> list[str]:
    return [c.chunk_id for c in candidates]


def test_stages_run_in_configured_order_and_the_trace_follows_it():
    log: list[str] = []
    names = ["similarity_threshold", "hard_filter", "bm25", "rerank", "diversity", "fallback"]
    chain, _, _ = chain_of(*(ChainStage(Recorder(name, log), True) for name in names))
    result = chain.retrieve("q", top_k=10)
    assert log == names
    assert chain.stage_names == names
    assert [s.name for s in result.trace.stages] == names
    assert list(result.trace.ranked_after) == ["candidates", *names]


def test_trace_counts_removals_and_ranked_lists():
    chain, _, _ = chain_of(
        ChainStage(Recorder("drop_two", [], keep=lambda ids: ids[:-2]), True),
        ChainStage(Recorder("drop_first", [], keep=lambda ids: ids[1:]), True),
    )
    result = chain.retrieve("q", top_k=10)
    first, second = result.trace.stages
    assert (first.input_count, first.output_count) == (6, 4)
    assert [(r.chunk_id, r.reason) for r in first.removed] == [
        ("c4", "drop_two said no"),
        ("c5", "drop_two said no"),
    ]
    assert (second.input_count, second.output_count) == (4, 3)
    assert [r.chunk_id for r in second.removed] == ["c0"]
    assert result.trace.ranked_after == {
        "candidates": ["c0", "c1", "c2", "c3", "c4", "c5"],
        "drop_two": ["c0", "c1", "c2", "c3"],
        "drop_first": ["c1", "c2", "c3"],
    }
    assert result.original_count == 6
    assert ids(result.documents) == ["c1", "c2", "c3"]
    assert result.trace.candidate_origins == {"dense": 6, "bm25": 0, "both": 0}
    assert all(s.latency_ms >= 0 for s in result.trace.stages)


def test_the_trace_keeps_each_search_s_order_and_has_an_id_of_its_own_per_query():
    chain, _, _ = chain_of(ChainStage(Recorder("keep_all", []), True))
    first, second = chain.retrieve_many([RetrievalRequest("q", 3), RetrievalRequest("q", 3)])
    assert not isinstance(first, BaseException) and not isinstance(second, BaseException)
    assert first.trace.search_hits == {
        "dense": ["c0", "c1", "c2", "c3", "c4", "c5"],
        "bm25": ["c5", "c4", "c3", "c2", "c1", "c0"],
    }
    assert re.fullmatch("[0-9a-f]{16}", first.trace.trace_id)
    assert first.trace.trace_id != second.trace.trace_id


def test_a_disabled_stage_is_not_run_and_is_recorded_as_disabled_in_config():
    log: list[str] = []
    chain, _, _ = chain_of(
        ChainStage(Recorder("a", log), True),
        ChainStage(Recorder("off", log, keep=lambda ids: []), False),
        ChainStage(Recorder("b", log), True),
    )
    result = chain.retrieve("q", top_k=10)
    assert log == ["a", "b"]
    off = result.trace.stages[1]
    assert (off.name, off.enabled, off.skipped) == ("off", False, "disabled in config")
    assert (off.input_count, off.output_count, off.removed, off.latency_ms) == (6, 6, [], 0.0)
    assert len(result.documents) == 6


def test_fallback_used_only_when_the_fallback_added_something():
    fallback = ChainStage(FallbackStage(FallbackSettings(enabled=True, min_results=2)), True)

    keep_three, _, _ = chain_of(ChainStage(Recorder("filter", [], keep=lambda ids: ids[:3]), True), fallback)
    enough = keep_three.retrieve("q", top_k=5)
    assert enough.fallback_used is False
    assert enough.trace.stages[-1].added == []

    drop_all, _, _ = chain_of(ChainStage(Recorder("filter", [], keep=lambda ids: []), True), fallback)
    refilled = drop_all.retrieve("q", top_k=5)
    assert refilled.fallback_used is True
    assert ids(refilled.documents) == ["c0", "c1"]  # the best raw candidates by dense score
    assert refilled.trace.stages[-1].added == ["c0", "c1"]
    assert (refilled.trace.stages[-1].input_count, refilled.trace.stages[-1].output_count) == (0, 2)
    # refilled candidates are the raw ones: no score written by a stage that had removed them
    assert refilled.documents[0].scores == {"dense": pytest.approx(0.9)}


def test_a_disabled_fallback_never_sets_fallback_used():
    fallback = ChainStage(FallbackStage(FallbackSettings(enabled=True, min_results=2)), False)
    chain, _, _ = chain_of(ChainStage(Recorder("filter", [], keep=lambda ids: []), True), fallback)
    result = chain.retrieve("q", top_k=5)
    assert (result.documents, result.fallback_used) == ([], False)


@pytest.mark.parametrize(
    ("top_k", "expected"), [(1, ["c0"]), (3, ["c0", "c1", "c2"]), (50, [f"c{i}" for i in range(6)])]
)
def test_documents_are_cut_to_top_k_after_every_stage(top_k, expected):
    chain, _, _ = chain_of(ChainStage(Recorder("a", []), True))
    result = chain.retrieve("q", top_k=top_k)
    assert ids(result.documents) == expected
    assert result.trace.stages[0].output_count == 6  # the cut happens after the stages, not inside them


def test_stage_scores_do_not_leak_into_the_raw_candidates():
    chain, _, candidates = chain_of(ChainStage(Recorder("scorer", []), True))
    result = chain.retrieve("q", top_k=3)
    assert result.documents[0].scores == {"dense": pytest.approx(0.9), "scorer": 1.0}
    assert all(set(c.scores) == {"dense"} for c in result.raw_candidates)
    assert all(set(c.scores) == {"dense"} for c in candidates.raw)


def test_retrieve_many_batches_and_returns_a_failed_query_as_its_exception():
    log: list[str] = []
    chain, embedder, candidates = chain_of(ChainStage(Recorder("flaky", log, fail_on="bad"), True))
    seen: list[tuple[int, object]] = []
    requests = [
        RetrievalRequest("good one", 2),
        RetrievalRequest("bad", 2, "hr"),
        RetrievalRequest("good two", 1, "hr"),
    ]
    results = chain.retrieve_many(requests, today=TODAY, on_result=lambda i, r: seen.append((i, r)))

    assert embedder.calls == [["good one", "bad", "good two"]]  # one embedding batch
    assert candidates.calls == [(["good one", "bad", "good two"], [None, "hr", "hr"])]
    assert isinstance(results[1], RuntimeError) and "failed on 'bad'" in str(results[1])
    assert [r.query for r in (results[0], results[2])] == ["good one", "good two"]
    assert ids(results[0].documents) == ["c0", "c1"] and ids(results[2].documents) == ["c0"]
    assert [i for i, _ in seen] == [0, 1, 2]
    assert [r for _, r in seen] == results


def test_retrieve_raises_what_retrieve_many_returned():
    chain, _, _ = chain_of(ChainStage(Recorder("flaky", [], fail_on="bad"), True))
    with pytest.raises(RuntimeError, match="failed on 'bad'"):
        chain.retrieve("bad", top_k=3)


def test_retrieve_many_of_nothing_does_no_work():
    chain, embedder, candidates = chain_of(ChainStage(Recorder("a", []), True))
    assert chain.retrieve_many([]) == []
    assert (embedder.calls, candidates.calls) == ([], [])


def test_the_query_context_carries_the_request_and_earlier_removals():
    seen: list[QueryContext] = []

    class Spy:
        name = "spy"

        def run(self, query, candidates):
            seen.append(query)
            return StageOutcome(kept=list(candidates))

    chain, _, _ = chain_of(
        ChainStage(Recorder("hard_filter", [], keep=lambda ids: ids[1:]), True), ChainStage(Spy(), True)
    )
    chain.retrieve_many([RetrievalRequest("q", 3, "finance")], today=TODAY)
    (ctx,) = seen
    assert (ctx.text, ctx.knowledge_tag, ctx.today) == ("q", "finance", TODAY)
    assert [c.chunk_id for c in ctx.raw_candidates] == [f"c{i}" for i in range(6)]
    assert [r.chunk_id for r in ctx.removed_by_stage["hard_filter"]] == ["c0"]


def test_the_trace_names_removals_a_withholding_stage_hides_from_readers_whichever_stage_removed_them() -> (
    None
):
    class Hides:
        """Hides c1's and c4's documents; removes nothing itself."""

        name = "hides"

        def run(self, query: QueryContext, candidates: list[Candidate]) -> StageOutcome:
            return StageOutcome(kept=list(candidates))

        def withheld(self, query: QueryContext, candidate: Candidate) -> str | None:
            return {"c1": "status=draft", "c4": "not yet effective"}.get(candidate.chunk_id)

    log: list[str] = []
    chain, _, _ = chain_of(
        ChainStage(Recorder("early", log, keep=lambda ids: ids[:4]), True),  # removes c4, c5
        ChainStage(Hides(), True),
        ChainStage(Recorder("late", log, keep=lambda ids: ids[:1]), True),  # removes c1, c2, c3
    )
    result = chain.retrieve("q", 5)
    assert result.trace.withheld == {"c4": "not yet effective", "c1": "status=draft"}


def test_a_stage_that_removes_what_it_withholds_is_not_asked_about_the_candidates_it_kept() -> None:
    asked: list[str] = []

    class Removes:
        """Removes c1, c3; withholds every candidate it is asked about."""

        name = "removes"
        removes_withheld = True

        def run(self, query: QueryContext, candidates: list[Candidate]) -> StageOutcome:
            gone = {"c1", "c3"}
            return StageOutcome(
                kept=[c for c in candidates if c.chunk_id not in gone],
                removed=[Removal(c.chunk_id, c.doc_id, "rule") for c in candidates if c.chunk_id in gone],
            )

        def withheld(self, query: QueryContext, candidate: Candidate) -> str | None:
            asked.append(candidate.chunk_id)
            return "status=draft"

    log: list[str] = []
    chain, _, _ = chain_of(
        ChainStage(Recorder("early", log, keep=lambda ids: ids[:5]), True),  # removes c5
        ChainStage(Removes(), True),
        ChainStage(Recorder("late", log, keep=lambda ids: ids[:1]), True),  # removes c2, c4
    )
    result = chain.retrieve("q", 5)
    assert result.trace.withheld == {"c5": "status=draft", "c1": "status=draft", "c3": "status=draft"}
    assert sorted(asked) == ["c1", "c3", "c5"]


def test_a_disabled_withholding_stage_hides_nothing() -> None:
    from app.retrieval.stages import HardFilterStage
    from app.settings import HardFilterSettings

    log: list[str] = []
    chain, _, candidates = chain_of(
        ChainStage(Recorder("early", log, keep=lambda ids: ids[:1]), True),
        ChainStage(HardFilterStage(HardFilterSettings()), False),
    )
    candidates.raw[1].metadata["status"] = "draft"
    assert chain.retrieve("q", 5).trace.withheld == {}
    chain.stages[1].enabled = True
    assert chain.retrieve("q", 5).trace.withheld == {"c1": "status=draft"}
