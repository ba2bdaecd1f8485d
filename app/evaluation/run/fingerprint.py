"""What exactly was run: the fingerprint every report carries in `run`, so two reports can say in words
what differs between them (`compare.describe_differences`)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterable, Mapping
from datetime import date
from pathlib import Path

from pydantic import JsonValue

from app.evaluation.golden.cases import GoldenCase, GoldenSet
from app.evaluation.report.model import CorpusFingerprint, EmbedderIdentity, RunFingerprint, RunSettings
from app.settings import AccessSettings, RagSettings


def canonical_json(value: object) -> str:
    """Sorted keys, no whitespace, UTF-8 as is: the same data always gives the same text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def case_json(case: GoldenCase) -> dict[str, JsonValue]:
    """One case as canonical data: JSON names, fields at their default value left out (so writing a
    default out, or a new optional field in a later Sieve, changes nothing)."""
    return case.model_dump(mode="json", by_alias=True, exclude_defaults=True)


def case_sha256(case: GoldenCase) -> str:
    """SHA-256 of one case's content: its `case_json` without its `id`, in canonical JSON. A renamed case
    keeps its hash, so the comparison pairs it with its baseline case by content (`compare.pairing`)."""
    content = {key: value for key, value in case_json(case).items() if key != "id"}
    return sha256_text(canonical_json(content))


def golden_set_sha256(golden: GoldenSet) -> str:
    """SHA-256 of the cases in canonical JSON, in file order: reformatting the file, or writing a default
    value out, does not change it; editing, adding, removing or reordering cases does."""
    return sha256_text(canonical_json([case_json(case) for case in golden.cases]))


def corpus_fingerprint(
    chunk_ids: Iterable[str], scopes: Mapping[str, Mapping[str, object]] | None = None
) -> CorpusFingerprint:
    """The chunks: how many, and the SHA-256 of the sorted chunk ids joined by newlines. Chunk ids are
    derived from the chunk's content, so a changed text changes the fingerprint. `scopes`: the stored
    `tenant` / `access` of each scoped chunk (`KnownIds.scopes`), fingerprinted apart (`scopesSha256`), so
    that a change of who may read what shows although no chunk id changes."""
    ids = sorted(chunk_ids)
    scoped = sorted(f"{chunk_id}\t{canonical_json(scope)}" for chunk_id, scope in (scopes or {}).items())
    return CorpusFingerprint(
        chunks=len(ids),
        sha256=sha256_text("\n".join(ids)),
        scopes_sha256=sha256_text("\n".join(scoped)) if scoped else None,
    )


# The keys of rag.models, rag.ingest and rag.store that can move a result, and those that only move speed,
# memory or where files live. Every key of those sections is in exactly one of the two (a unit test checks),
# so a key added later has to be placed. rag.retrieval and rag.chain are fingerprinted whole.
RESULT_KEYS: dict[str, tuple[str, ...]] = {
    # the model and the texts it embeds: the vectors themselves
    "models": ("embedder", "query_prompt", "passage_prompt"),
    # how a document becomes chunks, and which documents are refused
    "ingest": (
        "chunk_size",
        "chunk_overlap",
        "min_chunk_chars",
        "max_document_chars",
        "max_metadata_keys",
        "max_metadata_key_chars",
        "max_metadata_bytes",
        "follow_symlinks",
        "access_defaults",
    ),
    # exact or approximate search, and the approximate index's parameters (hnsw_m and
    # hnsw_construction_ef apply when a collection is created)
    "store": (
        "exact_search_max_chunks",
        "exact_filtered_max_chunks",
        "hnsw_search_ef",
        "hnsw_m",
        "hnsw_construction_ef",
    ),
}
SPEED_KEYS: dict[str, tuple[str, ...]] = {
    # float-level noise at most (batch padding, thread count, device kernels, the traced query model is
    # checked against eager at load)
    "models": (
        "batch_size",
        "cache_dir",
        "device",
        "ingest_slice_ms",
        "threads",
        "max_query_batch",
        "query_batch_wait_ms",
        "query_slots",
        "trace_queries",
    ),
    # which knowledge base is read is the corpus fingerprint's business, not a setting's
    "ingest": ("paths", "on_startup", "commit_chunks", "progress_log_seconds"),
    "store": ("mode", "path", "host", "port", "collection", "cache_chunks", "min_free_mb"),
}


