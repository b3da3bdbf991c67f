#!/usr/bin/env python3
"""Runs the same kvd-bench workloads against kvd and the reference `lmcache server`.

Starts each server on free 127.0.0.1 ports, one at a time, runs build/kvd-bench against it,
stops it, and prints kvd/lmcache ratios. Everything lands in one results folder:

    <out>/kvd_main.json, lmcache_main.json      control + data (+ hash for kvd)
    <out>/kvd_scale.json, lmcache_scale.json    RSS per cached entry, lookups at scale
    <out>/startup_*.json                        startup time with a large --l1-size-gb
    <out>/side_by_side.json                     the ratios below, machine-readable
    <out>/summary.md                            the same as markdown tables
    <out>/*.log                                 server and driver logs

Only the Python standard library is needed. The lmcache server comes from a virtualenv:
--venv (default /work/main/.venv when it has bin/lmcache), else /tmp/lmvenv. Where the
Python server cannot run a case on this machine, the output says why instead of a number.
Typical wall time on a 2-core / 24 GB machine: about 8-9 minutes (use --quick for ~1).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
QUIET_ENV = {
    "LMCACHE_DISABLE_BANNER": "1",
    "LMCACHE_TRACK_USAGE": "false",
    "DO_NOT_TRACK": "1",
    "PYTHONWARNINGS": "ignore",
}
OBJECT_BYTES = 4096  # scale-suite object size (tiny model, 256-token chunks)


def log(msg: str) -> None:
    print(f"[side-by-side] {msg}", flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


_HTTP_FLAG: dict[str, bool] = {}


def kvd_has_http(kvd: str) -> bool:
    """Whether this kvd build serves HTTP (then it gets a free port, like lmcache)."""
    if kvd not in _HTTP_FLAG:
        r = subprocess.run([kvd, "server", "--help"], capture_output=True, text=True)
        _HTTP_FLAG[kvd] = "--http-port" in r.stdout + r.stderr
    return _HTTP_FLAG[kvd]


def shm_names() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


class Server:
    """kvd or lmcache server as a subprocess in its own process group."""

    def __init__(self, kind: str, cmd_base: list[str], l1_gb: float, log_path: Path,
                 extra: list[str] | None = None) -> None:
        self.kind = kind
        self.http_port: int | None = None
        self.port = free_port()
        self.url = f"tcp://127.0.0.1:{self.port}"
        args = ["server", "--host", "127.0.0.1", "--port", str(self.port),
                "--l1-size-gb", f"{l1_gb:g}", "--eviction-policy", "LRU"]
        if kind == "lmcache":
            # Its HTTP (8080) and Prometheus (9090) listeners go to free loopback ports too.
            args += ["--http-host", "127.0.0.1", "--http-port", str(free_port()),
                     "--prometheus-port", str(free_port())]
        elif kvd_has_http(cmd_base[0]):
            self.http_port = free_port()
            args += ["--http-host", "127.0.0.1", "--http-port", str(self.http_port)]
        self.cmd = cmd_base + args + (extra or [])
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Server":
        env = dict(os.environ)
        env.update(QUIET_ENV)
        with open(self.log_path, "wb") as logf:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=logf,
                                         stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        log(f"started {self.kind} (pid {self.proc.pid}): {' '.join(self.cmd)}")
        return self

    def wait_l1_populated(self, timeout: float = 300.0) -> float | None:
        """kvd populates its L1 pages in the background after it starts (--l1-populate all);
        lmcache on a CPU host touches its whole L1 before it answers. Measuring kvd while
        its populator runs would charge that work to the first suites' server CPU, so wait
        for it. Returns the seconds waited, or None (no HTTP, or no such metric)."""
        if self.kind != "kvd" or self.http_port is None:
            return None
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            try:
                text = urllib.request.urlopen(
                    f"http://127.0.0.1:{self.http_port}/metrics", timeout=5).read().decode()
            except OSError:
                time.sleep(0.2)
                continue
            vals = {}
            for line in text.splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[0] in ("kvd_l1_populated_bytes", "kvd_l1_capacity_bytes"):
                    vals[parts[0]] = float(parts[1])
            if len(vals) < 2:
                return None
            if vals["kvd_l1_populated_bytes"] >= vals["kvd_l1_capacity_bytes"]:
                return time.monotonic() - t0
            time.sleep(0.2)
        log(f"kvd: L1 not populated within {timeout:.0f} s; measuring anyway")
        return time.monotonic() - t0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, grace: float = 30.0) -> None:
        if self.proc is None:
            return
        p = self.proc
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                log(f"{self.kind} did not stop within {grace:.0f} s; SIGKILL")
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=10)
        log(f"stopped {self.kind} (exit {p.returncode})")
        self.proc = None


LM_HASH_SNIPPET = r"""
import json, random, time
from lmcache.v1.multiprocess.token_hasher import TokenHasher
h = TokenHasher(chunk_size=256, hash_algorithm="blake3")
random.seed(7)
toks = [random.randrange(200000) for _ in range(1 << 18)]
best = 0.0
for _ in range(3):
    t0 = time.perf_counter()
    n = len(h.compute_chunk_hashes(toks))
    best = max(best, len(toks) / (time.perf_counter() - t0))
