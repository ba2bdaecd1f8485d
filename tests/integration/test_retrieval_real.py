"""The whole retrieval path with the real e5 embedder over the sample knowledge base in an embedded Chroma.

One Sieve is opened and the sample base ingested once for the module (about 20 s); variants of the chain
(other thresholds, fallback on or off) reuse its embedder and store.
"""

from __future__ import annotations

import time

import pytest

from app.models import load_reranker
from app.retrieval.stages.rerank import SKIPPED_NO_MODEL
from app.service import Sieve
from app.settings import IngestSettings, RagSettings, Settings, StoreSettings, merge, nested
from tests.conftest import REPO
from tests.fixtures.tiny_models import tiny_cross_encoder_dir  # noqa: F401  (a session fixture)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KNOWLEDGE_BASE = REPO / "golden_set" / "knowledge-base"
STAGES = ["similarity_threshold", "hard_filter", "bm25", "rerank", "diversity", "fallback"]


@pytest.fixture(scope="module")
def sieve(tmp_path_factory, e5_settings):
    rag = RagSettings(
        models=e5_settings,
        store=StoreSettings(path=str(tmp_path_factory.mktemp("retrieval-real") / "chroma")),
        ingest=IngestSettings(paths=[str(KNOWLEDGE_BASE)]),
    )
    opened = Sieve.open(Settings(rag=rag))
    report = opened.ingest([KNOWLEDGE_BASE])
    assert report.errors == [] and report.added == report.chunks > 0
    yield opened
    opened.close()


def variant(base: Sieve, *overrides: dict) -> Sieve:
    """The same models and store with other chain settings (the store stays owned by `base`)."""
    rag = RagSettings.model_validate(merge(base.settings.rag.model_dump(), *(o["rag"] for o in overrides)))
    return base.with_settings(Settings(rag=rag))


def doc_ids(result) -> list[str]:
    return [d.doc_id for d in result.documents]


def test_chinese_payroll_question_finds_the_chinese_payroll_document_first(sieve):
    assert doc_ids(sieve.retrieve("工资什么时候发"))[0] == "hr-payroll-zh"


def test_english_payroll_question_finds_the_english_payroll_document(sieve):
    # Observed: rank 1 (dense 0.903 against 0.895 for hr-performance-review-en, which is second).
    assert doc_ids(sieve.retrieve("When is salary paid?"))[0] == "hr-payroll-en"


def test_the_retired_travel_standard_is_removed_by_hard_filter_with_its_reason(sieve):
    result = sieve.retrieve("出差住宿标准是多少")
    hard_filter = next(s for s in result.trace.stages if s.name == "hard_filter")
    retired = [r for r in hard_filter.removed if r.doc_id == "travel-expense-2022"]
    assert retired, "the 2022 standard should be a candidate for a travel question"
    assert {r.reason for r in retired} == {"status=retired"}
    assert "travel-expense-2022" not in {c.doc_id for c in result.documents}
    assert doc_ids(result)[0] == "travel-expense-2024"  # the standard in force answers instead


def test_the_trace_has_every_stage_in_order_with_consistent_counts(sieve):
    result = sieve.retrieve("年假怎么申请", top_k=5)
    stages = result.trace.stages
    assert [s.name for s in stages] == STAGES
    assert stages[0].input_count == result.original_count == len(result.raw_candidates) > 0
    for before, after in zip(stages, stages[1:], strict=False):
        assert after.input_count == before.output_count, (before.name, after.name)
    for stage in stages:
        assert stage.output_count == stage.input_count - len(stage.removed) + len(stage.added), stage.name
    assert len(result.documents) == min(5, stages[-1].output_count)
    assert list(result.trace.ranked_after) == ["candidates", *STAGES]


def test_rerank_without_a_model_is_skipped_and_says_so(sieve):
    rerank = next(s for s in sieve.retrieve("VPN 怎么连").trace.stages if s.name == "rerank")
    assert rerank.skipped == SKIPPED_NO_MODEL == "skipped: no reranker model"
    assert rerank.input_count == rerank.output_count and rerank.removed == []


