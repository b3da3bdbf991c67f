"""SmolLM2-135M-Instruct as a float32 checkpoint (smollm2.py): the GGUF reader, the block
decoders and the rope row order on hand-built data; then the converted checkpoint itself,
with transformers (a chat answer, a likelihood far better than uniform) and with vLLM for
CPUs (the same greedy tokens as transformers).

The checkpoint tests skip when the folder is absent (`make e2e` and
tests/e2e/setup_venv.sh build it: `python tests/e2e/smollm2.py`).
"""

from __future__ import annotations

import json
import math
import os
import struct

import numpy as np
import pytest

import smollm2
from smollm2 import GGUFError

CKPT = smollm2.default_out_dir()
needs_checkpoint = pytest.mark.skipif(
    not smollm2.is_complete(CKPT),
    reason=f"no SmolLM2 checkpoint at {CKPT}: run `.venv-e2e/bin/python tests/e2e/smollm2.py` "
           "(make e2e does)")

Q4_1, Q8_0, F32 = 3, 8, 0


def f16(x: float) -> float:
    """x rounded to float16, as a Python float."""
    return struct.unpack("<e", struct.pack("<e", x))[0]


# ---- (a) block decoders ---------------------------------------------------------------------

def q4_1_block(d: float, m: float, quants: list[int]) -> bytes:
    """One Q4_1 block: d, m (float16), then byte j = quants[j] | quants[j+16] << 4."""
    assert len(quants) == 32 and all(0 <= q < 16 for q in quants)
    return struct.pack("<ee", d, m) + bytes(quants[j] | quants[j + 16] << 4 for j in range(16))


def test_q4_1_block_decoder():
    quants_a = [(7 * j + 3) % 16 for j in range(32)]
    quants_b = [15 - j // 2 for j in range(32)]
    raw = q4_1_block(0.5, -1.25, quants_a) + q4_1_block(0.1, 0.3, quants_b)
    got = smollm2.dequantize(np.frombuffer(raw, np.uint8), Q4_1, 64)
    expected = [q * 0.5 - 1.25 for q in quants_a] + [q * f16(0.1) + f16(0.3) for q in quants_b]
    assert got.dtype == np.float32 and got.shape == (64,)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    # First block exactly: small multiples of 1/4.
    assert got[:4].tolist() == [3 * 0.5 - 1.25, 10 * 0.5 - 1.25, 1 * 0.5 - 1.25, 8 * 0.5 - 1.25]
    # Element 16 comes from the high nibble of byte 0.
    assert got[16] == quants_a[16] * 0.5 - 1.25


def test_q8_0_block_decoder():
    qs = [-128, -1, 0, 1, 127] + [(-1) ** j * j for j in range(27)]
    raw = struct.pack("<e", 0.25) + struct.pack("<32b", *qs)
    raw += struct.pack("<e", -0.003) + struct.pack("<32b", *reversed(qs))
    got = smollm2.dequantize(np.frombuffer(raw, np.uint8), Q8_0, 64)
    expected = [q * 0.25 for q in qs] + [q * f16(-0.003) for q in reversed(qs)]
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0)
    assert got[:5].tolist() == [-32.0, -0.25, 0.0, 0.25, 31.75]


def test_f32_decoder():
    vals = [1.5, -2.25, 3.0e-8, 65504.0]
    got = smollm2.dequantize(np.frombuffer(struct.pack("<4f", *vals), np.uint8), F32, 4)
    assert got.tolist() == [struct.unpack("<f", struct.pack("<f", v))[0] for v in vals]


def test_unsupported_type_is_a_clear_error():
    with pytest.raises(GGUFError, match=r"Q4_K \(12\) has no dequantiser.*Q4_1"):
        smollm2.dequantize(np.zeros(144, np.uint8), 12, 256)
    with pytest.raises(GGUFError, match="do not hold"):
        smollm2.dequantize(np.zeros(19, np.uint8), Q4_1, 32)


