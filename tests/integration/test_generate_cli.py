"""`sieve golden generate` in-process on the sample base (the real e5 embedder, an embedded store, the real
BM25 index), then `sieve eval` of what it wrote: offline, with an LLM behind a local OpenAI-compatible fake
server, and the committed golden_set/generated.jsonl."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from app.cli import main
from app.evaluation.golden.cases import load_golden_set
from tests.fixtures.fake_llm import fake_llm
from tests.fixtures.seeded_store import seeded_store

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
MODELS_CACHE = REPO / "target" / "models"
COMMITTED = REPO / "golden_set" / "generated.jsonl"
EXIT_OK, EXIT_INPUT, EXIT_UNAVAILABLE = 0, 2, 3


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seeded_store(tmp_path_factory.mktemp("generate") / "store")


@pytest.fixture(autouse=True)
def cli_env(monkeypatch: pytest.MonkeyPatch, store_path: Path, tmp_path: Path, real_embedder) -> None:
    monkeypatch.chdir(REPO)
    for name in [n for n in os.environ if n.startswith("RAG__")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("SIEVE_CONFIG", raising=False)
    monkeypatch.setenv("RAG__STORE__PATH", str(store_path))
    monkeypatch.setenv("RAG__EVALUATE__OUTPUT_DIR", str(tmp_path / "reports"))
    monkeypatch.setenv("RAG__EVALUATE__AS_OF", "2026-12-01")
    monkeypatch.setenv("RAG__MODELS__CACHE_DIR", str(MODELS_CACHE))
    monkeypatch.setattr("app.service.load_embedder", lambda settings: real_embedder)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_offline_generation_is_stratified_found_again_and_appends_once(capsys, tmp_path: Path) -> None:
    out = tmp_path / "gen.jsonl"
    code, printed, err = run(capsys, "golden", "generate", "--chunks", "12", "--out", str(out))
    assert code == EXIT_OK, err
    cases = lines_of(out)
    # 6 knowledge tags, 12 passages: two of each tag
    assert "picked 12 passages" in printed and "6 knowledge tags" in printed
    assert Counter(c["knowledgeTag"] for c in cases).most_common(1)[0][1] <= 2
    # the draft, retired and future documents are never asked about, nor the VPN guide's mirror
    assert (
        "hr-remote-work-draft (status=draft)" in printed and "travel-expense-2022 (status=retired)" in printed
    )
    assert "it-vpn-setup-mirror (copy of it-vpn-setup)" in printed
    excluded = {
        "hr-remote-work-draft",
        "travel-expense-2022",
        "security-password-policy-v3-zh",
        "it-vpn-setup-mirror",
    }
    assert not excluded & {c["expectedDocIds"][0] for c in cases}
    assert {c["generator"] for c in cases} <= {"offline:heading", "offline:terms"}
    assert f"wrote {out} (0 -> {len(cases)} cases)" in printed
    assert all(c["origin"] == "generated" and c["evidenceChunkIds"] == [c["passageChunkId"]] for c in cases)
    assert all(0 <= c["literalness"] <= 1 for c in cases)
    assert len(load_golden_set(out).cases) == len(cases)

    code, printed, err = run(capsys, "golden", "generate", "--chunks", "12", "--out", str(out))
    assert code == EXIT_OK, err
    assert f"{len(cases)} already in the out file" in printed
    assert printed.splitlines()[-1] == f"unchanged: {out} ({len(cases)} cases)"
    assert len(lines_of(out)) == len(cases)


def test_the_committed_generated_set_runs_and_the_report_compares_it_with_the_manual_set(
    capsys, tmp_path: Path
) -> None:
    generated = load_golden_set(COMMITTED).cases
    assert len(generated) == 30 and all(c.origin == "generated" for c in generated)
    manual = json.loads((REPO / "golden_set" / "golden-set.json").read_text(encoding="utf-8"))["cases"]
    both = tmp_path / "both.jsonl"
    both.write_text(
        "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in manual)
        + COMMITTED.read_text(encoding="utf-8"),
        encoding="utf-8",
    )
    code, printed, err = run(capsys, "eval", "--golden-set", str(both), "--baseline", "none")
    assert code == EXIT_OK, err
    report = json.loads((tmp_path / "reports" / "retrieval-eval-latest.json").read_text(encoding="utf-8"))
    records = {c["id"]: c for c in report["cases"]}
    # every passage of the committed set is still in the sample base's index (ids are content hashes)
    assert all(records[c.id].get("metrics") for c in generated)
    by_origin = report["origins"]["byOrigin"]
    assert by_origin["generated"]["cases"] == 30 and by_origin["manual"]["cases"] == len(manual)
    versus = report["origins"]["generatedVsManual"]
    scored = [records[c.id]["metrics"]["ndcg"] for c in generated]
    manual_scored = [records[c["id"]]["metrics"]["ndcg"] for c in manual if records[c["id"]].get("metrics")]
    assert versus["delta"] == pytest.approx(
        sum(scored) / len(scored) - sum(manual_scored) / len(manual_scored)
    )
    markdown = (tmp_path / "reports" / "retrieval-eval-latest.md").read_text(encoding="utf-8")
    assert f"Generated vs manual: nDCG {versus['delta']:+.3f}" in markdown
    assert "| origin | generated | 30 |" in markdown
    segments = {(s["kind"], s["name"]) for s in report["segments"]}
    assert ("origin", "manual") in segments and ("origin", "generated") in segments
    assert any(kind == "literalness" for kind, _ in segments)


def test_llm_generation_through_an_openai_compatible_server(capsys, tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "llm.jsonl"
    with fake_llm() as server:
        monkeypatch.setenv("RAG__GENERATE__LLM__BASE_URL", server.url("echo"))
        monkeypatch.setenv("RAG__GENERATE__LLM__MODEL", "fake-7b")
        monkeypatch.setenv("SIEVE_LLM_API_KEY", "sk-local-test")
        code, printed, err = run(
            capsys, "golden", "generate", "--chunks", "4", "--generator", "llm", "--out", str(out)
        )
    assert code == EXIT_OK, err
    assert len(server.requests) == 4
    assert {r["headers"]["Authorization"] for r in server.requests} == {"Bearer sk-local-test"}
    cases = lines_of(out)
    assert cases and {c["generator"] for c in cases} == {"llm:fake-7b"}
    assert "round_trip: either" in printed  # auto: either for an LLM
    # the echoed question is the passage's title and headings: "<title> › <heading>?"
    assert all("›" in c["query"] and not c["query"].startswith("Question:") for c in cases)


def test_an_unreachable_llm_is_a_clear_error_and_writes_nothing(capsys, tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "llm.jsonl"
    with fake_llm() as server:
        monkeypatch.setenv("RAG__GENERATE__LLM__BASE_URL", server.url("unauthorized"))
        monkeypatch.setenv("RAG__GENERATE__LLM__MODEL", "fake-7b")
        code, _, err = run(
            capsys, "golden", "generate", "--chunks", "2", "--generator", "llm", "--out", str(out)
        )
    assert code == EXIT_UNAVAILABLE
    assert "HTTP 401" in err and "SIEVE_LLM_API_KEY" in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--chunks", "0"], "--chunks must be at least 1, got 0"),
        (["--chunks", "3", "--out", "set.json"], "must be a .jsonl file"),
        (["--chunks", "3", "--generator", "llm"], "the llm generator needs rag.generate.llm.base_url"),
    ],
)
def test_bad_options_exit_2_before_loading_anything(capsys, argv, message) -> None:
    code, _, err = run(capsys, "golden", "generate", *argv)
    assert code == EXIT_INPUT
    assert message in err and "Traceback" not in err
