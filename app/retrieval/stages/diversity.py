"""diversity: drop repeats (same text, copied document, near-same embedding, too many per source or document);
optionally MMR-order."""

from __future__ import annotations

import functools
import re
import unicodedata

import numpy as np

from app.retrieval.stages._common import ReplayFacts, format_pair
from app.retrieval.types import (
    SCORE_DENSE,
    SCORE_FUSED,
    SCORE_RERANK,
    Candidate,
    QueryContext,
    Removal,
    StageOutcome,
    nearest_slack,
)
from app.settings import DiversitySettings

# The latest score wins: a later stage's order is the one the chain stands behind.
RELEVANCE_KEYS = (SCORE_RERANK, SCORE_FUSED, SCORE_DENSE)
_SPACE = re.compile(r"\s+")


@functools.lru_cache(maxsize=65536)  # pure; the replay of `sieve tune` sees the same texts for every point
def normalise_text(text: str) -> str:
    """NFKC, whitespace runs collapsed to one space, stripped, casefolded: what "the same text" means here."""
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", text)).strip().casefold()


class DiversityStage:
    """Walks the candidates in order and keeps one that is not a repeat of an already kept one.

    Rules per candidate, first failing one is the reason:
    1. `drop_exact_duplicates`: same `normalise_text` as a kept one (`duplicate of c1 (same text)`);
    2. `drop_document_copies`: its document's whole text (the `doc_sha256` written at ingest) is that of a
       document a kept chunk belongs to, under another doc id (`copy of doc it-vpn-setup`): the same page
       published under two ids counts once, whichever of its sections the chunks are; candidates without
       `doc_sha256` skip this rule;
    3. `max_cosine`: cosine with a kept one's embedding > max_cosine (`cosine=0.99 > 0.97 with c1`, the
       most similar kept one); candidates without an embedding skip this rule;
    4. `max_per_source`: its source already has that many kept (`source=a.md already has 2`); candidates with
       no source are not capped;
    5. `max_per_document`: its document already has that many chunks kept (`doc=d1 already has 1`), so a
       long document cannot fill the whole top K with its own chunks. Such a chunk is still removed from the
       ranking, but up to `attach_per_document` of them (best first) are attached to the document's first
       kept chunk (`doc=d1 already has 1; attached to c1`): the document keeps one rank, and the passage that
       answers, when it is not the document's best-ranked chunk, still reaches the reader.
    Then, if `mmr`, the survivors are reordered (never removed) by maximal marginal relevance:
    pick next argmax  lambda * rel(c) - (1 - lambda) * max cosine(c, picked)  (0 when nothing is picked yet),
    rel = the latest score (rerank > fused > dense, the first any survivor has) min-max scaled to [0, 1]
    over the survivors that have it; survivors without that score (past rerank's top_n) keep their order after
    the reordered ones, so scores from different models are never compared. Ties keep the earlier candidate.
    """

    name = "diversity"

    def __init__(self, settings: DiversitySettings):
        self.settings = settings

    def replay_facts(self) -> ReplayFacts:
        """Without MMR it decides each candidate from the ones kept before it, so a prefix of its input keeps
        a prefix of what the whole input keeps; MMR reorders every survivor."""
        return ReplayFacts(prefix_stable=not self.settings.mmr)

    def run(self, query: QueryContext, candidates: list[Candidate]) -> StageOutcome:
        kept = _Kept(self.settings, len(candidates))
        removed: list[Removal] = []
        for candidate in candidates:
            text_key = normalise_text(candidate.text)
            doc_hash = candidate.doc_sha256
            why = kept.first_broken(candidate, text_key, doc_hash)
            if why is not None:
                removed.append(Removal(candidate.chunk_id, candidate.doc_id, why))
            else:
                kept.keep(candidate, text_key, doc_hash)
        survivors = kept.with_attachments()
        if self.settings.mmr and len(survivors) > 1:
            survivors = mmr_order(survivors, self.settings.mmr_lambda)
        return StageOutcome(kept=survivors, removed=removed)


