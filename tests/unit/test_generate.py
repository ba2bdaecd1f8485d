"""`sieve golden generate`'s parts with fakes: picking (stratification, skips, determinism), the offline
questions, the round trip, the cases and the out file."""

from __future__ import annotations

import json
import math
from collections import Counter
from datetime import date
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.evaluation.golden.authoring import generate as gen
from app.evaluation.golden.authoring.generate import (
    CorpusIdf,
    GenerateError,
    GenerateOptions,
    LlmGenerator,
    OfflineGenerator,
    Passage,
    Question,
    case_id,
    pick_passages,
)
from app.evaluation.golden.authoring.literalness import literalness
from app.evaluation.golden.cases import load_golden_set
from app.lexical.index import Analyzer
from app.settings import HardFilterSettings

ANALYZER = Analyzer()
TEXT = "A passage with enough text in it to be picked by the generator."


def passage(chunk_id, doc_id, tag=None, text=TEXT, heading="Title > Section", position=0, **meta) -> Passage:
    metadata = {
        "doc_id": doc_id,
        "title": heading.split(" > ")[0],
        "heading_path": heading,
        "position": position,
    }
    if tag is not None:
        metadata["knowledge"] = tag
    metadata.update(meta)
    return Passage.of(chunk_id, text, metadata)


def keep_all(p: Passage) -> None:
    return None


# -- Passage -----------------------------------------------------------------------------------------------


def test_passage_of_a_stored_chunk_has_the_indexed_text() -> None:
    p = passage("c1", "hr-pay", "hr", text="每月10日发放。", heading="工资发放制度 > 发薪日", position=3)
    assert (p.doc_id, p.knowledge_tag, p.position, p.title) == ("hr-pay", "hr", 3, "工资发放制度")
    assert p.heading_path == ("工资发放制度", "发薪日")
    # embedding_text: the title, headings after it (the repeated title skipped), then the text
    assert p.indexed_text == "工资发放制度 › 发薪日\n\n每月10日发放。"


# -- picking -----------------------------------------------------------------------------------------------


def corpus() -> list[Passage]:
    return [
        *[passage(f"a1-{i}", "a1", "A", position=i) for i in range(3)],
        passage("a2-0", "a2", "A"),
        *[passage(f"b1-{i}", "b1", "B", position=i) for i in range(2)],
        passage("u1-0", "u1", None),
    ]


def test_round_robin_over_tags_first() -> None:
    picked = pick_passages(corpus(), 3, seed=7, min_chars=10, exclude=keep_all).passages
    # three groups (A, B, untagged): the first round takes one passage of each
    assert Counter(p.knowledge_tag for p in picked) == {"A": 1, "B": 1, None: 1}


def test_round_robin_over_documents_within_a_tag() -> None:
    picked = pick_passages(corpus(), 5, seed=7, min_chars=10, exclude=keep_all).passages
    # rounds: (A, B, none), then (A, B) while "none" is spent; A's two takes are one from each of a1, a2
    assert Counter(p.knowledge_tag for p in picked) == {"A": 2, "B": 2, None: 1}
    assert {p.doc_id for p in picked if p.knowledge_tag == "A"} == {"a1", "a2"}


def test_asking_for_more_than_there_is_takes_everything_once() -> None:
    pick = pick_passages(corpus(), 100, seed=1, min_chars=10, exclude=keep_all)
    assert sorted(p.chunk_id for p in pick.passages) == sorted(p.chunk_id for p in corpus())
    assert pick.eligible == 7


def test_the_same_seed_picks_the_same_passages() -> None:
    def ids(seed: int) -> list[str]:
        return [p.chunk_id for p in pick_passages(corpus(), 4, seed, 10, keep_all).passages]

    assert ids(3) == ids(3)
    assert ids(3) == [
        p.chunk_id for p in pick_passages(list(reversed(corpus())), 4, 3, 10, keep_all).passages
    ]


