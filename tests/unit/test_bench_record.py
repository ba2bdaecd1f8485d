"""The bench-record script's arithmetic (ratios of medians, the record's share, rates), the ~1,000-character
documents it writes, the timed record's accounting and the doc block it writes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import bench_record  # noqa: E402

from app.ingest.types import Document  # noqa: E402
from app.settings import IngestSettings  # noqa: E402
from app.store.record import SqliteRecord  # noqa: E402


def test_the_ratio_is_of_the_medians_not_of_the_means() -> None:
    with_record = [110.0, 100.0, 400.0]  # median 110, mean 203.3
    without = [100.0, 90.0, 105.0]  # median 100
    assert bench_record.median_ratio(with_record, without) == pytest.approx(110.0 / 100.0)
    assert bench_record.overhead_percent(with_record, without) == pytest.approx((110.0 / 100.0 - 1) * 100)
    assert bench_record.median_ratio([3.0, 1.0], [2.0]) == pytest.approx(((1.0 + 3.0) / 2) / 2.0)


def test_a_faster_run_with_the_record_is_a_negative_overhead() -> None:
    assert bench_record.overhead_percent([95.0], [100.0]) == pytest.approx(-5.0)


@pytest.mark.parametrize(
    ("part", "whole", "expected"),
    [(0.5, 10.0, 100 * 0.5 / 10.0), (0.0, 10.0, 0.0), (1.0, 0.0, 0.0)],
)
def test_the_share_is_part_over_whole_in_percent(part: float, whole: float, expected: float) -> None:
    assert bench_record.share_percent(part, whole) == pytest.approx(expected)


def test_a_rate_is_count_over_seconds_and_zero_without_time() -> None:
    assert bench_record.per_second(1000, 4.0) == pytest.approx(1000 / 4.0)
    assert bench_record.per_second(10, 0.0) == 0.0


def test_the_documents_are_new_about_a_kilobyte_and_cut_at_a_space() -> None:
    source = [Document(doc_id="s", text="alpha beta gamma " * 20, title="T")]
    docs = bench_record.one_kb_documents(source, "one", 3, "n1")
    assert [d.doc_id for d in docs] == ["one-0", "one-1", "one-2"]
    assert len({d.text for d in docs}) == 3
    for doc in docs:
        assert bench_record.ONE_DOC_CHARS - 20 <= len(doc.text) <= bench_record.ONE_DOC_CHARS
        assert doc.text.split()[-1] in ("alpha", "beta", "gamma")
    assert bench_record.cut("short", 100) == "short"


def test_the_synthetic_documents_make_at_least_the_chunks_asked() -> None:
    settings = IngestSettings()
    docs = bench_record.synthetic_documents(40, settings)
    from app.ingest.pipeline import Ingestor

    made = len(Ingestor(None, None, settings).chunk(docs))  # type: ignore[arg-type]
    assert made >= 40
    assert made - len(Ingestor(None, None, settings).chunk(docs[-1:])) < 40  # type: ignore[arg-type]


def test_the_timed_record_counts_the_puts_and_keeps_what_they_put(tmp_path: Path) -> None:
    record = bench_record.TimedRecord(SqliteRecord(tmp_path / "documents.sqlite3"))
    assert record.put([Document(doc_id="a", text="x")]) == 1
    assert record.seconds > 0
    assert [d.doc_id for d in record.iter_documents()] == ["a"]
    assert record.delete(["a"]) == 1
    assert record.count() == 0
    record.close()


def test_the_block_replaces_only_what_lies_between_the_markers(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"head\n{bench_record.BEGIN}\nold\n{bench_record.END}\ntail\n", encoding="utf-8")
    bench_record.write_block(doc, "new")
    assert doc.read_text(encoding="utf-8") == f"head\n{bench_record.BEGIN}\nnew\n{bench_record.END}\ntail\n"


def test_the_block_shows_the_ratio_of_the_medians_and_the_records_share() -> None:
    single = [
        {"config": c, "ms": ms, "put_ms": put, "load": 1.0}
        for c, ms, put in [("A", 110.0, 2.0), ("B", 100.0, 0.0), ("A", 130.0, 4.0), ("B", 120.0, 0.0)]
    ]
    ingest = [
        {"config": c, "seconds": s, "chunks": 1000, "put_s": p, "load_before": 1.0, "load_after": 1.0}
        for c, s, p in [("A", 50.0, 0.5), ("B", 49.0, 0.0), ("A", 52.0, 1.04), ("B", 51.0, 0.0)]
    ]
    put = [
        {"record": r, "kind": k, "documents": n, "ms": ms, "load": 1.0}
        for r, k, n, ms in [
            ("sqlite", "new", 1, 1.0),
            ("sqlite", "new", 1000, 40.0),
            ("sqlite", "unchanged", 1000, 8.0),
        ]
    ]
    rebuilds = {
        f"rebuild-{name}-re-ingest": {
            "set": name,
            "how": "re-ingest",
            "documents": 10,
            "chunks": chunks,
            "seconds": seconds,
            "build_s": 1.0,
            "build_put_s": 0.1,
            "load_before": 1.0,
            "load_after": 1.0,
        }
        for name, chunks, seconds in [("scifact-hash", 18_000, 100.0), ("synthetic-100k", 100_000, 600.0)]
    }
    block = bench_record.render(
        {
            "cost-single": {"rows": single, "chars": 1000},
            "cost-ingest": {"rows": ingest, "documents": 300},
            "put": {"rows": put, "chars": 1000},
            **rebuilds,
        }
    )
    assert f"**{(110.0 + 130.0) / 2 / ((100.0 + 120.0) / 2):.3f}x**" in block
    assert f"**{100 * 1.04 / 52.0:.2f}%** at most" in block
    assert f"**{((50.0 + 52.0) / 2) / ((49.0 + 51.0) / 2):.3f}x**" in block
    assert "| sqlite | 1.0 ms | 40.0 ms (0.040 ms a document) | 8.0 ms (0.008 ms a document) |" in block
    assert f"**{600.0 / 100.0:.2f}x** the time for {100_000 / 18_000:.2f}x the chunks" in block
