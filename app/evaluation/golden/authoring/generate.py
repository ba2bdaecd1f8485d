"""`sieve golden generate`: a question per passage of the ingested store, kept only when retrieval can find
its passage again, written as golden cases with `origin: generated`.

1. **Pick** (`pick_passages`): skipped are chunks the hard filter removes from every query (its rules, as
   configured in `rag.chain.hard_filter`, applied whether or not the stage is enabled, as of
   `rag.evaluate.as_of`: retired, draft, not yet or no longer in force...), chunks of a document whose
   whole text copies another's (same `doc_sha256`: only the smallest document id, the one the diversity
   stage keeps, is asked about) and chunks with less than `min_passage_chars` of stripped text. The rest
   are grouped by knowledge tag (untagged chunks form one group), then by document; the tags, the
   documents of a tag and the chunks of a document are each shuffled by `random.Random(seed)` from sorted
   order. Passages are taken round-robin over the tags, and within a tag round-robin over its documents,
   one chunk at a time, until N are taken or none is left: every tag gets N / tags passages while it has
   any, and within a tag every document a fair share.
2. **Ask** (a generator per passage, `per_chunk` questions at most):
   - `OfflineGenerator` needs no model. A *heading question* uses the chunk's heading path: its title and
     its deepest section heading ("{title}中关于{heading}有什么规定？", "What does the {title} say about
     {heading}?"; the title alone for a chunk before any section; none under a generic heading such as
     FAQ / 常见问题). A *key-term question* names the passage's `key_terms` key terms ("What are the rules
     on {a}, {b} and {c}?", "关于{a}、{b}和{c}，有哪些规定？"). Key terms: the terms of the chunk's text by
     the BM25 index's analyzer (jieba search mode for Chinese, Snowball stems for English, its stop words
     dropped) that have two characters or more, are not all digits, are not in `GENERAL_WORDS`, and are not
     inside another term of the passage (jieba's search mode yields 服务 beside 服务器: only 服务器 is a
     candidate); ranked by tf × idf (tf in the passage; idf = ln(N - df + 0.5) - ln(df + 0.5), BM25Okapi's,
     over the indexed text of every chunk of the store: N chunks, df = chunks holding the term), ties by
     the longer term, then first appearance; written as in the passage (`surface_forms`), in text order.
     Passages alternate which kind comes first (the 1st, 3rd, ... picked passage: heading; the others: key
     terms), so a set holds both. The language is the passage text's (`query_language`); the template of
     a language is chosen by a hash of seed, chunk and kind.
   - `LlmGenerator`: one chat completion per question (app/evaluation/golden/authoring/llm.py).
3. **Round trip**: each question is searched in the whole collection (no knowledge tag: a tag's few chunks
   would make the check trivial) by BM25 (the lexical index) and by dense search (the store's nearest
   chunks to the query vector), the top `round_trip_k` (20) of each. `either` keeps it when its passage is
   in either list, `both` only when in both; `rag.generate.round_trip: auto` (the default) is `both` for the
   offline generator, whose questions are made of the passage's own terms so that BM25 finds their passage
   by construction, and `either` for an LLM, whose paraphrases BM25 may miss (docs/generation.md has the
   measurement).
4. **Write**: every kept question becomes a case {id: "gen-" + the first 10 hex digits of
   sha256(chunkId + query), query, knowledgeTag: the chunk's, expectedDocIds: [its document],
   evidenceChunkIds: [the chunk], origin: "generated", generator, passageChunkId, literalness (against the
   chunk's indexed text: literalness.py)}; cases whose id the out file already holds
   are dropped, the rest appended one JSON line each.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import unicodedata
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pydantic import JsonValue

from app.evaluation.golden.authoring.literalness import literalness
from app.evaluation.golden.authoring.llm import ChatClient, clean_question, question_messages
from app.evaluation.golden.cases import load_golden_set
from app.evaluation.golden.language import query_language
from app.ingest.chunker import embedding_text, stored_chunk
from app.jsonl import append_lines
from app.retrieval.stages.hard_filter import HardFilterStage
from app.retrieval.types import META_DOC_SHA256, Candidate, QueryContext, knowledge_tag_of
from app.settings import HardFilterSettings
from app.store.types import ChunkMetadata

if TYPE_CHECKING:
    from app.lexical.index import Bm25Index
    from app.models import Embedder
    from app.store import ChromaStore

# a golden case as a line of the golden-set file holds it: its JSON object
CaseJson = dict[str, JsonValue]
Tokenizer = Callable[[str], list[str]]
ExcludeRule = Callable[["Passage"], "str | None"]

CASE_ID_PREFIX = "gen-"
ORIGIN = "generated"

HEADING_TEMPLATES = {
    "zh": ("{title}中关于{heading}有什么规定？", "{title}里，{heading}是怎么规定的？"),
    "en": ("What does the {title} say about {heading}?", "What are the rules for {heading} in the {title}?"),
}
TITLE_TEMPLATES = {"zh": ("{title}有哪些规定？",), "en": ("What does the {title} cover?",)}
TERMS_TEMPLATES = {
    "zh": ("{terms}有什么规定？", "关于{terms}，有哪些规定？"),
    "en": ("What does the policy say about {terms}?", "What are the rules on {terms}?"),
}
# Section headings that say nothing about their section's content: no heading question under them.
GENERIC_HEADINGS = frozenset(
    ("常见问题", "问答", "其他", "其它", "附则", "说明", "备注")
    + ("faq", "faqs", "frequently asked questions", "q&a", "other", "notes", "miscellaneous")
)

# Words the analyzer keeps that say nothing about a passage's topic: never key terms.
GENERAL_WORDS = (
    "也 还 都 并 且 从 向 对 以 于 按 由 每 各 该 其 需 应 须 可 能 会 将 已 未 不 无 非 "
    "无论 一般 需要 必须 不得 不能 可以 应当 应该 需先 通过 经过 确保 符合 以及 或者 并且 如果 "
    "以上 以下 之前 之后 之内 相同 每天 每月 每周 每年 一次 其他 其它 所有 相关 进行 使用 提供 包括 "
    "根据 按照 由于 因为 所以 但是 同时 可能 至少 最多 超过 不超过 以内 当天 当月 次月 前 后 内 "
    "about above after again against all also am any because been before being below between both "
    "can cannot could did do does doing down during each either else even ever every few from "
    "further had has have having he her here hers how however i its just least less may me might more "
    "most must my neither never nor now off once only other otherwise our out over own per same shall "
    "she should so some still than those though through too under until up upon us very via what when "
    "whenever where whether which while who whom whose why within without would yet you your"
).split()

# The analyzer's split of a text into CJK runs and latin/digit runs (app/lexical/index.py).
_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_RUNS = re.compile(rf"([{_CJK}]+)|([^\W_{_CJK}]+)")


class GenerateError(ValueError):
    """Bad options for `sieve golden generate`; the message names the option."""


@dataclass(frozen=True)
class Passage:
    """One chunk as generation sees it. `indexed_text` is what BM25 and the embedder see for it (title and
    heading path, then the text: `embedding_text`)."""

    chunk_id: str
    doc_id: str
    text: str
    indexed_text: str
    title: str
    heading_path: tuple[str, ...]
    knowledge_tag: str | None
    position: int
    metadata: ChunkMetadata = field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, chunk_id: str, text: str, metadata: ChunkMetadata) -> Passage:
        """A passage from a stored chunk's id, text and metadata (as ingest wrote them)."""
        chunk = stored_chunk(chunk_id, text, metadata)
        title = str(metadata.get("title", ""))
        return cls(
            chunk_id=chunk_id,
            doc_id=chunk.doc_id,
            text=text,
            indexed_text=embedding_text(chunk, title),
            title=title,
            heading_path=chunk.heading_path,
            knowledge_tag=knowledge_tag_of(metadata),
            position=chunk.position,
            metadata=metadata,
        )


