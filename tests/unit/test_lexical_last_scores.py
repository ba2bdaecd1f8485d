"""The BM25 index reuses the last query's scores between top() and scores() (the chain asks both for one
query), and never across a write."""

from __future__ import annotations

from app.lexical.index import Analyzer, Bm25Index


def _index() -> Bm25Index:
    texts = ["vpn client install", "password reset vpn", "lunch menu", "vpn vpn vpn"]
    return Bm25Index.build([f"c{i}" for i in range(len(texts))], texts, Analyzer())


def test_scores_after_top_are_the_scores_a_fresh_index_gives() -> None:
    index, fresh = _index(), _index()
    top = index.top("vpn password", 3)
    ids = [i for i, _ in top] + ["c2", "unknown"]
    assert index.scores("vpn password", ids) == fresh.scores("vpn password", ids)
    assert dict(top) == {i: fresh.scores("vpn password", [i])[i] for i, _ in top}


def test_a_write_between_two_calls_is_seen_by_the_second() -> None:
    index = _index()
    before = index.scores("menu", ["c2", "c4"])
    index.upsert([("c4", "menu menu of the week", None)])
    after = index.scores("menu", ["c2", "c4"])
    expected = Bm25Index.build(
        ["c0", "c1", "c2", "c3", "c4"],
        ["vpn client install", "password reset vpn", "lunch menu", "vpn vpn vpn", "menu menu of the week"],
        Analyzer(),
    ).scores("menu", ["c2", "c4"])
    assert before["c4"] == 0.0 and after == expected and after["c4"] > 0
    index.delete(["c2"])
    assert index.scores("menu", ["c2"]) == {"c2": 0.0}
    assert [i for i, _ in index.top("menu", 5)] == ["c4"]


def test_a_batch_of_queries_is_tokenised_once_each_until_a_write(monkeypatch) -> None:
    # an evaluation batch asks top() for every query, then the bm25 stage asks scores() for each
    index, fresh = _index(), _index()
    tokenised: list[str] = []
    tokens = index.analyzer.tokens
    monkeypatch.setattr(index.analyzer, "tokens", lambda text: tokenised.append(text) or tokens(text))
    queries = ["vpn password", "lunch menu", "vpn client"]
    ids = ["c0", "c1", "c2", "c3"]
    assert [index.top(q, 3) for q in queries] == [fresh.top(q, 3) for q in queries]
    assert [index.scores(q, ids) for q in queries] == [fresh.scores(q, ids) for q in queries]
    assert tokenised == queries
    index.upsert([("c4", "vpn menu", None)])
    tokenised.clear()
    index.scores("vpn password", ids)
    assert tokenised == ["vpn password"]  # the write may change what the query's terms are numbered
