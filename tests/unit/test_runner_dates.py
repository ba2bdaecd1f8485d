"""A case's asOf on the real stages: the registry's chain (the hard filter checks effective dates) over a
fake embedder and candidate generator, and the replay of `sieve tune`, which must judge each case as of the
same date."""

from __future__ import annotations

from datetime import date

import numpy as np

from app.evaluation.golden.cases import GoldenCase, GoldenSet
from app.evaluation.run.runner import KnownIds, evaluate
from app.evaluation.tune.replay import record, replay
from app.retrieval.candidates import CandidateSet
from app.retrieval.chain import RetrievalChain
from app.retrieval.stages import build_stages
from app.retrieval.types import Candidate
from app.settings import ChainSettings

# policy-2026 replaced policy-2025 on 2026-01-01; faq is always in force
ROWS = [
    ("c_new", {"doc_id": "policy-2026", "effectiveFrom": "2026-01-01"}, 0.9),
    ("c_old", {"doc_id": "policy-2025", "effectiveTo": "2025-12-31"}, 0.8),
    ("c_faq", {"doc_id": "faq"}, 0.7),
]
KNOWN = KnownIds.from_metadata((chunk, meta) for chunk, meta, _ in ROWS)
RUN_DATE = date(2026, 6, 1)


class Embedder:
    def embed_queries(self, texts: list[str]) -> np.ndarray:
        return np.ones((len(texts), 2), dtype=np.float32)


class Store:
    """Every query gets the three chunks, best dense score first."""

    def generate_many(self, queries, embeddings, tags, principals=None):
        return [
            CandidateSet(
                [
                    Candidate(chunk, meta["doc_id"], f"text of {chunk}", meta, None, {"dense": dense})
                    for chunk, meta, dense in ROWS
                ],
                {"dense": len(ROWS), "bm25": 0, "both": 0},
            )
            for _ in queries
        ]


class Lexical:
    def scores(self, query, ids):
        return dict.fromkeys(ids, 0.0)


def chain() -> RetrievalChain:
    return RetrievalChain(Embedder(), Store(), build_stages(ChainSettings(), Lexical(), None))  # type: ignore[arg-type]


GOLDEN = GoldenSet(
    "t",
    [
        GoldenCase.model_validate(fields)
        for fields in (
            {
                "id": "now",
                "query": "policy",
                "expectedDocIds": ["policy-2026"],
                "forbiddenDocIds": ["policy-2025"],
            },
            {"id": "then", "query": "policy", "expectedDocIds": ["policy-2025"], "asOf": "2025-06-30"},
            {
                "id": "old-forbidden-then",
                "query": "policy",
                "expectedDocIds": ["faq"],
                "forbiddenDocIds": ["policy-2025"],
                "asOf": "2025-06-30",
            },
            {
                "id": "old-forbidden-now",
                "query": "policy",
                "expectedDocIds": ["faq"],
                "forbiddenDocIds": ["policy-2025"],
            },
        )
    ],
    "golden.json",
)


def documents(evaluation) -> dict[str, list[str]]:
    return {c.case.id: [d.doc_id for d in c.result.documents] for c in evaluation.cases}


def test_the_hard_filter_judges_each_case_as_of_its_own_date() -> None:
    ev = evaluate(chain(), GOLDEN, 3, KNOWN, today=RUN_DATE)
    assert documents(ev) == {
        "now": ["policy-2026", "faq"],
        "then": ["policy-2025", "faq"],  # on 2025-06-30 the 2026 policy is not yet in force
        "old-forbidden-then": ["policy-2025", "faq"],
        "old-forbidden-now": ["policy-2026", "faq"],
    }
    forbidden = {c.case.id: c.forbidden_found for c in ev.cases}
    assert forbidden == {
        "now": [],
        "then": [],
        "old-forbidden-then": ["policy-2025"],
        "old-forbidden-now": [],
    }
    then = ev.cases[1]
    assert then.metrics is not None and then.metrics["recall"] == 1.0
    removed = {c.case.id: [r.reason for s in c.stage_stats for r in s.removed_items] for c in ev.cases}
    assert removed["now"] == ["effectiveTo=2025-12-31 < today=2026-06-01"]
    assert removed["then"] == ["effectiveFrom=2026-01-01 > today=2025-06-30"]


def test_the_replay_judges_each_case_as_of_the_same_date_and_keeps_the_gain() -> None:
    live_chain = chain()
    ev = evaluate(live_chain, GOLDEN, 3, KNOWN, today=RUN_DATE, gain="exponential")
    replayed = replay(record(ev, live_chain), ChainSettings())
    assert documents(replayed) == documents(ev)
    assert [c.forbidden_found for c in replayed.cases] == [c.forbidden_found for c in ev.cases]
    assert [c.as_of for c in replayed.cases] == [c.as_of for c in ev.cases]
    assert replayed.gain == "exponential"
    assert [c.metrics for c in replayed.cases] == [c.metrics for c in ev.cases]