# -- picking ------------------------------------------------------------------------------------------


@dataclass
class Pick:
    passages: list[Passage]
    eligible: int  # chunks left after the skips
    skipped: Counter[str]  # reason -> chunks
    excluded_documents: dict[str, str]  # doc id -> the hard filter's reason
    copies: dict[str, str]  # doc id -> the document whose whole text it copies (kept instead)


def hard_filter_rule(settings: HardFilterSettings, today: date) -> ExcludeRule:
    """The hard filter's reason to remove a passage's chunk from any query's results (no knowledge tag
    asked), or None: `HardFilterStage.reason` itself, as of `today`."""
    stage = HardFilterStage(settings)
    context = QueryContext(text="", knowledge_tag=None, today=today)

    def rule(p: Passage) -> str | None:
        return stage.reason(context, Candidate(p.chunk_id, p.doc_id, p.text, p.metadata))

    return rule


def pick_passages(
    passages: Iterable[Passage], n: int, seed: int, min_chars: int, exclude: ExcludeRule
) -> Pick:
    """Up to `n` passages stratified by knowledge tag, then document (the module docstring, step 1)."""
    skipped: Counter[str] = Counter()
    excluded: dict[str, str] = {}
    by_tag: dict[str | None, dict[str, list[Passage]]] = {}
    eligible = 0
    ordered = sorted(passages, key=lambda p: (p.doc_id, p.position, p.chunk_id))
    reasons = [exclude(p) for p in ordered]
    canonical: dict[str, str] = {}  # document text hash -> the smallest doc id with it
    for p, why in zip(ordered, reasons, strict=True):
        digest = p.metadata.get(META_DOC_SHA256)
        if digest and why is None:
            canonical.setdefault(str(digest), p.doc_id)
    copies: dict[str, str] = {}
    for p, why in zip(ordered, reasons, strict=True):
        if why is not None:
            skipped["the hard filter excludes it"] += 1
            excluded.setdefault(p.doc_id, why)
            continue
        original = canonical.get(str(p.metadata.get(META_DOC_SHA256, "")), p.doc_id)
        if original != p.doc_id:
            skipped["its document copies another"] += 1
            copies[p.doc_id] = original
            continue
        if len(p.text.strip()) < min_chars:
            skipped[f"under {min_chars} characters of text"] += 1
            continue
        eligible += 1
        by_tag.setdefault(p.knowledge_tag, {}).setdefault(p.doc_id, []).append(p)
    rng = random.Random(seed)
    tags = sorted(by_tag, key=lambda t: (t is None, t or ""))
    rng.shuffle(tags)
    rotation: dict[str | None, deque[list[Passage]]] = {}
    for tag in tags:
        docs = sorted(by_tag[tag])
        rng.shuffle(docs)
        queue: deque[list[Passage]] = deque()
        for doc in docs:
            chunks = list(by_tag[tag][doc])
            rng.shuffle(chunks)
            queue.append(chunks)
        rotation[tag] = queue
    picked: list[Passage] = []
    while len(picked) < n and any(rotation.values()):
        for tag in tags:
            queue = rotation[tag]
            if not queue or len(picked) == n:
                continue
            chunks = queue.popleft()
            picked.append(chunks.pop(0))
            if chunks:
                queue.append(chunks)
    return Pick(picked, eligible, skipped, excluded, copies)