def test_rope_row_order():
    """GGUF stores q/k with each head's rotation pairs interleaved (rows 2i, 2i+1), for the
    GGML rope; HF pairs row i with i + head_dim/2 (rotate-half). After unpermuting, HF's rope
    on the unpermuted weights gives the attention scores GGML's rope gives on the GGUF ones."""
    rng = np.random.default_rng(0)
    n_heads, head_dim, hidden = 3, 8, 12
    half = head_dim // 2
    w_hf = rng.standard_normal((n_heads * head_dim, hidden))
    # GGUF row order, built row by row: GGUF row h*head_dim + 2i + j is HF row h*head_dim + j*half + i.
    w_gguf = np.empty_like(w_hf)
    for h in range(n_heads):
        for i in range(half):
            for j in range(2):
                w_gguf[h * head_dim + 2 * i + j] = w_hf[h * head_dim + j * half + i]
    np.testing.assert_array_equal(smollm2.unpermute_rope_rows(w_gguf, n_heads), w_hf)

    theta = 10000.0 ** (-np.arange(half) / half)

    def rope_interleaved(v, pos):   # pairs (2i, 2i+1), angle pos*theta_i
        out = v.copy()
        for i in range(half):
            c, s = math.cos(pos * theta[i]), math.sin(pos * theta[i])
            a, b = v[2 * i], v[2 * i + 1]
            out[2 * i], out[2 * i + 1] = a * c - b * s, a * s + b * c
        return out

    def rope_half(v, pos):          # pairs (i, i+half)
        out = v.copy()
        for i in range(half):
            c, s = math.cos(pos * theta[i]), math.sin(pos * theta[i])
            a, b = v[i], v[i + half]
            out[i], out[i + half] = a * c - b * s, a * s + b * c
        return out

    x_q, x_k = rng.standard_normal(hidden), rng.standard_normal(hidden)
    w_back = smollm2.unpermute_rope_rows(w_gguf, n_heads)
    for h in range(n_heads):
        rows = slice(h * head_dim, (h + 1) * head_dim)
        ggml = rope_interleaved(w_gguf[rows] @ x_q, 5) @ rope_interleaved(w_gguf[rows] @ x_k, 2)
        hf = rope_half(w_back[rows] @ x_q, 5) @ rope_half(w_back[rows] @ x_k, 2)
        assert ggml == pytest.approx(hf, rel=1e-9)


# ---- (b) GGUF reader on a file written here --------------------------------------------------

def _s(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def _kv(key: str, vtype: int, payload: bytes) -> bytes:
    return _s(key) + struct.pack("<I", vtype) + payload


def write_tiny_gguf(path, alignment: int | None = 64) -> dict:
    """A GGUF v3 with every scalar metadata type, arrays and three tensors (F32 [2 rows of
    3], Q4_1 [2 rows of 32], Q8_0 [32]) placed on `alignment`-byte boundaries (None: no
    general.alignment key, so the default 32). Returns what the file holds."""
    f32 = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    q41_quants = [[j % 16 for j in range(32)], [(5 * j) % 16 for j in range(32)]]
    q41 = q4_1_block(0.5, 1.0, q41_quants[0]) + q4_1_block(-0.25, 2.0, q41_quants[1])
    q41_values = np.array([[q * 0.5 + 1.0 for q in q41_quants[0]],
                           [q * -0.25 + 2.0 for q in q41_quants[1]]], np.float32)
    q80 = struct.pack("<e", 2.0) + struct.pack("<32b", *range(-16, 16))
    q80_values = np.arange(-16, 16, dtype=np.float32) * 2.0
    tensors = [  # name, GGUF dims (contiguous first), type, bytes
        ("a.weight", (3, 2), F32, f32.tobytes()),
        ("b.weight", (32, 2), Q4_1, q41),
        ("c.weight", (32,), Q8_0, q80),
    ]
    entries = [_kv("general.architecture", 8, _s("tiny"))]
    if alignment is not None:
        entries.append(_kv("general.alignment", 4, struct.pack("<I", alignment)))
    else:
        alignment = 32
    entries += [
        _kv("t.u8", 0, struct.pack("<B", 200)),
        _kv("t.i8", 1, struct.pack("<b", -100)),
        _kv("t.u16", 2, struct.pack("<H", 60000)),
        _kv("t.i16", 3, struct.pack("<h", -30000)),
        _kv("t.i32", 5, struct.pack("<i", -2_000_000_000)),
        _kv("t.f32", 6, struct.pack("<f", 0.5)),
        _kv("t.bool", 7, struct.pack("<?", True)),
        _kv("t.u64", 10, struct.pack("<Q", 2**63 + 5)),
        _kv("t.i64", 11, struct.pack("<q", -(2**62))),
        _kv("t.f64", 12, struct.pack("<d", 1e-300)),
        _kv("t.ints", 9, struct.pack("<IQ", 5, 3) + struct.pack("<3i", 7, -8, 9)),
        _kv("t.strs", 9, struct.pack("<IQ", 8, 3) + _s("a b") + _s("") + _s("Ġé")),
        _kv("t.nested", 9, struct.pack("<IQ", 9, 2) + struct.pack("<IQ", 7, 2) + b"\x01\x00"
            + struct.pack("<IQ", 7, 1) + b"\x01"),
    ]
    meta, n_kv = b"".join(entries), len(entries)
    infos = b""
    offset = 0
    data = b""
    for name, dims, ggml_type, raw in tensors:
        pad = (-offset) % alignment
        data += b"\0" * pad
        offset += pad
        infos += _s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        infos += struct.pack("<IQ", ggml_type, offset)
        data += raw
        offset += len(raw)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), n_kv) + meta + infos
    head += b"\0" * ((-len(head)) % alignment)
    with open(path, "wb") as f:
        f.write(head + data)
    return {"data_offset": len(head), "a.weight": f32, "b.weight": q41_values,
            "c.weight": q80_values}


