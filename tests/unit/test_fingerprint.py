"""The run fingerprint: reformatting the golden set does not change it, editing does; every setting that
can move a result is in it and named when it changes, speed knobs are not."""

from __future__ import annotations

import json
from datetime import date

import pytest

from app.evaluation.compare.comparison import describe_differences, fingerprint_of
from app.evaluation.golden.cases import parse_golden_set
from app.evaluation.report.model import CorpusFingerprint, RunInfo
from app.evaluation.run.fingerprint import (
    RESULT_KEYS,
    SPEED_KEYS,
    canonical_json,
    case_sha256,
    chain_sha256,
    corpus_fingerprint,
    golden_set_sha256,
    result_settings,
    run_fingerprint,
    sha256_text,
)
from app.settings import IngestSettings, ModelsSettings, Settings, StoreSettings

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
    assert corpus_fingerprint(["c2", "c1"]) == CorpusFingerprint(chunks=2, sha256=sha256_text("c1\nc2"))
    assert corpus_fingerprint(["c1", "c2"]) == corpus_fingerprint(["c2", "c1"])


def test_chain_hash_is_canonical_json() -> None:
    settings = {"retrieval": {"top_k": 5}, "chain": {"bm25": {"enabled": True, "b": 0.75}}}
    reordered = {"chain": {"bm25": {"b": 0.75, "enabled": True}}, "retrieval": {"top_k": 5}}
    assert chain_sha256(settings) == chain_sha256(reordered) == sha256_text(canonical_json(settings))
    assert canonical_json(settings) == '{"chain":{"bm25":{"b":0.75,"enabled":true}},"retrieval":{"top_k":5}}'


def fingerprint(**changes: object) -> dict:
    """A run fingerprint of the sample cases with default settings, `changes` applied as
    {"models.query_prompt": "query: "}."""
    settings = Settings()
    for dotted, value in changes.items():
        section, key = dotted.split(".")
        setattr(getattr(settings.rag, section), key, value)
    golden = parse_golden_set(json.dumps({"cases": CASES}), "g.json")
    return run_fingerprint(
        golden,
        ["c1", "c2"],
        {"name": "e5", "dimension": 384, "checksum": "c"},
        result_settings(settings.rag),
        5,
        date(2026, 12, 1),
        "2026-12-01T00:00:00+00:00",
    ).to_json()


def differences(before: dict, after: dict) -> list[str]:
    """`describe_differences` of two runs' JSON, each read as a report's `run`."""
    return describe_differences(
        fingerprint_of(RunInfo.model_validate(before)), fingerprint_of(RunInfo.model_validate(after))
    )


def test_every_key_of_models_ingest_and_store_is_either_result_moving_or_speed_only() -> None:
    for section, model in (("models", ModelsSettings), ("ingest", IngestSettings), ("store", StoreSettings)):
        result, speed = set(RESULT_KEYS[section]), set(SPEED_KEYS[section])
        assert not result & speed, section
        assert result | speed == set(model.model_fields), section


def test_run_settings_are_the_result_moving_keys_and_retrieval_and_chain_whole() -> None:
    rag = Settings().rag
    settings = result_settings(rag)
    assert list(settings) == ["models", "ingest", "store", "retrieval", "chain"]
    assert settings["models"] == {
        "embedder": "multilingual-e5-small",
        "query_prompt": None,
        "passage_prompt": None,
    }
    assert settings["ingest"] == {
        "chunk_size": 600,
        "chunk_overlap": 100,
        "min_chunk_chars": 1,
        "max_document_chars": 500_000,
        "max_metadata_keys": 64,
        "max_metadata_key_chars": 128,
        "max_metadata_bytes": 65_536,
        "follow_symlinks": False,
        "access_defaults": [],  # who may read a document moves what a principal retrieves
    }
    assert settings["retrieval"] == rag.retrieval.model_dump(mode="json")
    assert settings["chain"] == rag.chain.model_dump(mode="json")