print(json.dumps({"tokens_per_s": best, "chunks": n, "tokens": len(toks)}))
"""


def lmcache_hash_rate(lm_bin: Path) -> dict:
    """The reference server's own TokenHasher (blake3), timed in its venv's interpreter."""
    try:
        r = subprocess.run([str(lm_bin.parent / "python"), "-c", LM_HASH_SNIPPET],
                           capture_output=True, text=True, timeout=300,
                           env={**os.environ, **QUIET_ENV})
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError) as e:
        return {"error": f"could not time lmcache's TokenHasher: {e}"}


def run_bench(bench: Path, args: list[str], log_path: Path, timeout: float) -> int:
    """Runs kvd-bench, teeing its progress lines to stdout and a log file."""
    cmd = [str(bench), *args]
    with open(log_path, "w") as logf:
        logf.write("$ " + " ".join(cmd) + "\n")
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + timeout
        assert p.stdout is not None
        for line in p.stdout:
            sys.stdout.write("  " + line)
            sys.stdout.flush()
            logf.write(line)
            if time.monotonic() > deadline:
                p.kill()
                log(f"kvd-bench exceeded {timeout:.0f} s; killed")
                break
        p.wait()
        return p.returncode


def load_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def fmt(v, digits=1, suffix=""):
    if v is None:
        return "n/a"
    if isinstance(v, str):
        return v
    if abs(v) >= 100:
        return f"{v:,.0f}{suffix}"
    return f"{v:.{digits}f}{suffix}"


def cases_by_key(doc: dict) -> dict:
    out = {}
    for c in doc.get("control", {}).get("cases", []):
        out[(c["name"], c["concurrency"])] = c
    return out


def data_by_model(doc: dict) -> dict:
    return {m.get("model"): m for m in doc.get("data", {}).get("models", [])}


def gbps(phase):
    return phase.get("gbps") if isinstance(phase, dict) else None


def compare(kvd_main: dict, lm_main: dict, kvd_scale: dict, lm_scale: dict,
            startup: list[dict], notes: list[str], lm_hash: dict | None = None
            ) -> tuple[dict, str]:
    """Builds the ratio tables (dict + markdown)."""
    md: list[str] = []
    result: dict = {"control": [], "data": [], "scale": {}, "startup": [], "notes": notes}

    # ---- control
    kc, lc = cases_by_key(kvd_main), cases_by_key(lm_main)
    md.append("### Control path (requests/s and latency per operation)\n")
    md.append("| case | clients | kvd req/s | lmcache req/s | kvd/lmcache req/s | kvd p50 µs | "
              "lmcache p50 µs | lmcache/kvd p50 | kvd p99 µs | lmcache p99 µs | "
              "server CPU µs/op kvd | lmcache |")
    md.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key, k in kc.items():
        l = lc.get(key)
        row = {
            "case": key[0], "concurrency": key[1],
            "kvd_rps": k["rps"], "lmcache_rps": l["rps"] if l else None,
            "kvd_p50_us": k["p50_us"], "lmcache_p50_us": l["p50_us"] if l else None,
            "kvd_p99_us": k["p99_us"], "lmcache_p99_us": l["p99_us"] if l else None,
            "kvd_errors": k["errors"] + k["mismatches"],
            "lmcache_errors": (l["errors"] + l["mismatches"]) if l else None,
        }
        row["rps_ratio"] = ratio(row["kvd_rps"], row["lmcache_rps"])
        row["p50_ratio"] = ratio(row["lmcache_p50_us"], row["kvd_p50_us"])
        row["kvd_server_cpu_us_per_op"] = k.get("server_cpu_us_per_op")
        row["lmcache_server_cpu_us_per_op"] = l.get("server_cpu_us_per_op") if l else None
        reference = "reference" in k
        if reference:
            row["reference"] = k["reference"]
        result["control"].append(row)
        name = f"{key[0]} (no server: transport floor)" if reference else key[0]
        ratios = ("–", "–") if reference else (f"{fmt(row['rps_ratio'])}×",
                                               f"{fmt(row['p50_ratio'])}×")
        md.append(f"| {name} | {key[1]} | {fmt(row['kvd_rps'])} | {fmt(row['lmcache_rps'])} | "
                  f"{ratios[0]} | {fmt(row['kvd_p50_us'])} | "
                  f"{fmt(row['lmcache_p50_us'])} | {ratios[1]} | "
                  f"{fmt(row['kvd_p99_us'])} | {fmt(row['lmcache_p99_us'])} | "
                  f"{fmt(row['kvd_server_cpu_us_per_op'])} | "
                  f"{fmt(row['lmcache_server_cpu_us_per_op'])} |")

    # ---- data
    kd, ld = data_by_model(kvd_main), data_by_model(lm_main)
    md.append("\n### CPU data path (GB/s, 1 GB = 10^9 bytes)\n")
    md.append("| model | op | kvd GB/s | lmcache GB/s | kvd/lmcache | memcpy 1 thread | "
              "memcpy all threads | kvd / memcpy all threads |")
    md.append("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, k in kd.items():
        l = ld.get(name, {})
        if "error" in k:
            md.append(f"| {name} | – | error: {k['error']} | | | | | |")
            continue
        first = ("store (first pass, L1 pages touched by the previous model)"
                 if k.get("first_pass_after_other_model") else "store (first pass)")
        for op, label in (("store_cold", first), ("store", "store (after CLEAR)"),
                          ("retrieve", "retrieve")):
            kg, lg = gbps(k.get(op)), gbps(l.get(op)) if l else None
            lerr = l.get("error") if l else "not run"
            row = {"model": name, "op": op, "kvd_gbps": kg, "lmcache_gbps": lg,
                   "ratio": ratio(kg, lg), "memcpy_1t_gbps": k.get("memcpy_1t_gbps"),
                   "memcpy_mt_gbps": k.get("memcpy_mt_gbps"),
                   "kvd_vs_memcpy_mt": ratio(kg, k.get("memcpy_mt_gbps")),
                   "kvd_verified": k.get("retrieve_verified"),
                   "lmcache_verified": l.get("retrieve_verified") if l else None}
            if lg is None and lerr:
                row["lmcache_note"] = lerr
            result["data"].append(row)
            md.append(f"| {name} | {label} | {fmt(kg, 2)} | "
                      f"{fmt(lg, 2) if lg is not None else 'n/a (' + str(lerr) + ')'} | "
                      f"{fmt(row['ratio'])}× | {fmt(row['memcpy_1t_gbps'], 2)} | "
                      f"{fmt(row['memcpy_mt_gbps'], 2)} | {fmt(row['kvd_vs_memcpy_mt'], 2)} |")

    # ---- scale
    md.append("\n### Scale (tiny 4 KiB objects)\n")
    md.append("| server | entries | metadata per entry (anon RSS growth) | same, since previous "
              "level | total RSS per entry | fill entries/s | lookup hit 1K p50 µs | "
              "hit 32K p50 µs | miss 1K p50 µs |")
    md.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, doc in (("kvd", kvd_scale), ("lmcache", lm_scale)):
        sc = doc.get("scale", {})
        if "error" in sc:
            md.append(f"| {label} | error: {sc['error']} | | | | | | | |")
        levels = sc.get("levels", [])
        result["scale"][label] = levels
        for lv in levels:
            lk = lv.get("lookup", {})
            md.append(f"| {label} | {lv['entries']:,} | {fmt(lv.get('metadata_bytes_per_entry'))} B | "
                      f"{fmt(lv.get('metadata_bytes_per_entry_marginal'))} B | "
                      f"{fmt(lv.get('rss_bytes_per_entry'))} B | {fmt(lv.get('fill_entries_per_s'))} | "
                      f"{fmt(lk.get('lookup_hit_1k', {}).get('p50_us'))} | "
                      f"{fmt(lk.get('lookup_hit_32k', {}).get('p50_us'))} | "
                      f"{fmt(lk.get('lookup_miss_1k', {}).get('p50_us'))} |")
        if sc.get("fill_note"):
            md.append(f"| {label} | ({sc['fill_note']}) | | | | | | | |")
    kl = (kvd_scale.get("scale", {}).get("levels") or [{}])
    ll = (lm_scale.get("scale", {}).get("levels") or [{}])
    result["scale"]["metadata_ratio_lmcache_over_kvd"] = ratio(
        ll[-1].get("metadata_bytes_per_entry"), kl[0].get("metadata_bytes_per_entry"))

    # ---- hashing
    md.append("\n### Chained BLAKE3 chunk hashing (in-process, 1 thread)\n")
    md.append("| implementation | tokens/s | GB/s of hash input | ns per 256-token chunk | "
              "BLAKE3 of one 1 MiB input, GB/s |")
    md.append("|---|---:|---:|---:|---:|")
    seen = set()
    for i in kvd_main.get("hash", {}).get("impls", []):
        if i["impl"] in seen:
            continue
        seen.add(i["impl"])
        md.append(f"| kvd {i['impl']}{' (active)' if i.get('active') else ''} | "
                  f"{i['chain_tokens_per_s'] / 1e6:.1f} M | {i['chain_input_gbps']:.2f} | "
                  f"{i['chain_ns_per_chunk']:,.0f} | {i['bulk_1mib_gbps']:.2f} |")
    result["hash"] = {"kvd": kvd_main.get("hash", {}).get("impls", []), "lmcache": lm_hash}
    if lm_hash and "tokens_per_s" in lm_hash:
        tps = lm_hash["tokens_per_s"]
        md.append(f"| lmcache TokenHasher (Python + blake3 module) | {tps / 1e6:.2f} M | "
                  f"{tps * (4 + 32 / 256) / 1e9:.3f} | {256 / tps * 1e9:,.0f} | – |")
    elif lm_hash:
        md.append(f"| lmcache TokenHasher | {lm_hash.get('error')} | | | |")

    # ---- startup
    md.append("\n### Startup (until the first GET_CHUNK_SIZE reply)\n")
    md.append("| server | command | ready s (median) | RSS after ready |")
    md.append("|---|---|---:|---:|")
    for s in startup:
        rss = s.get("rss_after_ready") or [{}]
        vm = (rss[0] or {}).get("vm_rss_bytes")
        result["startup"].append({"label": s.get("label"), "ready_s": s.get("ready_seconds_median"),
                                  "rss_bytes": vm, "error": s.get("error"),
                                  "command": s.get("command")})
        md.append(f"| {s.get('label')} | `{s.get('command')}` | "
                  f"{fmt(s.get('ready_seconds_median'), 3) if s.get('ready_seconds_median') is not None else s.get('error', 'n/a')} | "
                  f"{fmt(vm / 2**20 if vm else None)} MiB |")
    if notes:
        md.append("\n### Notes\n")
        md.extend(f"- {n}" for n in notes)
    return result, "\n".join(md) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=str(REPO / "build"))
    ap.add_argument("--out", default=None, help="results folder (default <build-dir>/bench-results)")
    ap.add_argument("--venv", default=str(REPO / ".venv"),
                    help="virtualenv with lmcache 0.5.6 (falls back to /tmp/lmvenv)")
    ap.add_argument("--quick", action="store_true", help="tiny configuration (about a minute)")
    ap.add_argument("--skip-lmcache", action="store_true")
    ap.add_argument("--l1-gb", type=float, default=5.0, help="L1 for control + data runs")
    ap.add_argument("--data-gb", type=float, default=3.0, help="GiB stored per data model")
    ap.add_argument("--kvd-scale-max", type=int, default=10_000_000,
                    help="largest kvd scale level wanted (capped to what fits in memory)")
    ap.add_argument("--kvd-scale-seconds", type=float, default=150.0,
                    help="time limit for filling kvd's table")
    ap.add_argument("--lmcache-scale-entries", default="100000,250000",
                    help="lmcache scale levels (comma-separated)")
    ap.add_argument("--lmcache-scale-seconds", type=float, default=80.0)
    ap.add_argument("--startup-l1-gb", type=float, default=16.0)
    args = ap.parse_args()

    t_start = time.monotonic()
    build = Path(args.build_dir)
    kvd_bin, bench = build / "kvd", build / "kvd-bench"
    for b in (kvd_bin, bench):
        if not b.exists():
            log(f"{b} is missing; build with: cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && "
                "cmake --build build -j2 --target kvd kvd-bench")
            return 2
    out = Path(args.out) if args.out else build / "bench-results"
    out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []

    lm_bin = None
    for cand in (Path(args.venv) / "bin" / "lmcache", Path("/tmp/lmvenv/bin/lmcache")):
        if cand.exists():
            lm_bin = cand
            break
    if args.skip_lmcache:
        notes.append("lmcache server not run (--skip-lmcache)")
        lm_bin = None
    elif lm_bin is None:
        notes.append(f"lmcache server not run: no bin/lmcache in {args.venv} or /tmp/lmvenv "
                     "(create one with `make venv`)")
    else:
        ver = subprocess.run([str(lm_bin.parent / "python"), "-c",
                              "import importlib.metadata as m; print(m.version('lmcache'))"],
                             capture_output=True, text=True, env={**os.environ, **QUIET_ENV})
        log(f"lmcache server: {lm_bin} (lmcache {ver.stdout.strip() or '?'})")

    nproc = os.cpu_count() or 1
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()[:12]
    machine = {"nproc": nproc, "lscpu_head": lscpu, "mem_available_bytes": mem_available(),
               "loadavg_at_start": Path("/proc/loadavg").read_text().strip()}
    log(f"machine: {nproc} CPUs, {mem_available() / 2**30:.1f} GiB available, load "
        f"{machine['loadavg_at_start']}")
    shm_before = shm_names()

    quick = ["--quick"] if args.quick else []
    data_gb = 0.05 if args.quick else args.data_gb
    l1_gb = 1.0 if args.quick else args.l1_gb
    if l1_gb * 0.8 < data_gb * 1.05:
        l1_gb = data_gb * 1.05 / 0.8 + 0.5
    servers: list[Server] = []

    started_pids: list[int] = []

    def serve(kind: str, l1: float, tag: str) -> Server:
        base = [str(kvd_bin)] if kind == "kvd" else [str(lm_bin)]
        s = Server(kind, base, l1, out / f"{kind}_{tag}.server.log").start()
        servers.append(s)
        started_pids.append(s.pid)
        return s

    def stop(s: Server) -> None:
        s.stop()
        servers.remove(s)

    docs: dict[str, dict] = {}
    startup_docs: list[dict] = []
    try:
        # ---- control + data (+ hash, in-process, once) ------------------------------------
        kinds = ["kvd"] + (["lmcache"] if lm_bin else [])
        for kind in kinds:
            s = serve(kind, l1_gb, "main")
            waited = s.wait_l1_populated()
            if waited is not None:
                log(f"kvd: L1 populated {waited:.1f} s after start")
                notes.append(f"kvd's suites started once its L1 was populated ({l1_gb:g} GiB, "
                             f"{waited:.1f} s after start), as lmcache's start once it has "
                             "touched its L1")
            suites = "hash,control,data" if kind == "kvd" else "control,data"
            rc = run_bench(bench, ["--server-url", s.url, "--server-pid", str(s.pid),
                                   "--suite", suites, "--label", kind, "--data-gb", str(data_gb),
                                   "--json", str(out / f"{kind}_main.json"), *quick],
                           out / f"{kind}_main.bench.log", timeout=900)
            if rc != 0:
                notes.append(f"{kind} control/data run exited with {rc}; see {kind}_main.bench.log")
            stop(s)
            docs[f"{kind}_main"] = load_json(out / f"{kind}_main.json")

        # ---- scale ------------------------------------------------------------------------
        # Entries cost 4 KiB of L1 each plus metadata; keep 30% of available memory free.
        fit = int(mem_available() * 0.7 / (OBJECT_BYTES + 1024)) // 4096 * 4096
        want = 1024 * 8 if args.quick else args.kvd_scale_max
        top = min(want, fit)
        levels = sorted({min(1_000_000, top) if not args.quick else 4096, top})
        if want > fit:
            notes.append(
                f"kvd scale: {want:,} entries of 4 KiB need {want * OBJECT_BYTES / 2**30:.1f} GiB "
                f"of L1 alone; {mem_available() / 2**30:.1f} GiB is available, so the largest level "
                f"run is {top:,} entries (the 4 KiB object size is kvd's L1 page alignment, so "
                "smaller objects would not help)")
        l1_scale = max(1.0, top * OBJECT_BYTES / 0.75 / 2**30 + 0.5)
        s = serve("kvd", round(l1_scale, 1), "scale")
        rc = run_bench(bench, ["--server-url", s.url, "--server-pid", str(s.pid), "--suite",
                               "scale", "--label", "kvd", "--scale-entries",
                               ",".join(str(x) for x in levels), "--scale-fill-seconds",
                               str(20 if args.quick else args.kvd_scale_seconds), "--json",
                               str(out / "kvd_scale.json"), *quick],
                       out / "kvd_scale.bench.log", timeout=900)
        if rc != 0:
            notes.append(f"kvd scale run exited with {rc}")
        stop(s)
        docs["kvd_scale"] = load_json(out / "kvd_scale.json")
        if lm_bin:
            lm_levels = [4096] if args.quick else sorted(
                int(x) for x in str(args.lmcache_scale_entries).split(",") if x)
            n = lm_levels[-1]
            # lmcache's CPU L1 is allocated and touched in full at startup: size it to the level.
            s = serve("lmcache", max(1.0, round(n * OBJECT_BYTES / 0.75 / 2**30 + 0.5, 1)),
                      "scale")
            rc = run_bench(bench, ["--server-url", s.url, "--server-pid", str(s.pid), "--suite",
                                   "scale", "--label", "lmcache", "--scale-entries",
                                   ",".join(str(x) for x in lm_levels),
                                   "--scale-fill-seconds",
                                   str(20 if args.quick else args.lmcache_scale_seconds),
                                   "--scale-lookups", "40" if args.quick else "500",
                                   "--json", str(out / "lmcache_scale.json"), *quick],
                           out / "lmcache_scale.bench.log", timeout=900)
            if rc != 0:
                notes.append(f"lmcache scale run exited with {rc}")
            stop(s)
            docs["lmcache_scale"] = load_json(out / "lmcache_scale.json")
            lv = (docs["lmcache_scale"].get("scale", {}).get("levels") or [{}])[-1]
            rate = lv.get("fill_entries_per_s")
            meta = lv.get("metadata_bytes_per_entry_marginal") or lv.get("metadata_bytes_per_entry")
            if rate and meta and not args.quick:
                notes.append(
                    f"lmcache scale: measured up to {lv.get('entries', 0):,} entries (fill limit "
                    f"{args.lmcache_scale_seconds:.0f} s). At its measured {rate:,.0f} entries/s "
                    f"and {meta:,.0f} B of metadata per added entry, 1M entries would take about "
                    f"{1e6 / rate / 60:.0f} min to fill and need about "
                    f"{1e6 * (meta + OBJECT_BYTES) / 2**30:.1f} GiB of RAM (10M: "
                    f"{1e7 * (meta + OBJECT_BYTES) / 2**30:.0f} GiB, more than this machine has), "
                    "so it is not part of this ~10-minute run (pass --lmcache-scale-entries "
                    "1000000 --lmcache-scale-seconds 1500 to try 1M)")

        # ---- startup with a large L1 --------------------------------------------------------
        st_gb = 1.0 if args.quick else args.startup_l1_gb
        kvd_http = (" --http-host 127.0.0.1 --http-port {port2}"
                    if kvd_has_http(str(kvd_bin)) else "")
        cmds = [("kvd", 1 if args.quick else 3,
                 f"{kvd_bin} server --host 127.0.0.1 --port {{port}} --l1-size-gb {st_gb:g} "
                 "--eviction-policy LRU" + kvd_http)]
        if lm_bin:
            lm_cmd = (f"{lm_bin} server --host 127.0.0.1 --port {{port}} --eviction-policy LRU "
                      "--http-host 127.0.0.1 --http-port {port2} --prometheus-port {port3} "
                      "--l1-size-gb ")
            need = st_gb * 2**30 * 1.15 + 2 * 2**30
            if mem_available() > need:
                cmds.append((f"lmcache-{st_gb:g}g", 1, lm_cmd + f"{st_gb:g}"))
            else:
                notes.append(
                    f"lmcache startup with --l1-size-gb {st_gb:g} not run: on a CPU-only host it "
                    "allocates and touches the whole L1 at startup, which needs "
                    f"{need / 2**30:.1f} GiB and only {mem_available() / 2**30:.1f} GiB is "
                    "available")
            if not args.quick:
                cmds.append(("lmcache-1g", 1, lm_cmd + "1"))
        for label, runs, cmd in cmds:
            path = out / f"startup_{label}.json"
            run_bench(bench, ["--suite", "startup", "--scale-entries", "0", "--startup-runs",
                              str(runs), "--startup-cmd", f"{label}::{cmd}", "--json", str(path)],
                      out / f"startup_{label}.bench.log", timeout=600)
            for srv in load_json(path).get("startup", {}).get("servers", []):
                startup_docs.append(srv)
    finally:
        for s in list(servers):
            s.stop()

    # Only segments of this run count: the driver's (kvdbench_*) and those named after a
    # server started here (kvd_l1_pool_<pid>, lmcache_l1_pool_<pid>); other users of the
    # machine may create and remove their own meanwhile.
    leftover = sorted(n for n in shm_names() - shm_before
                      if n.startswith("kvdbench_")
                      or any(n.endswith(f"_{pid}") or f"_{pid}_" in n for pid in started_pids))
    if leftover:
        notes.append(f"shared-memory segments left behind: {', '.join(leftover)}")
        log(f"WARNING: /dev/shm entries left behind: {leftover}")

    lm_hash = lmcache_hash_rate(lm_bin) if lm_bin else None
    result, md = compare(docs.get("kvd_main", {}), docs.get("lmcache_main", {}),
                         docs.get("kvd_scale", {}), docs.get("lmcache_scale", {}),
                         startup_docs, notes, lm_hash)
    # Failed requests and wrong replies (e.g. a hit case answered with fewer hits) make a
    # case's figures meaningless: they head the summary, not only the JSON.
    warnings = []
    for who in ("kvd", "lmcache"):
        errs = [f"{r['case']}@{r['concurrency']} ({r[f'{who}_errors']})" for r in result["control"]
                if (r.get(f"{who}_errors") or 0) > 0]
        if errs:
            warnings.append(f"{who}: failed requests or unexpected replies in " + ", ".join(errs))
    notes.extend(warnings)
    machine["loadavg_at_end"] = Path("/proc/loadavg").read_text().strip()
    result["machine"] = machine
    result["wall_seconds"] = time.monotonic() - t_start
    result["lmcache_bin"] = str(lm_bin) if lm_bin else None
    (out / "side_by_side.json").write_text(json.dumps(result, indent=2) + "\n")
    header = (f"Machine: {nproc} CPUs, load {machine['loadavg_at_start']} → "
              f"{machine['loadavg_at_end']}; wall time {result['wall_seconds']:.0f} s.\n\n")
    header += "".join(f"**WARNING: {w}**\n\n" for w in warnings)
    (out / "summary.md").write_text(header + md)
    print()
    print(header + md)
    log(f"results in {out} (side_by_side.json, summary.md); total {result['wall_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
