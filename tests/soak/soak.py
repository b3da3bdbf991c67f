#!/usr/bin/env python3
"""kvd soak test: TP=8 deployments hammering a kvd whose L1 is far smaller than the data.

    tests/soak/soak.py --kvd build/kvd --seconds 300 [--clusters 2] [--l1-mb 64]

What runs (loopback only, bounded by --seconds plus fixed timeouts):

* one kvd on 127.0.0.1 with a small L1 (--l1-mb) and, when the binary has it, its HTTP
  /status endpoint (used for the server-side figures);
* --clusters client processes, each a vLLM-like deployment made of the *real* lmcache 0.5.6
  adapters (tests/integration/kvd_harness.TPCluster): one scheduler adapter and 8 worker
  adapters (TP=8), lmcache_driven, KV caches in CPU shared memory (CpuShm tensors);
* every client loops over vLLM requests drawn from prompt families that share prefixes (and
  share them across clients): LOOKUP -> (if hit) RETRIEVE the hit prefix into zeroed blocks
  and compare every byte against the expected per-chunk pattern -> fill and STORE the rest ->
  END_SESSION. A chunk's bytes (per rank, per layer) are a function of its token prefix, so
  a byte served for the wrong chunk, rank, layer or position is counted in wrong_bytes.

Pass criteria (exit status 1 otherwise): wrong bytes 0; no crash (kvd alive to the end, exits
0 on SIGTERM, every client exits 0); no retrieve failing after its lookup hit; locks left at
the end 0 (/status: locked_entries, pinned_objects, staging_objects; without /status a
black-box probe: after a full L1 of new chunks has been stored, no old chunk may still hit,
which only a leaked lock could explain); kvd's anonymous RSS growth bounded (--max-rss-growth-mb);
nothing left in /dev/shm.

The report (printed, and written as JSON with --report) has: requests done (vLLM requests and
wire requests), bytes moved, evictions (server-side from /status; client-visible re-stores),
wrong bytes, crashes, kvd RSS at start / peak / end, locks left, latency percentiles.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

import faults_util as FU  # noqa: E402
import kvd_harness as H  # noqa: E402

MODEL = "soak-model"
TP = 8
BLOCK = 16
CHUNK = 256
BLOCKS_PER_CHUNK = CHUNK // BLOCK
MAX_CHUNKS = 8                          # per prompt
STORE_REGION = 0                        # blocks [0, 128) hold what is stored
LOAD_REGION = MAX_CHUNKS * BLOCKS_PER_CHUNK  # blocks [128, 256) receive retrieves
SHAPE = H.ModelShape(num_layers=2, num_blocks=2 * MAX_CHUNKS * BLOCKS_PER_CHUNK,
                     block_size=BLOCK, num_kv_heads=1, head_size=64)
# bytes of one (chunk, rank) object: K and V, layers, tokens, heads x head size, bf16
OBJECT_BYTES = 2 * SHAPE.num_layers * CHUNK * SHAPE.num_kv_heads * SHAPE.head_size * 2


# ---------------------------------------------------------------------------------------
# Workload: prompt families with shared prefixes; per-chunk expected bytes
# ---------------------------------------------------------------------------------------


def family_prompt(family: int, variant: int, rng_tail: int) -> list[int]:
    """Family prefix (2..4 chunks) + variant tail (1..3 chunks) + a partial chunk."""
    pre_chunks = 2 + family % 3
    tail_chunks = 1 + variant % 3
    base = 1_000 + family * 100_003
    prefix = [(base + i * 7) % 60_000 + 1 for i in range(pre_chunks * CHUNK)]
    vbase = 7_000_000 + family * 9_973 + variant * 104_729
    tail = [(vbase + i * 13) % 60_000 + 1 for i in range(tail_chunks * CHUNK)]
    partial = [(vbase + 31 * i) % 60_000 + 1 for i in range(rng_tail % CHUNK)]
    return (prefix + tail)[: MAX_CHUNKS * CHUNK] + partial


def chunk_seed(tokens: list[int], chunk: int) -> int:
    """A 62-bit value determined by the token prefix ending with `chunk`."""
    h = hashlib.blake2b(digest_size=8)
    h.update(b"".join(t.to_bytes(4, "little") for t in tokens[: (chunk + 1) * CHUNK]))
    return int.from_bytes(h.digest(), "little") >> 2


class Patterns:
    """Expected int16 contents of one chunk's blocks, per (seed, rank, layer)."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        n = 2 * BLOCKS_PER_CHUNK * BLOCK * SHAPE.num_kv_heads * SHAPE.head_size
        self.base = torch.arange(n, dtype=torch.int64) * 0x9E3779B1
        self.cache: dict[tuple[int, int, int], object] = {}

    def get(self, seed: int, rank: int, layer: int):
        k = (seed, rank, layer)
        p = self.cache.get(k)
        if p is None:
            mix = (seed ^ (rank << 40) ^ (layer << 50)) & ((1 << 62) - 1)
            p = (((self.base + mix) >> 13) & 0x7FFF).to(self.torch.int16).view(
                2, BLOCKS_PER_CHUNK, BLOCK, SHAPE.num_kv_heads, SHAPE.head_size)
            if len(self.cache) > 4096:
                self.cache.clear()
            self.cache[k] = p
        return p


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


