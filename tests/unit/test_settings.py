"""Settings: YAML < environment < CLI overrides, one test per pair; every mistake names its key and origin."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from app.settings import (
    RagSettings,
    Settings,
    SettingsError,
    config_source,
    load_settings,
    merge,
    nested,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No RAG__* or SIEVE_CONFIG from the developer's shell may leak into these tests."""
    for name in list(os.environ):
        if name.upper().startswith("RAG__") or name == "SIEVE_CONFIG":
            monkeypatch.delenv(name)


def write_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> Path:
    path = tmp_path / "sieve.yml"
    path.write_text(text, encoding="utf-8")
    monkeypatch.setenv("SIEVE_CONFIG", str(path))
    return path


def test_yaml_overrides_defaults(tmp_path, monkeypatch):
    write_config(tmp_path, monkeypatch, "rag:\n  server:\n    port: 9100\n")
    assert load_settings().rag.server.port == 9100
    assert load_settings().rag.server.host == "127.0.0.1"  # untouched keys keep their defaults


def test_env_beats_yaml(tmp_path, monkeypatch):
    write_config(tmp_path, monkeypatch, "rag:\n  server:\n    port: 9100\n")
    monkeypatch.setenv("RAG__SERVER__PORT", "9200")
    assert load_settings().rag.server.port == 9200


def test_cli_beats_yaml(tmp_path, monkeypatch):
    write_config(tmp_path, monkeypatch, "rag:\n  server:\n    port: 9100\n")
    assert load_settings(overrides=nested("rag.server.port", 9300)).rag.server.port == 9300


def test_cli_beats_env(tmp_path, monkeypatch):
    write_config(tmp_path, monkeypatch, "rag: {}\n")
    monkeypatch.setenv("RAG__SERVER__PORT", "9200")
    assert load_settings(overrides=nested("rag.server.port", 9300)).rag.server.port == 9300


def test_cli_override_of_one_key_keeps_sibling_keys_from_yaml_and_env(tmp_path, monkeypatch):
    write_config(tmp_path, monkeypatch, "rag:\n  store:\n    path: /from/yaml\n    collection: yaml-coll\n")
    monkeypatch.setenv("RAG__STORE__COLLECTION", "env-coll")
    store = load_settings(overrides=nested("rag.store.port", 8123)).rag.store
    assert (store.path, store.collection, store.port) == ("/from/yaml", "env-coll", 8123)


def test_merged_cli_overrides_apply_together(tmp_path, monkeypatch):
    write_config(tmp_path, monkeypatch, "")
    rag = load_settings(
        overrides=merge(nested("rag.server.port", 9300), nested("rag.chain.fallback.enabled", False))
    ).rag
    assert (rag.server.port, rag.chain.fallback.enabled) == (9300, False)


def test_unknown_yaml_key_names_the_key_and_the_file(tmp_path, monkeypatch):
    path = write_config(tmp_path, monkeypatch, "rag:\n  store:\n    pathx: /tmp/x\n")
    with pytest.raises(SettingsError) as info:
        load_settings()
    message = str(info.value)
    assert "unknown key 'rag.store.pathx'" in message
    assert str(path) in message


def test_unknown_env_key_names_the_variable(tmp_path, monkeypatch):
    write_config(tmp_path, monkeypatch, "rag: {}\n")
    monkeypatch.setenv("RAG__STORE__PATHX", "/tmp/x")
    with pytest.raises(SettingsError) as info:
        load_settings()
    message = str(info.value)
    assert "unknown key 'rag.store.pathx'" in message
    assert "RAG__STORE__PATHX" in message


def test_wrong_type_in_yaml_names_key_file_and_value(tmp_path, monkeypatch):
    path = write_config(tmp_path, monkeypatch, "rag:\n  server:\n    port: eighty\n")
    with pytest.raises(SettingsError) as info:
        load_settings()
    message = str(info.value)
    assert "'rag.server.port'" in message
    assert str(path) in message
    assert "'eighty'" in message


def test_wrong_type_from_env_names_the_key(tmp_path, monkeypatch):
    write_config(tmp_path, monkeypatch, "rag: {}\n")
    monkeypatch.setenv("RAG__SERVER__PORT", "eighty")
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert "'rag.server.port'" in str(info.value)
    assert "RAG__SERVER__PORT" in str(info.value)


@pytest.mark.parametrize(
    ("name", "value", "takes"),
    [
        ("RAG__EVALUATE__K_VALUES", "1,10", "a list, e.g. '[1, 10]'"),
        ("RAG__INGEST__PATHS", "docs/a", "a list, e.g. '[1, 10]'"),
        ("RAG__CHAIN__DIVERSITY", "x", "a mapping, e.g. '{\"key\": 0.8}'"),
    ],
)
def test_a_list_or_mapping_from_env_that_is_not_json_names_the_variable(
    tmp_path, monkeypatch, name, value, takes
):
    write_config(tmp_path, monkeypatch, "rag: {}\n")
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    expected = f"environment variable {name}: {value!r} is not JSON; this key takes {takes}"
    assert str(info.value) == "invalid configuration:\n  " + expected


def test_wrong_type_from_env_is_blamed_on_env_even_when_yaml_sets_the_key(tmp_path, monkeypatch):
    path = write_config(tmp_path, monkeypatch, "rag:\n  server:\n    port: 8000\n")
    monkeypatch.setenv("RAG__SERVER__PORT", "eighty")
    with pytest.raises(SettingsError) as info:
        load_settings()
    line = next(x for x in str(info.value).splitlines() if "rag.server.port" in x)
    assert line.strip().startswith("environment variable RAG__SERVER__PORT"), line
    assert str(path) not in line


