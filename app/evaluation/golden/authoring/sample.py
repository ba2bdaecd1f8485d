"""`sieve golden sample --from-log N`: draft golden cases from the query log (docs/query-log.md).

The steps, each dropping queries with a reason that is counted and printed:

1. **Read** (`read_log`): every line of each log file that is a JSON object with a string `query` (and a
   string or null `knowledgeTag`) is an entry; any other non-blank line is an "unreadable line".
2. **Validity** (`invalid_reason`): "blank"; "punctuation or digits only" (no character is a letter:
   Unicode category L*); "too short": `query_length` < `min_length` (3 by default), where `query_length`
   counts letters and digits, a CJK character (Han, kana, Hangul) as 2: a Chinese word is one or two
   characters where an English one is about five letters, so 工资 (4) passes and a lone 发 (2) or "hi" (2)
   does not.
3. **Exact duplicates** (`group_entries`): entries whose `normalise_query` texts (the audit's: NFKC,
   casefold, whitespace squeezed, trailing punctuation dropped) are equal are one query;
   `seen` = their number, the text kept is the most frequent spelling and the knowledge tag the most
   frequent tag (the first seen among equals, for both).
4. **Already there**: a query whose normalised text is that of a golden-set query, or of a case the out file
   holds, is dropped; so is one whose case id is taken.
5. **Near an existing query** (`select_drafts`): novelty = 1 - max_j cos(q, r_j) over the reference
   queries r (the golden set's and the out file's; 1 when there are none). A query whose cosine to one
   of them is >= `threshold` (0.95, the audit's near-duplicate cosine) is dropped.
6. **Near duplicates**: in order of `seen` (most first; first seen first among equals), a query whose
   cosine to a query kept before it is >= `threshold` is dropped, and its entries count to that kept
   query's `seen` (the most frequent phrasing of a need stands for it).
7. **Selection**: strata by knowledge tag (untagged queries are a stratum of their own); the N drafts are
   split over the strata in proportion to how many queries each holds, by largest remainders (`allocate`);
   a stratum takes its queries by novelty (highest first), then `seen` (most first), then an order drawn
   from `seed`.

Counting: every log entry is counted once, an invalid one under its reason, a repeat of an earlier entry
as an exact duplicate, and each distinct query under the reason it was dropped for (or picked).

Each pick is appended to the out file (JSONL, never rewritten) as a draft case: {id: "log-" + the first 8
hex digits of sha256(normalised query), query, knowledgeTag, origin: "log", draft: true, note: "sampled from
the query log: seen n times; novelty 0.xx"}.

Cosines are between the configured embedder's query vectors (`Embedder.embed_queries`, unit length), each
row scaled to length 1 again here so that any vectors work.
"""

from __future__ import annotations

import hashlib
import json
import random
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from app.evaluation.golden.audit.checks import normalise_query
from app.evaluation.golden.authoring.generate import CaseJson, append_cases
from app.evaluation.golden.cases import GoldenCase, load_golden_set
from app.evaluation.report.model import NEAR_DUPLICATE_COSINE
from app.files import change_line
from app.jsonl import read_text, split_lines

MIN_LENGTH = 3
DEFAULT_SEED = 42
ID_PREFIX = "log-"
EMBED_BATCH = 256
NEAR_DUPLICATE_BLOCK = 256
EXAMPLES_SHOWN = 3

BLANK = "blank"
NO_LETTERS = "punctuation or digits only"
UNREADABLE = "unreadable line"
EXACT_DUPLICATE = "exact duplicate"
IN_GOLDEN_SET = "already in the golden set"
IN_OUT_FILE = "already in the out file"
ID_TAKEN = "case id already taken"
NEAR_EXISTING = "near an existing golden or draft query"
NEAR_DUPLICATE = "near duplicate of a more frequent query"
NOT_SELECTED = "not selected (beyond N in its stratum)"

# Han (unified, extension A, compatibility), kana, Hangul syllables and jamo; Han extensions B and beyond
CJK_RANGES = (
    (0x1100, 0x11FF),
    (0x3040, 0x30FF),
    (0x3130, 0x318F),
    (0x3400, 0x4DBF),
    (0x4E00, 0x9FFF),
    (0xAC00, 0xD7AF),
    (0xF900, 0xFAFF),
    (0x20000, 0x3FFFF),
)


