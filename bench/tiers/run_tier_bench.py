#!/usr/bin/env python3
"""Tier throughput, side by side in one run (docs/benchmarks.md, "Tiers"):

  disk:  raw sequential write/read of the directory (kvd-tier-bench, one thread)
         kvd's fs tier store / load (kvd-tier-bench, W workers)
         lmcache 0.5.6's fs_native connector (its own native client, W workers)
  redis: redis-benchmark SET / GET of the same value size (W connections)
         kvd's resp tier store / load (W workers)
         lmcache 0.5.6's resp connector (its own native client, W workers)

Same object size and count everywhere (default: one MiniMax-M3 TP=8 rank's chunk,
11,599,872 B rounded down to 4 KiB, 48 objects). Page cache warm for reads, as a tier read
right after its write is. Prints JSON lines and a markdown table with ratios.

  python3 bench/tiers/run_tier_bench.py --build-dir build --venv .venv [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LMCACHE_SNIPPET = r'''
import json, os, select, sys, time
kind, arg, n, size, workers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
if kind == "fs_native":
    from lmcache.lmcache_fs import LMCacheFSClient
    c = LMCacheFSClient(arg, workers, "", False, 0)
else:
    from lmcache.lmcache_redis import LMCacheRedisClient
    host, port = arg.rsplit(":", 1)
    c = LMCacheRedisClient(host, int(port), workers, "", "")
bufs = [bytearray(os.urandom(1 << 20) * (size >> 20)) + bytearray(size - (size >> 20 << 20)) for _ in range(n)]
keys = [f"bench/lm@08000800@0@{i:064x}" for i in range(n)]
def wait(fid):
    while True:
        select.select([c.event_fd()], [], [], 1.0)
        for f, ok, err, res in c.drain_completions():
            if f == fid:
                return ok, res
t0 = time.perf_counter(); ok, res = wait(c.submit_batch_set(keys, [memoryview(b) for b in bufs])); t1 = time.perf_counter()
print(json.dumps({"what": f"lmcache_{kind}_store", "bytes": n * size, "seconds": t1 - t0, "gb_per_s": n * size / (t1 - t0) / 1e9, "ok": ok}))
outs = [bytearray(size) for _ in range(n)]
t0 = time.perf_counter(); ok, res = wait(c.submit_batch_get(keys, [memoryview(b) for b in outs])); t1 = time.perf_counter()
good = sum(1 for a, b in zip(bufs, outs) if a == b)
print(json.dumps({"what": f"lmcache_{kind}_load", "bytes": n * size, "seconds": t1 - t0, "gb_per_s": n * size / (t1 - t0) / 1e9, "ok": ok, "byte_exact": good}))
c.close()
'''


def run_json(cmd, env=None) -> list[dict]:
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if out.returncode != 0:
        print(out.stdout, out.stderr, file=sys.stderr)
        raise SystemExit(f"failed: {' '.join(cmd[:3])}")
    rows = []
    for line in out.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
    return rows


def redis_benchmark(port: int, n: int, size: int, workers: int) -> list[dict]:
    rows = []
    for test in ("set", "get"):
        out = subprocess.run(["redis-benchmark", "-p", str(port), "-t", test, "-n", str(n),
                              "-d", str(size), "-c", str(workers), "-q"],
                             capture_output=True, text=True, timeout=900).stdout
        m = re.search(r"([0-9.]+) requests per second", out.replace("\r", "\n"))
        rps = float(m.group(1)) if m else 0.0
        rows.append({"what": f"redis_benchmark_{test}", "bytes": n * size, "seconds": n / rps if rps else 0,
                     "gb_per_s": rps * size / 1e9})
    return rows


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds (/proc/PID/stat)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--venv", default=".venv")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--objects", type=int, default=48)
    ap.add_argument("--object-bytes", type=int, default=11599872 // 4096 * 4096)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    n, size, w = a.objects, a.object_bytes, a.workers
    load = os.getloadavg()
    print(f"# uptime load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {os.cpu_count()} CPUs; "
          f"{n} objects of {size} B, {w} workers", flush=True)
    work = tempfile.mkdtemp(prefix="kvd-tier-bench-", dir=a.dir)
    port = free_port()
    rdir = tempfile.mkdtemp(prefix="kvd-bench-redis-")
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", rdir, "--protected-mode", "no",
                              "--loglevel", "warning"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    py = os.path.join(a.venv, "bin", "python")
    rows: list[dict] = []
    try:
        for _ in range(100):
            if subprocess.run(["redis-cli", "-p", str(port), "PING"], capture_output=True,
                              text=True).stdout.strip() == "PONG":
                break
            time.sleep(0.05)
        bench = os.path.join(a.build_dir, "kvd-tier-bench")
        # redis-server's CPU over each client's Redis store + load: how close to its one
        # thread's limit each client drives it.
        cpu0 = proc_cpu_seconds(redis.pid)
        rows += run_json([bench, "--dir", work, "--redis", f"127.0.0.1:{port}", "--objects", str(n),
                          "--object-mib", str(size / (1 << 20)), "--workers", str(w)])
        redis_cpu = {"kvd": proc_cpu_seconds(redis.pid) - cpu0}
        subprocess.run(["redis-cli", "-p", str(port), "FLUSHALL"], capture_output=True)
        env = dict(os.environ, LMCACHE_LOG_LEVEL="ERROR", LMCACHE_TRACK_USAGE="false",
                   LMCACHE_DISABLE_BANNER="1")
        lmdir = os.path.join(work, "lmcache")
        os.makedirs(lmdir)
        rows += run_json([py, "-c", LMCACHE_SNIPPET, "fs_native", lmdir, str(n), str(size), str(w)], env)
        cpu0 = proc_cpu_seconds(redis.pid)
        rows += run_json([py, "-c", LMCACHE_SNIPPET, "resp", f"127.0.0.1:{port}", str(n), str(size), str(w)], env)
        redis_cpu["lmcache"] = proc_cpu_seconds(redis.pid) - cpu0
        subprocess.run(["redis-cli", "-p", str(port), "FLUSHALL"], capture_output=True)
        rows += redis_benchmark(port, n, size, w)
    finally:
        os.killpg(redis.pid, 15)
        redis.wait(10)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(rdir, ignore_errors=True)
    for r in rows:
        print(json.dumps(r))
    g = {r["what"]: r["gb_per_s"] for r in rows}

    def line(name, kvd, raw, lm):
        return (f"| {name} | {g[kvd]:.2f} | {g[raw]:.2f} | {g[kvd] / g[raw]:.0%} | {g[lm]:.2f} | "
                f"{g[kvd] / g[lm]:.2f}x |")

    print()
    print("| tier, direction | kvd GB/s | raw GB/s | kvd / raw | lmcache GB/s | kvd / lmcache |")
    print("|---|---|---|---|---|---|")
    print(line("disk store (fs)", "kvd_fs_store", "raw_sequential_write", "lmcache_fs_native_store"))
    print(line("disk prefetch (fs)", "kvd_fs_load", "raw_sequential_read", "lmcache_fs_native_load"))
    print(line("redis store (resp)", "kvd_resp_store", "redis_benchmark_set", "lmcache_resp_store"))
    print(line("redis prefetch (resp)", "kvd_resp_load", "redis_benchmark_get", "lmcache_resp_load"))
    secs = {r["what"]: r["seconds"] for r in rows}
    print()
    for who in ("kvd", "lmcache"):
        busy = secs[f"{who}_resp_store"] + secs[f"{who}_resp_load"]
        print(f"redis-server CPU during {who}'s Redis store + load: {redis_cpu[who]:.2f} s in "
              f"{busy:.2f} s = {redis_cpu[who] / busy:.0%} of its one thread")
        rows.append({"what": f"redis_server_cpu_during_{who}", "cpu_seconds": redis_cpu[who],
                     "busy_seconds": busy})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
