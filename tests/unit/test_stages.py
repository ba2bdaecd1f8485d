from collections import Counter
from datetime import date

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.retrieval.stages import (
    STAGE_FACTORIES,
    Bm25Stage,
    DiversityStage,
    FallbackStage,
    HardFilterStage,
    RerankStage,
    SimilarityThresholdStage,
    build_stages,
    stage_order,
)
from app.retrieval.types import Candidate, QueryContext, Removal
from app.settings import (
    Bm25Settings,
    ChainSettings,
    DiversitySettings,
    FallbackSettings,
    HardFilterSettings,
    RerankSettings,
    SimilarityThresholdSettings,
)

TODAY = date(2024, 5, 1)


def cand(chunk_id, dense=None, text=None, embedding=None, **metadata) -> Candidate:
    scores = {} if dense is None else {"dense": dense}
    vector = None if embedding is None else np.asarray(embedding, dtype=float)
    return Candidate(chunk_id, f"doc-{chunk_id}", text or f"text of {chunk_id}", metadata, vector, scores)


def ctx(**kwargs) -> QueryContext:
    return QueryContext(text=kwargs.pop("text", "query"), today=TODAY, **kwargs)


def ids(candidates) -> list[str]:
    return [c.chunk_id for c in candidates]


def reasons(outcome) -> dict[str, str]:
    return {r.chunk_id: r.reason for r in outcome.removed}


class FakeIndex:
    def __init__(self, scores: dict[str, float]):
        self.table = scores
        self.calls: list[tuple[str, list[str]]] = []

    def scores(self, query, chunk_ids):
        self.calls.append((query, list(chunk_ids)))
        return {i: self.table.get(i, 0.0) for i in chunk_ids}


class FakeScorer:
    """Scores a passage by looking its text up; records what it was asked."""

    def __init__(self, by_text: dict[str, float] | None = None, result=...):
        self.by_text = by_text or {}
        self.result = result
        self.calls: list[list[str]] = []

    def score(self, query, passages):
        self.calls.append(list(passages))
        if self.result is not ...:
            return self.result
        return [self.by_text.get(p, 0.0) for p in passages]


def test_build_stages_makes_every_stage_in_rag_chain_order_named_by_its_key() -> None:
    assert stage_order() == list(ChainSettings.model_fields)
    assert set(STAGE_FACTORIES) == set(stage_order())
    stages = build_stages(ChainSettings(), FakeIndex({}), None)
    assert [s.name for s in stages] == list(ChainSettings.model_fields)
    assert [s.stage.name for s in stages] == list(ChainSettings.model_fields)
    assert all(s.enabled for s in stages)


def test_build_stages_follows_each_enabled_key_and_injects_the_scorers() -> None:
    chain = ChainSettings(rerank=RerankSettings(enabled=False), fallback=FallbackSettings(enabled=False))
    index, scorer = FakeIndex({}), FakeScorer()
    stages = {s.name: s for s in build_stages(chain, index, scorer)}
    assert {name for name, s in stages.items() if not s.enabled} == {"rerank", "fallback"}
    assert stages["bm25"].stage.index is index
    assert stages["rerank"].stage.scorer is scorer


@pytest.mark.parametrize("hard_filter_on", [True, False])
def test_build_stages_gives_the_fallback_the_hard_filter_rules_only_when_it_is_on(hard_filter_on) -> None:
    chain = ChainSettings(hard_filter=HardFilterSettings(enabled=hard_filter_on))
    fallback = next(s.stage for s in build_stages(chain, FakeIndex({}), None) if s.name == "fallback")
    retired = cand("r", 0.9, status="retired")
    refill = fallback.run(ctx(raw_candidates=[retired]), [])
    assert ids(refill.added) == ([] if hard_filter_on else ["r"])


def test_build_stages_refuses_a_stage_named_unlike_its_key(monkeypatch) -> None:
    monkeypatch.setitem(STAGE_FACTORIES, "diversity", lambda chain, deps: FallbackStage(chain.fallback))
    with pytest.raises(RuntimeError, match="stage registered as 'diversity' is named 'fallback'"):
        build_stages(ChainSettings(), FakeIndex({}), None)


