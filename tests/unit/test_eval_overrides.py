"""One table of a run's overrides: the `sieve eval` flags, the settings keys and the request body's keys
all come from `EvaluationOverrides`."""

from __future__ import annotations

import argparse

from app.api.evaluations import EvaluationRunRequest
from app.cli.eval import add_eval_commands
from app.evaluation.compare.overrides import THRESHOLDS, EvaluationOverrides, flag, setting_key
from app.settings import EvaluateSettings


def test_each_threshold_field_is_a_flag_a_settings_key_and_a_request_key() -> None:
    assert [flag(name) for name in THRESHOLDS] == [
        "--min-recall",
        "--min-hit-rate",
        "--min-mrr",
        "--min-ndcg",
        "--max-duplicate-rate",
        "--max-p95-ms",
    ]
    assert setting_key("min_ndcg") == "rag.evaluate.thresholds.min_ndcg"
    assert setting_key("top_k") == "rag.evaluate.top_k"
    keys = set(EvaluationRunRequest.model_json_schema()["properties"])
    assert keys == {
        "topK",
        "baseline",
        "minRecall",
        "minHitRate",
        "minMrr",
        "minNdcg",
        "maxDuplicateRate",
        "maxP95Ms",
    }


def test_sieve_eval_parses_every_threshold_flag_into_the_field_of_its_name() -> None:
    parser = argparse.ArgumentParser()
    add_eval_commands(parser.add_subparsers())
    args = parser.parse_args(["eval", "--min-recall", "0.8", "--max-p95-ms", "50"])
    assert (args.min_recall, args.max_p95_ms, args.min_ndcg) == (0.8, 50.0, None)


def test_overrides_set_only_what_they_give() -> None:
    base = EvaluateSettings()
    given = EvaluationOverrides.model_validate({"topK": 3, "minNdcg": 0.9})
    assert given.given() == {"top_k": 3, "min_ndcg": 0.9}
    changed = given.apply(base)
    assert (changed.top_k, changed.thresholds.min_ndcg) == (3, 0.9)
    assert changed.model_copy(update={"top_k": base.top_k, "thresholds": base.thresholds}) == base
