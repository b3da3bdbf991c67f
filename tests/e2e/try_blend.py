"""Try CacheBlend with kvd and a real vLLM (README: "CacheBlend").

Needs a kvd started with `--engine-type blend` on 127.0.0.1:PORT and the float32
SmolLM2-135M-Instruct checkpoint (tests/e2e/smollm2.py; `make e2e-smollm2`). Starts one vLLM
for CPUs with kvd_blend's KvdBlendConnector (recompute ratio 0.15, check layer 1), stores
three documents, each behind the same system prompt, then asks a question over the same
documents in another order: their KV is reused from kvd (re-rotated to the new positions) and
15% of their rows are recomputed. Prints the answer, the expected code and what kvd counted;
exits 0 when the documents were reused (scattered by kvd, blended by the model).
Run it with .venv-e2e/bin/python:

    tests/e2e/try_blend.py [--port 5555] [--http-port 8080] [--ratio 0.15]
"""

import argparse
import json
import random
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent / "bench"))
from e2e_harness import ServerAt, VllmProcess, vllm_settings  # noqa: E402
from smollm2 import default_out_dir  # noqa: E402


def main() -> int:
    import blend_quality as Q  # the synthetic documents of the quality bench  # noqa: PLC0415

    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=5555)
    ap.add_argument("--http-port", type=int, default=8080)
    ap.add_argument("--ratio", type=float, default=0.15)
    ap.add_argument("--model-dir", default=str(default_out_dir()))
    args = ap.parse_args()
    if not (Path(args.model_dir) / "config.json").exists():
        print(f"no checkpoint at {args.model_dir}: run .venv-e2e/bin/python tests/e2e/smollm2.py")
        return 2
    tok = Q.Tok(args.model_dir)
    rng = random.Random(7)
    system = Q.make_system(tok)
    docs = [Q.make_doc(tok, rng, 256) for _ in range(3)]
    target = docs[0]
    question = tok.ids(f"\nWhat is the access code of {target['who']}? Reply with the 4-digit code."
                       f"<|im_end|>\n<|im_start|>assistant\nThe access code of {target['who']} is")
    settings = vllm_settings(args.model_dir, 32, ServerAt(args.port), "lmcache_driven", heartbeat=10.0,
                             kv_cache_memory_bytes=512 << 20, connector_extra={"kvd.blend.enable": True,
                                              "kvd.blend.recompute_ratio": args.ratio})
    settings["connector"].update({"class": "KvdBlendConnector", "module": "kvd_blend.connector"})
    log = Path(tempfile.gettempdir()) / "kvd-try-blend.log"
    print(f"starting vLLM (log: {log}) ...", flush=True)
    with VllmProcess(settings, log) as p:
        for d in docs:  # each document behind the system prompt: stored in kvd
            p.generate([system + d["ids"]], max_tokens=1)
        time.sleep(1)  # stores are asynchronous
        p.reset_prefix_cache()
        prompt = system + docs[2]["ids"] + docs[1]["ids"] + docs[0]["ids"] + question
        t0 = time.monotonic()
        out, cached = p.generate([prompt], max_tokens=6)
        dt = time.monotonic() - t0
    answer = tok.text(out[0]).strip()
    print(f"prompt: {len(prompt)} tokens ({cached[0]} prefix tokens loaded), answered in {dt:.2f} s")
    print(f"answer: {answer!r}; expected {target['code']}")
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if "kvd_blend:" in ln]
    for ln in lines[-3:]:
        print("  " + ln[ln.index("kvd_blend:"):])
    with urllib.request.urlopen(f"http://127.0.0.1:{args.http_port}/metrics", timeout=10) as r:
        m = {ln.rsplit(" ", 1)[0]: ln.rsplit(" ", 1)[1] for ln in r.read().decode().splitlines()
             if ln.startswith(("lmcache_blend_retrieve_chunks_total", "lmcache_blend_scatter_tokens_total"))}
    print("kvd: " + json.dumps(m))
    if not answer.startswith(target["code"]):
        print("(a wrong code: at ratio 0.15 this 135M model often misses it, see docs/benchmarks.md, "
              "\"Quality\"; --ratio 1.0 recomputes every row and answers as a full prefill does)")
    # Success: the documents were reused (kvd scattered them and the model blended them).
    return 0 if any("kvd_blend: blended" in ln for ln in lines) and float(m.get(
        "lmcache_blend_retrieve_chunks_total", "0")) > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