# --- similarity_threshold -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dense", "reason"),
    [
        (0.30, None),  # equal to the threshold is kept
        (0.31, None),
        (0.2999, "dense=0.2999 < 0.3000"),  # never reads "0.30 < 0.30"
        (0.21, "dense=0.21 < 0.30"),
        (-0.5, "dense=-0.50 < 0.30"),
    ],
)
def test_similarity_threshold_boundary(dense: float, reason: str | None) -> None:
    stage = SimilarityThresholdStage(SimilarityThresholdSettings(min_dense=0.30))
    outcome = stage.run(ctx(), [cand("a", dense)])
    if reason is None:
        assert ids(outcome.kept) == ["a"] and outcome.removed == []
    else:
        assert outcome.kept == [] and outcome.removed == [Removal("a", "doc-a", reason)]
    assert outcome.score_key == "dense"


def test_similarity_threshold_per_knowledge_tag() -> None:
    stage = SimilarityThresholdStage(
        SimilarityThresholdSettings(min_dense=0.30, per_knowledge_tag={"hr": 0.5})
    )
    candidates = [
        cand("hr-low", 0.40, knowledge="hr"),
        cand("hr-ok", 0.50, knowledge="hr"),
        cand("fin", 0.40, knowledge="finance"),
        cand("none", 0.29),
        cand("no-dense"),  # kept without comment
    ]
    outcome = stage.run(ctx(), candidates)
    assert ids(outcome.kept) == ["hr-ok", "fin", "no-dense"]
    assert reasons(outcome) == {"hr-low": "dense=0.40 < 0.50", "none": "dense=0.29 < 0.30"}


# --- hard_filter ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metadata", "text", "reason"),
    [
        ({"knowledge": "finance"}, None, None),
        ({"knowledge": "hr"}, None, "knowledge=hr != finance"),
        ({}, None, "knowledge=(none) != finance"),
        ({"knowledge": "finance", "status": "retired"}, None, "status=retired"),
        ({"knowledge": "finance", "status": "Draft"}, None, "status=Draft"),
        ({"knowledge": "finance", "status": "active"}, None, None),
        (
            {"knowledge": "finance", "effectiveTo": "2023-12-31"},
            None,
            "effectiveTo=2023-12-31 < today=2024-05-01",
        ),
        ({"knowledge": "finance", "effectiveTo": "2024-05-01"}, None, None),  # inclusive
        (
            {"knowledge": "finance", "effectiveTo": "2024-04-30T23:59:00"},
            None,
            "effectiveTo=2024-04-30 < today=2024-05-01",
        ),
        (
            {"knowledge": "finance", "effectiveFrom": "2024-05-02"},
            None,
            "effectiveFrom=2024-05-02 > today=2024-05-01",
        ),
        ({"knowledge": "finance", "effectiveFrom": "2024-05-01"}, None, None),  # inclusive
        ({"knowledge": "finance", "effectiveFrom": ""}, None, None),  # blank = no bound
        ({"knowledge": "finance", "effectiveFrom": "soon"}, None, "effectiveFrom unparseable: 'soon'"),
        ({"knowledge": "finance", "effectiveTo": 20240101}, None, "effectiveTo unparseable: 20240101"),
        ({"knowledge": "finance", "source": "wiki.md"}, None, "source=wiki.md denied"),
        ({"knowledge": "finance"}, "  twelve chars  ", "text 12 chars < 20"),
        ({"knowledge": "finance"}, "x" * 20, None),
        # the first failing rule is the reason
        (
            {"knowledge": "hr", "status": "retired", "effectiveTo": "2000-01-01", "source": "wiki.md"},
            "short",
            "knowledge=hr != finance",
        ),
        ({"knowledge": "finance", "status": "retired", "effectiveTo": "2000-01-01"}, None, "status=retired"),
        (
            {"knowledge": "finance", "effectiveTo": "2000-01-01", "source": "wiki.md"},
            None,
            "effectiveTo=2000-01-01 < today=2024-05-01",
        ),
    ],
)
def test_hard_filter_rules(metadata: dict, text: str | None, reason: str | None) -> None:
    stage = HardFilterStage(HardFilterSettings(denied_sources=["wiki.md"], min_text_chars=20))
    outcome = stage.run(
        ctx(knowledge_tag="finance"), [cand("a", 0.9, text=text or "a long enough passage text", **metadata)]
    )
    if reason is None:
        assert ids(outcome.kept) == ["a"] and outcome.removed == []
    else:
        assert outcome.kept == [] and outcome.removed == [Removal("a", "doc-a", reason)]


