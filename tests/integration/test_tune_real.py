"""`sieve tune`'s replay against real evaluations: the real e5 embedder, an embedded Chroma with the sample
base, the real BM25 index and stages, and a deterministic stand-in cross-encoder (so the rerank parameters
change something; the sample configuration has no reranker model).

Every replayed point is compared with a real evaluation at that setting (`Sieve.with_settings`, the chain
`sieve eval` runs): every metric to 1e-9 and every case's returned chunk ids. To keep the module quick, the
real evaluations share one memo of the query embeddings: the runner embeds the same queries in the same
batches for every setting, so the vectors are the ones the model gives; the store, BM25 and stages run for
real each time.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest

from app.cli import main
from app.evaluation.golden.cases import load_golden_set
from app.evaluation.run.runner import KnownIds
from app.evaluation.session import run_evaluation
from app.evaluation.tune.grid import REPLAYABLE, parse_grid
from app.evaluation.tune.replay import point_metrics, record, replay
from app.service import Sieve
from app.settings import EvaluateSettings, RagSettings, Settings, StoreSettings
from app.store import ChromaStore
from tests.fixtures.seeded_store import seeded_store

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "golden_set" / "golden-set.json"
MODELS_CACHE = REPO / "target" / "models"


class StandInCrossEncoder:
    """Deterministic scores in [-4, 4): a function of (query, passage) only, like a real cross-encoder."""

    name = "stand-in-cross-encoder"

    def score(self, query: str, passages: list[str]) -> list[float]:
        overlap = [len(set(query) & set(p)) / (1 + len(set(query))) for p in passages]
        jitter = [int(hashlib.sha256((query + p).encode()).hexdigest()[:6], 16) / 2**24 for p in passages]
        return [8 * (0.7 * o + 0.3 * j) - 4 for o, j in zip(overlap, jitter, strict=True)]


class MemoEmbedder:
    def __init__(self, inner) -> None:
        self.inner = inner
        self.memo: dict[tuple[str, ...], np.ndarray] = {}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        key = tuple(texts)
        if key not in self.memo:
            self.memo[key] = np.array(self.inner.embed_queries(texts))
        return self.memo[key].copy()


@pytest.fixture(scope="module")
def world(tmp_path_factory, real_embedder, e5_settings):
    path = seeded_store(tmp_path_factory.mktemp("tune") / "store")
    rag = RagSettings(models=e5_settings, store=StoreSettings(path=str(path)))
    embedder = MemoEmbedder(real_embedder)
    store = ChromaStore.open(rag.store, real_embedder.identity())
    sieve = Sieve(Settings(rag=rag), embedder, store, StandInCrossEncoder())  # type: ignore[arg-type]
    golden = load_golden_set(str(GOLDEN))
    known = KnownIds.from_store(store)
    ev = EvaluateSettings(latency_sample=0)
    base = run_evaluation(sieve.chain, golden, known, ev)
    recording = record(base, sieve.chain)
    yield sieve, golden, known, ev, recording
    store.close()


def real_metrics(world, chain_settings):
    sieve, golden, known, ev, _ = world
    variant = sieve.with_settings(
        Settings(rag=sieve.settings.rag.model_copy(update={"chain": chain_settings}))
    )
    evaluation = run_evaluation(variant.chain, golden, known, ev)
    documents = [[d.chunk_id for d in c.result.documents] for c in evaluation.cases]
    return point_metrics(evaluation).to_json(), documents


def check_point(world, spec: list[str]) -> dict:
    sieve, *_, recording = world
    (settings,) = parse_grid(spec, sieve.settings.rag.chain).settings
    replayed = replay(recording, settings)
    got = point_metrics(replayed).to_json()
    expected, expected_ids = real_metrics(world, settings)
    for metric, value in expected.items():
        if value is None:
            assert got[metric] is None, (spec, metric)
        else:
            assert got[metric] == pytest.approx(value, abs=1e-9), (spec, metric, got[metric], value)
    assert [[d.chunk_id for d in c.result.documents] for c in replayed.cases] == expected_ids, spec
    rows = replay(recording, settings, trace=False)  # what a grid point of `sieve tune` runs
    assert point_metrics(rows).to_json() == got, spec
    assert [[d.chunk_id for d in c.result.documents] for c in rows.cases] == expected_ids, spec
    return got


def _value(key: str, rng: random.Random) -> str:
    leaf = key.rsplit(".", 1)[-1]
    if leaf in ("enabled", "mmr"):
        return rng.choice(["true", "false"])
    return str(
        {
            "min_dense": round(rng.uniform(0.78, 0.9), 3),
            "<tag>": round(rng.uniform(0.78, 0.9), 3),
            "fusion": rng.choice(["rrf", "weighted"]),
            "dense_weight": round(rng.uniform(0.05, 1), 2),
            "bm25_weight": round(rng.uniform(0.05, 1), 2),
            "rrf_k": rng.randint(1, 80),
            "min_score": rng.choice(["null", round(rng.uniform(0, 6), 1)]),
            "top_n": rng.randint(1, 30),
            "max_cosine": rng.choice(["null", round(rng.uniform(0.8, 0.99), 3)]),
            "max_per_document": rng.choice(["null", 1, 2]),
            "max_per_source": rng.choice(["null", 1, 2]),
            "mmr_lambda": round(rng.uniform(0, 1), 2),
            "min_results": rng.randint(0, 3),
        }[leaf]
    )


@pytest.mark.parametrize("key", REPLAYABLE)
def test_replay_equals_a_real_evaluation_at_random_points(world, key: str) -> None:
    rng = random.Random(f"real {key}")
    name = key.replace("<tag>", "hr")
    for _ in range(2):
        spec = [f"{name}={_value(key, rng)}"]
        if key.endswith("min_dense") or key.endswith("<tag>"):
            spec.append("chain.fallback.enabled=false")  # else the fallback hides most thresholds
        check_point(world, spec)


@pytest.mark.parametrize("seed", range(3))
def test_the_done_when_grids_equal_real_evaluations_at_random_points(world, seed: int) -> None:
    rng = random.Random(seed)
    threshold = rng.choice(
        parse_grid(
            ["chain.similarity_threshold.min_dense=0.80:0.90:0.01"], world[0].settings.rag.chain
        ).values["chain.similarity_threshold.min_dense"]
    )
    check_point(world, [f"chain.similarity_threshold.min_dense={threshold}", "chain.fallback.enabled=false"])
    weight = rng.randrange(21) / 20
    check_point(world, [f"chain.bm25.dense_weight={weight}"])


def test_a_high_threshold_without_fallback_abstains_on_no_answer_cases(world) -> None:
    got = check_point(world, ["chain.similarity_threshold.min_dense=0.87", "chain.fallback.enabled=false"])
    assert got["noAnswerCases"] > 0 and got["correctAbstentions"] > 0


# -- the command ---------------------------------------------------------------------------------------------


@pytest.fixture
def cli_env(monkeypatch, tmp_path_factory, real_embedder):
    path = seeded_store(tmp_path_factory.mktemp("tune-cli") / "store")
    out = tmp_path_factory.mktemp("tune-out")
    monkeypatch.chdir(REPO)
    for name in [n for n in os.environ if n.startswith("RAG__")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("SIEVE_CONFIG", raising=False)
    monkeypatch.setenv("RAG__STORE__PATH", str(path))
    monkeypatch.setenv("RAG__EVALUATE__OUTPUT_DIR", str(out))
    monkeypatch.setenv("RAG__MODELS__CACHE_DIR", str(MODELS_CACHE))
    monkeypatch.setattr("app.service.load_embedder", lambda settings: real_embedder)
    return out


def test_sieve_tune_writes_its_files_and_its_rows_equal_sieve_eval_runs(cli_env, capsys, monkeypatch) -> None:
    code = main(
        [
            "tune",
            "chain.similarity_threshold.min_dense=0.80:0.90:0.01",
            "rag.chain.fallback.enabled=false",
            "--json",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    assert set(doc) >= {"run", "grid", "rows", "recommendation", "costMs", "current"}
    assert doc["grid"]["chain.similarity_threshold.min_dense"] == [
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
    assert doc["grid"]["chain.fallback.enabled"] == [False] and len(doc["rows"]) == 11
    assert doc["run"]["selfCheck"].startswith("ok")
    assert set(doc["rows"][0]) == {"params", "metrics", "passesGate", "pareto"}
    assert set(doc["costMs"]) >= {"candidates", "perPoint"}
    assert any(r["pareto"] for r in doc["rows"])
    names = sorted(p.name for p in cli_env.iterdir())
    assert "retrieval-eval-tune-latest.json" in names and "retrieval-eval-tune-latest.md" in names
    assert json.loads((cli_env / "retrieval-eval-tune-latest.json").read_text()) == doc
    for row in (doc["rows"][2], doc["rows"][7]):
        assert_row_equals_sieve_eval(row, cli_env, capsys, monkeypatch)


def assert_row_equals_sieve_eval(row, cli_env, capsys, monkeypatch) -> None:
    """`sieve eval` with the row's settings (as RAG__CHAIN__... variables) reports the row's figures."""
    for key, value in row["params"].items():
        monkeypatch.setenv("RAG__" + key.upper().replace(".", "__"), json.dumps(value))
    code = main(["eval", "--baseline", "none", "--output-dir", str(cli_env / "eval")])
    capsys.readouterr()
    assert code == 0
    summary = json.loads((cli_env / "eval" / "retrieval-eval-latest.json").read_text())["summary"]
    m = row["metrics"]
    for key in ("recall", "hitRate", "mrr", "ndcg"):
        assert m[key] == pytest.approx(summary[key], abs=1e-9), (row["params"], key)
    assert m["correctAbstention"] == pytest.approx(summary["noAnswer"]["correctAbstentionRate"], abs=1e-9)
    assert m["falseAnswerRate"] == pytest.approx(summary["noAnswer"]["falseAnswerRate"], abs=1e-9)
    assert m["forbiddenHits"] == summary["forbidden"]["hits"]


def test_the_dense_weight_sweep_finishes_and_its_rows_equal_sieve_eval_runs(cli_env, capsys, monkeypatch):
    code = main(["tune", "chain.bm25.dense_weight=0:1:0.05", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    assert len(doc["rows"]) == 21 and doc["run"]["selfCheck"].startswith("ok")
    for row in (doc["rows"][3], doc["rows"][16]):
        assert_row_equals_sieve_eval(row, cli_env, capsys, monkeypatch)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["chain.bm25.k1=1:2:0.5"], "replayable: similarity_threshold.enabled"),
        (["retrieval.candidate_k=10,20"], "not a rag.chain.* key"),
        (["chain.bm25.fusion=rrf,mean"], "chain.bm25.fusion=mean"),
        (
            ["chain.bm25.dense_weight=0:1:0.001", "chain.bm25.bm25_weight=0:1:0.5"],
            "more than --max-points 2000",
        ),
    ],
)
def test_a_bad_grid_exits_2_before_any_model_loads(cli_env, capsys, monkeypatch, argv, message) -> None:
    def no_model(settings):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("app.service.load_embedder", no_model)
    code = main(["tune", *argv])
    _, err = capsys.readouterr()
    assert code == 2 and message in err


@pytest.mark.parametrize("enabled", [True, False])
def test_sieve_eval_reports_the_threshold_sweep_unless_switched_off(
    cli_env, capsys, monkeypatch, enabled
) -> None:
    monkeypatch.setenv("RAG__EVALUATE__SWEEP__ENABLED", str(enabled).lower())
    code = main(["eval", "--baseline", "none"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads((cli_env / "retrieval-eval-latest.json").read_text())
    markdown = (cli_env / "retrieval-eval-latest.md").read_text()
    if not enabled:
        assert (
            report["sweep"] is None and "## Threshold sweep" not in markdown and "sweep min_dense" not in out
        )
        return
    sweep = report["sweep"]
    assert sweep["param"] == "chain.similarity_threshold.min_dense" and len(sweep["rows"]) == 21
    values = sweep["grid"]["chain.similarity_threshold.min_dense"]
    assert values == sorted(values) and sweep["grid"]["chain.fallback.enabled"] == [False]
    assert sweep["current"]["point"] == {
        "chain.similarity_threshold.min_dense": 0.0,
        "chain.fallback.enabled": True,
    }
    # the replayed current configuration is this very evaluation
    for key in ("recall", "hitRate", "mrr", "ndcg"):
        assert sweep["current"]["metrics"][key] == pytest.approx(report["summary"][key], abs=1e-9)
    rec = sweep["recommendation"]["abstention"]
    assert rec is not None  # the sample set has 4 no-answer cases a threshold can separate
    line = next(x for x in out.splitlines() if x.startswith("sweep min_dense: "))
    m = rec["metrics"]
    assert line == (
        f"sweep min_dense: {rec['point']['chain.similarity_threshold.min_dense']} abstains on "
        f"{m['correctAbstentions']}/{m['noAnswerCases']} no-answer cases, recall "
        f"{sweep['current']['metrics']['recall']:.3f} -> {m['recall']:.3f} (fallback off)"
    )
    assert "## Threshold sweep" in markdown and "Recommended abstention threshold" in markdown
