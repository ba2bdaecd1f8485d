"""HNSW recall@N against exact search on a real BEIR collection's stored vectors (the model's own embeddings).

    RAG__STORE__PATH=<a copy of the store> python scripts/bench_hnsw_recall.py [--beir DIR] [--n 50]

bench-scale measures recall on synthetic hash vectors (a hard case for HNSW); this measures it on what Sieve
really stores: every vector of the `beir-<dir>` collection is read once, the split's queries are embedded by
the configured model, and Chroma's top N is compared with the exact cosine top N (numpy). Stop `sieve serve`
first, or point RAG__STORE__PATH at a copy: an embedded store opens in one process only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.models.embedder import load_embedder  # noqa: E402
from app.settings import load_settings  # noqa: E402
from app.store import ChromaStore  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beir", default=str(REPO.parent / "shared" / "datasets" / "scifact"))
    parser.add_argument("--split", default="test")
    parser.add_argument("--n", type=int, default=50)
    args = parser.parse_args()
    beir = Path(args.beir)
    settings = load_settings()
    embedder = load_embedder(settings.rag.models)
    store_settings = settings.rag.store.model_copy(update={"collection": f"beir-{beir.name}"})
    store = ChromaStore.open(store_settings, embedder.identity())
    try:
        all_ids = [c.chunk_id for c in store.iter_all(include_text=False)]
        chunks = [c for i in range(0, len(all_ids), 5000) for c in store.get(all_ids[i : i + 5000])]
        ids = [c.chunk_id for c in chunks]
        matrix = np.stack([np.asarray(c.embedding, dtype=np.float32) for c in chunks])
        wanted = {
            line.split("\t")[0]
            for line in (beir / "qrels" / f"{args.split}.tsv").read_text().splitlines()[1:]
        }
        queries = [
            json.loads(line) for line in (beir / "queries.jsonl").read_text(encoding="utf-8").splitlines()
        ]
        texts = [q["text"] for q in queries if q["_id"] in wanted]
        vectors = embedder.embed_queries(texts)
        exact = np.argsort(-(vectors @ matrix.T), axis=1)[:, : args.n]
        started = time.perf_counter()
        hits = store.query(vectors, args.n)
        ms = (time.perf_counter() - started) * 1000 / len(texts)
        position = {cid: i for i, cid in enumerate(ids)}
        recall = float(
            np.mean(
                [
                    len({position[h.chunk_id] for h in row} & set(e.tolist())) / args.n
                    for row, e in zip(hits, exact, strict=True)
                ]
            )
        )
    finally:
        store.close()
    print(
        f"{beir.name}: {len(ids)} chunks, {len(texts)} queries, HNSW recall@{args.n} vs exact {recall:.4f}, "
        f"store query {ms:.2f} ms a query (batched, with documents, metadata and vectors); "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