def test_gguf_reader(tmp_path):
    path = tmp_path / "tiny.gguf"
    want = write_tiny_gguf(path, alignment=64)
    g = smollm2.read_gguf(path)
    try:
        assert g.version == 3 and g.alignment == 64 and g.data_offset == want["data_offset"]
        assert g.data_offset % 64 == 0
        m = g.metadata
        assert m["general.architecture"] == "tiny"
        assert (m["t.u8"], m["t.i8"], m["t.u16"], m["t.i16"], m["t.i32"]) == (
            200, -100, 60000, -30000, -2_000_000_000)
        assert m["t.f32"] == 0.5 and m["t.bool"] is True and m["t.f64"] == 1e-300
        assert m["t.u64"] == 2**63 + 5 and m["t.i64"] == -(2**62)
        assert m["t.ints"] == [7, -8, 9]
        assert m["t.strs"] == ["a b", "", "Ġé"]
        assert m["t.nested"] == [[True, False], [True]]
        assert g.metadata_types["t.strs"] == "array" and g.metadata_types["t.u16"] == "uint16"
        assert list(g.tensors) == ["a.weight", "b.weight", "c.weight"]
        assert g.tensors["b.weight"].dims == (32, 2) and g.tensors["b.weight"].shape == (2, 32)
        assert [t.offset % 64 for t in g.tensors.values()] == [0, 0, 0]
        assert g.tensors["b.weight"].nbytes == 40 and g.tensors["c.weight"].nbytes == 34
        for name in ("a.weight", "b.weight", "c.weight"):
            got = g.tensor(name)
            assert got.dtype == np.float32 and got.shape == want[name].shape, name
            np.testing.assert_array_equal(got, want[name], err_msg=name)
    finally:
        g.close()


def test_gguf_reader_default_alignment_and_errors(tmp_path):
    want = write_tiny_gguf(tmp_path / "noalign.gguf", alignment=None)
    g = smollm2.read_gguf(tmp_path / "noalign.gguf")
    try:
        assert g.alignment == 32 and "general.alignment" not in g.metadata
        assert g.data_offset == want["data_offset"] and g.data_offset % 32 == 0
        np.testing.assert_array_equal(g.tensor("c.weight"), want["c.weight"])
    finally:
        g.close()

    write_tiny_gguf(tmp_path / "tiny.gguf")
    raw = (tmp_path / "tiny.gguf").read_bytes()
    (tmp_path / "bad.gguf").write_bytes(b"GGML" + raw[4:])
    with pytest.raises(GGUFError, match="not a GGUF file"):
        smollm2.read_gguf(tmp_path / "bad.gguf")
    (tmp_path / "v1.gguf").write_bytes(raw[:4] + struct.pack("<I", 1) + raw[8:])
    with pytest.raises(GGUFError, match="version 1"):
        smollm2.read_gguf(tmp_path / "v1.gguf")
    (tmp_path / "short.gguf").write_bytes(raw[:len(raw) - 10])
    with pytest.raises(GGUFError, match="past the end"):
        smollm2.read_gguf(tmp_path / "short.gguf")
    (tmp_path / "cut.gguf").write_bytes(raw[:100])
    with pytest.raises(GGUFError, match="truncated"):
        smollm2.read_gguf(tmp_path / "cut.gguf")


# ---- (c) the checkpoint with transformers -----------------------------------------------------

CHAT_PROMPTS = ["What is the capital of France?", "Name three primary colors."]
PLAIN_TEXT = ("The quick brown fox jumps over the lazy dog. It was a sunny day, and the "
              "children were playing in the park.")


