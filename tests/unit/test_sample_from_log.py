"""`sieve golden sample --from-log`: normalisation, validity, duplicates, novelty and stratified allocation,
over fake vectors (the real model is in tests/integration/test_querylog_server.py)."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.evaluation.golden.authoring import sample as sample_module
from app.evaluation.golden.authoring.sample import (
    BLANK,
    EXACT_DUPLICATE,
    IN_GOLDEN_SET,
    IN_OUT_FILE,
    NEAR_DUPLICATE,
    NEAR_EXISTING,
    NO_LETTERS,
    NOT_SELECTED,
    UNREADABLE,
    LogEntry,
    LogQuery,
    SampleError,
    allocate,
    group_entries,
    invalid_reason,
    normalise_query,
    novelty,
    query_length,
    sample_from_log,
    select_drafts,
    too_short,
)
from app.evaluation.golden.cases import GoldenSetError, load_golden_set

TOO_SHORT = too_short(3)


# -- text ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  When's  PAYDAY？ ", "when's payday"),
        ("工资什么时候发？", "工资什么时候发"),
        ("工资什么时候发?!…", "工资什么时候发"),
        ("ＶＰＮ　怎么 连", "vpn 怎么 连"),  # NFKC: full-width letters and the ideographic space
        ("Straße", "strasse"),  # casefold, not lower
        ("¿Qué pasa?", "¿qué pasa"),  # only trailing punctuation goes
        ("Wi-Fi password\t\n reset.", "wi-fi password reset"),
        ("???", ""),
    ],
)
def test_normalise_query(text: str, expected: str) -> None:
    assert normalise_query(text) == expected


@pytest.mark.parametrize(
    ("text", "length"),
    [
        ("a", 1),
        ("vpn", 3),
        ("Wi-Fi", 4),
        ("发", 2),
        ("工资", 2 * 2),
        ("年假 days", 2 * 2 + 4),
        ("ＶＰＮ", 3),  # full-width letters are Latin after NFKC
        ("カード", 3 * 2),
        ("휴가", 2 * 2),
        ("??!", 0),
    ],
)
def test_query_length_counts_a_cjk_character_as_two(text: str, length: int) -> None:
    assert query_length(text) == length


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", BLANK),
        ("  \t", BLANK),
        ("???", NO_LETTERS),
        ("？？", NO_LETTERS),
        ("12345", NO_LETTERS),
        ("2024-10-10 !", NO_LETTERS),
        ("👍👍", NO_LETTERS),
        ("a", TOO_SHORT),
        ("hi", TOO_SHORT),
        ("ok?", TOO_SHORT),
        ("发", TOO_SHORT),
        ("vpn", None),
        ("工资", None),
        ("2024年", None),
        ("What is the meal allowance?", None),
    ],
)
def test_invalid_reason(text: str, reason: str | None) -> None:
    assert invalid_reason(text) == reason


# -- grouping ------------------------------------------------------------------------------------------------


def entries(*rows: tuple[str, str | None]) -> list[LogEntry]:
    return [LogEntry(q, tag, f"log:{i + 1}") for i, (q, tag) in enumerate(rows)]


def test_exact_duplicates_become_one_query_with_its_most_frequent_spelling_and_tag() -> None:
    queries, drops = group_entries(
        entries(
            ("工资什么时候发", "hr"),
            ("工资什么时候发？", None),
            ("工资什么时候发？", "hr"),
            ("???", None),
            ("VPN setup", "it"),
            ("vpn  SETUP.", "it"),
            ("a", None),
        )
    )
    assert [(q.text, q.knowledge_tag, q.seen, q.first) for q in queries] == [
        ("工资什么时候发？", "hr", 3, 0),
        ("VPN setup", "it", 2, 4),  # two spellings once each: the first seen
    ]
    assert drops.counts == {EXACT_DUPLICATE: (3 - 1) + (2 - 1), NO_LETTERS: 1, TOO_SHORT: 1}


# -- selection over fake vectors -----------------------------------------------------------------------------


def q(text: str, seen: int = 1, tag: str | None = None, first: int = 0) -> LogQuery:
    return LogQuery(normalise_query(text), text, tag, seen, first)


def unit(angle_degrees: float) -> list[float]:
    """A 2-d unit vector at `angle_degrees` from [1, 0]: its cosine with [1, 0] is cos(angle)."""
    a = math.radians(angle_degrees)
    return [math.cos(a), math.sin(a)]


def test_a_near_duplicate_is_folded_into_the_more_frequent_query() -> None:
    queries = [q("pay date", seen=1, first=0), q("payday", seen=3, first=1), q("vpn", seen=2, first=2)]
    # cos(10°) = 0.985 >= 0.95: "pay date" folds into "payday" (seen more often), whatever the order
    vectors = np.array([unit(10), unit(0), unit(90)])
    selection = select_drafts(queries, vectors, np.zeros((0, 2)), n=5)
    # equally novel (no reference): the more often seen first
    assert [(p.query.text, p.seen) for p in selection.picks] == [("payday", 3 + 1), ("vpn", 2)]
    assert selection.drops.counts == {NEAR_DUPLICATE: 1}


def test_near_duplicates_are_decided_greedily_in_frequency_order() -> None:
    # a ~ b (cos 15° = 0.966) and b ~ c (0.966) but a !~ c (cos 30° = 0.866): a is kept, b folds into a,
    # c is compared with a only (b was not kept) and stays
    queries = [q("a query", seen=3, first=0), q("b query", seen=2, first=1), q("c query", seen=1, first=2)]
    vectors = np.array([unit(0), unit(15), unit(30)])
    selection = select_drafts(queries, vectors, np.zeros((0, 2)), n=5)
    assert sorted((p.query.text, p.seen) for p in selection.picks) == [("a query", 3 + 2), ("c query", 1)]


def test_the_near_duplicate_threshold_is_inclusive() -> None:
    queries = [q("x one", seen=2), q("x two", first=1)]
    vectors = np.array([[1.0, 0.0], [0.95, math.sqrt(1 - 0.95**2)]])
    selection = select_drafts(queries, vectors, np.zeros((0, 2)), n=5, threshold=0.95)
    assert [p.query.text for p in selection.picks] == ["x one"]


def test_novelty_is_one_minus_the_largest_cosine_to_the_reference() -> None:
    reference = np.array([unit(0), unit(60)])
    vectors = np.array([unit(0), unit(30), unit(90), unit(180)])
    expected = [
        1 - 1.0,
        1 - math.cos(math.radians(30)),
        1 - math.cos(math.radians(30)),
        1 - math.cos(math.radians(120)),
    ]
    assert novelty(vectors, reference) == pytest.approx(expected, abs=1e-12)
    assert novelty(vectors, np.zeros((0, 2))).tolist() == [1.0, 1.0, 1.0, 1.0]
    assert novelty(vectors * 7.5, reference * 0.1) == pytest.approx(expected, abs=1e-12)  # any length


def test_the_most_novel_queries_are_picked_and_those_near_a_golden_query_are_dropped() -> None:
    reference = np.array([unit(0)])
    queries = [q("near golden", seen=9), q("close", first=1), q("far", first=2), q("middle", first=3)]
    vectors = np.array([unit(15), unit(30), unit(90), unit(60)])  # cos 15° = 0.966 >= 0.95
    selection = select_drafts(queries, vectors, reference, n=2)
    assert [(p.query.text, round(p.novelty, 12)) for p in selection.picks] == [
        ("far", round(1 - math.cos(math.radians(90)), 12)),
        ("middle", round(1 - math.cos(math.radians(60)), 12)),
    ]
    assert selection.drops.counts == {NEAR_EXISTING: 1, NOT_SELECTED: 1}
    assert selection.picks[0].case()["note"] == "sampled from the query log: seen 1 time; novelty 1.00"
    assert selection.picks[1].case()["note"] == "sampled from the query log: seen 1 time; novelty 0.50"


def test_equally_novel_queries_go_by_frequency() -> None:
    queries = [q("rare one", seen=1), q("common one", seen=4, first=1)]
    vectors = np.array([unit(90), unit(-90)])
    selection = select_drafts(queries, vectors, np.array([unit(0)]), n=1)
    assert [p.query.text for p in selection.picks] == ["common one"]


# -- allocation ----------------------------------------------------------------------------------------------


def test_allocation_by_largest_remainders() -> None:
    # quotas 4*5/10 = 2.0, 4*3/10 = 1.2, 4*2/10 = 0.8: floors 2, 1, 0; the one seat left goes to the largest
    # remainder, untagged's 0.8
    assert allocate({"hr": 5, "it": 3, None: 2}, 4) == {"hr": 4 * 5 // 10, "it": 4 * 3 // 10, None: 0 + 1}
    # quotas 7*6/11 = 3.82, 7*4/11 = 2.55, 7*1/11 = 0.64: floors 3, 2, 0; two seats left: hr (0.82), then
    # finance (0.64) before it (0.55)
    assert allocate({"hr": 6, "it": 4, "finance": 1}, 7) == {"hr": 3 + 1, "it": 2, "finance": 0 + 1}
    # equal remainders (2/3 each): the larger population first, then tag order, untagged last
    assert allocate({"b": 1, "a": 1, None: 1}, 2) == {"a": 1, "b": 1, None: 0}
    assert allocate({"a": 2, "b": 1, None: 1}, 1) == {"a": 0 + 1, "b": 0, None: 0}  # remainders 2, 1, 1 (/4)
    assert allocate({"hr": 2, None: 1}, 10) == {"hr": 2, None: 1}  # n >= P: everything
    assert allocate({"hr": 3}, 0) == {"hr": 0}


@given(
    populations=st.dictionaries(
        st.one_of(st.none(), st.text(alphabet="abcdef", min_size=1, max_size=3)),
        st.integers(min_value=1, max_value=50),
        min_size=1,
        max_size=6,
    ),
    n=st.integers(min_value=0, max_value=200),
)
def test_allocation_sums_to_n_and_stays_within_one_of_each_quota(populations, n: int) -> None:
    shares = allocate(populations, n)
    total = sum(populations.values())
    assert sum(shares.values()) == min(n, total)
    for stratum, population in populations.items():
        assert 0 <= shares[stratum] <= population
        if n < total:
            assert abs(shares[stratum] - n * population / total) < 1


def test_selection_is_stratified_by_knowledge_tag() -> None:
    # 5 hr, 3 it, 2 untagged queries, all unrelated (orthogonal); N = 4 -> hr 2, it 1, untagged 1 (above)
    texts = [(f"hr question {i}", "hr") for i in range(5)]
    texts += [(f"it question {i}", "it") for i in range(3)]
    texts += [(f"other question {i}", None) for i in range(2)]
    queries = [q(t, tag=tag, first=i) for i, (t, tag) in enumerate(texts)]
    selection = select_drafts(queries, np.eye(len(queries)), np.zeros((0, len(queries))), n=4)
    assert [p.query.knowledge_tag for p in selection.picks] == ["hr", "hr", "it", None]
    assert selection.allocation == {"hr": (2, 5), "it": (1, 3), None: (1, 2)}
    assert selection.drops.counts == {NOT_SELECTED: 10 - 4}


# -- the command, with a fake embedder -----------------------------------------------------------------------


def fake_embed(vectors: dict[str, list[float]]) -> Callable[[list[str]], np.ndarray]:
    def embed(texts: list[str]) -> np.ndarray:
        return np.array([vectors[t] for t in texts], dtype=float)

    return embed


def write_log(path: Path, rows: list[dict | str]) -> Path:
    path.write_text(
        "\n".join(r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in rows) + "\n",
        encoding="utf-8",
    )
    return path


def write_golden(path: Path, queries: list[str]) -> Path:
    cases = [{"id": f"g{i}", "query": t, "expectedDocIds": ["d"]} for i, t in enumerate(queries)]
    path.write_text(json.dumps({"cases": cases}, ensure_ascii=False), encoding="utf-8")
    return path


VECTORS = {
    "工资什么时候发": [1, 0, 0, 0, 0],
    "What is the meal allowance?": [0, 1, 0, 0, 0],
    "Meal allowance per day?": [0, 0.99, 0.141, 0, 0],  # cos 0.99 with the golden one: near it
    "怎么申请年假": [0, 0, 1, 0, 0],
    "年假怎么申请": [0, 0, 0.98, 0.199, 0],  # cos 0.98 with 怎么申请年假: a near duplicate
    "How do I reset my password": [0, 0, 0, 1, 0],
    "打印机在哪里": [0, 0, 0, 0, 1],
    "printer location": [0, 0, 0, 0.6, 0.8],
}


def test_sample_from_log_writes_drafts_reports_drops_and_never_overwrites(tmp_path: Path) -> None:
    log = write_log(
        tmp_path / "queries.jsonl",
        [
            {"query": "工资什么时候发？", "knowledgeTag": None},  # the golden query: already there
            {"query": "Meal allowance per day?", "knowledgeTag": "finance"},
            {"query": "怎么申请年假", "knowledgeTag": "hr"},
            {"query": "怎么申请年假", "knowledgeTag": "hr"},
            {"query": "年假怎么申请", "knowledgeTag": "hr"},
            {"query": "How do I reset my password", "knowledgeTag": "it"},
            {"query": "打印机在哪里", "knowledgeTag": None},
            {"query": "???", "knowledgeTag": None},
            {"query": "a", "knowledgeTag": None},
            {"query": "   ", "knowledgeTag": None},
            "{not json",
            {"no": "query"},
        ],
    )
    golden = write_golden(tmp_path / "golden.json", ["工资什么时候发", "What is the meal allowance?"])
    out = tmp_path / "drafts" / "drafts.jsonl"
    result = sample_from_log([log], golden, out, 10, fake_embed(VECTORS))
    cases = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [(c["query"], c["knowledgeTag"]) for c in cases] == [
        ("怎么申请年假", "hr"),
        ("How do I reset my password", "it"),
        ("打印机在哪里", None),
    ]
    assert cases[0] == {
        "id": "log-" + hashlib.sha256("怎么申请年假".encode()).hexdigest()[:8],
        "query": "怎么申请年假",
        "knowledgeTag": "hr",
        "origin": "log",
        "draft": True,
        "note": "sampled from the query log: seen 3 times; novelty 1.00",  # 2 exact + 1 near duplicate
    }
    assert result.drops.counts == {
        IN_GOLDEN_SET: 1,
        NEAR_EXISTING: 1,
        EXACT_DUPLICATE: 1,
        NEAR_DUPLICATE: 1,
        NO_LETTERS: 1,
        TOO_SHORT: 1,
        BLANK: 1,
        UNREADABLE: 2,
    }
    # every entry counted once: dropped under one reason, or picked
    assert result.entries == sum(result.drops.counts.values()) - result.drops.counts[UNREADABLE] + 3
    loaded = load_golden_set(out)
    assert [(c.origin, c.draft, c.has_expectation()) for c in loaded.cases] == [("log", True, False)] * 3
    printed = "\n".join(result.lines())
    assert (
        "punctuation or digits only: 1  e.g. " in printed and f"wrote {out} (0 -> 3 draft cases)" in printed
    )

    more = write_log(
        tmp_path / "more.jsonl",
        [
            {"query": "怎么申请年假", "knowledgeTag": "hr"},  # in the out file now
            {"query": "printer location", "knowledgeTag": "facilities"},
        ],
    )
    again = sample_from_log([more], golden, out, 10, fake_embed(VECTORS))
    assert again.drops.counts == {IN_OUT_FILE: 1}
    # printer location: cos 0.8 with 打印机在哪里 (a draft now), 0.6 with the password draft
    assert [(p.query.text, round(p.novelty, 12)) for p in again.picks] == [
        ("printer location", round(1 - 0.8, 12))
    ]
    assert len(out.read_text(encoding="utf-8").splitlines()) == 3 + 1
    assert again.lines()[-1] == f"wrote {out} (3 -> 4 draft cases)"


def test_the_out_file_must_be_jsonl_and_valid_and_the_log_must_exist(tmp_path: Path) -> None:
    log = write_log(tmp_path / "q.jsonl", [{"query": "vpn setup"}])
    embed = fake_embed({"vpn setup": [1.0]})
    with pytest.raises(SampleError, match=r"--out .*drafts.json: must be a .jsonl file"):
        sample_from_log([log], None, tmp_path / "drafts.json", 1, embed)
    with pytest.raises(SampleError, match=r"--log .*missing.jsonl: no such file"):
        sample_from_log([tmp_path / "missing.jsonl"], None, tmp_path / "d.jsonl", 1, embed)
    with pytest.raises(SampleError, match="at least 1"):
        sample_from_log([log], None, tmp_path / "d.jsonl", 0, embed)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"id": "x"}\n', encoding="utf-8")
    with pytest.raises(GoldenSetError, match="broken.jsonl"):
        sample_from_log([log], None, broken, 1, embed)
    assert broken.read_text(encoding="utf-8") == '{"id": "x"}\n'


def test_appending_to_a_file_without_a_final_newline_keeps_its_last_case(tmp_path: Path) -> None:
    out = tmp_path / "d.jsonl"
    out.write_text(json.dumps({"id": "x", "query": "old", "draft": True}), encoding="utf-8")
    log = write_log(tmp_path / "q.jsonl", [{"query": "vpn setup"}])
    sample_from_log([log], None, out, 1, fake_embed({"vpn setup": [1.0, 0.0], "old": [0.0, 1.0]}))
    assert [c.query for c in load_golden_set(out).cases] == ["old", "vpn setup"]


def naive_near_duplicates(units: np.ndarray, order: list[int], threshold: float) -> dict[int, int]:
    kept: list[int] = []
    folded = {}
    for i in order:
        cosines = [float(units[k] @ units[i]) for k in kept]
        if cosines and max(cosines) >= threshold:
            folded[i] = kept[int(np.argmax(cosines))]
        else:
            kept.append(i)
    return folded


@given(
    rows=st.lists(
        st.lists(st.integers(min_value=-3, max_value=3), min_size=3, max_size=3), min_size=1, max_size=25
    ),
    block=st.integers(min_value=1, max_value=6),
    threshold=st.sampled_from([0.52, 0.91, 0.953]),  # cosines of these small integer vectors never equal one
)
def test_blocked_near_duplicates_agree_with_the_one_at_a_time_walk(rows, block, threshold) -> None:
    units = sample_module.unit_rows(np.array(rows, dtype=float))
    order = list(range(len(rows)))[::-1]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sample_module, "NEAR_DUPLICATE_BLOCK", block)
        blocked = sample_module.greedy_near_duplicates(units, order, threshold)
    naive = naive_near_duplicates(units, order, threshold)
    assert blocked.keys() == naive.keys()
    for i in naive:  # the same closest kept row, up to a tie between equally close ones
        assert float(units[i] @ units[blocked[i]]) == pytest.approx(
            float(units[i] @ units[naive[i]]), abs=1e-12
        )


# -- the command ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("enabled", [False, True])
def test_the_command_without_a_log_names_where_it_looked_and_the_sample_log(
    enabled: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli import main

    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # where golden_set/query-log.sample.jsonl is
    missing = tmp_path / "queries.jsonl"
    monkeypatch.setenv("RAG__QUERYLOG__PATH", str(missing))
    monkeypatch.setenv("RAG__QUERYLOG__ENABLED", str(enabled).lower())
    out = tmp_path / "drafts.jsonl"
    assert main(["golden", "sample", "--from-log", "5", "--out", str(out)]) == 2
    printed, err = capsys.readouterr()
    recording = "" if enabled else "; the server writes it with rag.querylog.enabled: true"
    assert (printed, err) == (
        "",
        f"error: no query log at {missing} (rag.querylog.path{recording}): pass --log PATH, "
        "e.g. --log golden_set/query-log.sample.jsonl (a recorded log)\n",
    )
    assert not out.exists()
