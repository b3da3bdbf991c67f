"""CacheBlend end to end for kvd_blend's Qwen2 and Qwen3 classes (test_blend_vllm.py covers
Llama): random-weight Qwen2 (q/k/v biases) and Qwen3 (per-head q_norm/k_norm before RoPE)
checkpoints of model.py, the same documents and prompts as the Llama test.

Per architecture, one kvd --engine-type blend and one vLLM with the KvdBlendConnector at
recompute ratio 0.15: the documents are stored, the four prompts blended, and

- the plugin blended each prompt (its trace has the prompt's segments and fewer kept rows than
  rows; no fallback logged; kvd scattered every document);
- the rows kept at the check layer equal the float64 reference's HKVD choice (ties aside) and
  the greedy tokens equal the reference's blended tokens (blend_reference.py, which reads the
  biases and norms from the checkpoint).

No full-prefill vLLM runs (the reference is the truth, and each vLLM start costs a minute or
two). Offline, per architecture: the reference's prefill equals transformers' own float64
forward of the checkpoint (so the reference reads the biases and norms as the model does), and
the reference blended at ratio 1.0 equals its full prefill.
"""

from __future__ import annotations

import json

import pytest
import torch

from blend_reference import RefLlama
from model import ModelSpec, write_model
from test_blend_vllm import (CHUNK, EXPECTED_SEGMENTS, PROMPTS, _assert_kept_rows_and_tokens_match,
                             _blend_settings, _fallbacks, _locks_released, _reference, _run)

RATIO = 0.15


@pytest.fixture(scope="module", params=["qwen2", "qwen3"])
def arch(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def qwen_dir(arch, tmp_path_factory) -> str:
    return write_model(str(tmp_path_factory.mktemp(f"model-{arch}")), ModelSpec(arch=arch))


@pytest.fixture(scope="module")
def qwen_ref(qwen_dir) -> RefLlama:
    return RefLlama(qwen_dir)


@pytest.fixture(scope="module")
def blended(arch, qwen_dir, server_kind, start_server, start_vllm, logdir) -> dict:
    if server_kind != "kvd":
        pytest.skip("blend end to end runs against kvd (lmcache's blend server has no CPU scatter)")
    server = start_server(kind="kvd", extra_args=["--engine-type", "blend"])
    trace = logdir / f"blend-trace-{arch}-{RATIO}.jsonl"
    trace.unlink(missing_ok=True)
    v = start_vllm(_blend_settings(qwen_dir, server, RATIO), f"blend-{arch}-{RATIO}",
                   env={"KVD_BLEND_TRACE": str(trace)})
    try:
        outputs = _run(v, PROMPTS)
        metrics = server.metrics()
    finally:
        v.close()
    records = [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []
    log = v.log_path.read_text(errors="replace")
    _locks_released(server)
    server.stop()
    return {"outputs": outputs, "records": records, "metrics": metrics,
            "fallbacks": _fallbacks(v.log_path), "log": log}


def test_the_checkpoint_has_the_architecture_s_weights(arch, qwen_dir, qwen_ref):
    with open(f"{qwen_dir}/config.json") as f:
        c = json.load(f)
    assert c["architectures"] == [{"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch]]
    a = "model.layers.0.self_attn."
    if arch == "qwen2":
        assert qwen_ref.qkv_bias and not qwen_ref.qk_norm
        assert qwen_ref.w[a + "k_proj.bias"].abs().min() > 0
    else:
        assert qwen_ref.qk_norm and not qwen_ref.qkv_bias
        assert (qwen_ref.w[a + "k_norm.weight"] - 1).abs().max() > 0.1


def test_the_reference_prefill_equals_transformers_forward(arch, qwen_dir, qwen_ref):
    from transformers import AutoModelForCausalLM

    tokens = PROMPTS["one_doc"][:300]
    model = AutoModelForCausalLM.from_pretrained(qwen_dir, dtype=torch.float64).eval()
    with torch.no_grad():
        want = model(torch.tensor([tokens])).logits[0, -1]
    _, _, logits = qwen_ref.prefill(tokens)
    # transformers computes RoPE's frequencies in float32: ~1e-5 apart; a bias or norm left
    # out moves the logits by O(1).
    assert (logits - want).abs().max().item() < 1e-4 * max(1.0, want.abs().max().item())


def test_the_reference_itself_blends_to_full_prefill_at_ratio_one(qwen_ref):
    name = "two_docs_reordered"
    res, _ = _reference(qwen_ref, name, 0, 1.0)
    _, _, logits = qwen_ref.prefill(PROMPTS[name])
    assert (res.logits - logits).abs().max().item() < 1e-9
    assert res.kept == list(range(len(PROMPTS[name])))


def test_ratio_0_15_blends_and_keeps_the_reference_hkvd_rows(arch, blended, qwen_ref):
    r = blended
    assert not r["fallbacks"], r["fallbacks"]
    assert "kvd_blend: blended" in r["log"], "the blend-aware model class never blended"
    docs = sum(len(s) for s in EXPECTED_SEGMENTS.values())
    assert r["metrics"].get("lmcache_blend_retrieve_chunks_total", 0) == docs
    assert r["metrics"].get("lmcache_blend_scatter_tokens_total", 0) == docs * CHUNK
    _assert_kept_rows_and_tokens_match(r, qwen_ref, RATIO, partial=True)