def test_wrong_type_from_cli_names_the_key(tmp_path, monkeypatch):
    write_config(tmp_path, monkeypatch, "")
    with pytest.raises(SettingsError, match=r"'rag\.retrieval\.top_k'.*\(got 0\)"):
        load_settings(overrides=nested("rag.retrieval.top_k", 0))


def test_chunk_overlap_not_below_chunk_size_is_an_error(tmp_path, monkeypatch):
    write_config(tmp_path, monkeypatch, "rag:\n  ingest:\n    chunk_size: 200\n    chunk_overlap: 200\n")
    with pytest.raises(SettingsError, match=r"chunk_overlap \(200\) must be smaller than chunk_size \(200\)"):
        load_settings()


def test_a_change_log_retention_under_an_hour_is_an_error_and_0_keeps_everything(tmp_path, monkeypatch):
    write_config(tmp_path, monkeypatch, "rag:\n  lexical:\n    change_log_retention_seconds: 600\n")
    with pytest.raises(SettingsError, match=r"change_log_retention_seconds is 600: use 0 .* at least 3600"):
        load_settings()
    write_config(tmp_path, monkeypatch, "rag:\n  lexical:\n    change_log_retention_seconds: 0\n")
    assert load_settings().rag.lexical.change_log_retention_seconds == 0
    write_config(tmp_path, monkeypatch, "")
    assert load_settings().rag.lexical.change_log_retention_seconds == 86400


def test_no_dense_and_no_lexical_candidates_is_an_error(tmp_path, monkeypatch):
    write_config(tmp_path, monkeypatch, "rag:\n  retrieval:\n    candidate_k: 0\n    hybrid: false\n")
    with pytest.raises(SettingsError, match=r"candidate_k is 0 and hybrid is false"):
        load_settings()


def test_a_missing_config_file_is_named(tmp_path, monkeypatch):
    missing = tmp_path / "nope.yml"
    monkeypatch.setenv("SIEVE_CONFIG", str(missing))
    with pytest.raises(SettingsError, match="configuration file not found") as info:
        load_settings()
    assert str(missing) in str(info.value)


def test_an_empty_top_level_yaml_section_means_defaults(tmp_path, monkeypatch):
    write_config(tmp_path, monkeypatch, "rag:\n  chain:\n  server:\n")
    assert load_settings().rag == RagSettings()


def test_an_empty_nested_yaml_section_means_defaults(tmp_path, monkeypatch):
    write_config(tmp_path, monkeypatch, "rag:\n  chain:\n    rerank:\n")
    assert load_settings().rag.chain.rerank == RagSettings().chain.rerank


def _key_tree(node: object) -> object:
    """The nested key names of a mapping; values and empty mappings (`per_knowledge_tag: {}`) are leaves."""
    return {k: _key_tree(v) for k, v in node.items()} if isinstance(node, dict) and node else None


def test_repo_application_yml_lists_every_key_with_its_default(monkeypatch):
    monkeypatch.chdir(REPO)  # load_settings() finds config/application.yml relative to the working directory
    loaded = load_settings()
    assert config_source() == Path("config/application.yml")
    assert loaded.rag == RagSettings()  # every value written there is the model's default
    # ... and every key of the model is written there, none left for the reader to guess.
    documented = yaml.safe_load((REPO / "config" / "application.yml").read_text(encoding="utf-8"))
    assert _key_tree(documented["rag"]) == _key_tree(RagSettings().model_dump())


def test_without_any_yaml_settings_are_the_model_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no config/application.yml here and no SIEVE_CONFIG
    loaded = load_settings()
    assert config_source() is None
    assert loaded.rag == Settings().rag == RagSettings()


def test_config_path_argument_beats_sieve_config_and_leaves_the_environment_alone(tmp_path, monkeypatch):
    write_config(tmp_path, monkeypatch, "rag:\n  server:\n    port: 9100\n")
    other = tmp_path / "other.yml"
    other.write_text("rag:\n  server:\n    port: 9300\n", encoding="utf-8")
    assert load_settings(config_path=other).rag.server.port == 9300
    assert os.environ["SIEVE_CONFIG"] == str(tmp_path / "sieve.yml")
    assert load_settings().rag.server.port == 9100  # the argument applied to that one load only


def test_a_bad_key_in_the_config_path_argument_names_that_file(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("rag:\n  evaluate:\n    keep_report: 3\n", encoding="utf-8")
    with pytest.raises(SettingsError, match=r"bad\.yml.*unknown key 'rag\.evaluate\.keep_report'"):
        load_settings(config_path=bad)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("k_values", [0, 5], "k_values must be between 1 and 100"),
        ("k_values", [], "at least one cut-off"),
        ("alpha", 1.5, "alpha"),
        ("keep_reports", 0, "keep_reports"),
        ("as_of", "not-a-date", "as_of"),
        ("gain", "log", r"'rag\.evaluate\.gain': Input should be 'linear' or 'exponential'"),
    ],
)
def test_evaluate_settings_reject_bad_values(key, value, message):
    with pytest.raises(SettingsError, match=message):
        load_settings(nested(f"rag.evaluate.{key}", value))


def test_evaluate_as_of_parses_an_iso_date_from_the_environment(monkeypatch):
    monkeypatch.setenv("RAG__EVALUATE__AS_OF", "2030-01-31")
    assert str(load_settings().rag.evaluate.as_of) == "2030-01-31"


def test_evaluate_gain_is_linear_by_default_and_takes_exponential(monkeypatch):
    assert load_settings().rag.evaluate.gain == "linear"
    monkeypatch.setenv("RAG__EVALUATE__GAIN", "exponential")
    assert load_settings().rag.evaluate.gain == "exponential"