# ---------------------------------------------------------------------------------------
# One client process: a scheduler + 8 workers
# ---------------------------------------------------------------------------------------


def run_client(url: str, seconds: float, index: int, families: int, variants: int,
               mq_timeout: float) -> dict:
    import torch

    rng = random.Random(1000 + index)
    pat = Patterns()
    st = {
        "client": index, "requests": 0, "wire_requests": 0, "lookups_hit_chunks": 0,
        "stored_chunks_sent": 0, "retrieved_chunks": 0, "bytes_stored": 0,
        "bytes_retrieved": 0, "wrong_bytes": 0, "wrong_chunks": 0, "store_failures": 0,
        "retrieve_failures": 0, "restored_chunks": 0, "errors": [],
        "lat_ms": {"lookup": [], "store": [], "retrieve": []},
    }
    stored_seeds: set[int] = set()
    cluster = H.TPCluster(url, "lmcache_driven", MODEL, tp=TP, shape=SHAPE,
                          mq_timeout=mq_timeout, heartbeat_interval=5.0, seed=index)
    try:
        views = [list(cluster.kv[r].values()) for r in range(TP)]  # per rank: layer tensors

        def blocks(region: int, first_chunk: int, n_chunks: int):
            b0 = region + first_chunk * BLOCKS_PER_CHUNK
            return b0, b0 + n_chunks * BLOCKS_PER_CHUNK

        deadline = time.monotonic() + seconds
        i = 0
        while time.monotonic() < deadline:
            fam = rng.randrange(families)
            toks = family_prompt(fam, rng.randrange(variants), rng.randrange(1 << 16))
            n_full = len(toks) // CHUNK
            seeds = [chunk_seed(toks, c) for c in range(n_full)]
            rid = f"soak-{index}-{i}"
            i += 1

            t = time.monotonic()
            hit_tokens = cluster.lookup(rid, toks)
            st["lat_ms"]["lookup"].append(1e3 * (time.monotonic() - t))
            st["wire_requests"] += 2  # lookup + query_prefetch_status (at least)
            if hit_tokens % CHUNK or hit_tokens > n_full * CHUNK:
                st["errors"].append(f"{rid}: lookup returned {hit_tokens} of {len(toks)} tokens")
                hit_tokens = 0
            h = hit_tokens // CHUNK
            st["lookups_hit_chunks"] += h
            expected_prefix = 0
            while expected_prefix < n_full and seeds[expected_prefix] in stored_seeds:
                expected_prefix += 1

            if h > 0:
                lo, hi = blocks(LOAD_REGION, 0, h)
                for r in range(TP):
                    for tns in views[r]:
                        tns[:, lo:hi].view(torch.int16).zero_()
                t = time.monotonic()
                ok = cluster.retrieve(rid, toks, list(range(lo, hi)), end=h * CHUNK)
                st["lat_ms"]["retrieve"].append(1e3 * (time.monotonic() - t))
                st["wire_requests"] += TP
                if not all(ok):
                    st["retrieve_failures"] += 1
                    st["errors"].append(f"{rid}: retrieve of {h} hit chunk(s) failed: {ok}")
                else:
                    st["retrieved_chunks"] += h
                    st["bytes_retrieved"] += h * TP * OBJECT_BYTES
                    for c in range(h):
                        b0 = lo + c * BLOCKS_PER_CHUNK
                        bad_chunk = False
                        for r in range(TP):
                            for layer, tns in enumerate(views[r]):
                                got = tns[:, b0:b0 + BLOCKS_PER_CHUNK].view(torch.int16)
                                want = pat.get(seeds[c], r, layer)
                                if not torch.equal(got, want):
                                    st["wrong_bytes"] += 2 * int((got != want).sum())
                                    bad_chunk = True
                        if bad_chunk:
                            st["wrong_chunks"] += 1
                            if len(st["errors"]) < 20:
                                st["errors"].append(f"{rid}: chunk {c} came back with wrong bytes")

            if h < n_full:
                lo, hi = blocks(STORE_REGION, h, n_full - h)
                for c in range(h, n_full):
                    b0 = STORE_REGION + c * BLOCKS_PER_CHUNK
                    for r in range(TP):
                        for layer, tns in enumerate(views[r]):
                            tns[:, b0:b0 + BLOCKS_PER_CHUNK].view(torch.int16).copy_(
                                pat.get(seeds[c], r, layer))
                t = time.monotonic()
                ok = cluster.store(rid, toks, list(range(lo, hi)), start=h * CHUNK,
                                   end=n_full * CHUNK)
                st["lat_ms"]["store"].append(1e3 * (time.monotonic() - t))
                st["wire_requests"] += TP
                if all(ok):
                    st["stored_chunks_sent"] += n_full - h
                    st["bytes_stored"] += (n_full - h) * TP * OBJECT_BYTES
                    for c in range(h, n_full):
                        if seeds[c] in stored_seeds and c < expected_prefix:
                            st["restored_chunks"] += 1
                        stored_seeds.add(seeds[c])
                else:
                    st["store_failures"] += 1
            cluster.end_session(rid)
            st["wire_requests"] += 1
            st["requests"] += 1
    except Exception as exc:  # reported, and the client exits non-zero
        st["errors"].append(f"client {index}: {type(exc).__name__}: {exc}")
        st["exception"] = True
    finally:
        cluster.close()
    lat = st.pop("lat_ms")
    st["latency_ms"] = {op: {"n": len(v), "p50": round(percentile(v, 0.5), 2),
                             "p99": round(percentile(v, 0.99), 2),
                             "max": round(max(v) if v else 0.0, 2)} for op, v in lat.items()}
    return st


