"""A synthetic mixed zh/en knowledge base for `scripts/bench_scale.py`, and a cheap deterministic embedder.

Corpus (`Corpus(seed)`, same seed -> same chunks, generated in any order by chunk number):
- documents `d0000000`, `d0000001`, ... of 1-7 chunks each (mean 4), chunk ids `<doc>-c<position>`;
- a chunk's text is 2-4 sentences: English sentences (60% of documents), Chinese (30%) or mixed (10%);
  English words are pronounceable pseudo-words drawn Zipf(1.1) from a 30,000-word vocabulary (plus real
  function words), Chinese words are jieba's own dictionary's 20,000 most frequent entries, drawn Zipf(1.1);
- metadata as the ingest pipeline writes it (doc_id, position, title, origin, chunker) and a knowledge tag on
  80% of documents, 8 tags with Zipf shares (`finance` the largest, about a third of the tagged chunks).

Embedder (`HashEmbedder`): each token (a latin word, lowercased, or one CJK character) gets a fixed unit
Gaussian vector seeded by crc32(token); a text's vector is the sum of its tokens' vectors weighted by
1 + ln(count), normalised to unit length. Deterministic, no model, cheap (docs/benchmarks.md#code-figures):
what the benchmark measures is the store and the index, never a model. Texts that share words get similar
vectors, as with a real model.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

DIM = 384
TAGS = ("finance", "hr", "it", "legal", "sales", "support", "security", "ops")
_FUNCTION_WORDS = "the of and to in is for on with as by that this are be or from at".split()
_CONSONANTS = "b c d f g h j k l m n p r s t v w z br cl dr fr gr pl pr st tr ch sh th".split()
_VOWELS = "a e i o u ai ea ou io".split()
_TOKENS = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]|[^\W_\u3400-\u4dbf\u4e00-\u9fff]+")


def _zipf_cdf(n: int, s: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, n + 1) ** s
    return np.cumsum(weights) / weights.sum()


def _english_vocabulary(n: int, rng: np.random.Generator) -> list[str]:
    words: list[str] = []
    seen: set[str] = set(_FUNCTION_WORDS)
    while len(words) < n:
        syllables = int(rng.integers(1, 4))
        word = "".join(
            _CONSONANTS[int(rng.integers(len(_CONSONANTS)))] + _VOWELS[int(rng.integers(len(_VOWELS)))]
            for _ in range(syllables)
        )
        if rng.random() < 0.4:
            word += _CONSONANTS[int(rng.integers(len(_CONSONANTS)))]
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


def _chinese_vocabulary(n: int) -> list[str]:
    import jieba

    rows = []
    with open(Path(jieba.__file__).parent / "dict.txt", encoding="utf-8") as f:
        for line in f:
            word, freq, *_ = line.split()
            if len(word) >= 2 and all("\u4e00" <= ch <= "\u9fff" for ch in word):
                rows.append((-int(freq), word))
    rows.sort()
    return [w for _, w in rows[:n]]


class _Uniforms:
    """Uniform [0, 1) numbers drawn from `rng` a block at a time (one numpy call per block)."""

    def __init__(self, rng: np.random.Generator, block: int = 1024):
        self.rng, self.block = rng, block
        self.buf = rng.random(block)
        self.at = 0

    def take(self, n: int) -> np.ndarray:
        if self.at + n > len(self.buf):
            self.buf = np.concatenate([self.buf[self.at :], self.rng.random(max(self.block, n))])
            self.at = 0
        out = self.buf[self.at : self.at + n]
        self.at += n
        return out


@dataclass(frozen=True)
class SyntheticChunk:
    chunk_id: str
    doc_id: str
    position: int
    title: str
    text: str
    knowledge: str | None

    def metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "doc_id": self.doc_id,
            "position": self.position,
            "title": self.title,
            "origin": "bench-scale",
            "chunker": "bench",
            "heading_path": "",
        }
        if self.knowledge is not None:
            meta["knowledge"] = self.knowledge
        return meta


class Corpus:
    """Chunks by number, deterministic in (seed, number): documents of 1-7 chunks laid out in a fixed
    sequence, so chunk n is always the same chunk whatever was generated before it."""

    def __init__(self, seed: int = 11):
        rng = np.random.default_rng(seed)
        self.seed = seed
        self.english = _english_vocabulary(30_000, rng)
        self.chinese = _chinese_vocabulary(20_000)
        self._en_cdf = _zipf_cdf(len(self.english), 1.1)
        self._zh_cdf = _zipf_cdf(len(self.chinese), 1.1)
        self._tag_cdf = _zipf_cdf(len(TAGS), 1.0)

    def _doc_rng(self, doc_no: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, doc_no])

    def _sentence(self, u: _Uniforms, language: str) -> str:
        if language == "zh":
            picks = np.searchsorted(self._zh_cdf, u.take(5 + int(u.take(1)[0] * 8)))
            return "".join([self.chinese[i] for i in picks.tolist()]) + "。"
        n = 8 + int(u.take(1)[0] * 10)
        picks = np.searchsorted(self._en_cdf, u.take(n)).tolist()
        kinds = u.take(n).tolist()
        words = [
            _FUNCTION_WORDS[int(r * 100) % len(_FUNCTION_WORDS)] if r < 0.3 else self.english[i]
            for i, r in zip(picks, kinds, strict=True)
        ]
        return (" ".join(words)).capitalize() + "."

    def document(self, doc_no: int, chunks: int | None = None) -> list[SyntheticChunk]:
        """Document `doc_no`'s chunks (its own number of them, or exactly `chunks`)."""
        u = _Uniforms(self._doc_rng(doc_no))
        head = u.take(4).tolist()
        n_chunks = 1 + int(head[0] * 7) if chunks is None else chunks
        language = "en" if head[1] < 0.6 else "zh" if head[1] < 0.9 else "mixed"
        tag = None
        if head[2] < 0.8:
            tag = TAGS[int(np.searchsorted(self._tag_cdf, head[3]))]
        doc_id = f"d{doc_no:07d}"
        title = self._sentence(u, "zh" if language == "zh" else "en")[:40].rstrip("。.")
        out = []
        for position in range(n_chunks):
            sentences = []
            for _ in range(2 + int(u.take(1)[0] * 3)):
                lang = language if language != "mixed" else ("zh" if u.take(1)[0] < 0.5 else "en")
                sentences.append(self._sentence(u, lang))
            out.append(
                SyntheticChunk(f"{doc_id}-c{position}", doc_id, position, title, " ".join(sentences), tag)
            )
        return out

    def chunks(self, total: int, first_doc: int = 0) -> Any:
        """Yield lists of chunks, a document at a time, until `total` chunks (the last document is cut)."""
        made = 0
        doc_no = first_doc
        while made < total:
            doc = self.document(doc_no)[: total - made]
            made += len(doc)
            doc_no += 1
            yield doc

    def chunk_ids(self, total: int) -> list[str]:
        """The ids `chunks(total)` yields, in order, without making any text."""
        ids: list[str] = []
        doc_no = 0
        while len(ids) < total:
            first = self._doc_rng(doc_no).random(1024)[0]  # what `document` draws first: its chunk count
            ids.extend(f"d{doc_no:07d}-c{p}" for p in range(1 + int(first * 7)))
            doc_no += 1
        return ids[:total]

    def query(self, rng: np.random.Generator) -> tuple[str, str | None]:
        """A query: 3-6 words of a random sentence's kind (English or Chinese), and a knowledge tag."""
        language = "zh" if rng.random() < 0.35 else "en"
        if language == "zh":
            picks = np.searchsorted(self._zh_cdf, rng.random(int(rng.integers(2, 4))) * 0.98)
            text = "".join(self.chinese[int(i)] for i in picks)
        else:
            picks = np.searchsorted(self._en_cdf, rng.random(int(rng.integers(3, 6))) * 0.98)
            text = " ".join(self.english[int(i)] for i in picks)
        return text, TAGS[int(np.searchsorted(self._tag_cdf, rng.random()))]


