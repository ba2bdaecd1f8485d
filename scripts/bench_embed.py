"""Benchmark: how fast can this machine embed passages, and how much faster is the default ingest?

    python scripts/bench_embed.py [--quick] [--docs 120] [--passages 96] [--rounds 2] [--doc FILE | --no-doc]

Three parts, in one run (the machine may be shared: compare the ratios of one run, not runs with each other;
the 1-minute load average is printed beside every figure):

1. Backends side by side on the same `--passages` SciFact passages (the ingest's own chunks and texts):
   torch `encode` on 1 intra-op thread at several batch sizes and on every usable core; Sieve's own ingest
   path (`Embedder.embed_passages`: ~250 ms slices in length order) on 1 worker and on one worker per core,
   each worker on 1 intra-op thread; ONNX Runtime fp32 (the model exported with `torch.onnx.export`) on
   1 thread and every core. Passages/s, and the smallest cosine of each one's vectors to torch 1 thread
   batch 32 (the reference).
2. Two thirds of those passages through 1 worker and one worker per core while another process spins on
   one core (`python -c 'while 1: pass'`, in a session of its own), alternately 1 N N 1 ..., `2 * --rounds`
   times each: does a busy machine make the workers slower than one?
3. The ingest itself: `sieve ingest` of the first `--docs` SciFact documents (copied to a temporary folder)
   into a fresh store, alternately with the default configuration (A) and `RAG__MODELS__THREADS=1` (B),
   A B A B ..., `--rounds` times each, read from the ingest's own "in N s" line; the ratio of the medians,
   the smallest cosine between the vectors A and B stored, and the load average around each run.

`--quick` (60 documents, 48 passages, two batch sizes) takes minutes (docs/benchmarks.md#code-figures).
Prints a Markdown block and writes it between the `bench-embed` markers of `--doc` (unless --no-doc).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SIEVE = Path(sys.executable).with_name("sieve")
DATASETS = Path(os.environ.get("SIEVE_DATASETS", REPO.parent / "shared" / "datasets"))
SUMMARY = re.compile(r"added=(\d+) .* in ([0-9.]+)s")
SPIN = "while 1: pass"


def subset(corpus: Path, docs: int, folder: Path) -> Path:
    """The first `docs` lines of a BEIR corpus.jsonl, as a corpus.jsonl in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "corpus.jsonl"
    with corpus.open(encoding="utf-8") as src, target.open("w", encoding="utf-8") as dst:
        for i, line in enumerate(src):
            if i >= docs:
                break
            dst.write(line)
    return target


def passages(corpus_file: Path, count: int) -> list[str]:
    from app.ingest.chunker import embedding_text
    from app.ingest.loaders import load_paths
    from app.ingest.pipeline import Ingestor
    from app.settings import IngestSettings

    loaded = load_paths([corpus_file])
    titles = {d.doc_id: d.title for d in loaded.documents}
    chunks = Ingestor(None, None, IngestSettings()).chunk(loaded.documents)  # type: ignore[arg-type]
    return [embedding_text(c, titles[c.doc_id]) for c in chunks[:count]]


def torch_encoder(model: Any, prompt: str, threads: int, batch: int):
    import torch

    def encode(texts: list[str]) -> np.ndarray:
        torch.set_num_threads(threads)
        return model.encode(texts, prompt=prompt, batch_size=batch, normalize_embeddings=True)

    return encode


