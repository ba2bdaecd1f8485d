"""`sieve tune`'s grid, the replay engine and the recommendation, on fakes: a counting embedder, store-like
candidate generator, BM25 scorer and reranker around the real stages and the real runner."""

from __future__ import annotations

import hashlib
import json
import random
from datetime import date
from typing import Any

import numpy as np
import pytest

from app.evaluation.golden.cases import GoldenCase, GoldenSet
from app.evaluation.render.lines import sweep_line
from app.evaluation.report.model import PointFigures, SweepRow
from app.evaluation.run.runner import KnownIds, evaluate
from app.evaluation.tune.grid import (
    REPLAYABLE,
    GridError,
    normalise_key,
    parse_grid,
    parse_spec,
    recommend,
    run_grid,
    sweep_values,
    threshold_sweep,
)
from app.evaluation.tune.model import GridResult
from app.evaluation.tune.replay import ReplayError, pareto_front, point_metrics, record, replay
from app.retrieval.candidates import CandidateSet
from app.retrieval.chain import RetrievalChain
from app.retrieval.stages import build_stages
from app.retrieval.types import Candidate
from app.settings import ChainSettings, EvaluateThresholds

# -- the grid ------------------------------------------------------------------


def test_a_float_range_is_inclusive_and_exact() -> None:
    values = parse_spec("k", "0:1:0.05")
    assert len(values) == 21
    assert values == [i / 20 for i in range(21)]
    assert parse_spec("k", "0.80:0.90:0.01") == [
        0.8,
        0.81,
        0.82,
        0.83,
        0.84,
        0.85,
        0.86,
        0.87,
        0.88,
        0.89,
        0.9,
    ]


def test_an_integer_range_gives_integers_and_stops_at_or_before_stop() -> None:
    assert parse_spec("k", "10:60:20") == [10, 30, 50]
    assert all(isinstance(v, int) for v in parse_spec("k", "1:3:1"))


def test_a_list_keeps_strings_for_the_settings_model_and_null_as_none() -> None:
    assert parse_spec("k", "rrf, weighted,null") == ["rrf", "weighted", None]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("0:1", "start:stop:step"),
        ("0:1:0", "step must be > 0"),
        ("1:0:0.1", "stop must be >= start"),
        ("a:b:c", "must be numbers"),
        ("0.1,,0.2", "empty value"),
        ("", "empty grid"),
    ],
)
def test_a_bad_grid_is_refused_with_what_was_expected(spec: str, message: str) -> None:
    with pytest.raises(GridError, match=message):
        parse_spec("chain.bm25.dense_weight", spec)


def test_the_rag_prefix_is_optional() -> None:
    assert normalise_key("rag.chain.bm25.dense_weight") == normalise_key("chain.bm25.dense_weight")
    assert normalise_key("chain.similarity_threshold.per_knowledge_tag.hr").endswith(".hr")


@pytest.mark.parametrize(
    "key",
    [
        "chain.bm25.k1",
        "chain.bm25.b",
        "retrieval.candidate_k",
        "rag.retrieval.candidate_k",
        "chain.rerank.model",
    ],
)
def test_what_changes_the_candidates_is_refused_with_the_replayable_list(key: str) -> None:
    with pytest.raises(GridError) as err:
        normalise_key(key)
    assert "replayable: similarity_threshold.enabled, similarity_threshold.min_dense" in str(err.value)
    assert "bm25.dense_weight" in str(err.value)


def test_a_known_but_unreplayable_key_says_why() -> None:
    with pytest.raises(GridError, match="changes the candidates"):
        normalise_key("chain.bm25.k1")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("chain.bm25.fusion=rrf,mean", r"chain.bm25.fusion=mean: .*'rrf' or 'weighted'"),
        ("chain.similarity_threshold.min_dense=0.5,2", r"min_dense=2.*less than or equal to 1"),
        ("chain.rerank.top_n=5,0", r"top_n=0: .*greater than or equal to 1"),
        ("chain.fallback.enabled=true,maybe", r"enabled=maybe: .*boolean"),
        ("chain.diversity.max_per_document=1.5", r"max_per_document=1.5"),
    ],
)
def test_an_invalid_value_is_an_error_naming_the_key_and_value(spec: str, message: str) -> None:
    with pytest.raises(GridError, match=message):
        parse_grid([spec], ChainSettings())


