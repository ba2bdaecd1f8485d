"""The BM25 index's top-N within a principal's scope: the same as the unfiltered scores restricted to the
chunks `may_read` lets the principal read, before the cut; also after a write moves a chunk in or out of the
scope (the per-slot mask is kept only until the next change)."""

from __future__ import annotations

import numpy as np
import pytest

from app.access.scope import Principal, may_read
from app.lexical.index import Analyzer, Bm25Index
from app.store.types import index_label_of

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()


def corpus(count: int, seed: int) -> list[tuple[str, str, dict[str, object]]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        text = " ".join(WORDS[int(w)] for w in rng.integers(len(WORDS), size=int(rng.integers(3, 9))))
        meta: dict[str, object] = {
            "tenant": ["t0", "t1"][int(rng.integers(2))],
            "access": [f"group:g{int(rng.integers(3))}"] + (["public"] if rng.random() < 0.2 else []),
        }
        if rng.random() < 0.5:
            meta["knowledge"] = "hr"
        out.append((f"c{i:03d}", text, meta))
    return out


def expected(index: Bm25Index, chunks, query: str, n: int, tag, principal) -> list[str]:
    readable = [
        cid
        for cid, _, meta in chunks
        if may_read(principal, meta) and (tag is None or meta.get("knowledge") == tag)
    ]
    scores = index.scores(query, readable)
    ranked = sorted(((-s, cid) for cid, s in scores.items() if s > 0))
    return [cid for _, cid in ranked[:n]]


@pytest.mark.parametrize("tag", [None, "hr"])
def test_top_within_a_scope_is_the_unfiltered_scores_restricted_to_what_the_principal_reads(tag) -> None:
    chunks = corpus(200, seed=3)
    index = Bm25Index(Analyzer())
    index.upsert([(cid, text, index_label_of(meta)) for cid, text, meta in chunks])
    principal = Principal("p", tenant="t1", groups=("g2",))
    for query in ("alpha beta", "theta", "kappa iota eta"):
        got = [cid for cid, _ in index.top(query, 10, tag, principal)]
        assert got == expected(index, chunks, query, 10, tag, principal)
    # a retag into the scope (same text) and a delete are seen by the next top
    cid, text, meta = chunks[0]
    moved = (cid, text, {**meta, "tenant": "t1", "access": ["group:g2"], "knowledge": "hr"})
    gone = expected(index, chunks, "alpha beta", 1, tag, principal)
    index.upsert([(moved[0], moved[1], index_label_of(moved[2]))])
    index.delete(gone)
    now = [moved] + [c for c in chunks[1:] if c[0] not in gone]
    for query in ("alpha beta", "theta"):
        got = [cid for cid, _ in index.top(query, 10, tag, principal)]
        assert got == expected(index, now, query, 10, tag, principal)