class HashEmbedder:
    """The benchmark's embedder: deterministic hashed-token vectors (see the module docstring). Duck-types the
    parts of app.models.Embedder that the store, the ingest pipeline and the chain use."""

    name = "bench-hash-384"
    dimension = DIM
    checksum = "0000000000000384"
    model_seconds = 0.0

    def __init__(self) -> None:
        self._vectors: dict[str, np.ndarray] = {}

    def identity(self) -> dict[str, Any]:
        return {"name": self.name, "dimension": self.dimension, "checksum": self.checksum}

    def _vector(self, token: str) -> np.ndarray:
        vector = self._vectors.get(token)
        if vector is None:
            rng = np.random.default_rng(zlib.crc32(token.encode("utf-8")))
            vector = rng.standard_normal(DIM).astype(np.float32)
            vector /= np.linalg.norm(vector)
            self._vectors[token] = vector
        return vector

    def embed(self, texts: list[str]) -> np.ndarray:
        from scipy import sparse

        rows: list[int] = []
        cols: list[int] = []
        vals: list[float] = []
        number: dict[str, int] = {}
        for row, text in enumerate(texts):
            counts: dict[str, int] = {}
            for token in _TOKENS.findall(text.lower()):
                counts[token] = counts.get(token, 0) + 1
            for token, count in counts.items():
                col = number.get(token)
                if col is None:
                    col = number[token] = len(number)
                rows.append(row)
                cols.append(col)
                vals.append(1.0 + math.log(count))
        basis = np.stack([self._vector(t) for t in number]) if number else np.zeros((1, DIM), np.float32)
        weights = sparse.csr_matrix(
            (np.asarray(vals, np.float32), (rows, cols)), shape=(len(texts), len(basis)), dtype=np.float32
        )
        out = np.asarray(weights @ basis, dtype=np.float32)
        norms = np.linalg.norm(out, axis=1)
        empty = norms == 0
        out[empty, 0] = 1.0
        norms[empty] = 1.0
        return out / norms[:, None]

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        return self.embed(texts)

    def embed_passages(self, texts: list[str], show_progress: bool = False, **_: Any) -> np.ndarray:
        return self.embed(texts)