def test_hard_filter_date_reasons_keep_each_values_own_type_and_take_any_value() -> None:
    # the dates rule is memoised on its values: 1 and True (equal keys in a dict) keep their own reasons,
    # and a value that cannot be a key (a list) is still decided, the same on every call
    stage = HardFilterStage(HardFilterSettings())
    for _ in range(2):
        outcome = stage.run(
            ctx(),
            [cand("a", effectiveTo=1), cand("b", effectiveTo=True), cand("c", effectiveFrom=["2024-01-01"])],
        )
        assert reasons(outcome) == {
            "a": "effectiveTo unparseable: 1",
            "b": "effectiveTo unparseable: True",
            "c": "effectiveFrom unparseable: ['2024-01-01']",
        }
    # the day is part of the key: the same dates decide differently on another day
    later = QueryContext(text="query", today=date(2024, 6, 1))
    dated = [cand("d", effectiveTo="2024-05-15")]
    assert reasons(stage.run(ctx(), dated)) == {}
    assert reasons(stage.run(later, dated)) == {"d": "effectiveTo=2024-05-15 < today=2024-06-01"}


def test_hard_filter_without_query_tag_or_date_check() -> None:
    stage = HardFilterStage(HardFilterSettings(check_effective_dates=False, excluded_statuses=[]))
    candidates = [cand("a", knowledge="hr", effectiveTo="1999-01-01", status="retired"), cand("b")]
    outcome = stage.run(ctx(), candidates)
    assert ids(outcome.kept) == ["a", "b"]


# --- bm25 -----------------------------------------------------------------------------------------------


def test_bm25_rrf_values_and_order() -> None:
    index = FakeIndex({"a": 1.0, "b": 0.0, "c": 3.0})
    stage = Bm25Stage(Bm25Settings(fusion="rrf", rrf_k=60, dense_weight=1.0, bm25_weight=1.0), index)
    inputs = [cand("a", 0.9), cand("b", 0.8), cand("c", 0.7)]
    outcome = stage.run(ctx(text="vpn"), inputs)
    fused = {c.chunk_id: c.scores["fused"] for c in outcome.kept}
    # dense ranks a=1 b=2 c=3; bm25 ranks c=1 a=2, b has bm25 = 0 and gets no bm25 term
    assert fused["a"] == pytest.approx(1 / (60 + 1) + 1 / (60 + 2), rel=1e-15)
    assert fused["b"] == pytest.approx(1 / (60 + 2), rel=1e-15)
    assert fused["c"] == pytest.approx(1 / (60 + 3) + 1 / (60 + 1), rel=1e-15)
    assert ids(outcome.kept) == ["a", "c", "b"]
    assert {c.chunk_id: c.scores["bm25"] for c in outcome.kept} == {"a": 1.0, "b": 0.0, "c": 3.0}
    assert outcome.score_key == "fused" and outcome.removed == []
    assert index.calls == [("vpn", ["a", "b", "c"])]
    assert all("bm25" not in c.scores for c in inputs)  # the inputs are not written into


def test_bm25_rrf_weights_and_ties_by_chunk_id() -> None:
    stage = Bm25Stage(
        Bm25Settings(fusion="rrf", rrf_k=10, dense_weight=2.0, bm25_weight=0.5),
        FakeIndex({"x": 2.0, "y": 2.0}),
    )
    outcome = stage.run(ctx(), [cand("y", 0.5), cand("x", 0.5)])
    # equal dense and equal bm25: ranks go by chunk_id, x first
    assert outcome.kept[0].scores["fused"] == pytest.approx(2.0 / (10 + 1) + 0.5 / (10 + 1), rel=1e-15)
    assert outcome.kept[1].scores["fused"] == pytest.approx(2.0 / (10 + 2) + 0.5 / (10 + 2), rel=1e-15)
    assert ids(outcome.kept) == ["x", "y"]