def test_values_take_the_settings_types() -> None:
    grid = parse_grid(
        [
            "chain.fallback.enabled=true,false",
            "chain.diversity.max_cosine=null,0.9",
            "chain.bm25.rrf_k=10,20",
        ],
        ChainSettings(),
    )
    assert grid.values == {
        "chain.fallback.enabled": [True, False],
        "chain.diversity.max_cosine": [None, 0.9],
        "chain.bm25.rrf_k": [10, 20],
    }
    assert len(grid.points) == 8
    assert grid.points[0] == {
        "chain.fallback.enabled": True,
        "chain.diversity.max_cosine": None,
        "chain.bm25.rrf_k": 10,
    }
    assert grid.settings[1].bm25.rrf_k == 20 and grid.settings[1].diversity.max_cosine is None


def test_a_point_invalid_only_in_combination_is_refused_before_anything_runs() -> None:
    with pytest.raises(GridError, match="chain.bm25.dense_weight=0.0, chain.bm25.bm25_weight=0.0"):
        parse_grid(["chain.bm25.dense_weight=0:1:0.5", "chain.bm25.bm25_weight=0,0.4"], ChainSettings())


def test_a_grid_past_max_points_is_refused_with_its_size() -> None:
    with pytest.raises(GridError, match=r"2121 points \(21 x 101\), more than --max-points 2000"):
        parse_grid(
            ["chain.bm25.dense_weight=0:1:0.05", "chain.similarity_threshold.min_dense=0:1:0.01"],
            ChainSettings(),
        )
    assert len(parse_grid(["chain.bm25.dense_weight=0:1:0.05"], ChainSettings(), max_points=21).points) == 21


def test_a_per_tag_threshold_is_set_in_the_dict() -> None:
    grid = parse_grid(["chain.similarity_threshold.per_knowledge_tag.hr=0.5,0.8"], ChainSettings())
    assert [s.similarity_threshold.per_knowledge_tag for s in grid.settings] == [{"hr": 0.5}, {"hr": 0.8}]


# -- replay on fakes ------------------------------------------------------------------

TAGS = ("hr", "it")


def _vec(seed: str) -> np.ndarray:
    rng = np.random.default_rng(int(hashlib.sha256(seed.encode()).hexdigest()[:8], 16))
    v = rng.normal(size=8)
    return (v / np.linalg.norm(v)).astype(np.float32)


