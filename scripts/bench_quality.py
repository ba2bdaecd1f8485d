"""Quality benchmark: Sieve's chain on BEIR datasets, next to published numbers; writes docs/benchmarks.md.

For each dataset (SciFact test, XQuAD-zh test by default) the corpus is ingested once into the configured
store (collection `beir-<dir>`, the same one `sieve eval --beir DIR` uses, so either reuses the other's
vectors), then every variant below runs all of the split's queries through a real chain built from the
default configuration plus the variant's overrides:

    BM25 alone         BM25 top-100 chunks over the whole collection, in BM25 order (no dense score used)
    dense alone        dense top-100 chunks, in cosine order (no BM25 at all)
    hybrid             dense top-50 + BM25 top-50 chunks, fused; no filters
                       (these three keep the diversity stage: one chunk per document, scored per document)
    default chain      the configuration as shipped (what `sieve eval --beir DIR` measures)
    default - <stage>  the default chain with that one stage switched off

Each query asks for its top 100, so nDCG@10, Recall@10, MRR@10 and Recall@100 come from one ranking (the
chain's order never depends on topK). `--tune` instead runs the tuning grid on the train split (SciFact),
the data the defaults were chosen on. The test split is never used to choose anything.

    .venv/bin/python scripts/bench_quality.py                 # test table -> docs/benchmarks.md
    .venv/bin/python scripts/bench_quality.py --tune          # train grid  -> docs/benchmarks.md
    .venv/bin/python scripts/bench_quality.py --no-write      # print only

A script that prints figures, not a timed test: these machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from app.evaluation.golden.beir import load_beir_cases
from app.evaluation.run.runner import KnownIds, evaluate, match_key
from app.evaluation.scoring.metrics import mrr_at_k, ndcg_at_k, recall_at_k
from app.retrieval.stages import stage_order
from app.service import Sieve
from app.settings import load_settings, merge, nested

DATASETS_DIR = Path(os.environ.get("SIEVE_DATASETS", "../shared/datasets"))
DOC = Path("docs/benchmarks.md")
DEPTH = 100
STAGES = tuple(stage_order())

# Published nDCG@10 on the test split (sources in docs/benchmarks.md).
PUBLISHED: dict[str, list[tuple[str, float, str]]] = {
    "scifact": [
        ("BM25 (BEIR paper)", 0.665, "BEIR, arXiv 2104.08663, Table 2"),
        ("BM25 (Anserini flat)", 0.679, "Pyserini BEIR regressions"),
        ("BM25 (bm25s)", 0.687, "MTEB results repository"),
        ("BM25 top-100 + ms-marco-MiniLM-L-6-v2 cross-encoder", 0.688, "BEIR, arXiv 2104.08663"),
        ("dense all-MiniLM-L6-v2", 0.645, "MTEB results repository"),
        ("dense multilingual-e5-small", 0.676, "MTEB results repository"),
        ("dense bge-small-en-v1.5", 0.713, "MTEB results repository"),
        ("BM25 top-100 + bge-reranker-v2-m3", 0.731, "MTEB results repository"),
    ],
    "xquad-zh": [
        ("dense all-MiniLM-L6-v2", 0.242, "MTEB XQuADRetrieval (zh)"),
        ("dense paraphrase-multilingual-MiniLM-L12-v2", 0.852, "MTEB XQuADRetrieval (zh)"),
        ("dense multilingual-e5-base", 0.955, "MTEB XQuADRetrieval (zh)"),
    ],
}


def _off(*stages: str) -> dict[str, Any]:
    return merge(*(nested(f"rag.chain.{s}.enabled", False) for s in stages))


def _only(*stages: str) -> dict[str, Any]:
    return _off(*(s for s in STAGES if s not in stages))


@dataclass
class Variant:
    name: str
    overrides: dict[str, Any] = field(default_factory=dict)
    note: str = ""


def table_variants() -> list[Variant]:
    # Scored per document, like BEIR: the "alone" and "hybrid" rows keep the diversity stage's one chunk per
    # document (a chunked corpus would otherwise fill the top 10 with several chunks of one abstract).
    variants = [
        Variant(
            "BM25 alone",
            merge(
                nested("rag.retrieval.candidate_k", 0),
                nested("rag.retrieval.bm25_candidate_k", DEPTH),
                nested("rag.chain.bm25.dense_weight", 0.0),
                _only("bm25", "diversity"),
            ),
            "BM25 top-100 chunks in BM25 order, best chunk per document",
        ),
        Variant(
            "dense alone",
            merge(
                nested("rag.retrieval.hybrid", False),
                nested("rag.retrieval.candidate_k", DEPTH),
                _only("diversity"),
            ),
            "dense top-100 chunks in cosine order, best chunk per document",
        ),
        Variant(
            "hybrid",
            _only("bm25", "diversity"),
            "dense top-50 + BM25 top-50 fused, best chunk per document; no filters",
        ),
        Variant("default chain", {}, "as shipped"),
    ]
    for stage in STAGES:
        variants.append(Variant(f"default - {stage}", _off(stage), f"{stage} switched off"))
    return variants


def tuning_variants() -> list[Variant]:
    """The grid the defaults were chosen from (SciFact train + the sample golden set)."""

    def v(name: str, *pairs: tuple[str, Any]) -> Variant:
        return Variant(name, merge(*(nested(k, val) for k, val in pairs)))

    alone = [v for v in table_variants() if v.name in ("BM25 alone", "dense alone")]
    out = [Variant("default chain", {}), *alone]
    rrf = (
        ("rag.chain.bm25.fusion", "rrf"),
        ("rag.chain.bm25.dense_weight", 1.0),
        ("rag.chain.bm25.bm25_weight", 1.0),
    )
    for k in (10, 30, 60, 100):
        out.append(v(f"rrf k={k}", *rrf, ("rag.chain.bm25.rrf_k", k)))
    for dw in (0.5, 0.75, 1.5):
        out.append(v(f"rrf k=60 dense_weight={dw}", *rrf, ("rag.chain.bm25.dense_weight", dw)))
    for w in (0.3, 0.4, 0.5, 0.55, 0.6, 0.65, 0.7):
        pairs = (("rag.chain.bm25.dense_weight", w), ("rag.chain.bm25.bm25_weight", round(1 - w, 2)))
        out.append(v(f"weighted dense={w} bm25={round(1 - w, 2)}", *pairs))
    for depth in (20, 30, 100):
        pairs = (("rag.retrieval.candidate_k", depth), ("rag.retrieval.bm25_candidate_k", depth))
        out.append(v(f"candidates {depth}+{depth}", *pairs))
    for k1, b in ((0.9, 0.4), (1.2, 0.5), (1.5, 0.75), (0.9, 0.75)):
        out.append(v(f"bm25 k1={k1} b={b}", ("rag.chain.bm25.k1", k1), ("rag.chain.bm25.b", b)))
    for cos in (None, 0.95):
        out.append(v(f"diversity max_cosine={cos}", ("rag.chain.diversity.max_cosine", cos)))
    for per_doc in (None, 2):
        pair = ("rag.chain.diversity.max_per_document", per_doc)
        out.append(v(f"diversity max_per_document={per_doc}", pair))
    return out


class CachedQueries:
    """The embedder with query vectors memoised, so variants of one run embed each query once."""

    def __init__(self, embedder: Any):
        self._embedder = embedder
        self._cache: dict[str, np.ndarray] = {}

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            for text, vec in zip(missing, self._embedder.embed_queries(missing), strict=True):
                self._cache[text] = vec
        return np.stack([self._cache[t] for t in texts]) if texts else self._embedder.embed_queries([])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._embedder, name)


@dataclass
class Row:
    variant: Variant
    ndcg10: float
    recall10: float
    recall100: float
    mrr10: float
    ms_per_query: float


def run_variant(base: Sieve, variant: Variant, golden: Any, known: KnownIds) -> Row:
    collection = nested("rag.store.collection", base.settings.rag.store.collection)
    sieve = base.with_settings(load_settings(merge(collection, variant.overrides)))
    t0 = time.perf_counter()
    evaluation = evaluate(sieve.chain, golden, DEPTH, known)
    elapsed = time.perf_counter() - t0
    per_case: dict[str, list[float]] = {"ndcg10": [], "recall10": [], "recall100": [], "mrr10": []}
    for case in evaluation.cases:
        if case.result is None:
            raise RuntimeError(f"{variant.name}: case {case.case.id} failed: {case.error}")
        ranked = [match_key(d, case.key) for d in case.result.documents]
        per_case["ndcg10"].append(ndcg_at_k(ranked, case.relevance, 10))
        per_case["recall10"].append(recall_at_k(ranked, case.relevance, 10))
        per_case["recall100"].append(recall_at_k(ranked, case.relevance, 100))
        per_case["mrr10"].append(mrr_at_k(ranked, case.relevance, 10))
    means = {key: statistics.fmean(values) for key, values in per_case.items()}
    return Row(variant, **means, ms_per_query=elapsed * 1000 / max(1, len(evaluation.cases)))


@dataclass
class DatasetRun:
    name: str
    split: str
    queries: int
    chunks: int
    ingest_seconds: float
    embedded: int
    embed_ms_per_query: float
    rows: list[Row]


def run_dataset(directory: Path, split: str, variants: list[Variant]) -> DatasetRun:
    name = directory.resolve().name
    settings = load_settings(nested("rag.store.collection", f"beir-{name}"))
    golden = load_beir_cases(directory, split)
    base = Sieve.open(settings)
    try:
        t0 = time.perf_counter()
        report = base.ingest([directory / "corpus.jsonl"], progress=True)
        ingest_seconds = time.perf_counter() - t0
        if report.errors:
            raise SystemExit(f"{directory}: ingest errors: {report.errors[:5]}")
        # Every variant embeds the same queries: do it once, up front, so the rows time the chain alone.
        base.embedder = CachedQueries(base.embedder)  # type: ignore[assignment]
        t0 = time.perf_counter()
        base.embedder.embed_queries([case.query for case in golden.cases])
        embed_ms = (time.perf_counter() - t0) * 1000 / max(1, len(golden.cases))
        known = KnownIds.from_store(base.store)
        rows = []
        for variant in variants:
            row = run_variant(base, variant, golden, known)
            print(
                f"  {name:<9} {variant.name:<34} nDCG@10 {row.ndcg10:.4f}  R@10 {row.recall10:.4f}  "
                f"R@100 {row.recall100:.4f}  MRR@10 {row.mrr10:.4f}  {row.ms_per_query:6.1f} ms/q",
                flush=True,
            )
            rows.append(row)
        return DatasetRun(
            name, split, len(golden.cases), base.store.count(), ingest_seconds, report.added, embed_ms, rows
        )
    finally:
        base.close()


# -- docs/benchmarks.md -------------------------------------------------------------------------------


def machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{model or cpu}, {os.cpu_count()} cores, torch {torch.__version__} with "
        f"{torch.get_num_threads()} thread(s), Python {platform.python_version()}"
    )


def results_block(runs: list[DatasetRun], wall: float) -> str:
    when = time.strftime("%Y-%m-%d")
    lines = [f"Measured {when} on {machine()}; `make bench-quality` took {wall / 60:.1f} min.", ""]
    for run in runs:
        lines += [
            f"### {run.name} ({run.split} split, {run.queries} queries, {run.chunks} chunks)",
            "",
            "| system | nDCG@10 | Recall@10 | Recall@100 | MRR@10 | ms/query |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for row in run.rows:
            label = f"**{row.variant.name}**" if row.variant.name == "default chain" else row.variant.name
            note = f" ({row.variant.note})" if row.variant.note else ""
            lines.append(
                f"| {label}{note} | {row.ndcg10:.3f} | {row.recall10:.3f} | {row.recall100:.3f} | "
                f"{row.mrr10:.3f} | {row.ms_per_query:.1f} |"
            )
        for label, value, source in PUBLISHED.get(run.name, []):
            lines.append(f"| published: {label} [{source}] | {value:.3f} | | | | |")
        ingest = (
            f"ingest embedded {run.embedded} chunks in {run.ingest_seconds / 60:.1f} min"
            if run.embedded
            else f"ingest: already in the store ({run.ingest_seconds:.0f} s to check)"
        )
        lines += [
            "",
            f"{ingest}. ms/query is the chain's wall time per query (batches of 32); the query vectors were "
            f"computed once beforehand, {run.embed_ms_per_query:.1f} ms a query, and are not in it.",
            "",
        ]
    return "\n".join(lines)


def tuning_block(runs: list[DatasetRun], wall: float) -> str:
    lines = [f"Measured {time.strftime('%Y-%m-%d')} on {machine()} ({wall / 60:.1f} min).", ""]
    for run in runs:
        default = next(r for r in run.rows if r.variant.name == "default chain")
        lines += [
            f"### {run.name} ({run.split} split, {run.queries} queries)",
            "",
            "| variant (default chain plus) | nDCG@10 | vs default | Recall@100 | MRR@10 |",
            "|---|---:|---:|---:|---:|",
        ]
        for row in run.rows:
            lines.append(
                f"| {row.variant.name} | {row.ndcg10:.4f} | {row.ndcg10 - default.ndcg10:+.4f} | "
                f"{row.recall100:.4f} | {row.mrr10:.4f} |"
            )
        lines.append("")
    return "\n".join(lines)


def replace_block(text: str, marker: str, body: str) -> str:
    """`text` with everything between `<!-- marker:begin -->` and `<!-- marker:end -->` replaced by `body`."""
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise ValueError(f"markers {begin} ... {end} not found")
    return pattern.sub(lambda _: f"{begin}\n{body}\n{end}", text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tune", action="store_true", help="run the tuning grid on the train split")
    parser.add_argument("--datasets", default=str(DATASETS_DIR), help="folder holding scifact/, xquad-zh/")
    parser.add_argument("--only", help="comma-separated dataset names (default: all of this mode's)")
    parser.add_argument("--variants", help="comma-separated variant names to run (default: all)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md")
    parser.add_argument("--doc", default=str(DOC), help="the Markdown file whose blocks are replaced")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s - %(message)s")

    root = Path(args.datasets)
    plan = [("scifact", "train")] if args.tune else [("scifact", "test"), ("xquad-zh", "test")]
    if args.only:
        wanted = {name.strip() for name in args.only.split(",")}
        if wanted - {name for name, _ in plan}:
            print(f"error: --only {args.only}: this mode runs {[n for n, _ in plan]}", file=sys.stderr)
            return 2
        plan = [p for p in plan if p[0] in wanted]
    missing = [str(root / name) for name, _ in plan if not (root / name / "corpus.jsonl").exists()]
    if missing:
        print(f"error: BEIR dataset(s) not found: {', '.join(missing)} (set --datasets)", file=sys.stderr)
        return 2
    doc, marker = Path(args.doc), "bench-quality-tuning" if args.tune else "bench-quality-results"
    if not args.no_write:
        try:  # fail before the long runs, not after them
            replace_block(doc.read_text(encoding="utf-8"), marker, "")
        except (OSError, ValueError) as exc:
            print(f"error: {doc}: {exc}", file=sys.stderr)
            return 2
    variants = tuning_variants() if args.tune else table_variants()
    if args.variants:
        names = [n.strip() for n in args.variants.split(",")]
        unknown = sorted(set(names) - {v.name for v in variants})
        if unknown:
            known = [v.name for v in variants]
            print(f"error: unknown variant(s) {unknown}; known: {known}", file=sys.stderr)
            return 2
        variants = [v for v in variants if v.name in names]
    started = time.perf_counter()
    runs = [run_dataset(root / name, split, variants) for name, split in plan]
    wall = time.perf_counter() - started
    if args.no_write:
        return 0
    block = tuning_block(runs, wall) if args.tune else results_block(runs, wall)
    text = replace_block(doc.read_text(encoding="utf-8"), marker, block)
    tmp = doc.with_suffix(".md.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(doc)
    print(f"wrote {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
