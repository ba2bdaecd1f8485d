"""`sieve tune --holdout` / `--folds`: the split's invariants (Hypothesis), the figures recomputed from a tiny
replay with expected values written as arithmetic, the tune files, and the flags' errors."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.cli import main
from app.evaluation.golden.cases import GoldenCase
from app.evaluation.render.tune import tune_markdown, write_tune
from app.evaluation.tune.grid import run_folds, run_holdout
from app.evaluation.tune.holdout import (
    HELD_OUT,
    TUNING,
    SplitError,
    check_split_flags,
    fold_split,
    holdout_split,
    make_split,
    split_units,
)
from app.evaluation.tune.model import FoldParts, FoldSplit, HoldoutParts, HoldoutSplit
from app.settings import EvaluateThresholds
from tests.fixtures.tiny_replay import tiny, tiny_document, tiny_settings

# -- the split ------------------------------------------------------------------------------------------


def _case(i: int, kind: str, tag: str | None, group: str | None) -> GoldenCase:
    fields: dict = {"id": f"c{i}", "query": f"question {i}"}
    if kind == "noAnswer":
        fields["expectNoAnswer"] = True
    elif kind == "draft":
        fields["draft"] = True
    else:
        fields["expectedDocIds"] = [f"d{i}"]
    if tag is not None:
        fields["knowledgeTag"] = tag
    if group is not None:
        fields["group"] = group
    return GoldenCase.model_validate(fields)


@st.composite
def golden_cases(draw) -> list[GoldenCase]:
    n = draw(st.integers(1, 40))
    kinds = st.sampled_from(["answer", "answer", "answer", "noAnswer", "draft"])
    tags = st.sampled_from([None, "hr", "it", "finance"])
    groups = st.one_of(st.none(), st.none(), st.sampled_from(["g1", "g2", "g3", "g4", "g5"]))
    return [_case(i, draw(kinds), draw(tags), draw(groups)) for i in range(n)]


def _assert_partition(cases: list[GoldenCase], parts: list[list[str]]) -> None:
    ids = [c.id for c in cases]
    flat = [i for part in parts for i in part]
    assert sorted(flat) == sorted(ids)  # covers every case, each once: disjoint
    position = {i: n for n, i in enumerate(ids)}
    for part in parts:
        assert part == sorted(part, key=position.__getitem__)  # in file order
    side = {i: n for n, part in enumerate(parts) for i in part}
    for group in {c.group for c in cases if c.group is not None}:
        assert len({side[c.id] for c in cases if c.group == group}) == 1, group


def _deviations(cases: list[GoldenCase], parts: list[list[str]], shares: list[float]):
    """Per part, |its cases - share * n| over every case, and the largest over the strata."""
    side = {i: n for n, part in enumerate(parts) for i in part}
    units = split_units(cases)
    overall = Counter(side[c.id] for c in cases)
    whole = max(abs(overall[p] - share * len(cases)) for p, share in enumerate(shares))
    worst = 0.0
    for stratum in {u.stratum for u in units}:
        held = Counter()
        for unit in (u for u in units if u.stratum == stratum):
            held[side[unit.ids[0]]] += len(unit.ids)
        n = sum(held.values())
        worst = max(worst, *(abs(held[p] - share * n) for p, share in enumerate(shares)))
    return whole, worst, max(len(u.ids) for u in units)


@settings(max_examples=150, deadline=None)
@given(golden_cases(), st.floats(0.05, 0.95), st.integers(0, 2**32), st.randoms(use_true_random=False))
def test_a_holdout_split_is_a_stratified_partition_keeping_groups_and_fixed_by_the_seed(
    cases, fraction, seed, rng
) -> None:
    parts = holdout_split(cases, fraction, seed)
    assert len(parts) == 2
    _assert_partition(cases, parts)
    whole, stratum, s = _deviations(cases, parts, [1 - fraction, fraction])
    assert whole <= s / 2 + 1e-9 and stratum <= s + 1e-9  # the bounds of assign_parts' docstring
    assert holdout_split(cases, fraction, seed) == parts
    shuffled = list(cases)
    rng.shuffle(shuffled)
    assert [set(p) for p in holdout_split(shuffled, fraction, seed)] == [set(p) for p in parts]


@settings(max_examples=150, deadline=None)
@given(golden_cases(), st.integers(2, 7), st.integers(0, 2**32), st.randoms(use_true_random=False))
def test_folds_are_a_stratified_partition_keeping_groups_and_fixed_by_the_seed(cases, k, seed, rng) -> None:
    parts = fold_split(cases, k, seed)
    assert len(parts) == k
    _assert_partition(cases, parts)
    sizes = [len(p) for p in parts]
    _, stratum, s = _deviations(cases, parts, [1 / k] * k)
    assert max(sizes) - min(sizes) <= s and stratum <= 2 * (k - 1) * s / k + 1e-9
    assert fold_split(cases, k, seed) == parts
    shuffled = list(cases)
    rng.shuffle(shuffled)
    assert [set(p) for p in fold_split(shuffled, k, seed)] == [set(p) for p in parts]


def test_the_seed_chooses_the_split() -> None:
    cases = [_case(i, "answer", None, None) for i in range(20)]
    splits = {tuple(holdout_split(cases, 0.3, seed)[1]) for seed in range(5)}
    assert len(splits) > 1
    assert all(len(held) == 20 * 3 // 10 for held in splits)  # one stratum of singles: exactly 0.3 * 20


def test_no_answer_cases_and_each_tag_are_split_in_proportion() -> None:
    cases = [_case(i, "answer", "hr" if i < 10 else "it", None) for i in range(20)]
    cases += [_case(20 + i, "noAnswer", None, None) for i in range(10)]
    tuning, held = holdout_split(cases, 0.3, 42)
    kinds = Counter(("noAnswer" if c.expect_no_answer else c.knowledge_tag) for c in cases if c.id in held)
    assert kinds == {"hr": 3, "it": 3, "noAnswer": 3}  # 0.3 * 10 of each stratum


def test_a_groups_paraphrases_go_to_one_side() -> None:
    cases = [_case(i, "answer", None, "pay" if i < 4 else None) for i in range(10)]
    for seed in range(10):
        tuning, held = holdout_split(cases, 0.5, seed)
        pay = {f"c{i}" for i in range(4)}
        assert pay <= set(tuning) or pay <= set(held)


@pytest.mark.parametrize(
    ("holdout", "folds", "message"),
    [
        (0.0, None, "--holdout must be a fraction between 0 and 1 (exclusive), got 0.0"),
        (1.0, None, "--holdout must be a fraction between 0 and 1 (exclusive), got 1.0"),
        (math.nan, None, "--holdout must be a fraction between 0 and 1"),
        (None, 1, "--folds must be at least 2, got 1"),
        (0.3, 5, "give --holdout or --folds, not both"),
    ],
)
def test_bad_flags_are_refused(holdout, folds, message) -> None:
    with pytest.raises(SplitError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_split_flags(holdout, folds)


def test_a_part_without_a_scored_case_is_an_error_naming_it() -> None:
    cases = [_case(i, "answer", None, None) for i in range(5)] + [_case(5, "noAnswer", None, None)]
    with pytest.raises(SplitError) as err:
        make_split(cases, 0.05, None, 42)
    assert str(err.value) == (
        "--holdout 0.05: the held-out part has no scored case (0 of 6 cases; the golden set has 5 scored "
        "cases in 5 groups or single cases); use a larger fraction"
    )
    with pytest.raises(SplitError, match=r"--folds 6: fold \d of 6 has no scored case .*; use fewer folds"):
        make_split(cases, None, 6, 42)
    grouped = [_case(i, "answer", None, "one") for i in range(6)]  # one group: it cannot be split
    with pytest.raises(SplitError, match="in 1 groups or single cases"):
        make_split(grouped, None, 2, 42)


def test_the_split_json_names_every_part() -> None:
    cases = [_case(i, "answer", None, None) for i in range(10)]
    split = make_split(cases, 0.3, None, 7)
    assert isinstance(split, HoldoutSplit) and split.mode == "holdout" and split.seed == 7
    assert split.fraction == 0.3 and sorted(split.parts.tuning + split.parts.held_out) == sorted(
        c.id for c in cases
    )
    assert split.to_json()["parts"].keys() == {TUNING, HELD_OUT}
    folds = make_split(cases, None, 3, 7)
    assert isinstance(folds, FoldSplit) and folds.k == 3 and len(folds.parts.folds) == 3
    assert make_split(cases, None, None, 7) is None


# -- the figures, on a tiny world whose every ranking is known ------------------------------------------

LOG3 = math.log2(3)
THRESHOLDS = EvaluateThresholds(min_recall=0.9)
# (the rankings of each threshold: tests/fixtures/tiny_replay.py)
TUNE = ["a1", "a1b", "a4", "n1"]
HELD = ["a2", "a3", "n2"]


def test_holdout_figures_gains_and_optimism() -> None:
    recording, grid = tiny()
    out = run_holdout(recording, grid, tiny_settings(), THRESHOLDS, 0.005, [TUNE, HELD])
    assert out.analysis is not None
    h = out.analysis.to_json()
    rows = out.result.to_json()["rows"]
    assert h["parts"] == {
        TUNING: {"cases": 4, "scoredCases": 3, "noAnswerCases": 1},
        HELD_OUT: {"cases": 3, "scoredCases": 2, "noAnswerCases": 1},
    }
    cur_t, cur_h = h["current"][TUNING]["metrics"], h["current"][HELD_OUT]["metrics"]
    assert cur_t["ndcg"] == pytest.approx((1 + 1 + 1) / 3)
    assert cur_t["meanResults"] == pytest.approx((2 + 2 + 2 + 1) / 4)
    assert cur_t["correctAbstention"] == 0 / 1
    assert cur_h["ndcg"] == pytest.approx((1 / LOG3 + 1 / LOG3) / 2)
    assert cur_h["mrr"] == pytest.approx((1 / 2 + 1 / 2) / 2)
    assert cur_h["meanResults"] == pytest.approx((2 + 2 + 1) / 3)
    # the rows and the recommendation are the tuning part's: every point finds a1, a1b, a4 at rank 1
    assert [r["metrics"]["ndcg"] for r in rows] == [1.0, 1.0, 1.0]
    assert [r["metrics"]["correctAbstentions"] for r in rows] == [0, 0, 1]
    # best: the highest nDCG passing the gate, ties to the earlier point: 0.0, the current setting
    best = h["best"]
    assert best["point"] == {"chain.similarity_threshold.min_dense": 0.0}
    assert all(v == 0 for side in (TUNING, HELD_OUT) for v in best["gain"][side].values())
    assert all(v == 0 for v in best["optimism"].values())
    # abstention: 0.65 abstains on n1 and keeps recall and nDCG on the tuning part
    rec = h["abstention"]
    assert rec["point"] == {"chain.similarity_threshold.min_dense": 0.65}
    assert rec[TUNING]["passesGate"] and not rec[HELD_OUT]["passesGate"]  # held-out recall 0 < 0.9
    assert h["current"][HELD_OUT]["passesGate"]
    g_t, g_h = rec["gain"][TUNING], rec["gain"][HELD_OUT]
    assert g_t["recall"] == 1 - 1 and g_t["ndcg"] == pytest.approx(1 - 1)
    assert g_t["correctAbstention"] == 1 / 1 - 0 / 1
    assert g_t["meanResults"] == pytest.approx((1 + 1 + 1 + 0) / 4 - (2 + 2 + 2 + 1) / 4)
    assert g_h["recall"] == (0 + 0) / 2 - (1 + 1) / 2
    assert g_h["ndcg"] == pytest.approx((0 + 0) / 2 - (1 / LOG3 + 1 / LOG3) / 2)
    assert g_h["mrr"] == pytest.approx(0 - (1 / 2 + 1 / 2) / 2)
    assert g_h["correctAbstention"] == 1 / 1 - 0 / 1
    assert g_h["falseAnswerRate"] == 0 / 1 - 1 / 1
    assert g_h["meanResults"] == pytest.approx((1 + 1 + 0) / 3 - (2 + 2 + 1) / 3)
    o = rec["optimism"]
    assert o["recall"] == pytest.approx(0 - (0 - 1))
    assert o["ndcg"] == pytest.approx(0 - (0 - 1 / LOG3))
    assert o["correctAbstention"] == pytest.approx(1 - 1)
    assert o["meanResults"] == pytest.approx((3 / 4 - 7 / 4) - (2 / 3 - 5 / 3))
    assert out.all_current.ndcg == pytest.approx((1 + 1 + 1 / LOG3 + 1 / LOG3 + 1) / 5)


def test_fold_figures_means_and_agreement() -> None:
    recording, grid = tiny()
    out = run_folds(recording, grid, tiny_settings(), THRESHOLDS, 0.005, [TUNE, HELD])
    assert out.analysis is not None
    f = out.analysis.to_json()
    assert f["k"] == 2
    one, two = f["perFold"]
    # fold 1 is held out: recommended on fold 2's cases (a2, a3, n2), where 0.55 and 0.65 lose recall
    assert one["best"]["point"] == {"chain.similarity_threshold.min_dense": 0.0}
    assert one["abstention"] is None
    assert one["current"][HELD_OUT]["metrics"]["ndcg"] == pytest.approx((1 + 1 + 1) / 3)
    assert one["current"][TUNING]["metrics"]["ndcg"] == pytest.approx((1 / LOG3 + 1 / LOG3) / 2)
    # fold 2 is held out: the holdout of the test above
    assert two["abstention"]["point"] == {"chain.similarity_threshold.min_dense": 0.65}
    assert two["abstention"]["optimism"]["recall"] == pytest.approx(0 - (0 - 1))
    mean = f["mean"]
    assert mean["current"][HELD_OUT]["ndcg"] == pytest.approx((1 + (1 / LOG3 + 1 / LOG3) / 2) / 2)
    assert mean["best"]["folds"] == [1, 2]
    assert mean["best"]["recommended"][HELD_OUT]["ndcg"] == pytest.approx((1 + 1 / LOG3) / 2)
    assert mean["best"]["gain"][HELD_OUT]["ndcg"] == pytest.approx((0 + 0) / 2)
    assert mean["abstention"]["folds"] == [2]  # fold 1 recommended none: the means are over fold 2 alone
    assert mean["abstention"]["current"][HELD_OUT]["recall"] == pytest.approx((1 + 1) / 2)
    assert mean["abstention"]["recommended"][HELD_OUT]["recall"] == pytest.approx((0 + 0) / 2)
    assert mean["abstention"]["optimism"]["ndcg"] == pytest.approx(0 - (0 - 1 / LOG3))
    assert f["agreement"]["best"] == {
        "points": [{"point": {"chain.similarity_threshold.min_dense": 0.0}, "folds": [1, 2]}],
        "none": [],
        "mostOften": 2,
        "allCasesPoint": 2,  # over every case the highest nDCG is 0.0's too
        "of": 2,
    }
    assert f["agreement"]["abstention"] == {
        "points": [{"point": {"chain.similarity_threshold.min_dense": 0.65}, "folds": [2]}],
        "none": [1],
        "mostOften": 1,
        "allCasesPoint": None,  # over every case nothing abstains without losing recall
        "of": 2,
    }
    assert out.result.recommendation.abstention is None
    assert [r.metrics.ndcg for r in out.result.rows][0] == pytest.approx(out.all_current.ndcg)


def test_the_tune_files_carry_the_split_and_the_figures(tmp_path) -> None:
    recording, grid = tiny()
    split = HoldoutSplit(
        seed=42,
        fraction=0.3,
        stratified_by=[],
        groups_together=True,
        parts=HoldoutParts(tuning=TUNE, held_out=HELD),
    )
    doc = tiny_document(run_holdout(recording, grid, tiny_settings(), THRESHOLDS, 0.005, [TUNE, HELD]), split)
    write_tune(doc, str(tmp_path), "t", stamp="s")
    assert json.loads((tmp_path / "t-tune-latest.json").read_text()) == doc.to_json()
    markdown = (tmp_path / "t-tune-latest.md").read_text()
    assert "## Recommendation (on the tuning part: 4 of 7 cases)" in markdown
    assert "## Holdout: recommended on 4 cases, checked on 3 held out" in markdown
    assert (
        "### Abstention (most correct abstentions within the tolerance): "
        "`similarity_threshold.min_dense=0.65`" in markdown
    )
    # Recall: current 1 -> 1 on tuning (gain 0), 1 -> 0 held out (gain -1): optimism +1
    assert "| Recall | 1.000 | 1.000 | +0.000 | 1.000 | 0.000 | -1.000 | +1.000 |" in markdown
    assert "| Gate | pass | pass |  | pass | FAIL |  |  |" in markdown

    folds = FoldSplit(
        seed=42, k=2, stratified_by=[], groups_together=True, parts=FoldParts(folds=[TUNE, HELD])
    )
    markdown = tune_markdown(
        tiny_document(run_folds(recording, grid, tiny_settings(), THRESHOLDS, 0.005, [TUNE, HELD]), folds)
    )
    assert "## Cross-validation: 2 folds" in markdown
    assert (
        "Recommended points: `similarity_threshold.min_dense=0.65` in 1 of 2 folds (fold 2); none in fold 1."
        in markdown
    )
    assert "the all-cases recommendation in 2 of 2 folds" in markdown


# -- the command's flags ----------------------------------------------------------------------------------


@pytest.fixture
def no_model(tmp_path, monkeypatch):
    import os

    for name in [n for n in os.environ if n.startswith("RAG__")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("SIEVE_CONFIG", raising=False)
    monkeypatch.setenv("RAG__STORE__PATH", str(tmp_path / "store"))
    monkeypatch.setenv("RAG__EVALUATE__OUTPUT_DIR", str(tmp_path / "out"))

    def refuse(settings):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("app.service.load_embedder", refuse)
    return tmp_path


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--holdout", "1.5"], "--holdout must be a fraction between 0 and 1 (exclusive), got 1.5"),
        (["--holdout", "0"], "--holdout must be a fraction between 0 and 1 (exclusive), got 0.0"),
        (["--folds", "1"], "--folds must be at least 2, got 1"),
        (["--holdout", "0.3", "--folds", "5"], "give --holdout or --folds, not both"),
    ],
)
def test_bad_flags_exit_2_before_any_model_loads(no_model, capsys, flags, message) -> None:
    code = main(["tune", "chain.bm25.dense_weight=0:1:0.5", *flags])
    _, err = capsys.readouterr()
    assert code == 2 and message in err


def test_a_part_without_a_scored_case_exits_2_before_any_model_loads(no_model, capsys) -> None:
    golden = no_model / "golden.json"
    cases = [{"id": f"c{i}", "query": f"q{i}", "expectedDocIds": [f"d{i}"]} for i in range(3)]
    golden.write_text(json.dumps({"cases": cases}))
    code = main(["tune", "chain.bm25.dense_weight=0:1:0.5", "--golden-set", str(golden), "--folds", "4"])
    _, err = capsys.readouterr()
    assert code == 2
    assert "--folds 4: fold 4 of 4 has no scored case (0 of 3 cases" in err and "use fewer folds" in err


def test_units_follow_the_file_and_take_their_cases_majority_stratum() -> None:
    cases = [
        _case(0, "answer", "hr", "g"),
        _case(1, "answer", None, None),
        _case(2, "answer", "it", "g"),
        _case(3, "answer", "it", "g"),
    ]
    units = split_units(cases)
    assert [(u.key, u.ids, u.stratum) for u in units] == [
        (("group", "g"), ("c0", "c2", "c3"), ("it", "answer")),
        (("case", "c1"), ("c1",), ("", "answer")),
    ]