# -- asking -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Question:
    query: str
    generator: str  # "offline:heading", "offline:terms", "llm:<model>"


class QuestionGenerator(Protocol):
    def questions(self, passage: Passage, ordinal: int, count: int) -> list[Question]:
        """Up to `count` distinct questions about `passage`, the `ordinal`-th picked (0-based)."""
        ...


@dataclass(frozen=True)
class CorpusIdf:
    """Document frequencies over a corpus of chunks; idf(t) = ln(N - df(t) + 0.5) - ln(df(t) + 0.5)
    (BM25Okapi's, without its floor for negative values: only the order of terms is used)."""

    n: int
    df: dict[str, int]

    @classmethod
    def of(cls, token_lists: Iterable[Iterable[str]]) -> CorpusIdf:
        df: Counter[str] = Counter()
        n = 0
        for tokens in token_lists:
            n += 1
            df.update(set(tokens))
        return cls(n, dict(df))

    def idf(self, term: str) -> float:
        df = self.df.get(term, 0)
        return math.log(self.n - df + 0.5) - math.log(df + 0.5)


class OfflineGenerator:
    """Heading and key-term questions from templates (the module docstring, step 2)."""

    def __init__(self, tokens: Tokenizer, idf: CorpusIdf, seed: int = 42, key_terms: int = 3):
        if key_terms < 1:
            raise GenerateError(f"key_terms must be at least 1, got {key_terms}")
        self.tokens = tokens
        self.corpus_idf = idf
        self.seed = seed
        self.key_terms = key_terms
        self._general = frozenset(t for word in GENERAL_WORDS for t in tokens(word))

    def questions(self, passage: Passage, ordinal: int, count: int) -> list[Question]:
        kinds = ("heading", "terms") if ordinal % 2 == 0 else ("terms", "heading")
        out: list[Question] = []
        for kind in kinds:
            query = self.heading_question(passage) if kind == "heading" else self.terms_question(passage)
            if query and query not in {q.query for q in out}:
                out.append(Question(query, f"offline:{kind}"))
        return out[:count]

    def heading_question(self, p: Passage) -> str | None:
        """From the title and the deepest heading of the chunk's heading path; None under a generic
        heading or without a title and heading."""
        language = query_language(p.text)
        title = p.title.strip() or (p.heading_path[0] if p.heading_path else "")
        heading = p.heading_path[-1].strip() if p.heading_path else ""
        if heading.casefold() in GENERIC_HEADINGS:
            return None
        if not heading or heading == title:
            if not title:
                return None
            return self._template(TITLE_TEMPLATES[language], p, "title").format(title=title)
        if language == "en":
            heading = _lower_first(heading)
        if not title:
            return self._template(TERMS_TEMPLATES[language], p, "heading").format(terms=heading)
        return self._template(HEADING_TEMPLATES[language], p, "heading").format(title=title, heading=heading)

    def terms_question(self, p: Passage) -> str | None:
        """From the passage's key terms; None when it has none."""
        terms = self.key_terms_of(p)
        if not terms:
            return None
        language = query_language(p.text)
        joined = _join(terms, language)
        return self._template(TERMS_TEMPLATES[language], p, "terms").format(terms=joined)

    def key_terms_of(self, p: Passage) -> list[str]:
        """The passage text's `key_terms` key terms (see the module docstring), each as it is written in
        the passage, in text order."""
        tokens = self.tokens(p.text)
        order: dict[str, int] = {}
        for i, term in enumerate(tokens):
            if len(term) >= 2 and not term.isdigit() and term not in self._general:
                order.setdefault(term, i)
        maximal = [t for t in order if not any(t != u and t in u for u in order)]
        tf = Counter(tokens)
        ranked = sorted(maximal, key=lambda t: (-tf[t] * self.corpus_idf.idf(t), -len(t), order[t]))
        chosen = sorted(ranked[: self.key_terms], key=order.__getitem__)
        surface = surface_forms(p.text, self.tokens)
        return [surface.get(t, t) for t in chosen]

    def _template(self, templates: Sequence[str], p: Passage, kind: str) -> str:
        digest = hashlib.sha256(f"{self.seed}\0{p.chunk_id}\0{kind}".encode()).digest()
        return templates[int.from_bytes(digest[:4], "big") % len(templates)]


