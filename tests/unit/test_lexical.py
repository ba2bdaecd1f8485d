import threading

import numpy as np
import pytest
from rank_bm25 import BM25Okapi

from app.lexical.index import Analyzer, Bm25Index


@pytest.fixture(scope="module")
def analyzer() -> Analyzer:
    return Analyzer()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # stop words gone, lowercased, Snowball-stemmed
        (
            "The employees are running the new reimbursement policies!",
            ["employe", "run", "new", "reimburs", "polici"],
        ),
        # split on non-alphanumerics; "it" is a Lucene stop word, so "IT-Helpdesk" loses it
        (
            "Reset your VPN password: see IT-Helpdesk #42.",
            ["reset", "your", "vpn", "password", "see", "helpdesk", "42"],
        ),
        ("foo_bar v2.0", ["foo", "bar", "v2", "0"]),
        # full-width forms are NFKC-normalised first
        ("Ｗｉ－Ｆｉ\u3000密码", ["wi", "fi", "密码"]),
        ("", []),
        ("  ,.!？。 ", []),
    ],
)
def test_english_and_punctuation(analyzer: Analyzer, text: str, expected: list[str]) -> None:
    assert analyzer.tokens(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # search mode: the compound and its dictionary sub-words; 的/了/我们/在 dropped
        (
            "我们在中华人民共和国的首都北京工作了三年。",
            [
                "中华",
                "华人",
                "人民",
                "共和",
                "共和国",
                "中华人民共和国",
                "首都",
                "北京",
                "首都北京",
                "工作",
                "三年",
            ],
        ),
        # mixed scripts: the latin run is lowercased, the question words 是什么 dropped
        ("公司的VPN密码重置流程是什么", ["公司", "vpn", "密码", "重置", "流程"]),
        ("员工如何申请年假？", ["员工", "申请", "年", "假"]),
    ],
)
def test_chinese(analyzer: Analyzer, text: str, expected: list[str]) -> None:
    assert analyzer.tokens(text) == expected


def test_user_dict_is_loaded_into_a_private_tokenizer(tmp_path) -> None:
    user_dict = tmp_path / "words.txt"
    user_dict.write_text("年假\n", encoding="utf-8")
    assert Analyzer(str(user_dict)).tokens("员工如何申请年假？") == ["员工", "申请", "年假"]
    # the global jieba dictionary (and any other analyzer) is untouched
    assert Analyzer().tokens("员工如何申请年假？") == ["员工", "申请", "年", "假"]


DOCS = {
    "d1": "How to reset your VPN password",
    "d2": "VPN setup guide for new laptops; the VPN client needs a password",
    "d3": "Travel reimbursement policy",
    "d4": "报销政策：差旅费用需要在三十天内提交",
    "d5": "VPN 密码 重置 流程",
    "d6": "Expense reports and reimbursement of travel",
}


@pytest.fixture(scope="module")
def index(analyzer: Analyzer) -> Bm25Index:
    return Bm25Index.build(list(DOCS), list(DOCS.values()), analyzer, k1=1.2, b=0.75)


@pytest.mark.parametrize(
    "query", ["reset VPN password", "travel reimbursement", "差旅 报销", "VPN 密码", "nothing"]
)
def test_scores_equal_rank_bm25(index: Bm25Index, analyzer: Analyzer, query: str) -> None:
    reference = BM25Okapi([analyzer.tokens(t) for t in DOCS.values()], k1=1.2, b=0.75, epsilon=0.25)
    expected = reference.get_scores(analyzer.tokens(query))
    got = index.scores(query, list(DOCS))
    assert list(got) == list(DOCS)
    np.testing.assert_allclose([got[i] for i in DOCS], expected, rtol=1e-12, atol=0)


def test_scores_of_a_subset_and_unknown_ids(index: Bm25Index) -> None:
    full = index.scores("reset VPN password", list(DOCS))
    subset = index.scores("reset VPN password", ["d5", "d1", "missing"])
    assert subset == {"d5": full["d5"], "d1": full["d1"], "missing": 0.0}


def test_top_orders_by_score_then_id_and_skips_zero(index: Bm25Index) -> None:
    full = index.scores("VPN password", list(DOCS))
    expected = sorted(((i, s) for i, s in full.items() if s > 0), key=lambda p: (-p[1], p[0]))
    assert index.top("VPN password", 10) == expected
    assert [i for i, _ in expected] and {i for i, _ in expected} <= {"d1", "d2", "d5"}
    assert index.top("VPN password", 2) == expected[:2]
    assert index.top("no match at all", 5) == []