class SampleError(ValueError):
    """Bad input to `sieve golden sample` (a missing log, an out file that is not JSONL); exit 2."""


# -- text ----------------------------------------------------------------------------------------------------


def is_cjk(char: str) -> bool:
    code = ord(char)
    return any(low <= code <= high for low, high in CJK_RANGES)


def query_length(text: str) -> int:
    """Σ over the characters of NFKC(text): 2 for a CJK character, 1 for any other letter or digit
    (`str.isalnum`), 0 for the rest (spaces, punctuation, symbols)."""
    return sum(2 if is_cjk(ch) else 1 if ch.isalnum() else 0 for ch in unicodedata.normalize("NFKC", text))


def invalid_reason(text: str, min_length: int = MIN_LENGTH) -> str | None:
    """Why `text` is no query to draft a case from, or None: blank; no letter at all (punctuation, digits,
    symbols only); `query_length` below `min_length`."""
    if not text.strip():
        return BLANK
    if not any(unicodedata.category(ch).startswith("L") for ch in unicodedata.normalize("NFKC", text)):
        return NO_LETTERS
    if query_length(text) < min_length:
        return too_short(min_length)
    return None


def too_short(min_length: int) -> str:
    return f"too short (length < {min_length}, a CJK character counting 2)"


def case_id(normalised: str) -> str:
    return ID_PREFIX + hashlib.sha256(normalised.encode("utf-8")).hexdigest()[:8]


# -- reading and grouping ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogEntry:
    query: str
    knowledge_tag: str | None
    where: str  # file:line


@dataclass
class Drops:
    """Dropped queries by reason: how many, and the first few (text, where) as examples."""

    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, reason: str, example: str, count: int = 1) -> None:
        self.counts[reason] += count
        shown = self.examples.setdefault(reason, [])
        if len(shown) < EXAMPLES_SHOWN:
            shown.append(example)

    def merge(self, other: Drops) -> None:
        for reason, count in other.counts.items():
            self.counts[reason] += count
            for example in other.examples.get(reason, []):
                shown = self.examples.setdefault(reason, [])
                if len(shown) < EXAMPLES_SHOWN:
                    shown.append(example)


def read_log(paths: Sequence[Path]) -> tuple[list[LogEntry], Drops]:
    """The entries of the log files `paths`, in file then line order, and the unreadable lines."""
    entries: list[LogEntry] = []
    drops = Drops()
    for path in paths:
        try:
            text = read_text(path)
        except OSError as exc:
            raise SampleError(f"--log {path}: cannot read it: {exc}") from None
        if text is None:
            raise SampleError(f"--log {path}: no such file")
        for number, line in split_lines(text):
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except ValueError:
                drops.add(UNREADABLE, f"{where}: not JSON")
                continue
            query = record.get("query") if isinstance(record, dict) else None
            tag = record.get("knowledgeTag") if isinstance(record, dict) else None
            if not isinstance(query, str) or not (tag is None or isinstance(tag, str)):
                drops.add(UNREADABLE, f"{where}: no string query (or a knowledgeTag that is not a string)")
                continue
            entries.append(LogEntry(query, tag or None, where))
    return entries, drops


@dataclass
class LogQuery:
    """One distinct query of the log (its exact duplicates folded in)."""

    normalised: str
    text: str  # the most frequent spelling
    knowledge_tag: str | None  # the most frequent tag
    seen: int  # log entries it stands for
    first: int  # position of its first entry in the log (tie-breaks)

    @property
    def id(self) -> str:
        return case_id(self.normalised)