def result_settings(rag: RagSettings) -> RunSettings:
    """The settings that can move a result, as the report's `run.settings`: {"models": {...}, "ingest":
    {...}, "store": {...}} with the `RESULT_KEYS` of those sections, then rag.retrieval and rag.chain
    whole."""
    out: RunSettings = {}
    for section, keys in RESULT_KEYS.items():
        dumped = getattr(rag, section).model_dump(mode="json")
        out[section] = {key: dumped[key] for key in keys}
    out["retrieval"] = rag.retrieval.model_dump(mode="json")
    out["chain"] = rag.chain.model_dump(mode="json")
    return out


def access_settings(access: AccessSettings) -> dict[str, JsonValue]:
    """The part of rag.access that moves an evaluation's results, as `run.settings.access`: `enabled` (a case
    without `principal` then runs as the default), `eval_principals` (the scopes the cases run as) and
    `eval_default_principal`. The API's token principals are left out: no evaluation reads them."""
    dumped = access.model_dump(mode="json")
    return {key: dumped[key] for key in ("enabled", "eval_principals", "eval_default_principal")}


def access_matters(access: AccessSettings) -> bool:
    """Whether rag.access can move an evaluation's results: access enabled or evaluation principals
    defined. Without either every case runs unscoped (or as the admin, the same), and `run.settings`
    carries no `access` section, as before scopes existed."""
    return access.enabled or bool(access.eval_principals)


def chain_settings(settings: RunSettings) -> RunSettings:
    """The chain's part of `run.settings`: rag.retrieval and rag.chain."""
    return {"retrieval": settings["retrieval"], "chain": settings["chain"]}


def chain_sha256(settings: RunSettings) -> str:
    """SHA-256 of rag.retrieval + rag.chain in canonical JSON (`chain_settings`)."""
    return sha256_text(canonical_json(settings))


def settings_sha256(settings: RunSettings) -> str:
    """SHA-256 of `run.settings` (every setting that can move a result, `result_settings`) in canonical
    JSON: two runs with the same hash ran the same configuration."""
    return sha256_text(canonical_json(settings))


def code_version() -> str:
    """`git describe --always --dirty` when the code runs from a git checkout, else the package version."""
    here = Path(__file__).resolve().parent
    try:
        described = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=here,
        )
        if described.returncode == 0 and described.stdout.strip():
            return described.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sieve")
    except PackageNotFoundError:
        return "unknown"


def run_fingerprint(
    golden: GoldenSet,
    chunk_ids: Iterable[str],
    embedder: Mapping[str, object],
    settings: RunSettings,
    k: int,
    as_of: date,
    evaluated_at: str,
    gain: str = "linear",
    scopes: Mapping[str, Mapping[str, object]] | None = None,
) -> RunFingerprint:
    """What exactly was run. `embedder` is `Embedder.identity()`, `settings` `result_settings(rag)`;
    `chainSha256` covers its retrieval and chain parts (as in reports before models, ingest and store were
    fingerprinted), `settingsSha256` all of it. K, asOf and nDCG's gain (`rag.evaluate.gain`) have their
    own fields. `scopes`: the scoped chunks' tenant and access (`corpus_fingerprint`)."""
    return RunFingerprint(
        golden_set_sha256=golden_set_sha256(golden),
        corpus_fingerprint=corpus_fingerprint(chunk_ids, scopes),
        embedder=EmbedderIdentity.model_validate(embedder),
        chain_sha256=chain_sha256(chain_settings(settings)),
        settings_sha256=settings_sha256(settings),
        settings=settings,
        k=k,
        code_version=code_version(),
        evaluated_at=evaluated_at,
        as_of=as_of.isoformat(),
        gain=gain,
    )