class LlmGenerator:
    """Questions from an OpenAI-compatible chat endpoint: one request per question, the prompt in the
    passage's language, over the passage's indexed text (title, headings and text)."""

    def __init__(self, client: ChatClient):
        self.client = client
        self.name = f"llm:{client.endpoint.model}"

    def questions(self, passage: Passage, ordinal: int, count: int) -> list[Question]:
        language = query_language(passage.text)
        out: list[Question] = []
        for _ in range(count):
            query = clean_question(self.client.complete(question_messages(passage.indexed_text, language)))
            if query and query not in {q.query for q in out}:
                out.append(Question(query, self.name))
        return out


def surface_forms(text: str, tokens: Tokenizer) -> dict[str, str]:
    """Each term of `text` -> the word it comes from, as written in `text`: a Chinese term is its own word;
    an English stem ("polici") maps to its first occurrence ("policies") not at the start of a sentence,
    or, when it only starts sentences, to that word with a lowercase first letter ("Older" -> "older",
    "VPN" stays)."""
    first: dict[str, str] = {}
    inside: dict[str, str] = {}
    normalised = unicodedata.normalize("NFKC", text)
    for match in _RUNS.finditer(normalised):
        cjk, word = match.groups()
        if cjk:
            for term in tokens(cjk):
                first.setdefault(term, term)
            continue
        before = normalised[: match.start()].rstrip()
        starts_sentence = not before or before[-1] in ".!?:;。！？：；"
        for term in tokens(word):
            first.setdefault(term, _lower_first(word) if starts_sentence else word)
            if not starts_sentence:
                inside.setdefault(term, word)
    return {term: inside.get(term, written) for term, written in first.items()}


def _join(terms: list[str], language: str) -> str:
    if language == "zh":
        return terms[0] if len(terms) == 1 else "、".join(terms[:-1]) + "和" + terms[-1]
    return terms[0] if len(terms) == 1 else ", ".join(terms[:-1]) + " and " + terms[-1]


def _lower_first(heading: str) -> str:
    """ "Installing the client" -> "installing the client"; "VPN access" and "Wi-Fi" stay."""
    if len(heading) > 1 and heading[0].isupper() and heading[1].islower():
        return heading[0].lower() + heading[1:]
    return heading