@given(
    st.lists(st.tuples(st.sampled_from(["A", "B", "C", None]), st.integers(0, 4)), min_size=1, max_size=30),
    st.integers(1, 40),
    st.integers(0, 1000),
)
def test_picks_are_balanced_over_tags(chunks, n, seed) -> None:
    """Distinct passages; min(n, eligible) of them; two tags' counts differ by at most 1 unless the smaller
    one ran out of passages."""
    passages = [passage(f"c{i}", f"{tag}-d{doc}", tag, position=i) for i, (tag, doc) in enumerate(chunks)]
    picked = pick_passages(passages, n, seed, 10, keep_all).passages
    assert len({p.chunk_id for p in picked}) == len(picked) == min(n, len(passages))
    available = Counter(p.knowledge_tag for p in passages)
    taken = Counter(p.knowledge_tag for p in picked)
    for tag in available:
        for other in available:
            if taken[tag] + 1 < taken[other]:
                assert taken[tag] == available[tag]


def test_skips_what_the_hard_filter_excludes_copies_and_short_chunks() -> None:
    passages = [
        passage("ok", "hr-pay", "hr", status="active", doc_sha256="s1"),
        passage("old", "travel-2022", "travel", status="retired", doc_sha256="s2"),
        passage("draft", "hr-remote-draft", "hr", status="draft", doc_sha256="s3"),
        passage("future", "pw-v3", "security", effectiveFrom="2099-01-01", doc_sha256="s4"),
        passage("vpn", "it-vpn", "it", doc_sha256="same"),
        passage("mirror", "it-vpn-mirror", "it", doc_sha256="same"),
        passage("short", "it-wifi", "it", text="Too short.", doc_sha256="s5"),
    ]
    rule = gen.hard_filter_rule(HardFilterSettings(), date(2026, 12, 1))
    pick = pick_passages(passages, 10, 0, min_chars=20, exclude=rule)
    assert sorted(p.chunk_id for p in pick.passages) == ["ok", "vpn"]
    assert pick.skipped == {
        "the hard filter excludes it": 3,
        "its document copies another": 1,
        "under 20 characters of text": 1,
    }
    assert pick.excluded_documents == {
        "travel-2022": "status=retired",
        "hr-remote-draft": "status=draft",
        "pw-v3": "effectiveFrom=2099-01-01 > today=2026-12-01",
    }
    assert pick.copies == {"it-vpn-mirror": "it-vpn"}


def test_the_hard_filter_rules_apply_even_when_the_stage_is_off() -> None:
    rule = gen.hard_filter_rule(HardFilterSettings(enabled=False), date(2026, 12, 1))
    assert rule(passage("old", "d", status="retired")) == "status=retired"


# -- offline questions --------------------------------------------------------------------------------------


def test_corpus_idf_is_bm25okapis() -> None:
    idf = CorpusIdf.of([["a", "b"], ["a", "a"], ["c"]])
    assert (idf.n, idf.df) == (3, {"a": 2, "b": 1, "c": 1})
    assert idf.idf("b") == math.log(3 - 1 + 0.5) - math.log(1 + 0.5)
    assert idf.idf("a") == math.log(3 - 2 + 0.5) - math.log(2 + 0.5)
    assert idf.idf("zzz") == math.log(3 - 0 + 0.5) - math.log(0 + 0.5)


def offline(passages: list[Passage], key_terms: int = 3, seed: int = 42) -> OfflineGenerator:
    idf = CorpusIdf.of(ANALYZER.tokens(p.indexed_text) for p in passages)
    return OfflineGenerator(ANALYZER.tokens, idf, seed=seed, key_terms=key_terms)


def test_heading_questions_per_language() -> None:
    zh = passage("z", "hr-pay", "hr", text="每月10日发放上月工资。", heading="工资发放制度 > 发薪日")
    en = passage(
        "e",
        "it-vpn",
        "it",
        text="Open the client and sign in.",
        heading="VPN Setup Guide > Installing the client",
    )
    g = offline([zh, en])
    assert g.heading_question(zh) in {
        "工资发放制度中关于发薪日有什么规定？",
        "工资发放制度里，发薪日是怎么规定的？",
    }
    # the heading's capital goes ("Installing" -> "installing"), the title's stays
    assert g.heading_question(en) in {
        "What does the VPN Setup Guide say about installing the client?",
        "What are the rules for installing the client in the VPN Setup Guide?",
    }