def test_a_configured_cross_encoder_rescores_the_top_n_in_the_chain(sieve, tiny_cross_encoder_dir):  # noqa: F811
    """A tiny random cross-encoder (plumbing only): the stage runs, rescores exactly top_n, sorts them by
    its score, and leaves the rest in fused order."""
    rag = RagSettings.model_validate(
        merge(
            sieve.settings.rag.model_dump(),
            nested("rag.chain.rerank.model", str(tiny_cross_encoder_dir))["rag"],
            nested("rag.chain.rerank.top_n", 4)["rag"],
            nested("rag.chain.diversity.enabled", False)["rag"],
        )
    )
    reranked = Sieve(
        Settings(rag=rag), sieve.embedder, sieve.store, load_reranker(rag.chain.rerank), sieve.lexical
    )
    result = reranked.retrieve("VPN 怎么连", top_k=10)
    bm25, rerank = (next(s for s in result.trace.stages if s.name == n) for n in ("bm25", "rerank"))
    assert rerank.skipped is None and rerank.score_key == "rerank"
    assert (rerank.input_count, rerank.output_count, rerank.removed) == (
        bm25.output_count,
        bm25.output_count,
        [],
    )
    fused_order = result.trace.ranked_after["bm25"]
    after = result.trace.ranked_after["rerank"]
    assert sorted(after[:4]) == sorted(fused_order[:4]) and after[4:] == fused_order[4:]
    head = result.documents[:4]
    assert all("rerank" in d.scores for d in head)
    assert [d.scores["rerank"] for d in head] == sorted((d.scores["rerank"] for d in head), reverse=True)
    assert all("rerank" not in d.scores for d in result.documents[4:])


def test_a_knowledge_tag_keeps_only_that_tag(sieve):
    result = sieve.retrieve("年假怎么申请", top_k=10, knowledge_tag="hr")
    assert result.documents
    assert {d.metadata["knowledge"] for d in result.documents} == {"hr"}
    assert {d.metadata["knowledge"] for d in result.raw_candidates} == {"hr"}
    assert doc_ids(result)[0] == "hr-annual-leave-zh"


def test_an_unknown_knowledge_tag_gives_no_documents_not_an_error(sieve):
    result = sieve.retrieve("年假怎么申请", knowledge_tag="no-such-tag")
    assert (result.documents, result.original_count, result.fallback_used) == ([], 0, False)
    assert [s.name for s in result.trace.stages] == STAGES


def test_a_high_threshold_without_fallback_returns_nothing(sieve):
    strict = variant(
        sieve,
        nested("rag.chain.similarity_threshold.min_dense", 0.99),
        nested("rag.chain.fallback.enabled", False),
    )
    result = strict.retrieve("工资什么时候发")
    assert (result.documents, result.fallback_used) == ([], False)
    threshold, *_, fallback = result.trace.stages
    assert threshold.output_count == 0 and len(threshold.removed) == result.original_count
    assert all(r.reason.startswith("dense=") and r.reason.endswith("< 0.99") for r in threshold.removed)
    assert (fallback.enabled, fallback.skipped) == (False, "disabled in config")


def test_a_high_threshold_with_fallback_refills_and_says_so(sieve):
    refilled = variant(
        sieve,
        nested("rag.chain.similarity_threshold.min_dense", 0.99),
        nested("rag.chain.fallback.enabled", True),
        nested("rag.chain.fallback.min_results", 2),
    )
    result = refilled.retrieve("工资什么时候发")
    assert result.fallback_used is True
    fallback = result.trace.stages[-1]
    assert (fallback.input_count, fallback.output_count, len(fallback.added)) == (0, 2, 2)
    assert [d.chunk_id for d in result.documents] == fallback.added
    assert result.documents[0].doc_id == "hr-payroll-zh"  # the best raw candidate by dense score
    assert "travel-expense-2022" not in doc_ids(result)  # never refilled from what hard_filter removed


def test_fallback_never_refills_a_retired_document(sieve):
    refilled = variant(
        sieve,
        nested("rag.chain.similarity_threshold.min_dense", 0.99),
        nested("rag.chain.fallback.min_results", 3),
    )
    result = refilled.retrieve("国内差旅费用标准（2022版）住宿标准")
    assert result.fallback_used is True
    assert "travel-expense-2022" in {c.doc_id for c in result.raw_candidates}
    assert "travel-expense-2022" not in doc_ids(result)