# -- round trip and cases -----------------------------------------------------------------------------


class Searcher(Protocol):
    def bm25_top(self, queries: list[str], k: int) -> list[list[str]]:
        """The chunk ids of each query's BM25 top k over the whole collection."""
        ...

    def dense_top(self, queries: list[str], k: int) -> list[list[str]]:
        """The chunk ids of each query's dense top k over the whole collection."""
        ...


@dataclass(frozen=True)
class GenerateOptions:
    chunks: int
    per_chunk: int = 1
    seed: int = 42
    min_passage_chars: int = 40
    round_trip_k: int = 20
    round_trip: str = "both"

    @staticmethod
    def round_trip_for(setting: str, generator: str) -> str:
        """`rag.generate.round_trip` for `generator`: "auto" is "both" for offline, "either" for llm."""
        if setting == "auto":
            return "either" if generator == "llm" else "both"
        return setting

    def __post_init__(self) -> None:
        if self.chunks < 1:
            raise GenerateError(f"--chunks must be at least 1, got {self.chunks}")
        if not 1 <= self.per_chunk <= 10:
            raise GenerateError(f"--per-chunk must be between 1 and 10, got {self.per_chunk}")
        if self.round_trip not in ("either", "both"):
            raise GenerateError(f"round_trip must be 'either' or 'both', got {self.round_trip!r}")


@dataclass
class GenerationResult:
    pick: Pick
    cases: list[CaseJson]  # the kept cases, in pick order
    generated: Counter[str]  # generator -> questions made
    found: Counter[str]  # "both", "BM25 only", "dense only", "neither": where each question's passage was
    dropped: Counter[str]  # reason -> questions
    no_question: int  # passages no question could be made for
    options: GenerateOptions

    def lines(self) -> list[str]:
        """What `sieve golden generate` prints."""
        p = self.pick
        tags = len({x.knowledge_tag for x in p.passages})
        docs = len({x.doc_id for x in p.passages})
        out = [
            f"picked {len(p.passages)} passages ({docs} documents, {tags} knowledge tags) of {p.eligible} "
            "eligible chunks"
        ]
        if p.skipped:
            out.append("skipped chunks: " + ", ".join(f"{n} {why}" for why, n in p.skipped.most_common()))
        if p.excluded_documents:
            out.append(
                "documents the hard filter excludes: "
                + ", ".join(f"{doc} ({why})" for doc, why in sorted(p.excluded_documents.items()))
            )
        if p.copies:
            out.append(
                "documents passed over as copies: "
                + ", ".join(f"{doc} (copy of {original})" for doc, original in sorted(p.copies.items()))
            )
        made = sum(self.generated.values())
        out.append(
            f"generated {made} questions ("
            + ", ".join(f"{g} {n}" for g, n in sorted(self.generated.items()))
            + ")"
            + (f"; no question for {self.no_question} passages" if self.no_question else "")
        )
        k = self.options.round_trip_k
        out.append(
            f"round trip, passage in the top {k}: "
            + ", ".join(
                f"{where} {self.found[where]}" for where in ("both", "BM25 only", "dense only", "neither")
            )
        )
        dropped = sum(self.dropped.values())
        out.append(
            f"kept {len(self.cases)} (round_trip: {self.options.round_trip}), dropped {dropped}"
            + (": " + ", ".join(f"{n} {why}" for why, n in self.dropped.most_common()) if dropped else "")
        )
        return out


def case_id(chunk_id: str, query: str) -> str:
    """ "gen-" + the first 10 hex digits of sha256(chunkId + query) (UTF-8)."""
    return CASE_ID_PREFIX + hashlib.sha256((chunk_id + query).encode("utf-8")).hexdigest()[:10]


def make_case(passage: Passage, question: Question, tokens: Tokenizer) -> CaseJson:
    """The golden case of one kept question (literalness against the passage's indexed text)."""
    case: CaseJson = {"id": case_id(passage.chunk_id, question.query), "query": question.query}
    if passage.knowledge_tag is not None:
        case["knowledgeTag"] = passage.knowledge_tag
    case.update(
        {
            "expectedDocIds": [passage.doc_id],
            "evidenceChunkIds": [passage.chunk_id],
            "origin": ORIGIN,
            "generator": question.generator,
            "passageChunkId": passage.chunk_id,
        }
    )
    value = literalness(question.query, passage.indexed_text, tokens)
    if value is not None:
        case["literalness"] = value
    return case


