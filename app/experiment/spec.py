"""The experiment file: variants as overlays of dotted settings keys, and axes expanded into variants.

```yaml
name: chunking              # optional: the report folder's name (default: a timestamp)
variants:                   # NAME: {dotted.settings.key: value, ...}; the base is the current configuration
  bm25-off: {rag.chain.bm25.enabled: false}
axes:                       # optional: each key's values, expanded by `design`
  rag.ingest.chunk_size: [300, 900]
design: grid                # grid (every combination) | one-at-a-time (one axis moved at a time)
```

Everything is checked before anything runs: a key that is not a settings key is an error with "did you mean"
(difflib over every key), a key an experiment cannot vary (the store's place, the golden set, the server)
says why, and every variant's overlay is validated by the Settings model over the current configuration, the
error naming the variant and the key.
"""

from __future__ import annotations

import difflib
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from app.settings import RagSettings, Settings, SettingsError, load_settings, merge, nested

# the keys a variant may set: what changes the index (chunking, embedder, HNSW) or the run (retrieval, chain)
VARIABLE_PREFIXES = (
    "rag.ingest.chunk_size",
    "rag.ingest.chunk_overlap",
    "rag.ingest.min_chunk_chars",
    "rag.models.",
    "rag.store.hnsw_",
    "rag.retrieval.",
    "rag.chain.",
)
DESIGNS = ("grid", "one-at-a-time")
ONE_AT_A_TIME_CAVEAT = (
    "one factor at a time: each axis is moved alone with the others at the base, so interactions between "
    "axes are not measured (a grid measures them, at the cost of every combination)"
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=,+-]{0,79}$")
_TOP_KEYS = {"name", "variants", "axes", "design"}
_WHOLE_SECTION = re.compile(r" \(got \{.*\}\)$")  # a section-wide rule's input: the whole section


class ExperimentFileError(ValueError):
    """The experiment file cannot be used; the message names the file, the variant and the key."""


@dataclass(frozen=True)
class Variant:
    """One variant: its name, its overlay ({dotted key: value}) and the settings it runs with."""

    name: str
    overlay: dict[str, Any]
    settings: Settings


@dataclass
class ExperimentSpec:
    name: str | None
    path: Path
    variants: list[Variant]
    design: str
    notes: list[str] = field(default_factory=list)


def settings_keys(model: type[BaseModel] = RagSettings, prefix: str = "rag") -> list[str]:
    """Every dotted leaf key of the settings (a nested section is walked; a dict-valued key is a leaf)."""
    keys = []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys.extend(settings_keys(annotation, f"{prefix}.{name}"))
        else:
            keys.append(f"{prefix}.{name}")
    return keys


def check_key(key: str, where: str, known: list[str]) -> str:
    """`key` with its `rag.` prefix (optional in the file), or an `ExperimentFileError` naming `where`: an
    unknown key with the closest known ones (difflib), a key no experiment may vary with why."""
    full = key if key.startswith("rag.") else f"rag.{key}"
    if full not in known:
        close = difflib.get_close_matches(full, known, n=3, cutoff=0.85)
        hint = f"; did you mean {' or '.join(close)}?" if close else " (see config/application.yml)"
        raise ExperimentFileError(f"{where}: unknown settings key '{key}'{hint}")
    if not full.startswith(VARIABLE_PREFIXES):
        raise ExperimentFileError(
            f"{where}: '{full}' cannot vary in an experiment: variants share the store, the golden set, K, "
            "the server, and the store's search mode and caches; a variant may set rag.ingest chunking, "
            "rag.models, rag.store hnsw_*, rag.retrieval and rag.chain keys"
        )
    return full


def load_spec(path: str | Path, base: Settings, config_path: str | Path | None = None) -> ExperimentSpec:
    """Read and check the experiment file at `path` against `base` (the current configuration): every
    variant's key checked and its settings validated (`ExperimentFileError`), before anything runs."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ExperimentFileError(f"{p}: experiment file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ExperimentFileError(f"{p}: cannot read the experiment file: {exc}") from None
    return parse_spec(text, p, base, config_path)


def parse_spec(text: str, p: Path, base: Settings, config_path: str | Path | None = None) -> ExperimentSpec:
    """`load_spec` of an experiment file's text (`p` names it in messages: a path, or the API request)."""
    data = _parsed(text, p)
    known = settings_keys()
    design = str(data.get("design", "grid"))
    if design not in DESIGNS:
        raise ExperimentFileError(f"{p}: design must be one of {', '.join(DESIGNS)}, got {design!r}")
    overlays = _explicit(p, data.get("variants"), known)
    axes = _axes(p, data.get("axes"), known)
    notes = [ONE_AT_A_TIME_CAVEAT] if axes and design == "one-at-a-time" else []
    for name, overlay in expand_axes(axes, design, base).items():
        if name in overlays:
            raise ExperimentFileError(f"{p}: variant '{name}' is named twice (variants and axes)")
        overlays[name] = overlay
    if not overlays:
        raise ExperimentFileError(f"{p}: no variant: give `variants: {{NAME: {{key: value}}}}` or `axes`")
    variants = [validated(p, name, overlay, config_path) for name, overlay in overlays.items()]
    return ExperimentSpec(_name(p, data.get("name")), p, variants, design, notes)