def test_a_query_prompt_change_is_named_and_moves_the_settings_hash_only() -> None:
    before, after = fingerprint(), fingerprint(**{"models.query_prompt": "query: "})
    assert differences(before, after) == ['rag.models.query_prompt: null -> "query: "']
    assert before["settingsSha256"] != after["settingsSha256"]
    assert before["settingsSha256"] == sha256_text(canonical_json(before["settings"]))
    assert (
        before["chainSha256"]
        == after["chainSha256"]
        == chain_sha256({"retrieval": before["settings"]["retrieval"], "chain": before["settings"]["chain"]})
    )
    assert fingerprint()["settingsSha256"] == before["settingsSha256"]


@pytest.mark.parametrize(
    ("change", "line"),
    [
        ({"ingest.chunk_size": 400}, "rag.ingest.chunk_size: 600 -> 400"),
        ({"ingest.chunk_overlap": 50}, "rag.ingest.chunk_overlap: 100 -> 50"),
        ({"ingest.min_chunk_chars": 20}, "rag.ingest.min_chunk_chars: 1 -> 20"),
        ({"models.passage_prompt": ""}, 'rag.models.passage_prompt: null -> ""'),
        (
            {"models.embedder": "all-MiniLM-L6-v2"},
            'rag.models.embedder: "multilingual-e5-small" -> "all-MiniLM-L6-v2"',
        ),
        ({"store.exact_search_max_chunks": 0}, "rag.store.exact_search_max_chunks: 30000 -> 0"),
        ({"retrieval.candidate_k": 20}, "rag.retrieval.candidate_k: 50 -> 20"),
    ],
)
def test_each_result_moving_setting_is_named(change: dict, line: str) -> None:
    before, after = fingerprint(), fingerprint(**change)
    assert differences(before, after) == [line]
    assert before["settingsSha256"] != after["settingsSha256"]


@pytest.mark.parametrize(
    "change",
    [{"models.batch_size": 8}, {"models.threads": 1}, {"ingest.commit_chunks": 7}, {"store.cache_chunks": 0}],
)
def test_speed_knobs_are_not_in_the_fingerprint(change: dict) -> None:
    before, after = fingerprint(), fingerprint(**change)
    assert differences(before, after) == []
    assert before["settingsSha256"] == after["settingsSha256"]


def test_an_older_baseline_without_models_ingest_store_names_each_section_once() -> None:
    current = fingerprint(**{"retrieval.candidate_k": 20})
    older = fingerprint()
    older["settings"] = {"retrieval": older["settings"]["retrieval"], "chain": older["settings"]["chain"]}
    del older["settingsSha256"]
    assert differences(older, current) == [
        "rag.ingest: not in the baseline report's fingerprint (an older Sieve): unknown",
        "rag.models: not in the baseline report's fingerprint (an older Sieve): unknown",
        "rag.store: not in the baseline report's fingerprint (an older Sieve): unknown",
        "rag.retrieval.candidate_k: 50 -> 20",
    ]


def test_the_ndcg_gain_is_fingerprinted_and_a_change_is_named() -> None:
    golden = parse_golden_set(json.dumps({"cases": CASES}), "g.json")

    def with_gain(gain: str) -> dict:
        settings = result_settings(Settings().rag)
        return run_fingerprint(
            golden, ["c1"], {"name": "e5"}, settings, 5, date(2026, 12, 1), "2026-12-01T00:00:00+00:00", gain
        ).to_json()

    linear, exponential = with_gain("linear"), with_gain("exponential")
    assert (linear["gain"], exponential["gain"]) == ("linear", "exponential")
    assert differences(linear, exponential) == ["nDCG gain: linear -> exponential"]
    # a baseline written before the gain was recorded: nothing to name
    older = {key: value for key, value in linear.items() if key != "gain"}
    assert differences(older, linear) == []


def test_a_case_hash_is_its_content_so_a_renamed_case_keeps_it() -> None:
    original = parse_golden_set(json.dumps({"cases": CASES}), "g.json").cases[0]
    renamed = parse_golden_set(json.dumps({"cases": [{**CASES[0], "id": "a-renamed"}]}), "g.json").cases[0]
    edited = parse_golden_set(json.dumps({"cases": [{**CASES[0], "query": "发薪日"}]}), "g.json").cases[0]
    assert case_sha256(renamed) == case_sha256(original)
    assert case_sha256(edited) != case_sha256(original)
