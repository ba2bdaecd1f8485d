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
        kept: list[Candidate] = []
        removed: list[Removal] = []
        seen_text: dict[str, str] = {}
        kept_documents: dict[str, str] = {}  # doc_sha256 -> doc id of the first kept chunk with it
        # The kept unit vectors, row after row, in a buffer allocated once: `kept_matrix[:m] @ vector` is the
        # very product (same values, same C layout, same m x d shape) an np.stack of the m kept vectors gave,
        # without re-stacking them after every keep. Rows are copied in only when a cosine check needs
        # them (`filled` so far): most candidates never get one.
        kept_matrix: np.ndarray | None = None
        kept_vectors: list[np.ndarray] = []
        kept_ids: list[str] = []
        filled = 0
        slack_width, near_bound = -1, 0.0  # the vector length `near_bound` was computed for
        per_source: dict[str, int] = {}
        per_doc: dict[str, int] = {}
        cap = self.settings.max_per_source
        doc_cap = self.settings.max_per_document
        max_cosine = self.settings.max_cosine

        attach_limit = self.settings.attach_per_document
        first_kept: dict[str, str] = {}  # doc id -> chunk id of its first kept chunk
        attachments: dict[str, list[Candidate]] = {}
        exact_duplicates = self.settings.drop_exact_duplicates
        document_copies = self.settings.drop_document_copies

        for candidate in candidates:
            why = None
            text_key = normalise_text(candidate.text)
            vector = candidate.unit
            doc_hash = candidate.doc_sha256
            original = kept_documents.get(doc_hash) if doc_hash is not None else None
            if exact_duplicates and text_key in seen_text:
                why = f"duplicate of {seen_text[text_key]} (same text)"
            elif document_copies and original is not None and original != candidate.doc_id:
                why = f"copy of doc {original}"
            elif max_cosine is not None and vector is not None and kept_ids:
                if len(vector) != slack_width:
                    slack_width = len(vector)
                    near_bound = max_cosine - nearest_slack(slack_width)
                # Skipped when no candidate of its set comes near max_cosine: its exact cosines below
                # could then not exceed it either (`nearest_slack`), and nothing else reads them.
                if candidate.nearest is None or candidate.nearest > near_bound:
                    for row in range(filled, len(kept_ids)):
                        kept_matrix[row] = kept_vectors[row]  # type: ignore[index]
                    filled = len(kept_ids)
                    sims = kept_matrix[: len(kept_ids)] @ vector  # type: ignore[index]
                    best = int(sims.argmax())
                    if sims[best] > max_cosine:
                        shown, bound = format_pair(float(sims[best]), max_cosine)
                        why = f"cosine={shown} > {bound} with {kept_ids[best]}"
            source = candidate.source if cap is not None else ""  # sources are counted only for a cap
            if why is None and source and per_source.get(source, 0) >= cap:  # type: ignore[operator]
                why = f"source={source} already has {per_source[source]}"
            if why is None and doc_cap is not None and per_doc.get(candidate.doc_id, 0) >= doc_cap:
                why = f"doc={candidate.doc_id} already has {per_doc[candidate.doc_id]}"
                host = first_kept[candidate.doc_id]
                if len(attachments.get(host, ())) < attach_limit:
                    attachments.setdefault(host, []).append(candidate)
                    why += f"; attached to {host}"

            if why is not None:
                removed.append(Removal(candidate.chunk_id, candidate.doc_id, why))
                continue
            kept.append(candidate)
            seen_text.setdefault(text_key, candidate.chunk_id)
            if doc_hash is not None:
                kept_documents.setdefault(doc_hash, candidate.doc_id)
            if vector is not None:
                if kept_matrix is None:
                    kept_matrix = np.empty((len(candidates), len(vector)))
                elif len(vector) != kept_matrix.shape[1]:
                    kept_matrix[len(kept_ids)] = vector  # raises, as copying it in at once always did
                kept_vectors.append(vector)
                kept_ids.append(candidate.chunk_id)
            if source:
                per_source[source] = per_source.get(source, 0) + 1
            per_doc[candidate.doc_id] = per_doc.get(candidate.doc_id, 0) + 1
            first_kept.setdefault(candidate.doc_id, candidate.chunk_id)

        if attachments:
            kept = [
                c.with_attached(tuple(attachments[c.chunk_id])) if c.chunk_id in attachments else c
                for c in kept
            ]
        if self.settings.mmr and len(kept) > 1:
            kept = mmr_order(kept, self.settings.mmr_lambda)
        return StageOutcome(kept=kept, removed=removed)


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
