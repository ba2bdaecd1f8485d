"""The index as the golden-set audit sees it (`IndexView`: every chunk's document, metadata and, where read,
text), and the ids a golden case names (`Ref`, `case_refs`) with the documents they stand for."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from app.evaluation.golden.cases import GoldenCase
from app.ingest.ids import text_sha256
from app.retrieval.types import META_DOC_SHA256, knowledge_tag_of
from app.store.types import ChunkMetadata

# Fields that name ids, the level each id is looked up at ("docOrChunk": a judgments key judges a chunk
# when the index holds a chunk of that id, else a document).
DOC, CHUNK, DOC_OR_CHUNK, SOURCE = "doc", "chunk", "docOrChunk", "source"


# -- the index as the audit sees it -------------------------------------------------------------------


@dataclass
class IndexView:
    """Every chunk's document and metadata, and the texts of the chunks that were read.

    Built by `from_rows` from (chunk id, metadata, text or None) rows; the derived maps: each document's
    chunks (in `position` order), its `doc_sha256` (the chunk metadata written at ingest), the documents of
    each doc_sha256, each read chunk's `text_sha256` and the chunks of each, the documents of each source, and
    each document's knowledge tag."""

    chunk_doc: dict[str, str] = field(default_factory=dict)
    chunk_meta: dict[str, ChunkMetadata] = field(default_factory=dict)
    chunk_text: dict[str, str] = field(default_factory=dict)
    doc_chunks: dict[str, list[str]] = field(default_factory=dict)
    doc_sha: dict[str, str] = field(default_factory=dict)
    docs_by_sha: dict[str, list[str]] = field(default_factory=dict)
    chunk_sha: dict[str, str] = field(default_factory=dict)
    chunks_by_sha: dict[str, list[str]] = field(default_factory=dict)
    source_docs: dict[str, set[str]] = field(default_factory=dict)
    doc_tag: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[str, ChunkMetadata, str | None]]) -> IndexView:
        view = cls()
        for chunk_id, meta, text in rows:
            view.chunk_meta[chunk_id] = meta
            if text is not None:
                view.chunk_text[chunk_id] = text
        view._derive()
        return view

    def add_texts(self, texts: dict[str, str]) -> None:
        """Texts read later (of chunks already in the view)."""
        self.chunk_text.update((cid, text) for cid, text in texts.items() if cid in self.chunk_meta)
        self._derive()

    def _derive(self) -> None:
        self.chunk_doc = {cid: str(meta.get("doc_id", "")) for cid, meta in self.chunk_meta.items()}
        chunks: dict[str, list[str]] = {}
        for cid, doc in self.chunk_doc.items():
            chunks.setdefault(doc, []).append(cid)
        self.doc_chunks = {
            doc: sorted(ids, key=lambda c: (_position(self.chunk_meta[c]), c)) for doc, ids in chunks.items()
        }
        self.doc_sha, self.docs_by_sha, self.source_docs, self.doc_tag = {}, {}, {}, {}
        for doc, ids in sorted(self.doc_chunks.items()):
            meta = self.chunk_meta[ids[0]]
            sha = meta.get(META_DOC_SHA256)
            if sha:
                self.doc_sha[doc] = str(sha)
                self.docs_by_sha.setdefault(str(sha), []).append(doc)
            self.doc_tag[doc] = knowledge_tag_of(meta)
            for cid in ids:
                source = self.chunk_meta[cid].get("source")
                if source:
                    self.source_docs.setdefault(str(source), set()).add(doc)
        self.chunk_sha = {cid: text_sha256(text) for cid, text in self.chunk_text.items()}
        self.chunks_by_sha = {}
        for cid, sha in sorted(self.chunk_sha.items()):
            self.chunks_by_sha.setdefault(sha, []).append(cid)

    @property
    def docs(self) -> set[str]:
        return set(self.doc_chunks)

    @property
    def tags(self) -> set[str]:
        return {tag for tag in self.doc_tag.values() if tag is not None}

    def holds(self, ref: Ref) -> str | None:
        """The level `ref.id` resolves to in the index ("doc", "chunk", "source"), or None when stale."""
        if ref.level in (CHUNK, DOC_OR_CHUNK) and ref.id in self.chunk_meta:
            return CHUNK
        if ref.level in (DOC, DOC_OR_CHUNK) and ref.id in self.doc_chunks:
            return DOC
        if ref.level == SOURCE and ref.id in self.source_docs:
            return SOURCE
        return None

    def content_hash(self, ref: Ref) -> str | None:
        """The content hash of what `ref` resolves to: a document's doc_sha256, a chunk's text_sha256."""
        level = self.holds(ref)
        if level == DOC:
            return self.doc_sha.get(ref.id)
        if level == CHUNK:
            return self.chunk_sha.get(ref.id)
        return None