def generate(
    passages: Sequence[Passage],
    generator: QuestionGenerator,
    searcher: Searcher,
    tokens: Tokenizer,
    options: GenerateOptions,
    exclude: ExcludeRule,
    existing_ids: set[str] | frozenset[str] = frozenset(),
) -> GenerationResult:
    """Pick, ask, round-trip and make the cases (the module docstring); writes nothing."""
    pick = pick_passages(passages, options.chunks, options.seed, options.min_passage_chars, exclude)
    asked: list[tuple[Passage, Question]] = []
    generated: Counter[str] = Counter()
    dropped: Counter[str] = Counter()
    no_question = 0
    seen = set(existing_ids)
    for ordinal, passage in enumerate(pick.passages):
        questions = generator.questions(passage, ordinal, options.per_chunk)
        if not questions:
            no_question += 1
        for q in questions:
            generated[q.generator] += 1
            cid = case_id(passage.chunk_id, q.query)
            if cid in seen:
                dropped["already in the out file" if cid in existing_ids else "a repeated question"] += 1
                continue
            seen.add(cid)
            asked.append((passage, q))
    queries = [q.query for _, q in asked]
    k = options.round_trip_k
    bm25 = searcher.bm25_top(queries, k) if queries else []
    dense = searcher.dense_top(queries, k) if queries else []
    found: Counter[str] = Counter()
    cases = []
    for (passage, q), lexical_ids, dense_ids in zip(asked, bm25, dense, strict=True):
        in_bm25, in_dense = passage.chunk_id in lexical_ids, passage.chunk_id in dense_ids
        where = {(True, True): "both", (True, False): "BM25 only", (False, True): "dense only"}.get(
            (in_bm25, in_dense), "neither"
        )
        found[where] += 1
        keep = (in_bm25 and in_dense) if options.round_trip == "both" else (in_bm25 or in_dense)
        if not keep:
            if options.round_trip == "both":
                dropped[f"passage not in both top {k} ({where})"] += 1
            else:
                dropped[f"passage in neither the BM25 nor the dense top {k}"] += 1
            continue
        cases.append(make_case(passage, q, tokens))
    return GenerationResult(pick, cases, generated, found, dropped, no_question, options)


class StoreSearcher:
    """`Searcher` over a running service's parts: the BM25 index (`top`), the embedder
    (`embed_queries`) and the vector store (`query_ids`)."""

    def __init__(self, lexical: Bm25Index, embedder: Embedder, store: ChromaStore):
        self.lexical, self.embedder, self.store = lexical, embedder, store

    def bm25_top(self, queries: list[str], k: int) -> list[list[str]]:
        return [[chunk_id for chunk_id, _ in self.lexical.top(q, k)] for q in queries]

    def dense_top(self, queries: list[str], k: int) -> list[list[str]]:
        vectors = self.embedder.embed_queries(queries)
        return [[chunk_id for chunk_id, _ in hits] for hits in self.store.query_ids(vectors, k)]


def store_passages(store: ChromaStore) -> list[Passage]:
    """Every chunk of the store (`iter_all`) as a passage."""
    return [Passage.of(c.chunk_id, c.text, c.metadata) for c in store.iter_all(include_text=True)]


# -- the out file ---------------------------------------------------------------------------------------


def check_out_path(path: Path) -> None:
    """Cases are appended one JSON line each: the out file must be a .jsonl file, not a directory."""
    if path.suffix.lower() != ".jsonl":
        raise GenerateError(f"--out {path}: must be a .jsonl file (cases are appended one JSON line each)")
    if path.is_dir():
        raise GenerateError(f"--out {path}: is a directory")


def existing_case_ids(path: Path) -> set[str]:
    """The case ids already in `path` (none when it does not exist or is blank). An invalid file raises
    `GoldenSetError` naming its problems: nothing is appended to a broken set."""
    if not path.exists():
        return set()
    try:
        if not path.read_text(encoding="utf-8").strip():
            return set()
    except (OSError, UnicodeDecodeError):
        pass  # load_golden_set reports it with the file's name
    return {case.id for case in load_golden_set(path).cases}


def append_cases(path: Path, cases: list[CaseJson]) -> None:
    """Append `cases` to `path`, one JSON line each (`app.jsonl.append_lines`: UTF-8, the line-break
    characters escaped); creates the file and its folder when missing."""
    append_lines(path, cases)