def test_bm25_weighted_fusion() -> None:
    stage = Bm25Stage(
        Bm25Settings(fusion="weighted", dense_weight=0.6, bm25_weight=0.4),
        FakeIndex({"a": 1.0, "b": 0.0, "c": 3.0}),
    )
    outcome = stage.run(ctx(), [cand("a", 0.9), cand("b", 0.8), cand("c", 0.5)])
    fused = {c.chunk_id: c.scores["fused"] for c in outcome.kept}
    assert fused["a"] == pytest.approx(0.6 * (0.9 - 0.5) / (0.9 - 0.5) + 0.4 * (1.0 - 0.0) / (3.0 - 0.0))
    assert fused["b"] == pytest.approx(0.6 * (0.8 - 0.5) / (0.9 - 0.5) + 0.0)
    assert fused["c"] == pytest.approx(0.0 + 0.4 * (3.0 - 0.0) / (3.0 - 0.0))
    assert ids(outcome.kept) == ["a", "b", "c"]  # 0.733, 0.45, 0.4


def test_bm25_weighted_without_spread_is_zero() -> None:
    stage = Bm25Stage(Bm25Settings(fusion="weighted"), FakeIndex({"a": 2.0}))
    outcome = stage.run(ctx(), [cand("a", 0.9)])
    assert outcome.kept[0].scores["fused"] == 0.0


def test_bm25_min_score_drops_before_fusing() -> None:
    stage = Bm25Stage(
        Bm25Settings(fusion="rrf", dense_weight=1.0, bm25_weight=1.0, min_score=0.5),
        FakeIndex({"a": 1.0, "b": 0.0, "c": 3.0, "d": 0.4999}),
    )
    outcome = stage.run(ctx(), [cand("a", 0.9), cand("b", 0.8), cand("c", 0.7), cand("d", 0.6)])
    assert reasons(outcome) == {"b": "bm25=0.00 < 0.50", "d": "bm25=0.4999 < 0.5000"}
    fused = {c.chunk_id: c.scores["fused"] for c in outcome.kept}
    # ranks among the survivors only: dense a=1 c=2, bm25 c=1 a=2
    assert fused == pytest.approx({"a": 1 / 61 + 1 / 62, "c": 1 / 62 + 1 / 61})
    assert ids(outcome.kept) == ["a", "c"]  # equal fused: by chunk_id


def test_bm25_validates_its_index() -> None:
    with pytest.raises(TypeError, match=r"\.scores\(query, ids\)"):
        Bm25Stage(Bm25Settings(), object())


def test_bm25_empty_list() -> None:
    index = FakeIndex({})
    outcome = Bm25Stage(Bm25Settings(), index).run(ctx(), [])
    assert outcome.kept == [] and index.calls == []


# --- rerank ---------------------------------------------------------------------------------------------


def test_rerank_without_model_is_skipped() -> None:
    candidates = [cand("a", 0.9), cand("b", 0.8)]
    outcome = RerankStage(RerankSettings(), None).run(ctx(), candidates)
    assert outcome.kept == candidates and outcome.removed == []
    assert outcome.skipped == "skipped: no reranker model"


def test_rerank_rescores_the_top_n_and_keeps_the_rest_after() -> None:
    scorer = FakeScorer({"A": 0.1, "B": 0.9, "C": 5.0})
    stage = RerankStage(RerankSettings(top_n=2), scorer)
    outcome = stage.run(
        ctx(), [cand("a", text="A"), cand("b", text="B"), cand("c", text="C"), cand("d", text="D")]
    )
    assert scorer.calls == [["A", "B"]]
    assert ids(outcome.kept) == ["b", "a", "c", "d"]
    assert [c.scores.get("rerank") for c in outcome.kept] == [0.9, 0.1, None, None]
    assert outcome.score_key == "rerank" and outcome.skipped is None


def test_rerank_ties_keep_previous_order_and_min_score_drops() -> None:
    scorer = FakeScorer({"A": 1.0, "B": 1.0, "C": -3.1, "D": 0.0})
    stage = RerankStage(RerankSettings(top_n=10, min_score=0.0), scorer)
    outcome = stage.run(
        ctx(), [cand("a", text="A"), cand("c", text="C"), cand("b", text="B"), cand("d", text="D")]
    )
    assert ids(outcome.kept) == ["a", "b", "d"]  # d at exactly min_score is kept
    assert reasons(outcome) == {"c": "rerank=-3.10 < 0.00"}


def test_rerank_scorer_without_scores_or_wrong_count() -> None:
    candidates = [cand("a"), cand("b")]
    outcome = RerankStage(RerankSettings(), FakeScorer(result=None)).run(ctx(), candidates)
    assert outcome.kept == candidates and outcome.skipped == "skipped: the reranker returned no scores"
    with pytest.raises(RuntimeError, match="1 scores for 2 passages"):
        RerankStage(RerankSettings(), FakeScorer(result=[1.0])).run(ctx(), candidates)
    with pytest.raises(TypeError, match="score"):
        RerankStage(RerankSettings(), object())