@pytest.fixture(scope="module")
def hf():
    """(tokenizer, model) of the checkpoint, float32 on the CPU."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(CKPT))
    model = AutoModelForCausalLM.from_pretrained(str(CKPT), dtype=torch.float32)
    model.eval()
    return tok, model


def chat_ids(tok, question: str) -> list[int]:
    text = tok.apply_chat_template([{"role": "user", "content": question}],
                                   add_generation_prompt=True, tokenize=False)
    return tok(text, add_special_tokens=False)["input_ids"]


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    """n greedy tokens (no stop at EOS, like vLLM with ignore_eos)."""
    import torch

    out, past = [], None
    x = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            r = model(input_ids=x, past_key_values=past, use_cache=True)
            past = r.past_key_values
            nxt = int(r.logits[0, -1].argmax())
            out.append(nxt)
            x = torch.tensor([[nxt]])
    return out


@needs_checkpoint
def test_config_matches_the_gguf():
    cfg = json.loads((CKPT / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["head_dim"], cfg["vocab_size"]) == (
        30, 576, 9, 3, 64, 49152)
    assert cfg["rope_theta"] == 100000.0 and cfg["rms_norm_eps"] == 1e-5
    assert cfg["tie_word_embeddings"] is True
    tcfg = json.loads((CKPT / "tokenizer_config.json").read_text())
    assert (tcfg["bos_token"], tcfg["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    assert "<|im_start|>" in tcfg["chat_template"]
    try:
        gguf = smollm2.find_gguf()
    except FileNotFoundError:
        return
    g = smollm2.read_gguf(gguf)
    try:
        assert smollm2.llama_config(g) == cfg
    finally:
        g.close()


@needs_checkpoint
def test_conversion_is_idempotent():
    try:
        gguf = smollm2.find_gguf()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    before = {f: os.stat(CKPT / f).st_mtime_ns for f in smollm2.OUTPUT_FILES}
    smollm2.convert(gguf, CKPT)
    assert {f: os.stat(CKPT / f).st_mtime_ns for f in smollm2.OUTPUT_FILES} == before


@needs_checkpoint
def test_tokenizer(hf):
    tok, _ = hf
    ids = tok("Hello world 2024!", add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["Hello", "Ġworld", "Ġ", "2", "0", "2", "4", "!"]
    assert tok.decode(ids) == "Hello world 2024!"
    ids = chat_ids(tok, "Hi")
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") == 1
    assert tok.decode(ids).endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.eos_token_id == 2


@needs_checkpoint
def test_transformers_answers_a_chat_prompt(hf):
    tok, model = hf
    ids = chat_ids(tok, CHAT_PROMPTS[0])
    out = hf_greedy(model, ids, 12)
    answer = tok.decode(out)
    assert "Paris" in answer, answer


@needs_checkpoint
def test_transformers_likelihood_far_better_than_uniform(hf):
    import torch

    tok, model = hf
    ids = torch.tensor([tok(PLAIN_TEXT)["input_ids"]])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, :-1].double(), dim=-1)
    mean = logp.gather(1, ids[0, 1:, None]).mean().item()
    uniform = -math.log(model.config.vocab_size)  # -10.8
    # The float32 checkpoint gives about -3.1 nats per token here.
    assert mean > -5.0, (mean, uniform)


# ---- (d) vLLM for CPUs: the same greedy tokens ------------------------------------------------

VLLM_TOKENS = 12
VLLM_MATCH = 8


@needs_checkpoint
def test_vllm_greedy_equals_transformers(hf, start_vllm):
    from e2e_harness import vllm_settings

    tok, model = hf
    prompts = [chat_ids(tok, q) for q in CHAT_PROMPTS]
    prompts.append(tok("The largest planet in the solar system is")["input_ids"])
    expected = [hf_greedy(model, p, VLLM_TOKENS) for p in prompts]
    settings = vllm_settings(str(CKPT), 32, kv_cache_memory_bytes=64 << 20, max_model_len=1024,
                             engine_args={"skip_tokenizer_init": False})
    vllm = start_vllm(settings, "smollm2")
    got, _ = vllm.generate(prompts, VLLM_TOKENS)
    vllm.close()
    for p, e, g in zip(prompts, expected, got):
        assert g[:VLLM_MATCH] == e[:VLLM_MATCH], (tok.decode(p[-8:]), tok.decode(e), tok.decode(g))