def test_no_heading_question_under_a_generic_heading_and_the_title_alone_before_any_section() -> None:
    faq = passage(
        "f", "hr-pay", "hr", text="问：工资几点到账？答：18:00前。", heading="工资发放制度 > 常见问题"
    )
    intro = passage("i", "hr-pay", "hr", text="本制度适用于全体员工。", heading="工资发放制度")
    g = offline([faq, intro])
    assert g.heading_question(faq) is None
    assert g.heading_question(intro) == "工资发放制度有哪些规定？"


def test_key_terms_are_the_highest_tf_idf_terms_as_written_in_text_order() -> None:
    target = passage("t", "d1", text="Contractors renew badges. Badges expire yearly; renew badges early.")
    others = [
        passage("o1", "d2", text="Contractors must renew the parking permit."),
        passage("o2", "d3", text="Permits renew early."),
    ]
    g = offline([target, *others], key_terms=2)
    # terms of the target (Snowball stems): contractor, renew, badg (x3), expir, year, earli.
    # df over the three indexed texts: badg 1, expir 1, year 1, contractor 2, renew 3, earli 2;
    # tf * idf: badg 3 * (ln 2.5 - ln 1.5) is the largest; expir and year tie at 1 * (ln 2.5 - ln 1.5),
    # and the longer term wins a tie ("expir" 5 letters > "year" 4); shown in text order, as written
    assert g.key_terms_of(target) == ["badges", "expire"]
    assert g.terms_question(target) in {
        "What does the policy say about badges and expire?",
        "What are the rules on badges and expire?",
    }


def test_a_chinese_key_term_inside_a_longer_one_is_passed_over() -> None:
    target = passage("t", "d1", text="服务器采购需先经过技术评估。")
    g = offline([target, passage("o", "d2", text="采购电脑。")], key_terms=2)
    terms = g.key_terms_of(target)
    # jieba's search mode yields 服务 beside 服务器: only the longer one may be chosen
    assert "服务器" in terms and "服务" not in terms
    assert g.terms_question(target) in {
        f"{terms[0]}和{terms[1]}有什么规定？",
        f"关于{terms[0]}和{terms[1]}，有哪些规定？",
    }


def test_passages_alternate_which_kind_comes_first_and_per_chunk_gives_both() -> None:
    p = passage("p", "hr-pay", "hr", text="每月10日发放上月工资。", heading="工资发放制度 > 发薪日")
    g = offline([p])
    assert [q.generator for q in g.questions(p, 0, 1)] == ["offline:heading"]
    assert [q.generator for q in g.questions(p, 1, 1)] == ["offline:terms"]
    assert [q.generator for q in g.questions(p, 0, 2)] == ["offline:heading", "offline:terms"]


def test_surface_forms_lowercase_a_word_only_seen_starting_a_sentence() -> None:
    forms = gen.surface_forms(
        "Older claims wait. Policies of VPN apply to older laptops. VPN users.", ANALYZER.tokens
    )
    assert forms["older"] == "older"  # seen inside a sentence as written
    assert forms["polici"] == "policies"  # only starts a sentence: first letter lowered
    assert forms["vpn"] == "VPN"


# -- the round trip and the cases ---------------------------------------------------------------------------


class FakeSearcher:
    def __init__(self, bm25: dict[str, list[str]], dense: dict[str, list[str]]):
        self.bm25, self.dense, self.asked = bm25, dense, []

    def bm25_top(self, queries, k):
        self.asked.append(("bm25", list(queries), k))
        return [self.bm25.get(q, [])[:k] for q in queries]

    def dense_top(self, queries, k):
        self.asked.append(("dense", list(queries), k))
        return [self.dense.get(q, [])[:k] for q in queries]


class CannedQuestions:
    def __init__(self, by_chunk: dict[str, list[str]]):
        self.by_chunk = by_chunk

    def questions(self, passage, ordinal, count):
        return [Question(q, "offline:terms") for q in self.by_chunk.get(passage.chunk_id, [])][:count]


def three_passages() -> list[Passage]:
    return [
        passage("c1", "hr-pay", "hr", text="Payday is the 10th of each month, by bank transfer."),
        passage("c2", "it-vpn", "it", text="Install the VPN client before travelling abroad."),
        passage("c3", "fac-park", "facilities", text="Parking permits are issued by the front desk."),
    ]