class _Kept:
    """The candidates kept so far, and what each rule of `DiversityStage` compares a new candidate with.

    `first_broken` asks the rules in order and returns the reason of the first one a candidate fails, or
    None when it passes them all (a rule that is off passes everything); `keep` records a candidate that
    passed them all."""

    def __init__(self, settings: DiversitySettings, size: int):
        self.drop_exact_duplicates = settings.drop_exact_duplicates
        self.drop_document_copies = settings.drop_document_copies
        self.max_per_source = settings.max_per_source
        self.max_per_document = settings.max_per_document
        self.attach_per_document = settings.attach_per_document
        self.candidates: list[Candidate] = []
        self.seen_text: dict[str, str] = {}  # normalised text -> chunk id of the first kept chunk with it
        self.documents: dict[str, str] = {}  # doc_sha256 -> doc id of the first kept chunk with it
        self.vectors = _KeptVectors(settings.max_cosine, size)
        self.per_source: dict[str, int] = {}
        self.per_doc: dict[str, int] = {}
        self.first_kept: dict[str, str] = {}  # doc id -> chunk id of its first kept chunk
        self.attachments: dict[str, list[Candidate]] = {}

    def first_broken(self, candidate: Candidate, text_key: str, doc_hash: str | None) -> str | None:
        """The reason of the first rule `candidate` fails, in the stage's order, or None (`text_key`: its
        `normalise_text`; `doc_hash`: its `doc_sha256`).

        A hot path (every candidate of every query), so the rules are written out here, a rule that is off
        is not asked at all, and the cosine rule only when some candidate was kept: either way the rule
        would say None."""
        # 1. drop_exact_duplicates
        if self.drop_exact_duplicates:
            first = self.seen_text.get(text_key)
            if first is not None:
                return f"duplicate of {first} (same text)"
        # 2. drop_document_copies: a kept chunk's document has this one's whole text under another id
        if self.drop_document_copies and doc_hash is not None:
            original = self.documents.get(doc_hash)
            if original is not None and original != candidate.doc_id:
                return f"copy of doc {original}"
        # 3. max_cosine
        if self.vectors.ids:
            why = self.vectors.too_similar(candidate)
            if why is not None:
                return why
        # 4. max_per_source
        if self.max_per_source is not None:
            source = candidate.source
            if source and self.per_source.get(source, 0) >= self.max_per_source:
                return f"source={source} already has {self.per_source[source]}"
        # 5. max_per_document
        if self.max_per_document is not None:
            return self.document_full(candidate)
        return None

    def document_full(self, candidate: Candidate) -> str | None:
        """Rule 5, `max_per_document`, attaching the chunk to its document's first kept chunk while that one
        has room (`attach_per_document`)."""
        doc_id = candidate.doc_id
        count = self.per_doc.get(doc_id, 0)
        if self.max_per_document is None or count < self.max_per_document:
            return None
        why = f"doc={doc_id} already has {count}"
        host = self.first_kept[doc_id]
        if len(self.attachments.get(host, ())) < self.attach_per_document:
            self.attachments.setdefault(host, []).append(candidate)
            why += f"; attached to {host}"
        return why

    def keep(self, candidate: Candidate, text_key: str, doc_hash: str | None) -> None:
        chunk_id, doc_id = candidate.chunk_id, candidate.doc_id
        self.candidates.append(candidate)
        self.seen_text.setdefault(text_key, chunk_id)
        if doc_hash is not None:
            self.documents.setdefault(doc_hash, doc_id)
        self.vectors.add(candidate)
        if self.max_per_source is not None:  # sources are counted only for a cap
            source = candidate.source
            if source:
                self.per_source[source] = self.per_source.get(source, 0) + 1
        self.per_doc[doc_id] = self.per_doc.get(doc_id, 0) + 1
        self.first_kept.setdefault(doc_id, chunk_id)

    def with_attachments(self) -> list[Candidate]:
        """The kept candidates in order, each document's first kept chunk carrying its attached ones."""
        if not self.attachments:
            return self.candidates
        return [
            c.with_attached(tuple(self.attachments[c.chunk_id])) if c.chunk_id in self.attachments else c
            for c in self.candidates
        ]