def group_entries(entries: Sequence[LogEntry], min_length: int = MIN_LENGTH) -> tuple[list[LogQuery], Drops]:
    """Steps 2 and 3: the valid entries grouped by normalised text, in order of first appearance."""
    drops = Drops()
    groups: dict[str, list[tuple[int, LogEntry]]] = {}
    for position, entry in enumerate(entries):
        reason = invalid_reason(entry.query, min_length)
        if reason is not None:
            drops.add(reason, f"{entry.where}: {entry.query!r}")
            continue
        groups.setdefault(normalise_query(entry.query), []).append((position, entry))
    queries = []
    for normalised, members in groups.items():
        texts = Counter(e.query for _, e in members)
        tags = Counter(e.knowledge_tag for _, e in members)
        queries.append(
            LogQuery(
                normalised=normalised,
                text=_most_common(texts, [e.query for _, e in members]),
                knowledge_tag=_most_common(tags, [e.knowledge_tag for _, e in members]),
                seen=len(members),
                first=members[0][0],
            )
        )
        if len(members) > 1:
            drops.add(EXACT_DUPLICATE, f"{members[0][1].query!r} x{len(members)}", count=len(members) - 1)
    return queries, drops


def _most_common(counts: Counter[Any], in_order: list[Any]) -> Any:
    """The most frequent value; among equally frequent ones, the first in `in_order`."""
    top = max(counts.values())
    return next(v for v in in_order if counts[v] == top)


def drop_existing(
    queries: Sequence[LogQuery], golden: Iterable[GoldenCase], drafts: Iterable[GoldenCase]
) -> tuple[list[LogQuery], Drops]:
    """Step 4: the queries whose text (normalised) or case id the golden set or the out file holds."""
    golden_texts = {normalise_query(c.query) for c in golden}
    golden_ids = {c.id for c in golden}
    draft_list = list(drafts)
    draft_texts = {normalise_query(c.query) for c in draft_list}
    taken = golden_ids | {c.id for c in draft_list}
    kept, drops = [], Drops()
    for q in queries:
        if q.normalised in golden_texts:
            drops.add(IN_GOLDEN_SET, repr(q.text))
        elif q.normalised in draft_texts:
            drops.add(IN_OUT_FILE, repr(q.text))
        elif q.id in taken:
            drops.add(ID_TAKEN, f"{q.text!r} ({q.id})")
        else:
            kept.append(q)
    return kept, drops


# -- the selection (pure: vectors in, picks out) -------------------------------------------------------------


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """Each row scaled to length 1 (a row of no length stays 0, so its cosines are 0)."""
    rows = np.asarray(vectors, dtype=float)
    if rows.ndim != 2:
        rows = rows.reshape(len(rows), -1)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return np.divide(rows, norms, out=np.zeros_like(rows), where=norms > 0)