# --- diversity ------------------------------------------------------------------------------------------


def test_diversity_exact_duplicates_by_normalised_text() -> None:
    stage = DiversityStage(DiversitySettings(max_cosine=None))
    candidates = [
        cand("a", text="Hello  World\n"),
        cand("b", text="hello world"),
        cand("c", text="ＨＥＬＬＯ world"),  # NFKC folds full-width
        cand("d", text="Hello, World"),
    ]
    outcome = stage.run(ctx(), candidates)
    assert ids(outcome.kept) == ["a", "d"]
    assert reasons(outcome) == {"b": "duplicate of a (same text)", "c": "duplicate of a (same text)"}


def section(chunk_id: str, doc_id: str, doc_sha256: str | None, text: str | None = None) -> Candidate:
    meta = {} if doc_sha256 is None else {"doc_sha256": doc_sha256}
    return Candidate(chunk_id, doc_id, text or f"section {chunk_id}", meta, None, {})


def test_diversity_drops_chunks_of_a_copied_document_whatever_their_section() -> None:
    stage = DiversityStage(DiversitySettings(max_cosine=None, max_per_document=None))
    candidates = [
        section("vpn-1", "it-vpn-setup", "h-vpn", "When you need the VPN"),
        section("other", "it-wifi", "h-wifi"),
        section("mirror-3", "it-vpn-setup-mirror", "h-vpn", "Troubleshooting"),  # another section
        section("vpn-2", "it-vpn-setup", "h-vpn", "Installing the client"),  # the kept document itself
        section("mirror-1", "it-vpn-setup-mirror", "h-vpn", "When you need the VPN"),  # also the same text
        section("legacy", "no-hash-doc", None),  # a chunk without doc_sha256: rule skipped
        section("legacy-2", "no-hash-doc-2", None),
    ]
    outcome = stage.run(ctx(), candidates)
    assert ids(outcome.kept) == ["vpn-1", "other", "vpn-2", "legacy", "legacy-2"]
    assert reasons(outcome) == {
        "mirror-3": "copy of doc it-vpn-setup",
        "mirror-1": "duplicate of vpn-1 (same text)",  # rule 1 comes first
    }


def test_diversity_keeps_the_copy_that_ranks_first() -> None:
    stage = DiversityStage(DiversitySettings(max_cosine=None))
    outcome = stage.run(ctx(), [section("m", "it-vpn-setup-mirror", "h"), section("v", "it-vpn-setup", "h")])
    assert ids(outcome.kept) == ["m"]
    assert reasons(outcome) == {"v": "copy of doc it-vpn-setup-mirror"}


def test_diversity_document_copies_rule_can_be_switched_off() -> None:
    stage = DiversityStage(DiversitySettings(max_cosine=None, drop_document_copies=False))
    outcome = stage.run(ctx(), [section("v", "it-vpn-setup", "h"), section("m", "it-vpn-setup-mirror", "h")])
    assert ids(outcome.kept) == ["v", "m"]


def test_diversity_near_duplicates_by_cosine() -> None:
    stage = DiversityStage(DiversitySettings(max_cosine=0.97))
    close = [0.99, np.sqrt(1 - 0.99**2)]
    candidates = [
        cand("a", embedding=[1.0, 0.0]),
        cand("b", embedding=[0.0, 1.0]),
        cand("c", embedding=close),
        cand("d"),  # no embedding: no cosine check
        cand("e", embedding=[0.0, 3.0]),  # not unit length: still cosine 1.0 with b
    ]
    outcome = stage.run(ctx(), candidates)
    assert ids(outcome.kept) == ["a", "b", "d"]
    assert reasons(outcome) == {"c": "cosine=0.99 > 0.97 with a", "e": "cosine=1.00 > 0.97 with b"}


def test_diversity_cosine_equal_to_max_is_kept() -> None:
    stage = DiversityStage(DiversitySettings(max_cosine=0.0))
    outcome = stage.run(ctx(), [cand("a", embedding=[1.0, 0.0]), cand("b", embedding=[0.0, 1.0])])
    assert ids(outcome.kept) == ["a", "b"]