class _KeptVectors:
    """The unit vectors of the kept candidates, for rule 3 (`max_cosine`).

    Row after row in a buffer allocated once: `matrix[:m] @ vector` is the very product (same values, same C
    layout, same m x d shape) an np.stack of the m kept vectors gave, without re-stacking them after every
    keep. Rows are copied in only when a cosine check needs them (`filled` so far): most candidates never
    get one."""

    def __init__(self, max_cosine: float | None, size: int):
        self.max_cosine = max_cosine
        self.size = size
        self.matrix: np.ndarray | None = None
        self.vectors: list[np.ndarray] = []
        self.ids: list[str] = []
        self.filled = 0
        self.slack_width, self.near_bound = -1, 0.0  # the vector length `near_bound` was computed for

    def too_similar(self, candidate: Candidate) -> str | None:
        """`cosine=0.99 > 0.97 with c1` for the most similar kept one, when over `max_cosine`. A candidate
        without an embedding, or with none kept yet, passes."""
        max_cosine, vector = self.max_cosine, candidate.unit
        if max_cosine is None or vector is None or not self.ids:
            return None
        if len(vector) != self.slack_width:
            self.slack_width = len(vector)
            self.near_bound = max_cosine - nearest_slack(self.slack_width)
        # Skipped when no candidate of its set comes near max_cosine: its exact cosines below could then
        # not exceed it either (`nearest_slack`), and nothing else reads them.
        if candidate.nearest is not None and candidate.nearest <= self.near_bound:
            return None
        for row in range(self.filled, len(self.ids)):
            self.matrix[row] = self.vectors[row]  # type: ignore[index]
        self.filled = len(self.ids)
        sims = self.matrix[: len(self.ids)] @ vector  # type: ignore[index]
        best = int(sims.argmax())
        if sims[best] > max_cosine:
            shown, bound = format_pair(float(sims[best]), max_cosine)
            return f"cosine={shown} > {bound} with {self.ids[best]}"
        return None

    def add(self, candidate: Candidate) -> None:
        vector = candidate.unit
        if vector is None:
            return
        if self.matrix is None:
            self.matrix = np.empty((self.size, len(vector)))
        elif len(vector) != self.matrix.shape[1]:
            self.matrix[len(self.ids)] = vector  # raises, as copying it in at once always did
        self.vectors.append(vector)
        self.ids.append(candidate.chunk_id)


def mmr_order(candidates: list[Candidate], lam: float) -> list[Candidate]:
    key = next((k for k in RELEVANCE_KEYS if any(k in c.scores for c in candidates)), None)
    if key is None:
        return candidates
    group = [c for c in candidates if key in c.scores]
    rest = [c for c in candidates if key not in c.scores]
    raw = np.array([c.scores[key] for c in group], dtype=float)
    spread = raw.max() - raw.min()
    relevance = (raw - raw.min()) / spread if spread > 0 else np.zeros_like(raw)
    vectors = [c.unit for c in group]

    order: list[int] = []
    max_sim = np.zeros(len(group))  # max cosine to anything picked so far
    remaining = list(range(len(group)))
    while remaining:
        best = max(remaining, key=lambda i: (lam * relevance[i] - (1 - lam) * max_sim[i], -i))
        order.append(best)
        remaining.remove(best)
        picked = vectors[best]
        if picked is not None:
            for i in remaining:
                other = vectors[i]
                if other is not None:
                    max_sim[i] = max(max_sim[i], float(other @ picked))
    return [group[i] for i in order] + rest