def _position(meta: ChunkMetadata) -> int:
    """The chunk's `position` in its document; 0 when absent or not a number."""
    position = meta.get("position", 0)
    try:
        return int(position) if position is not None else 0
    except (TypeError, ValueError):
        return 0


# -- what a case names ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ref:
    """One id a case names: the field it is in, the id, the level it is looked up at, and whether it is
    relevant (grade > 0), judged not relevant, forbidden, or only named (passageChunkId)."""

    field: str
    id: str
    level: str
    role: str  # "relevant" | "notRelevant" | "forbidden" | "named"


def case_refs(case: GoldenCase) -> list[Ref]:
    """Every id `case` names, field by field, in the case's order."""
    refs = [Ref("expectedDocIds", i, DOC, "relevant") for i in case.expected_doc_ids]
    refs += [
        Ref("relevance", i, DOC, "relevant" if g > 0 else "notRelevant") for i, g in case.relevance.items()
    ]
    refs += [Ref("forbiddenDocIds", i, DOC, "forbidden") for i in case.forbidden_doc_ids]
    refs += [
        Ref("judgments", i, DOC_OR_CHUNK, "relevant" if g > 0 else "notRelevant")
        for i, g in case.judgments.items()
    ]
    refs += [Ref("expectedChunkIds", i, CHUNK, "relevant") for i in case.expected_chunk_ids]
    refs += [Ref("evidenceChunkIds", i, CHUNK, "relevant") for i in case.evidence_chunk_ids]
    refs += [
        Ref(f"anyOf[{n}]", i, CHUNK, "relevant")
        for n, group in enumerate(case.any_of)
        for i in group
        if isinstance(i, str)
    ]
    if case.passage_chunk_id:
        refs.append(Ref("passageChunkId", case.passage_chunk_id, CHUNK, "named"))
    refs += [Ref("expectedSources", i, SOURCE, "relevant") for i in case.expected_sources]
    return refs


def ref_docs(ref: Ref, index: IndexView) -> list[str]:
    """The documents `ref` stands for in the index (none when stale)."""
    level = index.holds(ref)
    if level == DOC:
        return [ref.id]
    if level == CHUNK:
        return [index.chunk_doc[ref.id]]
    if level == SOURCE:
        return sorted(index.source_docs[ref.id])
    return []


def relevant_docs(case: GoldenCase, index: IndexView) -> list[str]:
    """The case's relevant documents in the index, as `runner.resolve_case` grades them: a document's own
    grade (expectedDocIds 1, then relevance, then a judgments key that is not a chunk id; the later wins)
    when it has one, else relevant when one of its expected, evidence or grade > 0 judged chunks, or a source
    the case expects, belongs to it. In the order first named."""
    direct = case.relevance_map()
    direct.update({key: float(g) for key, g in case.judgments.items() if key not in index.chunk_meta})
    out = dict.fromkeys(doc for doc, grade in direct.items() if grade > 0 and doc in index.doc_chunks)
    for ref in case_refs(case):
        if ref.role == "relevant" and index.holds(ref) in (CHUNK, SOURCE):
            out.update(dict.fromkeys(doc for doc in ref_docs(ref, index) if doc not in direct))
    return list(out)


def touched_docs(case: GoldenCase, index: IndexView) -> set[str]:
    """Every document of the index that `case` expects, judges (any grade), forbids, or names a chunk or
    source of."""
    return {doc for ref in case_refs(case) for doc in ref_docs(ref, index)}


def judged_docs(case: GoldenCase, index: IndexView) -> set[str]:
    """The documents `case` grades or forbids, directly or through one of their chunks (passageChunkId
    aside: naming the passage a question was made from judges nothing)."""
    return {doc for ref in case_refs(case) if ref.role != "named" for doc in ref_docs(ref, index)}