def test_either_keeps_a_passage_found_by_one_search_both_needs_both() -> None:
    questions = CannedQuestions({"c1": ["when is payday"], "c2": ["vpn before a trip"], "c3": ["permits"]})
    searcher = FakeSearcher(
        bm25={"when is payday": ["x", "c1"], "vpn before a trip": ["c2"], "permits": ["x"]},
        dense={"when is payday": ["c1"], "vpn before a trip": ["x"], "permits": ["y"]},
    )
    for rule, kept, dropped in [
        ("either", ["c1", "c2"], {"passage in neither the BM25 nor the dense top 20": 1}),
        (
            "both",
            ["c1"],
            {"passage not in both top 20 (BM25 only)": 1, "passage not in both top 20 (neither)": 1},
        ),
    ]:
        result = gen.generate(
            three_passages(),
            questions,
            searcher,
            ANALYZER.tokens,
            GenerateOptions(chunks=3, round_trip=rule),
            keep_all,
        )
        assert [c["passageChunkId"] for c in sorted(result.cases, key=lambda c: c["passageChunkId"])] == kept
        assert result.dropped == dropped
        assert result.found == {"both": 1, "BM25 only": 1, "neither": 1}
    assert searcher.asked[0] == ("bm25", searcher.asked[0][1], 20)  # the top 20, one batch


def test_a_kept_case_has_every_field_and_loads_as_a_golden_case(tmp_path: Path) -> None:
    p = three_passages()[0]
    query = "When is payday?"
    result = gen.generate(
        [p],
        CannedQuestions({"c1": [query]}),
        FakeSearcher({query: ["c1"]}, {query: ["c1"]}),
        ANALYZER.tokens,
        GenerateOptions(chunks=1),
        keep_all,
    )
    (case,) = result.cases
    import hashlib

    assert case == {
        "id": "gen-" + hashlib.sha256(("c1" + query).encode()).hexdigest()[:10],
        "query": query,
        "knowledgeTag": "hr",
        "expectedDocIds": ["hr-pay"],
        "evidenceChunkIds": ["c1"],
        "origin": "generated",
        "generator": "offline:terms",
        "passageChunkId": "c1",
        # query terms {when, payday}; the indexed text "Title › Section\n\nPayday is the 10th of each
        # month, by bank transfer." holds payday: 1 of 2
        "literalness": 1 / 2,
    }
    assert case["literalness"] == literalness(query, p.indexed_text, ANALYZER.tokens)
    out = tmp_path / "generated.jsonl"
    gen.append_cases(out, result.cases)
    (loaded,) = load_golden_set(out).cases
    assert (loaded.id, loaded.origin, loaded.generator, loaded.passage_chunk_id, loaded.literalness) == (
        case["id"],
        "generated",
        "offline:terms",
        "c1",
        0.5,
    )
    assert loaded.evidence_chunk_ids == ["c1"] and loaded.expected_doc_ids == ["hr-pay"]


def test_ids_already_in_the_file_and_repeats_are_dropped_before_searching() -> None:
    questions = CannedQuestions({"c1": ["q1", "q1"], "c2": ["q2"]})
    searcher = FakeSearcher({"q1": ["c1"], "q2": ["c2"]}, {"q1": ["c1"], "q2": ["c2"]})
    existing = {case_id("c2", "q2")}
    result = gen.generate(
        three_passages()[:2],
        questions,
        searcher,
        ANALYZER.tokens,
        GenerateOptions(chunks=2, per_chunk=2),
        keep_all,
        existing,
    )
    assert [c["query"] for c in result.cases] == ["q1"]
    assert result.dropped == {"already in the out file": 1, "a repeated question": 1}
    assert searcher.asked[0][1] == ["q1"]


def test_a_passage_without_a_question_is_counted() -> None:
    result = gen.generate(
        three_passages(),
        CannedQuestions({}),
        FakeSearcher({}, {}),
        ANALYZER.tokens,
        GenerateOptions(chunks=3),
        keep_all,
    )
    assert (result.cases, result.no_question, sum(result.generated.values())) == ([], 3, 0)


