"""Benchmark: what an evaluation of N cases costs next to the model work inside it.

Prints, for the sample golden set (or --golden-set): evaluation wall time per case, the time spent inside
model calls per case (embedder and reranker `model_seconds`), and the same for N single `retrieve()` calls,
so "an evaluation of N cases costs close to N times the model work of one query" can be read off as ratios
measured in one run, and so can the evaluation's wall time against the model time inside it (the time it
spends beyond the model: candidates, stages, scoring). A script that prints figures, not a timed test: these
machines are shared and noisy.

    .venv/bin/python scripts/bench_eval.py [--golden-set F] [--store-path DIR] [--repeat 3] [--no-freeze]

Once loaded, the service's objects are frozen out of the garbage collector's reach as `sieve eval` and
`sieve serve` do (`freeze_loaded_objects`); `--no-freeze` leaves them in, as code that opens a service
itself (a test) runs.
"""

from __future__ import annotations

import argparse
import logging
import platform
import statistics
import time

from app.evaluation.golden.cases import load_golden_set
from app.evaluation.run.runner import KnownIds, evaluate
from app.service import Sieve, freeze_loaded_objects
from app.settings import load_settings, merge, nested


def model_seconds(sieve: Sieve) -> float:
    return sieve.embedder.model_seconds + float(getattr(sieve.reranker, "model_seconds", 0.0) or 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--golden-set", default="golden_set/golden-set.json")
    parser.add_argument("--store-path", default="target/bench/eval-chroma")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--freeze",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="freeze the loaded service's objects, as `sieve eval` does (default on)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    settings = load_settings(merge(nested("rag.store.path", args.store_path)))
    sieve = Sieve.open(settings)
    try:
        sieve.ingest(settings.rag.ingest.paths)
        golden = load_golden_set(args.golden_set)
        known = KnownIds.from_store(sieve.store)
        k = settings.rag.evaluate.top_k
        n = len(golden.cases)
        sieve.retrieve("warm-up query", k)  # first call pays one-off initialisation (jieba, torch kernels)
        if args.freeze:
            freeze_loaded_objects()

        eval_wall, eval_model, single_wall, single_model = [], [], [], []
        for _ in range(args.repeat):
            m0, t0 = model_seconds(sieve), time.perf_counter()
            evaluate(sieve.chain, golden, k, known)
            eval_wall.append(time.perf_counter() - t0)
            eval_model.append(model_seconds(sieve) - m0)

            m0, t0 = model_seconds(sieve), time.perf_counter()
            for case in golden.cases:
                sieve.retrieve(case.query, case.top_k or k, case.knowledge_tag)
            single_wall.append(time.perf_counter() - t0)
            single_model.append(model_seconds(sieve) - m0)
    finally:
        sieve.close()

    def per_case_ms(values: list[float]) -> float:
        return statistics.median(values) / n * 1000

    print(
        f"machine: {platform.machine()}, {platform.processor() or 'cpu'}, python {platform.python_version()}"
    )
    print(
        f"cases: {n}, K={k}, repeats: {args.repeat} (medians shown), embedder: {sieve.embedder.name}, "
        f"loaded objects frozen: {'yes' if args.freeze else 'no'}"
    )
    print(f"{'':<34}{'wall ms/case':>14}{'model ms/case':>15}{'model share':>13}")
    for label, wall, model in (
        ("evaluation (batched)", eval_wall, eval_model),
        ("N single retrieve() calls", single_wall, single_model),
    ):
        w, m = per_case_ms(wall), per_case_ms(model)
        print(f"{label:<34}{w:>14.1f}{m:>15.1f}{m / w:>13.0%}")
    ratio = statistics.median(eval_wall) / statistics.median(single_wall)
    print(f"evaluation wall / N single queries: {ratio:.2f}")
    # each evaluation's wall against the model time inside it, so a repeat slowed by the machine (or by a
    # full garbage collection) shows as itself
    own = sorted(w / m for w, m in zip(eval_wall, eval_model, strict=True))
    spread = ", ".join(f"{r:.3f}" for r in own)
    print(f"evaluation wall / its model time: {statistics.median(own):.3f} (each repeat: {spread})")


if __name__ == "__main__":
    main()