# ---------------------------------------------------------------------------------------
# The driver: kvd, clients, measurements
# ---------------------------------------------------------------------------------------


def proc_status(pid: int) -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "RssAnon", "RssShmem", "VmHWM", "Threads"):
                    out[k] = int(v.split()[0])
    except OSError:
        pass
    return out


def http_status(port: int | None) -> dict | None:
    if not port:
        return None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as r:
            return json.loads(r.read())
    except Exception:
        return None


def kvd_has_http(binary: str) -> bool:
    try:
        out = subprocess.run([binary, "server", "--help"], capture_output=True, text=True,
                             timeout=30)
        return "--http-port" in out.stdout + out.stderr
    except Exception:
        return False


def blackbox_lock_probe(url: str, l1_chunks: int, old_prompts: list[list[int]],
                        mq_timeout: float) -> int:
    """Old chunks still hitting after a full L1 of newer chunks was stored: leaked locks."""
    c = H.TPCluster(url, "lmcache_driven", MODEL, tp=TP, shape=SHAPE, mq_timeout=mq_timeout,
                    seed=99)
    try:
        n = 0
        while n < l1_chunks + 8:
            toks = H.unique_tokens(MAX_CHUNKS * CHUNK)
            blocks = list(range(0, MAX_CHUNKS * BLOCKS_PER_CHUNK))
            c.store(f"flush-{n}", toks, blocks)
            c.end_session(f"flush-{n}")
            n += MAX_CHUNKS
        return sum(c.probe(p) // CHUNK for p in old_prompts)
    finally:
        c.close()


def main() -> int:
    ap = argparse.ArgumentParser(description="kvd soak test (TP=8, small L1)")
    ap.add_argument("--kvd", default=str(H.DEFAULT_KVD_BIN))
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--clusters", type=int, default=2, help="client processes (TP=8 each)")
    ap.add_argument("--l1-mb", type=int, default=64)
    ap.add_argument("--families", type=int, default=24)
    ap.add_argument("--variants", type=int, default=6)
    ap.add_argument("--max-rss-growth-mb", type=float, default=256)
    ap.add_argument("--report", type=Path, help="also write the report here (JSON)")
    ap.add_argument("--tsan", action="store_true",
                    help="kvd is a ThreadSanitizer build: one client, long timeouts, no RSS "
                         "bound (TSan's shadow memory is anonymous RSS)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--mq-timeout", type=float, default=60.0, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        res = run_client(args.url, args.seconds, args.index, args.families, args.variants,
                         args.mq_timeout)
        print("SOAK-RESULT " + json.dumps(res), flush=True)
        return 1 if res.get("exception") else 0

    if args.tsan:
        args.clusters = 1
        args.mq_timeout = 240.0
    binary = str(Path(args.kvd).resolve())
    if not Path(binary).exists():
        print(f"soak: kvd binary {binary} not found", file=sys.stderr)
        return 2
    os.environ["KVD_TEST_KVD_BIN"] = binary
    logdir = Path(os.environ.get("KVD_SOAK_LOGDIR", REPO / "build" / "soak"))
    logdir.mkdir(parents=True, exist_ok=True)
    port = H.free_port()
    extra = []
    if kvd_has_http(binary) and not FU.harness_sets_http_port("kvd"):
        extra = ["--http-host", "127.0.0.1", "--http-port", str(H.free_port())]
    srv = H.ServerProc(kind="kvd", port=port, l1_size_gb=args.l1_mb / 1024.0,
                       log_path=logdir / f"kvd-{port}.log", extra_args=extra)
    shm_before = set(os.listdir("/dev/shm"))
    t_start = time.monotonic()
    srv.start(ready_timeout=120)
    pid = srv.proc.pid
    http_port = FU.http_port_of(pid)
    rss = {"start": proc_status(pid)}
    peak = dict(rss["start"])
    stop_sampling = threading.Event()
    kvd_died = threading.Event()

    def sample() -> None:
        while not stop_sampling.wait(1.0):
            s = proc_status(pid)
            if not s:
                kvd_died.set()
                return
            for k, v in s.items():
                peak[k] = max(peak.get(k, 0), v)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    clients = []
    for i in range(args.clusters):
        cmd = [sys.executable, __file__, "--child", "--url", srv.url, "--index", str(i),
               "--seconds", str(args.seconds), "--families", str(args.families),
               "--variants", str(args.variants), "--mq-timeout", str(args.mq_timeout)]
        clients.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, start_new_session=True))
    results, client_crashes, notes = [], 0, []
    hang_limit = args.seconds + 3 * args.mq_timeout + 120
    for i, p in enumerate(clients):
        try:
            out, err = p.communicate(timeout=max(1.0, hang_limit - (time.monotonic() - t_start)))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            notes.append(f"client {i} hung and was killed")
        line = [ln for ln in out.splitlines() if ln.startswith("SOAK-RESULT ")]
        if p.returncode != 0 or not line:
            client_crashes += 1
            notes.append(f"client {i} exited {p.returncode}: {err.strip()[-1500:]}")
        if line:
            results.append(json.loads(line[-1][len("SOAK-RESULT "):]))

    status_end = http_status(http_port)
    rss["end"] = proc_status(pid)
    locks_left = None
    if status_end and "l1" in status_end:
        l1 = status_end["l1"]
        locks_left = int(l1.get("locked_entries", 0)) + int(l1.get("pinned_objects", 0)) + \
            int(l1.get("staging_objects", 0))
    elif srv.alive():
        old = [family_prompt(f, v, 0) for f in range(args.families) for v in range(args.variants)]
        try:
            locks_left = blackbox_lock_probe(srv.url, args.l1_mb * (1 << 20) // (OBJECT_BYTES * TP),
                                             old, args.mq_timeout)
        except Exception as exc:
            notes.append(f"lock probe failed: {exc!r}")
    stop_sampling.set()
    sampler.join()
    kvd_alive = srv.alive() and not kvd_died.is_set()
    rc = srv.stop()
    kvd_crashed = (not kvd_alive) or rc != 0
    # The clients unlink their KV segments when they exit; kvd unlinks its pool on SIGTERM.
    # (Other processes on the machine may create segments meanwhile: only ours count.)
    mine = (f"kvd_l1_pool_{pid}",) + tuple(f"lmcache_kv_{p.pid}_" for p in clients)
    leftovers = sorted(n for n in set(os.listdir("/dev/shm")) - shm_before
                       if n.startswith(mine))
    for n in leftovers:
        try:
            os.unlink(f"/dev/shm/{n}")
        except OSError:
            pass

    tot = lambda k: sum(r.get(k, 0) for r in results)  # noqa: E731
    lat = {}
    for op in ("lookup", "store", "retrieve"):
        rows = [r["latency_ms"][op] for r in results if r["latency_ms"][op]["n"]]
        if rows:
            lat[op] = {"p50_ms": max(x["p50"] for x in rows), "p99_ms": max(x["p99"] for x in rows),
                       "max_ms": max(x["max"] for x in rows)}
    l1 = (status_end or {}).get("l1", {})
    counters = (status_end or {}).get("counters", {})
    report = {
        "seconds": round(time.monotonic() - t_start, 1),
        "clients": f"{args.clusters} x (1 scheduler + {TP} workers), lmcache_driven, CpuShm",
        "l1_mb": args.l1_mb,
        "working_set_mb_approx": round(args.families * (3 + args.variants * 2) * TP *
                                       OBJECT_BYTES / (1 << 20)),
        "requests_done": tot("requests"),
        "wire_requests": counters.get("requests", tot("wire_requests")),
        "bytes_moved": tot("bytes_stored") + tot("bytes_retrieved"),
        "bytes_stored": tot("bytes_stored"),
        "bytes_retrieved": tot("bytes_retrieved"),
        "retrieved_chunks": tot("retrieved_chunks"),
        "evictions_server": l1.get("evictions"),
        "evicted_bytes_server": l1.get("evicted_bytes"),
        "restored_chunks_client": tot("restored_chunks"),
        "wrong_bytes": tot("wrong_bytes"),
        "wrong_chunks": tot("wrong_chunks"),
        "retrieve_failures_after_hit": tot("retrieve_failures"),
        "store_failures": tot("store_failures"),
        "crashes": int(kvd_crashed) + client_crashes,
        "kvd_exit_code": rc,
        "kvd_rss_kib": {"start": rss["start"].get("VmRSS"), "peak": peak.get("VmRSS"),
                        "end": rss["end"].get("VmRSS")},
        "kvd_rss_anon_kib": {"start": rss["start"].get("RssAnon"), "peak": peak.get("RssAnon"),
                             "end": rss["end"].get("RssAnon")},
        "kvd_rss_shmem_kib": {"start": rss["start"].get("RssShmem"),
                              "peak": peak.get("RssShmem"), "end": rss["end"].get("RssShmem")},
        "kvd_threads": {"start": rss["start"].get("Threads"), "end": rss["end"].get("Threads")},
        "locks_left": locks_left,
        "locks_source": "/status" if status_end else "black-box probe",
        "l1_at_end": {k: l1.get(k) for k in ("used_bytes", "total_bytes", "entries",
                                             "locked_entries", "pinned_objects",
                                             "staging_objects")} if l1 else None,
        "latency": lat,
        "shm_leftovers": leftovers,
        "errors": [e for r in results for e in r.get("errors", [])][:20] + notes,
        "kvd_log": str(srv.log_path),
    }
    anon_growth_mb = ((rss["end"].get("RssAnon") or 0) - (rss["start"].get("RssAnon") or 0)) / 1024
    failures = []
    if report["wrong_bytes"]:
        failures.append("wrong bytes served")
    if report["crashes"]:
        failures.append("crash")
    if report["retrieve_failures_after_hit"]:
        failures.append("retrieve failed after its lookup hit")
    if locks_left is None or locks_left != 0:
        failures.append(f"locks left at the end: {locks_left}")
    if anon_growth_mb > args.max_rss_growth_mb and not args.tsan:  # (TSan: shadow memory)
        failures.append(f"kvd anonymous RSS grew by {anon_growth_mb:.0f} MiB")
    if leftovers:
        failures.append(f"/dev/shm leftovers: {leftovers}")
    if report["requests_done"] == 0:
        failures.append("no request completed")
    report["result"] = "PASS" if not failures else "FAIL: " + "; ".join(failures)
    text = json.dumps(report, indent=2)
    print(text)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text + "\n")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