def test_diversity_caps_per_source() -> None:
    stage = DiversityStage(DiversitySettings(max_cosine=None, max_per_source=2))
    candidates = [
        cand("a", source="s1"),
        cand("b", source="s1"),
        cand("c"),
        cand("d"),
        cand("e", source="s1"),
    ]
    outcome = stage.run(ctx(), candidates)
    assert ids(outcome.kept) == ["a", "b", "c", "d"]  # no source: not capped
    assert reasons(outcome) == {"e": "source=s1 already has 2"}


def test_diversity_mmr_reorders_and_never_removes() -> None:
    stage = DiversityStage(DiversitySettings(max_cosine=None, mmr=True, mmr_lambda=0.5))
    a = cand("a", embedding=[1.0, 0.0])
    b = cand("b", embedding=[1.0, 0.0], text="other")
    c = cand("c", embedding=[0.0, 1.0])
    for candidate, fused in ((a, 1.0), (b, 0.9), (c, 0.5)):
        candidate.scores.update({"dense": 0.5, "fused": fused})
    outcome = stage.run(ctx(), [a, b, c])
    # relevance min-max over fused: a=1, b=0.8, c=0. After a: b = 0.5*0.8 - 0.5*1 = -0.1 < c = 0.5*0 - 0.5*0
    assert ids(outcome.kept) == ["a", "c", "b"] and outcome.removed == []


def test_diversity_mmr_leaves_candidates_without_the_latest_score_after() -> None:
    stage = DiversityStage(DiversitySettings(max_cosine=None, mmr=True, mmr_lambda=0.5))
    a, b, c = cand("a", 0.9, embedding=[1, 0]), cand("b", 0.8, embedding=[1, 0], text="x"), cand("c", 0.7)
    a.scores["rerank"], b.scores["rerank"] = 2.0, 1.0
    outcome = stage.run(ctx(), [c, a, b])
    assert ids(outcome.kept) == ["a", "b", "c"]  # c has no rerank score: it stays after the reranked ones


# --- fallback -------------------------------------------------------------------------------------------


def raw_pool() -> list[Candidate]:
    return [cand("a", 0.9), cand("b", 0.8), cand("c", 0.95), cand("d", 0.7), cand("e", 0.85)]


def test_fallback_refills_best_dense_first_but_not_hard_filtered() -> None:
    raw = raw_pool()
    query = ctx(
        raw_candidates=raw, removed_by_stage={"hard_filter": [Removal("c", "doc-c", "status=retired")]}
    )
    outcome = FallbackStage(FallbackSettings(min_results=3)).run(query, [raw[1]])
    assert ids(outcome.added) == ["a", "e"]  # c is best, but the hard filter removed it
    assert ids(outcome.kept) == ["b", "a", "e"]
    assert outcome.removed == []


def test_fallback_when_not_needed_or_disabled() -> None:
    raw = raw_pool()
    enough = FallbackStage(FallbackSettings(min_results=1)).run(ctx(raw_candidates=raw), [raw[3]])
    assert ids(enough.kept) == ["d"] and enough.added == []
    disabled = FallbackStage(FallbackSettings(enabled=False, min_results=5)).run(ctx(raw_candidates=raw), [])
    assert disabled.kept == [] and disabled.added == []


def test_fallback_adds_what_there_is() -> None:
    raw = raw_pool()[:2]
    outcome = FallbackStage(FallbackSettings(min_results=5)).run(ctx(raw_candidates=raw + raw), [])
    assert ids(outcome.kept) == ["a", "b"]  # each raw candidate at most once


# --- the invariant: a stage never invents or loses a candidate -------------------------------------------

VECTORS = [None, [1.0, 0.0], [0.0, 1.0], [0.999, 0.0447], [0.6, 0.8]]


@st.composite
def candidate_lists(draw) -> list[Candidate]:
    chunk_ids = draw(st.lists(st.text("abcdefgh", min_size=1, max_size=3), unique=True, max_size=12))
    out = []
    for chunk_id in chunk_ids:
        metadata = {
            "knowledge": draw(st.sampled_from([None, "hr", "finance"])),
            "status": draw(st.sampled_from([None, "active", "retired"])),
            "source": draw(st.sampled_from(["", "s1", "s2"])),
            "effectiveTo": draw(st.sampled_from([None, "2023-01-01", "2030-01-01", "junk"])),
        }
        text = draw(st.sampled_from(["same text", "Same  text", "other", "x", "a longer passage"]))
        dense = draw(st.one_of(st.none(), st.floats(-1, 1)))
        out.append(cand(chunk_id, dense, text=text, embedding=draw(st.sampled_from(VECTORS)), **metadata))
    return out