def test_with_settings_shares_the_bm25_index_unless_its_parameters_change(sieve):
    assert variant(sieve, nested("rag.chain.bm25.rrf_k", 10)).lexical is sieve.lexical
    rebuilt = variant(sieve, nested("rag.chain.bm25.k1", 0.9))
    assert rebuilt.lexical is not sieve.lexical
    assert rebuilt.lexical.ids == sieve.lexical.ids


def test_candidate_k_zero_gives_lexical_candidates_only(sieve):
    lexical_only = variant(
        sieve,
        nested("rag.retrieval.candidate_k", 0),
        nested("rag.chain.bm25.dense_weight", 0.0),
        nested("rag.chain.diversity.enabled", False),
    )
    result = lexical_only.retrieve("工资什么时候发", top_k=3)
    assert result.trace.candidate_origins == {"dense": 0, "bm25": result.original_count, "both": 0}
    assert 0 < result.original_count <= lexical_only.settings.rag.retrieval.bm25_candidate_k
    top = sieve.lexical.top("工资什么时候发", 3)
    assert [round(d.scores["bm25"], 6) for d in result.documents] == [round(s, 6) for _, s in top]
    assert result.documents[0].doc_id == "hr-payroll-zh"


def test_a_copy_of_the_vpn_guide_under_another_id_is_dropped_as_a_copy(sieve):
    """it-vpn-setup-mirror is the VPN guide under another id and source: none of its sections is returned
    beside the original, not even one ranking below it."""
    result = sieve.retrieve("How do I connect to the VPN when working from home?")
    ranked = doc_ids(result)
    # the two score alike (the same text): whichever ranks first is kept, the other dropped as its copy
    pair = {"it-vpn-setup", "it-vpn-setup-mirror"}
    kept = pair & set(ranked)
    assert len(kept) == 1, ranked
    (original,) = kept
    diversity = next(s for s in result.trace.stages if s.name == "diversity")
    copies = [r for r in diversity.removed if r.reason == f"copy of doc {original}"]
    assert copies and {r.doc_id for r in copies} == pair - kept
    keep_copies = variant(sieve, nested("rag.chain.diversity.drop_document_copies", False))
    assert "it-vpn-setup-mirror" in doc_ids(
        keep_copies.retrieve("How do I connect to the VPN when working from home?")
    )


def test_every_chunk_of_the_two_vpn_copies_has_the_same_document_hash(sieve):
    stored = list(sieve.store.iter_all(include_text=False))
    hashes = {
        doc: {c.metadata["doc_sha256"] for c in stored if c.metadata["doc_id"] == doc}
        for doc in ("it-vpn-setup", "it-vpn-setup-mirror")
    }
    assert len(hashes["it-vpn-setup"]) == 1 and hashes["it-vpn-setup"] == hashes["it-vpn-setup-mirror"]
    assert len({c.metadata["doc_sha256"] for c in stored}) == len({c.metadata["doc_id"] for c in stored}) - 1


def test_a_knowledge_tag_restricts_the_bm25_candidates_of_the_real_index(sieve):
    tags = {c.chunk_id: c.metadata.get("knowledge") for c in sieve.store.iter_all(include_text=False)}
    for tag in ("hr", "it"):
        top = sieve.lexical.top("VPN password salary", 10, knowledge_tag=tag)
        assert top and {tags[chunk_id] for chunk_id, _ in top} == {tag}
        scores = sieve.lexical.scores("VPN password salary", [chunk_id for chunk_id, _ in top])
        assert dict(top) == scores  # the same scores as without the tag
    result = sieve.retrieve("How do I connect to the VPN when working from home?", knowledge_tag="it")
    assert {d.knowledge_tag for d in result.documents} == {"it"}
    assert result.trace.candidate_origins["both"] > 0  # BM25 still found it-tagged candidates


def test_queries_on_an_embedded_store_never_read_the_change_log(sieve, monkeypatch):
    # The process holds the embedded store's lock: no other process can write, so there is nothing to catch
    # up with (its own writes reach the index through on_commit).
    reads = []
    real = sieve.store.changes_since
    monkeypatch.setattr(sieve.store, "changes_since", lambda stamp: reads.append(stamp) or real(stamp))
    sieve.retrieve("出差住宿标准", 5)
    time.sleep(sieve.settings.rag.lexical.refresh_seconds + 0.1)  # past a Chroma server's check interval
    sieve.retrieve("VPN setup", 5)

    assert reads == []