def onnx_encoder(model: Any, prompt: str, threads: int, batch: int, path: Path):
    """ONNX Runtime fp32 over the exported transformer, with the model's mean pooling and normalisation."""
    import onnxruntime as ort
    import torch

    if not path.exists():

        class Hidden(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.bert = model[0].auto_model.eval()

            def forward(self, input_ids: Any, attention_mask: Any) -> Any:
                return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

        sample = model.tokenizer(["passage: a sample"], return_tensors="pt")
        with torch.no_grad():
            torch.onnx.export(
                Hidden(),
                (sample["input_ids"], sample["attention_mask"]),
                str(path),
                input_names=["input_ids", "attention_mask"],
                output_names=["hidden"],
                dynamic_axes={
                    n: {0: "batch", 1: "tokens"} for n in ("input_ids", "attention_mask", "hidden")
                },
                opset_version=17,
                dynamo=False,
            )
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    max_len = model.max_seq_length

    def encode(texts: list[str]) -> np.ndarray:
        out = []
        for i in range(0, len(texts), batch):
            enc = model.tokenizer(
                [prompt + t for t in texts[i : i + batch]],
                padding=True,
                truncation=True,
                max_length=max_len,
                return_tensors="np",
            )
            feeds = {
                "input_ids": enc["input_ids"].astype(np.int64),
                "attention_mask": enc["attention_mask"].astype(np.int64),
            }
            hidden = session.run(None, feeds)[0]
            mask = feeds["attention_mask"][..., None].astype(np.float32)
            pooled = (hidden * mask).sum(1) / np.maximum(mask.sum(1), 1e-9)
            out.append(pooled / np.linalg.norm(pooled, axis=1, keepdims=True))
        return np.concatenate(out)

    return encode


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """min over rows of a_i . b_i / (|a_i| |b_i|)."""
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float(np.min(np.sum(a * b, axis=1)))


def sieve_encoder(embedder: Any, workers: int):
    """Sieve's ingest path: `embed_passages` (slices of ~250 ms in length order) on `workers` workers, each
    on one torch intra-op thread: a fresh Embedder over the same model (warm it up, which also measures
    its slice size, before timing it)."""
    from app.models import Embedder

    return Embedder(
        embedder.model,
        embedder.name,
        embedder.checksum,
        embedder.batch_size,
        embedder.query_prompt,
        embedder.passage_prompt,
        embedder.slice_ms,
        workers=workers,
    )


def backends(texts: list[str], cores: int, batches: list[int], tmp: Path) -> list[dict[str, Any]]:
    """Part 1: every configuration on the same passages, in one process."""
    from app.models import load_embedder
    from app.settings import ModelsSettings

    embedder = load_embedder(ModelsSettings(cache_dir=str(REPO / "target" / "models")))
    model, prompt = embedder.model, embedder.passage_prompt
    configs: list[tuple[str, int, int, int]] = [
        ("torch encode", 1, 1, 32)
    ]  # (backend, threads, workers, batch)
    configs += [("torch encode", 1, 1, b) for b in batches if b != 32]
    if cores > 1:
        configs += [("torch encode", cores, 1, 32)]
    configs += [("sieve slices", 1, 1, 32)]
    if cores > 1:
        configs += [("sieve slices", 1, cores, 32)]
    configs += [("onnxruntime", 1, 1, 32)] + ([("onnxruntime", cores, 1, 32)] if cores > 1 else [])
    torch_encoder(model, prompt, 1, 32)(texts[:8])  # warm up
    rows: list[dict[str, Any]] = []
    baseline: np.ndarray | None = None
    for backend, threads, workers, batch in configs:
        closing = None
        try:
            if backend == "torch encode":
                encode = torch_encoder(model, prompt, threads, batch)
            elif backend == "sieve slices":
                sliced = sieve_encoder(embedder, workers)
                sliced.embed_passages(texts[: 2 * workers])  # start the workers, measure the slice size
                encode, closing = sliced.embed_passages, sliced.close
            else:
                encode = onnx_encoder(model, prompt, threads, batch, tmp / "e5.onnx")
                encode(texts[:8])  # warm up the session
        except Exception as exc:  # an optional backend that cannot run here is reported, not fatal
            error = " ".join(f"{type(exc).__name__}: {exc}".split())[:160]
            rows.append({"backend": backend, "threads": threads, "workers": workers, "batch": batch})
            rows[-1]["error"] = error
            print(json.dumps(rows[-1]), flush=True)
            continue
        load = os.getloadavg()[0]
        started = time.perf_counter()
        vectors = np.asarray(encode(texts), dtype=np.float32)
        seconds = time.perf_counter() - started
        if closing is not None:
            closing()
        if baseline is None:
            baseline = vectors
        rows.append(
            {
                "backend": backend,
                "threads": threads,
                "workers": workers,
                "batch": batch,
                "per_s": len(texts) / seconds,
                "cosine": min_cosine(vectors, baseline),
                "load": load,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    import torch

    torch.set_num_threads(1)
    return rows


def busy(texts: list[str], cores: int, rounds: int) -> list[dict[str, Any]]:
    """Part 2: 1 worker and `cores` workers, alternately, while another process spins on one core."""
    from app.models import load_embedder
    from app.settings import ModelsSettings

    embedder = load_embedder(ModelsSettings(cache_dir=str(REPO / "target" / "models")))
    encoders = {w: sieve_encoder(embedder, w) for w in (1, cores)}
    for sliced in encoders.values():
        sliced.embed_passages(texts[:4])  # warm up, measure the slice size
    # In a session of its own: where the kernel shares CPU time between sessions (autogroup), the spinner
    # then takes a core from this process as another service would, rather than a share of its threads'.
    spinner = subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True)
    rows: list[dict[str, Any]] = []
    try:
        time.sleep(2.0)  # the spinner has its core
        for round_no in range(rounds):
            for workers, sliced in sorted(encoders.items(), reverse=round_no % 2 == 1):  # 1 N N 1 1 N ...
                load = os.getloadavg()[0]
                started = time.perf_counter()
                sliced.embed_passages(texts)
                seconds = time.perf_counter() - started
                rows.append({"workers": workers, "per_s": len(texts) / seconds, "load": load})
                print(json.dumps({"busy": True, **rows[-1]}), flush=True)
    finally:
        spinner.terminate()
        try:
            spinner.wait(timeout=5)
        except subprocess.TimeoutExpired:
            spinner.kill()
            spinner.wait(timeout=5)
        for sliced in encoders.values():
            sliced.close()
    return rows


def ingest_once(corpus_dir: Path, store: Path, threads: str | None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG__")}
    env |= {
        "RAG__STORE__PATH": str(store),
        "RAG__MODELS__CACHE_DIR": str(REPO / "target" / "models"),
        "PYTHONPATH": str(REPO),
    }
    if threads is not None:
        env["RAG__MODELS__THREADS"] = threads
    load = os.getloadavg()[0]
    done = subprocess.run(
        [str(SIEVE), "ingest", str(corpus_dir)], cwd=REPO, env=env, capture_output=True, text=True
    )
    found = SUMMARY.search(done.stdout)
    if done.returncode != 0 or not found:
        sys.exit(f"sieve ingest failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return {
        "seconds": float(found.group(2)),
        "added": int(found.group(1)),
        "load_before": load,
        "load_after": os.getloadavg()[0],
    }


def stored_vectors(store: Path) -> dict[str, np.ndarray]:
    from app.models import load_embedder
    from app.settings import ModelsSettings, StoreSettings
    from app.store import ChromaStore

    embedder = load_embedder(ModelsSettings(cache_dir=str(REPO / "target" / "models")))
    opened = ChromaStore.open(StoreSettings(path=str(store)), embedder.identity())
    try:
        ids = [c.chunk_id for c in opened.iter_all(include_text=False)]
        return {c.chunk_id: c.embedding for c in opened.get(ids) if c.embedding is not None}
    finally:
        opened.close()


def render(rows, spun, runs, cores: int, n_texts: int, n_busy: int, docs: int, cosine_ab: float, wall: float):
    lines = [
        f"Measured by `make bench-embed` on {cores} usable cores, {time.strftime('%Y-%m-%d %H:%M')}, wall "
        f"{wall / 60:.1f} min; load average (1 min) at the start of each measurement in its last column.",
    ]
    if rows:
        lines += [
            "",
            f"Backends on the same {n_texts} SciFact passages (threads: torch or ONNX Runtime intra-op "
            "threads per worker; cosine: the smallest, to torch encode 1 thread batch 32):",
            "",
            "| backend | threads | workers | batch | passages/s | x torch 1 thread | min cosine | load |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        base = next((r["per_s"] for r in rows if "per_s" in r), 1.0)
        for r in rows:
            head = f"| {r['backend']} | {r['threads']} | {r['workers']} | {r['batch']} |"
            if "error" in r:
                lines.append(f"{head} failed: {r['error']} | | | |")
                continue
            lines.append(
                f"{head} {r['per_s']:.1f} | {r['per_s'] / base:.2f} | {r['cosine']:.6f} | {r['load']:.1f} |"
            )
    if spun:
        one = statistics.median(r["per_s"] for r in spun if r["workers"] == 1)
        many = statistics.median(r["per_s"] for r in spun if r["workers"] == cores)
        lines += [
            "",
            f"Busy machine: the first {n_busy} of those passages through Sieve's slices while another "
            "process spins on one core (`python -c 'while 1: pass'`, its own session), alternately:",
            "",
            "| run | workers | passages/s | load |",
            "|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {i} | {r['workers']} | {r['per_s']:.1f} | {r['load']:.1f} |" for i, r in enumerate(spun, 1)
        ]
        lines += [
            "",
            f"{cores} workers vs 1 with a core taken: **{many / one:.2f}x** (ratio of the medians).",
        ]
    a = [r for r in runs if r["config"] == "A"]
    b = [r for r in runs if r["config"] == "B"]
    ratio = statistics.median(r["seconds"] for r in b) / statistics.median(r["seconds"] for r in a)
    lines += [
        "",
        f"`sieve ingest` of the first {docs} SciFact documents ({a[0]['added']} chunks) into a fresh store, "
        "alternately; seconds from the ingest's own summary line:",
        "",
        "| run | configuration | seconds | chunks/s | load before | load after |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(runs, 1):
        name = f"default ({cores} workers)" if r["config"] == "A" else "RAG__MODELS__THREADS=1"
        lines.append(
            f"| {i} | {name} | {r['seconds']:.1f} | {r['added'] / r['seconds']:.1f} | "
            f"{r['load_before']:.1f} | {r['load_after']:.1f} |"
        )
    lines += [
        "",
        f"Default vs RAG__MODELS__THREADS=1: **{ratio:.2f}x** faster (ratio of the medians); "
        f"smallest cosine between the vectors the two stored: {cosine_ab:.6f}.",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="60 documents, 48 passages, batch 8 and 32")
    parser.add_argument("--docs", type=int, help="SciFact documents for the ingest runs (120; quick 60)")
    parser.add_argument("--passages", type=int, help="passages for the backend comparison (96; quick 48)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each configuration in parts 2 and 3")
    parser.add_argument("--skip-backends", action="store_true", help="skip parts 1 and 2")
    parser.add_argument("--doc", default=str(REPO / "docs" / "benchmarks.md"))
    parser.add_argument("--no-doc", action="store_true")
    args = parser.parse_args()
    docs = args.docs or (60 if args.quick else 120)
    n_passages = args.passages or (48 if args.quick else 96)
    batches = [8, 32] if args.quick else [8, 32, 64]
    logging.basicConfig(level=logging.WARNING)
    corpus = DATASETS / "scifact" / "corpus.jsonl"
    if not corpus.is_file():
        print(f"error: {corpus} not found (set SIEVE_DATASETS)", file=sys.stderr)
        return 2
    doc = Path(args.doc)
    if not args.no_doc and "<!-- bench-embed:begin -->" not in doc.read_text(encoding="utf-8"):
        print(
            f"error: {doc} has no <!-- bench-embed:begin --> ... <!-- bench-embed:end --> markers",
            file=sys.stderr,
        )
        return 2
    from app.models.embedder import usable_cores

    cores = usable_cores()
    wall = time.perf_counter()
    print(f"{cores} usable cores; load average {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="sieve-bench-embed-") as name:
        tmp = Path(name)
        corpus_dir = tmp / "scifact"
        corpus_file = subset(corpus, docs, corpus_dir)
        texts = passages(corpus_file, n_passages)
        busy_texts = texts[: max(8, len(texts) * 2 // 3)]
        rows = [] if args.skip_backends else backends(texts, cores, batches, tmp)
        spun = [] if args.skip_backends or cores < 2 else busy(busy_texts, cores, 2 * args.rounds)
        runs: list[dict[str, Any]] = []
        for _ in range(args.rounds):
            for config, threads in (("A", None), ("B", "1")):
                store = tmp / f"store-{config}"
                shutil.rmtree(store, ignore_errors=True)
                run = {"config": config, **ingest_once(corpus_dir, store, threads)}
                runs.append(run)
                print(json.dumps(run), flush=True)
        a_vectors, b_vectors = stored_vectors(tmp / "store-A"), stored_vectors(tmp / "store-B")
        ids = sorted(set(a_vectors) & set(b_vectors))
        if len(ids) != len(a_vectors) or len(ids) != len(b_vectors):
            sys.exit(f"the two stores hold different chunks: {len(a_vectors)} vs {len(b_vectors)}")
        cosine_ab = min_cosine(np.stack([a_vectors[i] for i in ids]), np.stack([b_vectors[i] for i in ids]))
    block = render(
        rows, spun, runs, cores, len(texts), len(busy_texts), docs, cosine_ab, time.perf_counter() - wall
    )
    print(block)
    if not args.no_doc:
        text = doc.read_text(encoding="utf-8")
        begin, end = "<!-- bench-embed:begin -->", "<!-- bench-embed:end -->"
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        doc.write_text(f"{head}{begin}\n{block}\n{end}{tail}", encoding="utf-8")
        print(f"written to {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