def _parsed(text: str, p: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ExperimentFileError(f"{p}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ExperimentFileError(f"{p}: expected a mapping with `variants:` and/or `axes:`")
    unknown = sorted(set(map(str, data)) - _TOP_KEYS)
    if unknown:
        raise ExperimentFileError(f"{p}: unknown top-level key(s) {unknown}; expected {sorted(_TOP_KEYS)}")
    return data


def _name(p: Path, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _NAME.match(value):
        raise ExperimentFileError(f"{p}: name {value!r} must be letters, digits and _.=,+- (a folder name)")
    return value


def _explicit(p: Path, variants: Any, known: list[str]) -> dict[str, dict[str, Any]]:
    """The `variants:` section as {name: {full dotted key: value}}."""
    if variants is None:
        return {}
    if not isinstance(variants, dict):
        raise ExperimentFileError(f"{p}: `variants` must map a variant name to its settings")
    out: dict[str, dict[str, Any]] = {}
    for name, overlay in variants.items():
        name = str(name)
        if not _NAME.match(name) or name == "base":
            raise ExperimentFileError(
                f"{p}: variant name {name!r} must be letters, digits and _.=,+- and not 'base'"
            )
        if not isinstance(overlay, dict) or not overlay:
            raise ExperimentFileError(f"{p}: variant '{name}' must map dotted settings keys to values")
        out[name] = {check_key(str(k), f"{p}: variant '{name}'", known): v for k, v in overlay.items()}
    return out


def _axes(p: Path, axes: Any, known: list[str]) -> dict[str, list[Any]]:
    if axes is None:
        return {}
    if not isinstance(axes, dict):
        raise ExperimentFileError(f"{p}: `axes` must map a settings key to a list of values")
    out = {}
    for key, values in axes.items():
        full = check_key(str(key), f"{p}: axis", known)
        if not isinstance(values, list) or not values:
            raise ExperimentFileError(f"{p}: axis '{key}' must list at least one value")
        out[full] = values
    return out


def current_value(settings: Settings, key: str) -> Any:
    """The value of dotted `key` (`rag.ingest.chunk_size`) in `settings`."""
    node: Any = settings
    for part in key.split("."):
        node = getattr(node, part)
    return node.model_dump() if isinstance(node, BaseModel) else node


def expand_axes(axes: dict[str, list[Any]], design: str, base: Settings) -> dict[str, dict[str, Any]]:
    """The variants `axes` make, each named `key=value,...` by the last part of the keys that differ from
    the base. `grid`: every combination; `one-at-a-time`: each value of each axis alone. A combination
    equal to the base is left out."""
    if not axes:
        return {}
    if design == "grid":
        points = [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())]
    else:
        points = [{key: value} for key, values in axes.items() for value in values]
    out = {}
    for point in points:
        moved = {k: v for k, v in point.items() if v != current_value(base, k)}
        if moved:
            out[_point_name(moved)] = moved
    return out


def _point_name(point: dict[str, Any]) -> str:
    return ",".join(f"{key.rsplit('.', 1)[-1]}={value}" for key, value in point.items())[:80]


def validated(p: Path, name: str, overlay: dict[str, Any], config_path: str | Path | None = None) -> Variant:
    """The variant with its settings: the current configuration (file, environment) under `overlay`,
    through the Settings model; an invalid value is an `ExperimentFileError` naming the variant and key."""
    try:
        settings = load_settings(merge(*(nested(k, v) for k, v in overlay.items())), config_path)
    except SettingsError as exc:
        raise ExperimentFileError(f"{p}: variant '{name}': {_problems(exc)}") from None
    return Variant(name, overlay, settings)


def _problems(exc: SettingsError) -> str:
    """The settings error's lines without their source (an overlay is neither the file nor a flag)."""
    lines = str(exc).splitlines()[1:] or [str(exc)]
    kept = [line.strip()[line.strip().find("'rag.") :] for line in lines]
    return "; ".join(_WHOLE_SECTION.sub("", line) for line in kept)
