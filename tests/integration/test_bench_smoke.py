"""Smoke test of the benchmark driver: build/kvd-bench runs a tiny configuration of every
suite end to end against a real kvd, and writes JSON with the expected keys.

This checks that the driver works, not how fast anything is (no thresholds on numbers
beyond "positive"). It needs only the standard library and pytest; about 5-10 s.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from kvd_harness import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]


def _kvd_bin() -> Path:
    return Path(os.environ.get("KVD_BIN") or os.environ.get("KVD_TEST_KVD_BIN")
                or REPO_ROOT / "build" / "kvd")


def _bench_bin() -> Path:
    env = os.environ.get("KVD_BENCH_BIN")
    if env:
        return Path(env)
    # Sanitizer builds skip the driver: use the plain build's next to the kvd under test.
    beside = _kvd_bin().parent / "kvd-bench"
    return beside if beside.exists() else REPO_ROOT / "build" / "kvd-bench"


def _http_args(kvd: Path, port: str) -> list[str]:
    """kvd builds with an HTTP endpoint get a free port (the default 8080 may be taken)."""
    r = subprocess.run([str(kvd), "server", "--help"], capture_output=True, text=True)
    if "--http-port" in r.stdout + r.stderr:
        return ["--http-host", "127.0.0.1", "--http-port", port]
    return []




def _bench_segments() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("kvdbench_")}
    except FileNotFoundError:
        return set()


def _positive(doc: dict, *keys: str) -> None:
    for k in keys:
        v = doc.get(k)
        assert isinstance(v, (int, float)) and v > 0, f"{k} = {v!r} in {sorted(doc)}"


@pytest.fixture()
def kvd_server(tmp_path):
    if os.environ.get("KVD_TEST_SERVER", "kvd").strip().lower() == "lmcache":
        pytest.skip("the bench smoke test drives kvd itself")
    kvd = _kvd_bin()
    if not kvd.exists():
        pytest.fail(f"{kvd} not found: build it (make build)")
    port = free_port()
    log = open(tmp_path / "kvd.log", "wb")
    proc = subprocess.Popen(
        [str(kvd), "server", "--host", "127.0.0.1", "--port", str(port), "--l1-size-gb", "1",
         "--eviction-policy", "LRU", *_http_args(kvd, str(free_port()))],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc, f"tcp://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        log.close()


def test_bench_quick_all_suites(kvd_server, tmp_path):
    proc, url = kvd_server
    bench = _bench_bin()
    if not bench.exists():
        pytest.fail(f"{bench} not found: build it (cmake --build build --target kvd-bench)")
    before = _bench_segments()
    out = tmp_path / "bench.json"
    startup = (f"kvd::{_kvd_bin()} server --host 127.0.0.1 --port {{port}} --l1-size-gb 1 "
               "--eviction-policy LRU " + " ".join(_http_args(_kvd_bin(), "{port2}")))
    t0 = time.monotonic()
    run = subprocess.run(
        [str(bench), "--server-url", url, "--server-pid", str(proc.pid), "--quick",
         "--suite", "all", "--startup-cmd", startup, "--json", str(out)],
        capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - t0
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "[kvd-bench]" in run.stdout  # progress lines
    doc = json.loads(out.read_text())

    assert doc["tool"] == "kvd-bench" and doc["quick"] is True
    assert doc["server"]["chunk_size"] == 256
    assert doc["machine"]["nproc"] >= 1

    # hash: in-process BLAKE3 chained chunk hashing
    impls = doc["hash"]["impls"]
    assert impls and impls[0]["active"] is True
    _positive(impls[0], "chain_tokens_per_s", "chain_input_gbps", "bulk_1mib_gbps")

    # control: every case at every client count, no failed or wrong replies
    cases = doc["control"]["cases"]
    names = {c["name"] for c in cases}
    assert names == {"ping", "lookup_miss_1k", "lookup_hit_1k", "lookup_hit_8k",
                     "lookup_hit_32k", "end_session", "zmq_echo_floor", "zmtp_echo_floor"}, names
    assert {c["concurrency"] for c in cases} == {1, 8}
    for c in cases:
        _positive(c, "ops", "rps", "p50_us", "p99_us", "seconds")
        assert c["errors"] == 0 and c["mismatches"] == 0, c
    for c in cases:
        if c["name"].startswith("lookup"):
            assert c["queries_per_op"] >= 1, c

    # data: both models stored, looked up, retrieved byte-exact, memcpy baselines beside
    models = {m["model"]: m for m in doc["data"]["models"]}
    assert set(models) == {"llama8b_tp1", "minimax_m3_tp8"}, models.keys()
    for m in models.values():
        assert "error" not in m, m
        for phase in ("store_cold", "store", "retrieve"):
            _positive(m[phase], "bytes", "gbps", "seconds")
            assert m[phase]["failures"] == 0, (m["model"], phase, m[phase])
        assert m["retrieve_verified"] is True, m["model"]
        assert m["lookup_full_hits"] == m["requests"], m
        _positive(m, "memcpy_1t_gbps", "memcpy_mt_gbps", "memcpy_1t_fresh_gbps",
                  "chunk_bytes_per_rank")
    assert models["minimax_m3_tp8"]["tp"] == 8

    # scale: levels with RSS and lookup latency; startup timing of a kvd command
    scale = doc["scale"]
    assert scale["object_bytes"] == 4096
    levels = scale["levels"]
    assert levels and all(lv["reached"] for lv in levels), levels
    for lv in levels:
        assert lv["entries"] >= lv["target_entries"] > 0
        assert lv["rss"]["vm_rss_bytes"] > 0
        assert "metadata_bytes_per_entry" in lv
        lk = lv["lookup"]
        assert lk["errors"] == 0 and lk["mismatches"] == 0, lk
        for kind in ("lookup_hit_1k", "lookup_hit_32k", "lookup_miss_1k"):
            _positive(lk[kind], "n", "p50_us", "p99_us")
    servers = doc["startup"]["servers"]
    assert len(servers) == 1 and "error" not in servers[0], servers
    _positive(servers[0], "ready_seconds_median")

    # hygiene: the server survived, no shared-memory segment of the driver is left
    assert proc.poll() is None, "kvd exited during the benchmark"
    assert _bench_segments() - before == set()
    assert elapsed < 60, f"the quick benchmark took {elapsed:.1f} s"
