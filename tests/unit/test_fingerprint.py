"""The run fingerprint: reformatting the golden set does not change it, editing does."""

from __future__ import annotations

import json

from app.evaluation.fingerprint import (
    canonical_json,
    chain_sha256,
    corpus_fingerprint,
    golden_set_sha256,
    sha256_text,
)
from app.evaluation.golden_set import parse_golden_set

CASES = [
    {"id": "a", "query": "工资什么时候发", "expectedDocIds": ["hr-payroll-zh"]},
    {"id": "b", "query": "When is payday?", "expectedDocIds": ["hr-payroll-en"], "tags": ["en"]},
]


def test_golden_set_hash_ignores_formatting_and_written_out_defaults() -> None:
    compact = parse_golden_set(json.dumps({"cases": CASES}), "g.json")
    pretty = parse_golden_set(json.dumps({"cases": CASES}, indent=4, ensure_ascii=False), "other.json")
    jsonl = parse_golden_set("\n".join(json.dumps(c) for c in CASES), "g.jsonl")
    with_defaults = [{**CASES[0], "forbiddenDocIds": [], "expectNoAnswer": False, "note": ""}, CASES[1]]
    explicit = parse_golden_set(json.dumps({"cases": with_defaults}), "g.json")
    assert len({golden_set_sha256(g) for g in (compact, pretty, jsonl, explicit)}) == 1


def test_golden_set_hash_changes_with_a_case() -> None:
    edited = [CASES[0], {**CASES[1], "query": "When do we get paid?"}]
    before = parse_golden_set(json.dumps({"cases": CASES}), "g.json")
    after = parse_golden_set(json.dumps({"cases": edited}), "g.json")
    assert golden_set_sha256(before) != golden_set_sha256(after)


def test_corpus_fingerprint_is_over_the_sorted_chunk_ids() -> None:
    assert corpus_fingerprint(["c2", "c1"]) == {"chunks": 2, "sha256": sha256_text("c1\nc2")}
    assert corpus_fingerprint(["c1", "c2"]) == corpus_fingerprint(["c2", "c1"])


def test_chain_hash_is_canonical_json() -> None:
    settings = {"retrieval": {"top_k": 5}, "chain": {"bm25": {"enabled": True, "b": 0.75}}}
    reordered = {"chain": {"bm25": {"b": 0.75, "enabled": True}}, "retrieval": {"top_k": 5}}
    assert chain_sha256(settings) == chain_sha256(reordered) == sha256_text(canonical_json(settings))
    assert canonical_json(settings) == '{"chain":{"bm25":{"b":0.75,"enabled":true}},"retrieval":{"top_k":5}}'