def every_stage_but_fallback(lexical: dict[str, float], rerank: dict[str, float]):
    yield SimilarityThresholdStage(SimilarityThresholdSettings(min_dense=0.1, per_knowledge_tag={"hr": 0.5}))
    yield HardFilterStage(HardFilterSettings(denied_sources=["s2"], min_text_chars=3))
    yield Bm25Stage(Bm25Settings(min_score=0.5), FakeIndex(lexical))
    yield Bm25Stage(Bm25Settings(fusion="weighted"), FakeIndex(lexical))
    yield RerankStage(RerankSettings(top_n=3, min_score=0.0), FakeScorer(rerank))
    yield RerankStage(RerankSettings(), None)
    yield DiversityStage(DiversitySettings(max_per_source=2, mmr=True))


@settings(max_examples=150, deadline=None)
@given(
    candidates=candidate_lists(),
    lexical=st.dictionaries(st.text("abcdefgh", min_size=1, max_size=3), st.floats(0, 10)),
    rerank=st.dictionaries(st.sampled_from(["same text", "other", "x"]), st.floats(-5, 5)),
    tag=st.sampled_from([None, "hr"]),
)
def test_stages_never_invent_or_lose_candidates(candidates, lexical, rerank, tag) -> None:
    query = ctx(knowledge_tag=tag, raw_candidates=list(candidates))
    by_id = {c.chunk_id: c for c in candidates}
    for stage in every_stage_but_fallback(lexical, rerank):
        outcome = stage.run(query, list(candidates))
        assert Counter(ids(outcome.kept)) + Counter(r.chunk_id for r in outcome.removed) == Counter(
            ids(candidates)
        ), stage.name
        assert outcome.added == []
        for kept in outcome.kept:
            original = by_id[kept.chunk_id]
            assert (kept.doc_id, kept.text, kept.metadata) == (
                original.doc_id,
                original.text,
                original.metadata,
            )
        for removal in outcome.removed:
            assert removal.doc_id == by_id[removal.chunk_id].doc_id and removal.reason


@settings(max_examples=100, deadline=None)
@given(candidates=candidate_lists(), keep=st.integers(0, 12), min_results=st.integers(0, 15))
def test_fallback_only_adds(candidates, keep, min_results) -> None:
    current = candidates[:keep]
    outcome = FallbackStage(FallbackSettings(min_results=min_results)).run(
        ctx(raw_candidates=candidates), current
    )
    assert outcome.removed == [] and outcome.kept[: len(current)] == current
    assert outcome.kept[len(current) :] == outcome.added
    assert len(outcome.kept) == max(len(current), min(min_results, len(candidates)))


@pytest.mark.parametrize(
    ("metadata", "kind"),
    [
        ({}, None),
        ({"status": "active"}, None),
        ({"status": " Draft "}, "status=draft"),
        ({"status": "retired"}, "status=retired"),
        ({"effectiveFrom": "2024-05-02"}, "not yet effective"),
        ({"effectiveTo": "2024-04-30"}, "no longer effective"),
        ({"effectiveTo": "soon"}, "effective date unparseable"),
        ({"effectiveFrom": "2024-05-01", "effectiveTo": "2024-05-01"}, None),
        ({"source": "wiki.md"}, "source denied"),
        # a document of another tag, or a short one, hides nothing: the kind is the hiding rule's, whatever
        # rule removed the chunk first
        ({"knowledge": "hr"}, None),
        ({"knowledge": "hr", "status": "draft"}, "status=draft"),
    ],
)
def test_hard_filter_withheld_names_the_rule_that_hides_a_document_not_the_document(
    metadata: dict, kind: str | None
) -> None:
    stage = HardFilterStage(HardFilterSettings(denied_sources=["wiki.md"], min_text_chars=20))
    assert stage.withheld(ctx(knowledge_tag="finance"), cand("a", 0.9, text="short", **metadata)) == kind


def test_hard_filter_withheld_follows_its_settings() -> None:
    stage = HardFilterStage(HardFilterSettings(check_effective_dates=False, excluded_statuses=[]))
    assert stage.withheld(ctx(), cand("a", status="draft", effectiveTo="1999-01-01")) is None