def test_top_breaks_ties_by_id(analyzer: Analyzer) -> None:
    others = ["banana split", "cherry tart", "plum cake", "lemon curd", "fig roll"]
    idx = Bm25Index.build(["b", "a", "c", "v", "w", "x", "y", "z"], ["apple pie"] * 3 + others, analyzer)
    top = idx.top("pie", 2)
    assert [i for i, _ in top] == ["a", "b"]
    assert top[0][1] == top[1][1] > 0


def test_negative_idf_uses_rank_bm25_epsilon_floor(analyzer: Analyzer) -> None:
    # "pie" is in 3 of 4 documents: idf = ln(4 - 3 + 0.5) - ln(3 + 0.5) < 0, replaced by 0.25 * mean idf
    texts = ["apple pie", "apple pie", "apple pie", "banana"]
    idx = Bm25Index.build(["a", "b", "c", "d"], texts, analyzer)
    reference = BM25Okapi([analyzer.tokens(t) for t in texts], k1=1.2, b=0.75, epsilon=0.25)
    mean_idf = (2 * (np.log(1.5) - np.log(3.5)) + (np.log(3.5) - np.log(1.5))) / 3
    assert reference.idf["pie"] == pytest.approx(0.25 * mean_idf)
    assert idx.scores("pie", ["a"])["a"] == pytest.approx(reference.get_scores(["pie"])[0])
    # here the mean idf is itself negative, so is the score, and top() returns nothing
    assert idx.scores("pie", ["a"])["a"] < 0
    assert idx.top("pie", 3) == []


def test_empty_collection_and_empty_query(analyzer: Analyzer) -> None:
    empty = Bm25Index.build([], [], analyzer)
    assert empty.top("anything", 3) == []
    assert empty.scores("anything", ["x"]) == {"x": 0.0}
    idx = Bm25Index.build(["a"], ["text"], analyzer)
    assert idx.scores("the of", ["a"]) == {"a": 0.0}


def test_build_rejects_bad_input(analyzer: Analyzer) -> None:
    with pytest.raises(ValueError, match="2 ids but 1 texts"):
        Bm25Index.build(["a", "b"], ["x"], analyzer)
    with pytest.raises(ValueError, match="duplicate id 'a'"):
        Bm25Index.build(["a", "a"], ["x", "y"], analyzer)


def test_top_and_scores_are_rank_bm25_get_scores_bit_for_bit(analyzer: Analyzer) -> None:
    """top() and scores() score from posting lists; the values must be BM25Okapi's own, exactly,
    including repeated query terms, terms in most documents (epsilon floor) and varied lengths."""
    rng = np.random.default_rng(7)
    vocabulary = [f"w{i}" for i in range(60)] + ["common"] * 40
    texts = [" ".join(rng.choice(vocabulary, size=int(rng.integers(1, 40)))) for _ in range(300)]
    ids = [f"c{i:03d}" for i in range(300)]
    index = Bm25Index.build(ids, texts, analyzer, k1=0.9, b=0.4)
    reference = BM25Okapi([analyzer.tokens(t) for t in texts], k1=0.9, b=0.4, epsilon=0.25)
    for query in ["w1 w2 w3", "common w7 w7", "w59 common", "w0"]:
        expected = reference.get_scores(analyzer.tokens(query))
        got = dict(index.top(query, len(ids)))
        positive = {ids[i]: float(s) for i, s in enumerate(expected) if s > 0}
        assert got == positive, query  # exact float equality, not approx
        assert index.scores(query, ids) == {ids[i]: float(s) for i, s in enumerate(expected)}, query


def _crowded(
    analyzer: Analyzer, n_other: int = 12
) -> tuple[Bm25Index, list[str], list[str], list[str | None]]:
    """`n_other` finance/untagged chunks that match "vpn password" strongly, then three weaker it chunks."""
    ids, texts, tags = [], [], []
    for i in range(n_other):
        ids.append(f"other{i:02d}")
        texts.append("vpn password vpn password reset")
        tags.append("finance" if i % 2 else None)
    for i, text in enumerate(["vpn client install guide for laptops", "password rules", "the wifi guide"]):
        ids.append(f"it{i}")
        texts.append(text)
        tags.append("it")
    filler = [f"filler text number {i} about lunch menus" for i in range(20)]  # keeps idf positive
    ids += [f"f{i:02d}" for i in range(20)]
    texts += filler
    tags += [None] * 20
    return Bm25Index.build(ids, texts, analyzer, knowledge_tags=tags), ids, texts, tags