def test_the_llm_generator_names_its_model_and_drops_blank_and_repeated_replies() -> None:
    replies = iter(["Question: When is payday?", "When is payday?", "  ", "Who pays?"])

    class FakeClient:
        endpoint = SimpleNamespace(model="qwen2.5:7b")
        messages: list = []

        def complete(self, messages):
            self.messages.append(messages)
            return next(replies)

    client = FakeClient()
    p = passage("c1", "hr-pay", "hr", text="每月10日发放工资。", heading="工资发放制度 > 发薪日")
    questions = LlmGenerator(client).questions(p, 0, 4)  # type: ignore[arg-type]
    assert questions == [
        Question("When is payday?", "llm:qwen2.5:7b"),
        Question("Who pays?", "llm:qwen2.5:7b"),
    ]
    # the prompt holds the passage with its title and heading, in the passage's language
    assert "工资发放制度 › 发薪日\n\n每月10日发放工资。" in client.messages[0][1]["content"]


# -- options and the out file -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chunks": 0}, "--chunks must be at least 1, got 0"),
        ({"chunks": 1, "per_chunk": 0}, "--per-chunk must be between 1 and 10, got 0"),
        ({"chunks": 1, "round_trip": "any"}, "round_trip must be 'either' or 'both'"),
    ],
)
def test_bad_options(kwargs, message) -> None:
    with pytest.raises(GenerateError, match=message):
        GenerateOptions(**kwargs)


def test_auto_round_trip_is_both_offline_and_either_for_an_llm() -> None:
    assert GenerateOptions.round_trip_for("auto", "offline") == "both"
    assert GenerateOptions.round_trip_for("auto", "llm") == "either"
    assert GenerateOptions.round_trip_for("either", "offline") == "either"


def test_the_out_file_must_be_jsonl(tmp_path: Path) -> None:
    with pytest.raises(GenerateError, match=r"must be a \.jsonl file"):
        gen.check_out_path(tmp_path / "generated.json")
    (tmp_path / "d.jsonl").mkdir()
    with pytest.raises(GenerateError, match="is a directory"):
        gen.check_out_path(tmp_path / "d.jsonl")


def test_appending_to_a_file_without_a_final_newline_and_reading_its_ids(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "set.jsonl"
    assert gen.existing_case_ids(out) == set()
    out.parent.mkdir()
    out.write_text("  \n", encoding="utf-8")
    assert gen.existing_case_ids(out) == set()
    first = {"id": "m-1", "query": "工资什么时候发", "expectedDocIds": ["hr-pay"]}
    out.write_text(json.dumps(first, ensure_ascii=False), encoding="utf-8")  # no newline at the end
    gen.append_cases(out, [{"id": "gen-1", "query": "q", "expectedDocIds": ["d"], "origin": "generated"}])
    assert gen.existing_case_ids(out) == {"m-1", "gen-1"}
    assert "工资什么时候发" in out.read_text(encoding="utf-8")  # not \\u-escaped


def test_a_broken_out_file_is_an_error_naming_it(tmp_path: Path) -> None:
    from app.evaluation.golden.cases import GoldenSetError

    out = tmp_path / "set.jsonl"
    out.write_text('{"id": "x"}\n', encoding="utf-8")
    with pytest.raises(GoldenSetError, match="set.jsonl"):
        gen.existing_case_ids(out)


def test_the_printed_summary() -> None:
    questions = CannedQuestions({"c1": ["when is payday"], "c2": ["vpn"]})
    searcher = FakeSearcher({"when is payday": ["c1"], "vpn": ["c2"]}, {"when is payday": ["c1"]})
    result = gen.generate(
        three_passages(), questions, searcher, ANALYZER.tokens, GenerateOptions(chunks=3), keep_all
    )
    assert result.lines() == [
        "picked 3 passages (3 documents, 3 knowledge tags) of 3 eligible chunks",
        "generated 2 questions (offline:terms 2); no question for 1 passages",
        "round trip, passage in the top 20: both 1, BM25 only 1, dense only 0, neither 0",
        "kept 1 (round_trip: both), dropped 1: 1 passage not in both top 20 (BM25 only)",
    ]
