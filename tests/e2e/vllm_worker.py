"""One vLLM process (offline LLM API) driven over stdin/stdout by tests/e2e.

Started by VllmProcess (vllm_harness.py) as
    python vllm_worker.py '<settings json>'
It builds an `LLM` from the settings, prints `KVD-E2E {"ready": ...}`, then reads one
JSON command per line from stdin and answers each with one `KVD-E2E {...}` line on
stdout (vLLM's own logs go to the same streams; the prefix tells them apart):

    {"op": "generate", "prompts": [[token ids], ...], "max_tokens": 16}
        -> {"outputs": [[token ids], ...], "num_cached_tokens": [int, ...]}
    {"op": "reset_prefix_cache"}    -> {"ok": bool}
    {"op": "metrics"}               -> {"metrics": {name: value}} (counters and gauges)
    {"op": "exit"}

Settings: model (folder), block_size, kv_cache_memory_bytes, max_model_len, and
`connector`: null (no KV connector) or {"host", "port", "mode"} for LMCacheMPConnector
(mode: lmcache_driven | engine_driven | auto; optional "class" and "module" name another
connector class, e.g. KvdBlendConnector from kvd_blend.connector), plus `connector_extra` (more
kv_connector_extra_config keys), `kv_load_failure_policy` (recompute | fail) and
`engine_args` (more LLM keyword arguments).
"""

from __future__ import annotations

import json
import sys
import traceback

PREFIX = "KVD-E2E "


def reply(obj: dict) -> None:
    sys.stdout.write(PREFIX + json.dumps(obj) + "\n")
    sys.stdout.flush()


def build_llm(s: dict):
    from vllm import LLM

    kwargs = dict(
        model=s["model"],
        # float32 (model.py says why): "auto" would run the float32 checkpoint in bfloat16 on
        # CPU, and bfloat16 selects the AMX attention kernels where the CPU has them.
        dtype=s.get("dtype", "float32"),
        skip_tokenizer_init=True,
        enforce_eager=True,
        block_size=s["block_size"],
        max_model_len=s.get("max_model_len", 4096),
        max_num_seqs=s.get("max_num_seqs", 4),
        max_num_batched_tokens=s.get("max_num_batched_tokens", 4096),
        gpu_memory_utilization=0.5,
        kv_cache_memory_bytes=s.get("kv_cache_memory_bytes", 256 << 20),
        enable_prefix_caching=True,
        disable_log_stats=False,
        seed=0,
    )
    conn = s.get("connector")
    if conn is not None:
        extra = {
            "lmcache.mp.host": "tcp://" + conn["host"],
            "lmcache.mp.port": conn["port"],
            "lmcache.mp.mp_transfer_mode": conn["mode"],
        }
        extra.update(s.get("connector_extra", {}))
        kwargs["kv_transfer_config"] = {
            "kv_connector": conn.get("class", "LMCacheMPConnector"),
            "kv_role": "kv_both",
            "kv_connector_extra_config": extra,
            "kv_load_failure_policy": s.get("kv_load_failure_policy", "fail"),
        }
        if conn.get("module"):  # a connector of our own (kvd_blend.connector)
            kwargs["kv_transfer_config"]["kv_connector_module_path"] = conn["module"]
    kwargs.update(s.get("engine_args", {}))
    return LLM(**kwargs)


def metrics(llm) -> dict:
    out = {}
    for m in llm.get_metrics():
        if hasattr(m, "value") and isinstance(m.value, (int, float)):
            out[m.name] = out.get(m.name, 0) + m.value
    return out


def main() -> None:
    settings = json.loads(sys.argv[1])
    from vllm import SamplingParams

    llm = build_llm(settings)
    reply({"ready": True})
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        try:
            op = cmd["op"]
            if op == "generate":
                params = SamplingParams(temperature=0.0, max_tokens=cmd.get("max_tokens", 16),
                                        ignore_eos=True, detokenize=False)
                prompts = [{"prompt_token_ids": p} for p in cmd["prompts"]]
                outs = llm.generate(prompts, params, use_tqdm=False)
                reply({"outputs": [list(o.outputs[0].token_ids) for o in outs],
                       "num_cached_tokens": [o.num_cached_tokens for o in outs]})
            elif op == "reset_prefix_cache":
                reply({"ok": bool(llm.reset_prefix_cache())})
            elif op == "metrics":
                reply({"metrics": metrics(llm)})
            elif op == "exit":
                reply({"bye": True})
                break
            else:
                reply({"error": f"unknown op {op!r}"})
        except Exception as e:  # reported to the test, which fails with it
            reply({"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})


if __name__ == "__main__":
    main()
