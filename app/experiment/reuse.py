"""Evaluations reused from an earlier run when nothing they depend on changed, so a second run of an
experiment (or one resumed after a kill) evaluates only what is new.

An evaluation's key is the sha256 of: the golden set file's bytes; every setting that can move a result
(`fingerprint.result_settings`) and the evaluation's own (K, cut-offs, gain, seed, alpha, thresholds,
latency sample, sweep, audit; the date the hard filter uses when `as_of` is unset); the collection it ran
on (its name, Chroma id, the embedder its metadata records, and the sha256 of its sorted chunk ids); the
document record's digest; and the sha256 of Sieve's own code (every `app/**/*.py`). Any change runs the
evaluation again; `sieve experiment --rerun` does so regardless (e.g. to measure latency again). A reused
evaluation keeps its figures, latency included, from the run that made it (its report says when). The
embedder enters the key by its settings name and the identity the collection recorded; an embedder folder
whose weights change under the same path is seen only once a model loads (its collection is rebuilt then):
after replacing a model in place, run with `--rerun`.

The entries live in `<rag.experiment.cache_dir>/runs/<key>.json`: the report, the cost and the collection.
"""

from __future__ import annotations

import hashlib
import json
from datetime import date
from pathlib import Path
from typing import Any

from app.evaluation.report.model import Report
from app.evaluation.run.fingerprint import result_settings
from app.files import atomic_write_text
from app.settings import Settings
from app.store import ChromaStore

RUNS_DIR = "runs"
_APP = Path(__file__).resolve().parents[1]
_NOT_KEYED = {
    "output_dir",
    "baseline",
    "keep_reports",
    "write_markdown",
    "write_json",
    "write_html",
    "enabled",
}


def code_digest(root: Path = _APP) -> str:
    """sha256 over every `*.py` under `root` (relative path and bytes, in path order)."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode("utf-8"))
        digest.update(path.read_bytes())
    return digest.hexdigest()


def collection_state(store: ChromaStore) -> dict[str, Any]:
    """What identifies the content of `store`'s collection: name, id, embedder, sha256 of its chunk ids."""
    ids = hashlib.sha256("\n".join(sorted(store.iter_ids())).encode("utf-8")).hexdigest()
    embedder = {k: v for k, v in store.metadata().items() if k.startswith("embedder_")}
    return {"name": store.name, "id": store.collection_id, "embedder": embedder, "chunkIds": ids}


def evaluation_key(
    golden: bytes, settings: Settings, collection: dict[str, Any], record: str, code: str
) -> str:
    """The key of an evaluation (the module docstring), as hex."""
    ev = settings.rag.evaluate.model_dump(mode="json", exclude=_NOT_KEYED)
    ev["as_of"] = ev["as_of"] or date.today().isoformat()
    body = {
        "golden": hashlib.sha256(golden).hexdigest(),
        "settings": result_settings(settings.rag),
        "evaluate": ev,
        "collection": collection,
        "record": record,
        "code": code,
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode("utf-8")).hexdigest()


def load_entry(cache_dir: Path, key: str) -> tuple[Report, dict[str, Any]] | None:
    """(the report, the cost) stored under `key`, or None (missing or unreadable: evaluated again)."""
    path = cache_dir / RUNS_DIR / f"{key}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Report.model_validate(data["report"]), dict(data["cost"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_entry(cache_dir: Path, key: str, report: Report, cost: dict[str, Any]) -> None:
    folder = cache_dir / RUNS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    body = {"report": report.to_json(), "cost": cost}
    atomic_write_text(folder / f"{key}.json", json.dumps(body, ensure_ascii=False))