def _corpus() -> list[Candidate]:
    out = []
    for i in range(24):
        doc = f"d{i // 2}"  # two chunks per document
        meta = {"doc_id": doc, "source": f"s{i // 6}.md", "knowledge": TAGS[i % 2]}
        if i == 5:
            meta["status"] = "retired"
        if i in (8, 9, 10, 11):
            meta["doc_sha256"] = "same"  # d4 and d5 are copies of each other
        text = f"text {i // 2}" if i in (20, 22) else f"chunk {i} of {doc}"  # d10 and d11 share a text
        emb = _vec(str(i // 3 if i < 6 else i))  # chunks 0-2 and 3-5 are near-duplicates
        out.append(Candidate(f"c{i}", doc, text, meta, emb, {}, frozenset({"dense"})))
    return out


class CountingEmbedder:
    def __init__(self) -> None:
        self.calls = 0

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        return np.stack([_vec("q" + t) for t in texts])


class CountingStore:
    """A candidate generator over `_corpus()`: dense = cosine of query and chunk vectors, all chunks."""

    def __init__(self) -> None:
        self.calls = 0
        self.corpus = _corpus()

    def generate_many(self, queries, embeddings, tags, principals=None):
        self.calls += 1
        out = []
        for emb, tag in zip(embeddings, tags, strict=True):
            cands = [
                Candidate(
                    c.chunk_id, c.doc_id, c.text, c.metadata, c.embedding, {"dense": float(emb @ c.embedding)}
                )
                for c in self.corpus
                if tag is None or c.metadata["knowledge"] == tag
            ]
            cands.sort(key=lambda c: (-c.scores["dense"], c.doc_id, c.chunk_id))
            out.append(CandidateSet(cands, {"dense": len(cands), "bm25": 0, "both": 0}))
        return out


class CountingLexical:
    def __init__(self) -> None:
        self.calls = 0

    def scores(self, query, ids):
        self.calls += 1
        return {i: float(int(hashlib.sha256((query + i).encode()).hexdigest()[:4], 16) % 7) for i in ids}


class CountingReranker:
    name = "fake-cross-encoder"

    def __init__(self) -> None:
        self.calls = 0

    def score(self, query, passages):
        self.calls += 1
        return [
            int(hashlib.sha256((query + p).encode()).hexdigest()[:6], 16) / 2**24 * 8 - 4 for p in passages
        ]


def _golden() -> GoldenSet:
    cases = []
    for i in range(10):
        fields = {"id": f"q{i}", "query": f"question {i}", "expectedDocIds": [f"d{i}", f"d{(i + 3) % 12}"]}
        if i % 3 == 0:
            fields["knowledgeTag"] = TAGS[i % 2]
        if i == 4:
            fields["forbiddenDocIds"] = ["d9"]
        cases.append(GoldenCase.model_validate(fields))
    for i in range(4):
        cases.append(
            GoldenCase.model_validate({"id": f"na{i}", "query": f"nothing {i}", "expectNoAnswer": True})
        )
    return GoldenSet(dataset_version="t", cases=cases, path="golden.json")


KNOWN = KnownIds.from_metadata((c.chunk_id, c.metadata) for c in _corpus())
TODAY = date(2026, 1, 1)


class Fakes:
    def __init__(self) -> None:
        self.embedder, self.store = CountingEmbedder(), CountingStore()
        self.lexical, self.reranker = CountingLexical(), CountingReranker()

    def chain(self, settings: ChainSettings) -> RetrievalChain:
        return RetrievalChain(self.embedder, self.store, build_stages(settings, self.lexical, self.reranker))  # type: ignore[arg-type]

    def calls(self) -> tuple[int, int, int, int]:
        return (self.embedder.calls, self.store.calls, self.lexical.calls, self.reranker.calls)


def real(fakes: Fakes, settings: ChainSettings):
    return evaluate(fakes.chain(settings), _golden(), 3, KNOWN, today=TODAY)


def random_value(key: str, rng: random.Random):
    leaf = key.rsplit(".", 1)[-1]
    if leaf in ("enabled", "mmr"):
        return rng.choice([True, False])
    return {
        "min_dense": round(rng.uniform(-0.6, 0.6), 2),
        "<tag>": round(rng.uniform(-0.6, 0.6), 2),
        "fusion": rng.choice(["rrf", "weighted"]),
        "dense_weight": round(rng.uniform(0.05, 1), 2),
        "bm25_weight": round(rng.uniform(0.05, 1), 2),
        "rrf_k": rng.randint(1, 80),
        "min_score": rng.choice([None, round(rng.uniform(-2, 4), 1)]),
        "top_n": rng.randint(1, 12),
        "max_cosine": rng.choice([None, round(rng.uniform(0.3, 1), 2)]),
        "max_per_document": rng.choice([None, 1, 2]),
        "max_per_source": rng.choice([None, 1, 2, 3]),
        "mmr_lambda": round(rng.uniform(0, 1), 2),
        "min_results": rng.randint(0, 4),
    }[leaf]


@pytest.mark.parametrize("key", REPLAYABLE)
def test_replay_equals_a_real_evaluation_at_random_points_of_every_parameter(key: str) -> None:
    fakes = Fakes()
    recording = record(real(fakes, ChainSettings()), fakes.chain(ChainSettings()))
    rng = random.Random(key)
    name = key.replace("<tag>", "hr")
    base = parse_grid([f"chain.fallback.enabled={rng.choice(['true', 'false'])}"], ChainSettings()).settings[
        0
    ]
    for _ in range(4):
        value = random_value(key, rng)
        spec = (
            f"{name}={'null' if value is None else str(value).lower() if isinstance(value, bool) else value}"
        )
        (settings,) = parse_grid([spec], base).settings
        before = fakes.calls()
        replayed = replay(recording, settings)
        assert fakes.calls() == before, "the replay called a model, the store or the BM25 index"
        live = real(fakes, settings)
        expected, got = point_metrics(live).to_json(), point_metrics(replayed).to_json()
        for metric, value_live in expected.items():
            if value_live is None:
                assert got[metric] is None, (spec, metric)
            else:
                assert got[metric] == pytest.approx(value_live, abs=1e-9), (spec, metric)
        assert [[d.chunk_id for d in c.result.documents] for c in replayed.cases] == [
            [d.chunk_id for d in c.result.documents] for c in live.cases
        ], spec
        rows = replay(recording, settings, trace=False)  # what a grid point runs
        assert point_metrics(rows).to_json() == got, spec
        assert _documents(rows) == _documents(live), spec


def _documents(evaluation) -> list[list[str] | None]:
    return [[d.chunk_id for d in c.result.documents] if c.result else None for c in evaluation.cases]


def test_a_rows_only_replay_gives_every_figure_and_document_of_the_full_replay() -> None:
    """The grid's replay scores the final lists only, and its diversity stage may stop once it has kept what
    the top K (and the fallback's min_results) needs: the rows and the documents must stay those of a full
    replay, also when the walk has to go past its first prefix (caps that remove most candidates) and when
    the fallback wants more than K."""
    fakes = Fakes()
    recording = record(real(fakes, ChainSettings()), fakes.chain(ChainSettings()))
    grid = parse_grid(
        [
            "chain.diversity.max_per_document=1,2,null",
            "chain.diversity.max_per_source=1,2,null",
            "chain.diversity.max_cosine=0.2,0.97",
            "chain.fallback.min_results=0,2,7",
            "chain.fallback.enabled=true,false",
        ],
        ChainSettings(),
    )
    shortened = 0
    for settings in grid.settings:
        full, rows = replay(recording, settings), replay(recording, settings, trace=False)
        assert point_metrics(rows) == point_metrics(full), settings
        assert _documents(rows) == _documents(full), settings
        for a, b in zip(full.cases, rows.cases, strict=True):
            removed_full = [len(s.removed) for s in a.result.trace.stages]
            removed_rows = [len(s.removed) for s in b.result.trace.stages]
            shortened += removed_rows != removed_full
        assert [c.stage_stats for c in rows.cases] == [[] for _ in rows.cases]  # rows only: no stage rows
    assert shortened > 0  # the prefix walk did happen


def test_recording_scores_every_candidate_once_and_replay_never_calls_them_again() -> None:
    fakes = Fakes()
    evaluation = real(fakes, ChainSettings())
    after_eval = fakes.calls()
    recording = record(evaluation, fakes.chain(ChainSettings()))
    cases = len(evaluation.cases)
    assert fakes.calls()[:2] == after_eval[:2]  # recording needs no embedding and no store call
    assert fakes.calls()[2] - after_eval[2] == cases  # one BM25 call per case, over all its candidates
    assert fakes.calls()[3] - after_eval[3] == cases  # one reranker call per case, over all its candidates
    settled = fakes.calls()
    for point in parse_grid(
        ["chain.bm25.dense_weight=0:1:0.25", "chain.rerank.top_n=1,20"], ChainSettings()
    ).settings:
        replay(recording, point)
    assert fakes.calls() == settled


def _everything(evaluation) -> list:
    """Every case's documents with their scores, and every stage's trace with its removal reasons."""
    out = []
    for c in evaluation.cases:
        r = c.result
        out.append(
            (
                [(d.chunk_id, sorted(d.scores.items())) for d in r.documents],
                [
                    (s.name, s.input_count, s.output_count, s.removed, s.added, s.skipped)
                    for s in r.trace.stages
                ],
                r.trace.ranked_after,
                c.metrics,
                c.lost,
            )
        )
    return out


def test_a_point_replays_the_same_whatever_the_points_replayed_before_it() -> None:
    """The stage memo is shared by every point of a recording: reusing an outcome must never change one."""
    fakes = Fakes()
    grid = parse_grid(
        [
            "chain.similarity_threshold.min_dense=0.1,0.5",
            "chain.bm25.dense_weight=0.2,0.8",
            "chain.rerank.top_n=1,20",
            "chain.diversity.mmr=true,false",
            "chain.fallback.enabled=true,false",
        ],
        ChainSettings(),
    ).settings
    forward = record(real(fakes, ChainSettings()), fakes.chain(ChainSettings()))
    backward = record(real(fakes, ChainSettings()), fakes.chain(ChainSettings()))
    ahead = [_everything(replay(forward, point)) for point in grid]
    behind = [_everything(replay(backward, point)) for point in reversed(grid)][::-1]
    assert ahead == behind
    fresh = record(real(fakes, ChainSettings()), fakes.chain(ChainSettings()))
    assert _everything(replay(fresh, grid[5])) == ahead[5]


def test_a_replay_asked_for_an_unrecorded_score_fails_loudly() -> None:
    fakes = Fakes()
    recording = record(real(fakes, ChainSettings()), fakes.chain(ChainSettings()))
    recording.lexical.table.clear()
    with pytest.raises(ReplayError, match="no recorded BM25 score"):
        replay(recording, ChainSettings())


# -- recommendation and Pareto ------------------------------------------------------------------


def row(ndcg, recall, abst, passes=True, n=4):
    metrics = PointFigures(
        ndcg=ndcg,
        recall=recall,
        correct_abstention=abst / n,
        correct_abstentions=abst,
        no_answer_cases=n,
        hit_rate=None,
        mrr=None,
        false_answer_rate=None,
        forbidden_hits=0,
        mean_results=None,
    )
    return SweepRow(params={"x": ndcg}, metrics=metrics, passes_gate=passes, pareto=False)


def test_pareto_marks_the_points_nothing_beats_on_both_ndcg_and_abstention() -> None:
    rows = [row(0.9, 1, 0), row(0.8, 1, 2), row(0.7, 1, 2), row(0.6, 1, 4), row(0.9, 1, 0)]
    assert pareto_front([r.metrics for r in rows]) == [True, True, False, True, True]


def test_best_is_the_highest_ndcg_that_passes_the_gate() -> None:
    rows = [row(0.95, 1, 0, passes=False), row(0.9, 1, 0), row(0.8, 1, 2)]
    assert recommend(rows, row(0.85, 1, 0).metrics, 0.005).best.metrics.ndcg == 0.9


def test_abstention_is_the_most_abstentions_within_tolerance_of_the_current() -> None:
    current = row(0.90, 1.0, 0).metrics
    rows = [
        row(0.90, 1.0, 1),
        row(0.896, 0.996, 2),
        row(0.894, 1.0, 4),
        row(0.95, 0.99, 4),
        row(0.90, 1.0, 2),
    ]
    rec = recommend(rows, current, 0.005).abstention
    # 0.894 loses 0.006 nDCG and 0.95/0.99 loses 0.01 recall: out; of the two with 2, the higher nDCG wins
    assert rec.metrics.correct_abstentions == 2 and rec.metrics.ndcg == 0.90


def test_no_abstention_recommendation_when_nothing_abstains() -> None:
    assert recommend([row(0.9, 1, 0)], row(0.9, 1, 0).metrics, 0.005).abstention is None


# -- the startup sweep ------------------------------------------------------------------


def test_sweep_values_span_the_observed_scores_in_21_steps() -> None:
    values = sweep_values([0.80, 0.90, 0.85])
    assert len(values) == 21 and values[0] == 0.8 and values[-1] == 0.9 and values[10] == 0.85
    assert sweep_values([]) == [] and sweep_values([0.5, 0.5]) == [0.5]


def test_the_sweep_replays_min_dense_with_the_fallback_off_and_names_a_threshold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    produced: list[GridResult] = []

    def recorded(*args: Any, **kwargs: Any) -> GridResult:
        produced.append(run_grid(*args, **kwargs))
        return produced[-1]

    monkeypatch.setattr("app.evaluation.tune.grid.run_grid", recorded)
    fakes = Fakes()
    recording = record(real(fakes, ChainSettings()), fakes.chain(ChainSettings()))
    sweep = threshold_sweep(recording, ChainSettings(), EvaluateThresholds(), 0.005)
    assert sweep is not None and sweep.param == "chain.similarity_threshold.min_dense"
    # the typed sweep writes the JSON the grid's records make, key for key and number for number
    assert json.dumps(sweep.to_json()) == json.dumps({"param": sweep.param, **produced[0].to_json()})
    assert len(sweep.rows) == 21
    assert all(r.params["chain.fallback.enabled"] is False for r in sweep.rows)
    assert sweep.current.point == {
        "chain.similarity_threshold.min_dense": 0.0,
        "chain.fallback.enabled": True,
    }
    top = sweep.rows[-1].metrics  # the highest threshold keeps only the best candidate of the best case
    assert top.correct_abstentions == 4
    line = sweep_line(sweep)
    assert line is not None and line.startswith("sweep min_dense: ")
    rec = sweep.recommendation.abstention
    if rec is not None:
        assert f"abstains on {rec.metrics.correct_abstentions}/4 no-answer cases" in line
        assert line.endswith("(fallback off)")