def test_top_with_a_tag_cuts_among_that_tag_only(analyzer: Analyzer) -> None:
    index, ids, _, _ = _crowded(analyzer)
    n = 5
    untagged_top = index.top("vpn password", n)
    assert all(i.startswith("other") for i, _ in untagged_top)  # the it chunks do not make the global cut
    tagged = index.top("vpn password", n, knowledge_tag="it")
    full = index.scores("vpn password", ids)
    expected = sorted(((i, full[i]) for i in ("it0", "it1") if full[i] > 0), key=lambda p: (-p[1], p[0]))
    assert tagged == expected
    assert {i for i, _ in tagged} == {"it0", "it1"}  # "the wifi guide" matches nothing: no zero scores
    assert index.top("vpn password", 1, knowledge_tag="it") == expected[:1]
    finance = index.top("vpn password", 100, knowledge_tag="finance")
    assert {i for i, _ in finance} == {f"other{i:02d}" for i in range(1, 12, 2)}
    assert index.top("vpn password", 5, knowledge_tag="no-such-tag") == []


def test_tag_restricted_top_scores_are_rank_bm25_bit_for_bit(analyzer: Analyzer) -> None:
    """Restricting the candidates never changes a score: idf and avgdl stay the whole collection's."""
    index, ids, texts, tags = _crowded(analyzer)
    reference = BM25Okapi([analyzer.tokens(t) for t in texts], k1=1.2, b=0.75, epsilon=0.25)
    for query in ["vpn password", "vpn client", "lunch password"]:
        expected = reference.get_scores(analyzer.tokens(query))
        for tag in ("it", "finance"):
            want = {ids[i]: float(s) for i, s in enumerate(expected) if s > 0 and tags[i] == tag}
            assert dict(index.top(query, len(ids), knowledge_tag=tag)) == want, (query, tag)


def test_build_rejects_tags_that_do_not_match_the_ids(analyzer: Analyzer) -> None:
    with pytest.raises(ValueError, match="2 ids but 1 knowledge tags"):
        Bm25Index.build(["a", "b"], ["x", "y"], analyzer, knowledge_tags=["it"])


def test_the_converted_postings_cache_is_bounded_and_scores_stay_exact(monkeypatch) -> None:
    # ten terms in 30 of 60 chunks each (tf 1-3), so 30 postings a term; a bound of 70 postings keeps the
    # two most recently used terms only
    texts = [" ".join(f"w{t} " * ((i + t) % 3 + 1) for t in range(10)) for i in range(30)]
    texts += [f"filler {i}" for i in range(30)]
    ids = [f"c{i}" for i in range(60)]
    index = Bm25Index.build(ids, texts, Analyzer())
    unbounded = {f"w{t}": index.scores(f"w{t} w{(t + 3) % 10}", ids) for t in range(10)}
    monkeypatch.setattr(Bm25Index, "POSTINGS_CACHE_LIMIT", 70)
    bounded = Bm25Index.build(ids, texts, Analyzer())
    for t in range(10):
        assert bounded.scores(f"w{t} w{(t + 3) % 10}", ids) == unbounded[f"w{t}"]
        assert bounded._post_np_size <= 70 and len(bounded._post_np) <= 2
    assert bounded._post_np_size == sum(size for size, *_ in bounded._post_np.values())
    # the last query's terms are the ones kept: w9 and w2
    assert sorted(bounded._terms[n] for n in bounded._post_np) == ["w2", "w9"]


def test_queries_run_while_a_snapshot_export_sorts_the_postings(monkeypatch) -> None:
    # The export holds the index lock only to copy the arrays: a query from another thread is answered while
    # the rest of the export runs, and a write made meanwhile is not in the exported state.
    from app.lexical import index as lexical

    analyzer = Analyzer()
    index = Bm25Index.build(list(DOCS), list(DOCS.values()), analyzer)
    before = Bm25Index.from_state(*index.export_state(), analyzer).top("VPN password", 10)
    sorting, answered = threading.Event(), threading.Event()
    real_export = lexical._export

    def slow_export(raw):
        sorting.set()
        assert answered.wait(10), "no query could run during the export"
        return real_export(raw)

    monkeypatch.setattr(lexical, "_export", slow_export)
    exported: list = []
    exporter = threading.Thread(target=lambda: exported.append(index.export_state()))
    exporter.start()
    assert sorting.wait(10)
    during = index.top("VPN password", 10)  # takes the index lock
    index.upsert([("late", "vpn password vpn password", None)])
    answered.set()
    exporter.join(10)
    assert during == before
    assert "late" not in Bm25Index.from_state(*exported[0], analyzer)
    assert Bm25Index.from_state(*exported[0], analyzer).top("VPN password", 10) == before