def max_cosines(vectors: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """max_j cos(v_i, r_j) for every row v_i over the reference rows r_j; -inf when there are none."""
    units = unit_rows(vectors)
    if len(reference) == 0 or len(units) == 0:
        return np.full(len(units), -np.inf)
    return (units @ unit_rows(reference).T).max(axis=1)


def novelty(vectors: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """novelty_i = 1 - max_j cos(v_i, r_j) over the reference rows; 1 for every row when there are none."""
    nearest = max_cosines(vectors, reference)
    return np.where(np.isfinite(nearest), 1.0 - nearest, 1.0)


def greedy_near_duplicates(units: np.ndarray, order: Sequence[int], threshold: float) -> dict[int, int]:
    """Walk the rows of `units` (unit length) in `order`: a row whose cosine to a row kept before it is >=
    `threshold` maps to the kept row it is closest to; any other row is kept. Returns {dropped: kept}.
    Compared a block of rows at a time against the rows kept so far (one matrix product per block), then
    within the block in order."""
    dimension = units.shape[1] if units.ndim == 2 else 1
    kept_rows = np.zeros((len(order), dimension))
    kept_ids: list[int] = []
    folded: dict[int, int] = {}
    for start in range(0, len(order), NEAR_DUPLICATE_BLOCK):
        block = list(order[start : start + NEAR_DUPLICATE_BLOCK])
        before = len(kept_ids)
        against_kept = units[block] @ kept_rows[:before].T if before else np.zeros((len(block), 0))
        for row, i in enumerate(block):
            cosines = np.concatenate([against_kept[row], kept_rows[before : len(kept_ids)] @ units[i]])
            if len(cosines) and cosines.max() >= threshold:
                folded[i] = kept_ids[int(cosines.argmax())]
            else:
                kept_rows[len(kept_ids)] = units[i]
                kept_ids.append(i)
    return folded


def allocate(populations: Mapping[str | None, int], n: int) -> dict[str | None, int]:
    """Proportional allocation by largest remainders (Hamilton): with P = Σ p_s, stratum s first gets
    floor(n · p_s / P), then the n - Σ floor(...) seats left go one each to the strata with the largest
    remainders n · p_s mod P (ties: the larger population, then tag order, untagged last). Exact integer
    arithmetic. When n >= P every stratum gets its whole population."""
    total = sum(populations.values())
    if n >= total:
        return dict(populations)
    floors = {s: n * p // total for s, p in populations.items()}
    left = n - sum(floors.values())
    order = sorted(populations, key=lambda s: (-(n * populations[s] % total), -populations[s], *_tag_key(s)))
    for s in order[:left]:
        floors[s] += 1
    return floors


def _tag_key(tag: str | None) -> tuple[int, str]:
    return (1, "") if tag is None else (0, tag)


@dataclass
class Pick:
    query: LogQuery
    novelty: float
    seen: int  # its own entries and those of the near duplicates folded into it

    def case(self) -> CaseJson:
        times = "time" if self.seen == 1 else "times"
        return {
            "id": self.query.id,
            "query": self.query.text,
            "knowledgeTag": self.query.knowledge_tag,
            "origin": "log",
            "draft": True,
            "note": f"sampled from the query log: seen {self.seen} {times}; novelty {self.novelty:.2f}",
        }


@dataclass
class Selection:
    picks: list[Pick]
    drops: Drops
    # stratum -> (drafts allocated, queries it held after every drop)
    allocation: dict[str | None, tuple[int, int]]


def select_drafts(
    queries: Sequence[LogQuery],
    vectors: np.ndarray,
    reference: np.ndarray,
    n: int,
    threshold: float = NEAR_DUPLICATE_COSINE,
    seed: int = DEFAULT_SEED,
) -> Selection:
    """Steps 5 to 7 of the module docstring over `queries` (rows of `vectors` in the same order) and the
    reference queries' vectors (the golden set's and the out file's)."""
    if n < 0:
        raise SampleError(f"--from-log {n}: must be at least 0")
    drops = Drops()
    units = unit_rows(vectors) if len(queries) else np.zeros((0, 1))
    nearest = max_cosines(units, reference)
    novel = novelty(units, reference)
    candidates = []
    for i, q in enumerate(queries):
        if nearest[i] >= threshold:
            drops.add(NEAR_EXISTING, f"{q.text!r} (cosine {nearest[i]:.3f})")
        else:
            candidates.append(i)
    candidates.sort(key=lambda i: (-queries[i].seen, queries[i].first))
    folded = greedy_near_duplicates(units, candidates, threshold)
    kept = [i for i in candidates if i not in folded]
    seen = {i: queries[i].seen for i in kept}
    for i, into in folded.items():
        seen[into] += queries[i].seen
        drops.add(
            NEAR_DUPLICATE,
            f"{queries[i].text!r} ~ {queries[into].text!r} (cosine {float(units[i] @ units[into]):.3f})",
        )
    draw = random.Random(seed)
    tiebreak = {i: draw.random() for i in sorted(kept, key=lambda i: queries[i].first)}
    strata: dict[str | None, list[int]] = {}
    for i in sorted(kept, key=lambda i: (-novel[i], -seen[i], tiebreak[i])):
        strata.setdefault(queries[i].knowledge_tag, []).append(i)
    shares = allocate({s: len(members) for s, members in strata.items()}, n)
    picks = []
    for stratum in sorted(strata, key=_tag_key):
        members = strata[stratum]
        for i in members[: shares[stratum]]:
            picks.append(Pick(queries[i], float(novel[i]), seen[i]))
        for i in members[shares[stratum] :]:
            drops.add(NOT_SELECTED, repr(queries[i].text))
    allocation = {s: (shares[s], len(strata[s])) for s in sorted(strata, key=_tag_key)}
    return Selection(picks, drops, allocation)


# -- the command ---------------------------------------------------------------------------------------------


@dataclass
class SampleResult:
    files: int
    entries: int
    picks: list[Pick]
    drops: Drops
    allocation: dict[str | None, tuple[int, int]]
    out: Path
    drafts_before: int = 0  # the cases `out` held before the picks were appended

    def lines(self) -> list[str]:
        """What the command prints: the log read, every drop reason with its count and examples, the
        allocation per stratum, and what was written."""
        out = [f"read {self.entries} log entries from {self.files} file(s)"]
        if self.drops.counts:
            out.append("dropped, by reason (every log entry counted once: a repeat as an exact duplicate, a")
            out.append("distinct query under the reason it was dropped for):")
            for reason, count in self.drops.counts.most_common():
                examples = "; ".join(self.drops.examples.get(reason, []))
                out.append(f"  {reason}: {count}" + (f"  e.g. {examples}" if examples else ""))
        if self.allocation:
            out.append(
                "drafts per knowledge tag (of the queries left): "
                + ", ".join(f"{s or '(untagged)'} {a} of {h}" for s, (a, h) in self.allocation.items())
            )
        after = self.drafts_before + len(self.picks)
        out.append(change_line(self.out, bool(self.picks), self.drafts_before, after, "draft case"))
        return out


def check_out_path(path: Path) -> None:
    if path.suffix.lower() != ".jsonl":
        raise SampleError(
            f"--out {path}: must be a .jsonl file (draft cases are appended one JSON line each)"
        )
    if path.is_dir():
        raise SampleError(f"--out {path}: is a directory")


def existing_cases(path: Path) -> list[GoldenCase]:
    """The cases of `path`; none when it does not exist or is blank. An invalid file raises `GoldenSetError`
    naming its problems (nothing is appended to a broken file)."""
    if not path.exists():
        return []
    try:
        if not path.read_text(encoding="utf-8").strip():
            return []
    except (OSError, UnicodeDecodeError):
        pass  # load_golden_set names the file and the problem
    return list(load_golden_set(path).cases)


def embed_all(embed: Callable[[list[str]], np.ndarray], texts: Sequence[str]) -> np.ndarray:
    parts = [np.asarray(embed(list(texts[i : i + EMBED_BATCH]))) for i in range(0, len(texts), EMBED_BATCH)]
    return np.vstack(parts) if parts else np.zeros((0, 1))


def sample_from_log(
    log_paths: Sequence[Path],
    golden_path: Path | None,
    out: Path,
    n: int,
    embed: Callable[[list[str]], np.ndarray],
    min_length: int = MIN_LENGTH,
    threshold: float = NEAR_DUPLICATE_COSINE,
    seed: int = DEFAULT_SEED,
) -> SampleResult:
    """Read the logs, drop, select and append N draft cases to `out` (see the module docstring). `embed`
    maps texts to query vectors (called only when some query is left to compare)."""
    if n < 1:
        raise SampleError(f"--from-log {n}: the number of drafts must be at least 1")
    if min_length < 1:
        raise SampleError(f"--min-length {min_length}: must be at least 1")
    if not 0.0 < threshold <= 1.0:
        raise SampleError(f"--near-duplicate-cosine {threshold}: must be in (0, 1]")
    check_out_path(out)
    if not log_paths:
        raise SampleError("no query log to read: pass --log PATH (or enable rag.querylog and let it record)")
    drafts = existing_cases(out)
    golden = list(load_golden_set(golden_path).cases) if golden_path is not None else []
    entries, drops = read_log(log_paths)
    queries, grouped = group_entries(entries, min_length)
    drops.merge(grouped)
    queries, existing = drop_existing(queries, golden, drafts)
    drops.merge(existing)
    if queries:
        reference_texts = [c.query for c in golden] + [c.query for c in drafts]
        vectors = embed_all(embed, [q.text for q in queries] + reference_texts)
        query_vectors, reference = vectors[: len(queries)], vectors[len(queries) :]
    else:
        query_vectors, reference = np.zeros((0, 1)), np.zeros((0, 1))
    selection = select_drafts(queries, query_vectors, reference, n, threshold, seed)
    drops.merge(selection.drops)
    append_cases(out, [p.case() for p in selection.picks])
    return SampleResult(
        len(log_paths), len(entries), selection.picks, drops, selection.allocation, out, len(drafts)
    )
