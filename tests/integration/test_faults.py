"""Client and server faults: what kvd guarantees when the other side misbehaves.

Each test starts its own server (small L1, short lock TTLs, an explicit --shm-name) on a
free 127.0.0.1 port and drives it with the real lmcache 0.5.6 adapters (TPCluster) or raw
frames; child processes are faults_worker.py / faults_flood.py.

1. A worker SIGKILLed between PREPARE_STORE and COMMIT_STORE (engine-driven: it was writing
   into kvd's pool): nothing of it becomes visible, its staging memory blocks other stores
   only until the write TTL, then the same chunks store and load normally.
2. A worker SIGKILLed with a STORE in flight (lmcache-driven: kvd copies from the worker's
   CpuShm tensors): the prompt is either wholly there with the right bytes or not at all.
3. A scheduler that looks up (read-locking the hits) and never retrieves: the locks keep
   the chunks from eviction only until the read TTL.
3b. A client flooding lookups of a stored prefix without retrieving (past 65,535 holds of
   one chunk): another client's lookup of that prefix still hits and its retrieve loads it.
4. kvd SIGKILLed and restarted on the same port: clients fail (degraded mode) while it is
   down, then re-register through their heartbeat and work again.
5. One client flooding kvd (4 sockets x 512 requests in flight): another client's lookups
   stay within a bounded delay (p99 measured with and without the flood). Before pool ops
   got per-connection lanes, the victim waited behind the whole backlog (1.5-2.4 s).

Run: pytest tests/integration/test_faults.py (KVD_TEST_KVD_BIN selects the kvd binary).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import faults_util as F
import kvd_harness as H
from faults_worker import prompt_tokens

HERE = Path(__file__).resolve().parent
CHUNK = H.CHUNK_SIZE
# Default ModelShape: 4 layers x [2, 128, 16, 2, 64] bf16 -> 512 KiB per (chunk, rank) object.
OBJ = 2 * 4 * CHUNK * 2 * 64 * 2
MiB = 1 << 20
SHAPE = H.ModelShape(num_blocks=256)  # blocks 0..127 to store from, 128..255 to load into
LOAD = 128

pytestmark = pytest.mark.skipif(H.server_kind() != "kvd",
                                reason="fault tests drive kvd-specific flags and recovery")


def spawn_worker(mode: str, url: str, model: str, seed: int, n: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(HERE / "faults_worker.py"), mode, url, model, str(seed), str(n)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def reap_child(p: subprocess.Popen, timeout: float = 120.0) -> tuple[int, str]:
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, err = p.communicate()
    return p.returncode, out + err


def remove_client_segments(pid: int) -> None:
    """A SIGKILLed lmcache_driven worker never unlinks its CpuShm KV segments."""
    for n in os.listdir("/dev/shm"):
        if n.startswith(f"lmcache_kv_{pid}_"):
            try:
                os.unlink(f"/dev/shm/{n}")
            except OSError:
                pass


def expected_blocks(c: H.TPCluster, seed: int, n_chunks: int, scratch_first: int) -> list:
    """The bytes faults_worker.py put in its blocks, made with the same generator here."""
    scratch = list(range(scratch_first, scratch_first + n_chunks * c.blocks_per_chunk))
    c.fill_random(0, scratch, seed=seed)
    return c.snapshot_blocks(0, scratch)


def assert_blocks_equal(got: list, want: list, what: str) -> None:
    import torch

    for layer, (g, w) in enumerate(zip(got, want, strict=True)):
        gi, wi = g.view(torch.int16), w.view(torch.int16)
        bad = int((gi != wi).sum())
        assert bad == 0, f"{what}: layer {layer} has {bad} wrong elements"


# ---------------------------------------------------------------------------------------


def test_worker_killed_before_commit_leaves_nothing_visible(tmp_path):
    wttl = 6.0
    n_dead = 6                       # the dying worker reserves 6 of L1's 8 objects
    # The bounds on what uncommitted engine-driven prepares hold (a quarter of L1 per worker,
    # issue 27 finding 2, test_hostile_r2.py) are lifted: this test is about what a worker
    # killed mid-store leaves, held until the write TTL.
    with F.kvd_server(tmp_path, l1_gb=8 * OBJ / (1 << 30),
                      extra=["--l1-write-ttl-seconds", str(wttl),
                             "--engine-driven-max-held-fraction", "1",
                             "--engine-driven-instance-held-fraction", "1"]) as srv:
        model = "faults-killed-writer"
        live = H.TPCluster(srv.url, "lmcache_driven", model, tp=1, shape=SHAPE)
        try:
            base_used = (srv.l1() or {}).get("used_bytes", 0)
            child = spawn_worker("engine-die-before-commit", srv.url, model, seed=11, n=n_dead)
            rc, out = reap_child(child)
            t_dead = time.monotonic()
            assert rc == -9 and "STORING" in out, f"worker did not die as planned: {rc}\n{out}"
            toks = prompt_tokens(11, n_dead)

            # Not visible: half-written objects never become hits.
            assert live.probe(toks) == 0
            l1 = srv.l1()
            if l1 is not None:
                assert l1["staging_objects"] == n_dead, l1
                assert l1["used_bytes"] >= base_used + n_dead * OBJ, l1

            # While the write lock lives, the dead worker's staging memory is not evictable:
            # a 4-chunk store does not fit in the 2 free objects.
            other = H.unique_tokens(4 * CHUNK)
            blocks = list(range(4 * live.blocks_per_chunk))
            assert live.store(F.rid("blocked"), other, blocks) == [False]
            assert time.monotonic() - t_dead < wttl - 1, "too slow to observe the locked state"

            # After the write TTL (and a maintenance pass) the memory is back.
            def released() -> bool:
                l1 = srv.l1()
                return l1 is None or (l1["staging_objects"] == 0 and l1["used_bytes"] <= base_used)

            assert F.wait_until(released, wttl + 10), srv.l1()
            time.sleep(max(0.0, wttl + 1.5 - (time.monotonic() - t_dead)))
            assert live.store(F.rid("after-ttl"), other, blocks) == [True]
            assert live.probe(other) == 4 * CHUNK

            # The killed worker's chunks can be stored again by a live worker and load right.
            want = expected_blocks(live, seed=11, n_chunks=n_dead, scratch_first=0)
            src = list(range(n_dead * live.blocks_per_chunk))
            live.fill_random(0, src, seed=11)
            assert live.store(F.rid("restore"), toks, src) == [True]
            req = F.rid("reload")
            assert live.lookup(req, toks) == n_dead * CHUNK
            dst = list(range(LOAD, LOAD + n_dead * live.blocks_per_chunk))
            live.zero_blocks(0, dst)
            assert live.retrieve(req, toks, dst, end=n_dead * CHUNK) == [True]
            live.end_session(req)
            assert_blocks_equal(live.snapshot_blocks(0, dst), want, "re-stored prompt")
        finally:
            live.close()
        assert srv.alive(), srv.log()[-3000:]


def test_worker_killed_with_store_in_flight_is_all_or_nothing(tmp_path):
    n = 8
    with F.kvd_server(tmp_path, l1_gb=0.05) as srv:
        model = "faults-killed-in-store"
        live = H.TPCluster(srv.url, "lmcache_driven", model, tp=1, shape=SHAPE)
        try:
            child = spawn_worker("lmcache-die-in-store", srv.url, model, seed=23, n=n)
            rc, out = reap_child(child)
            remove_client_segments(child.pid)
            assert rc == -9 and "STORING" in out, f"worker did not die as planned: {rc}\n{out}"
            toks = prompt_tokens(23, n)
            time.sleep(0.5)  # a STORE that reached kvd has finished by now
            req = F.rid("after-kill")
            hit = live.lookup(req, toks)
            assert hit in (0, n * CHUNK), f"partial prompt visible: {hit} tokens"
            if hit:
                want = expected_blocks(live, seed=23, n_chunks=n, scratch_first=0)
                dst = list(range(LOAD, LOAD + n * live.blocks_per_chunk))
                live.zero_blocks(0, dst)
                assert live.retrieve(req, toks, dst, end=hit) == [True]
                assert_blocks_equal(live.snapshot_blocks(0, dst), want, "prompt of the dead worker")
            live.end_session(req)
            # kvd keeps serving others.
            other = H.unique_tokens(2 * CHUNK)
            assert live.store(F.rid("other"), other, list(range(2 * live.blocks_per_chunk))) == [True]
        finally:
            live.close()
        assert srv.alive(), srv.log()[-3000:]


def test_lookup_without_retrieve_pins_nothing_past_read_ttl(tmp_path):
    rttl = 3.0
    with F.kvd_server(tmp_path, l1_gb=8 * OBJ / (1 << 30),
                      extra=["--l1-read-ttl-seconds", str(rttl)]) as srv:
        c = H.TPCluster(srv.url, "lmcache_driven", "faults-lookup-only", tp=1, shape=SHAPE)
        try:
            bpc = c.blocks_per_chunk
            a = H.unique_tokens(8 * CHUNK)
            assert c.store(F.rid("fill"), a, list(range(8 * bpc))) == [True]
            req = F.rid("lookup-only")
            t_lock = time.monotonic()
            assert c.lookup(req, a) == 8 * CHUNK       # 8 objects read-locked ...
            c.end_session(req)                          # ... and the request goes away
            l1 = srv.l1()
            if l1 is not None:
                assert l1["locked_entries"] == 8, l1

            b = H.unique_tokens(2 * CHUNK)
            assert c.store(F.rid("blocked"), b, list(range(2 * bpc))) == [False], \
                "locked chunks were evicted before their read TTL"
            assert time.monotonic() - t_lock < rttl - 0.5, "too slow to observe the locked state"

            time.sleep(max(0.0, rttl + 1.0 - (time.monotonic() - t_lock)))
            assert c.store(F.rid("after-ttl"), b, list(range(2 * bpc))) == [True]
            assert c.probe(b) == 2 * CHUNK  # (its FREE_LOOKUP_LOCKS is not acknowledged)
            if srv.l1() is not None:
                assert F.wait_until(lambda: srv.l1()["locked_entries"] == 0, 10), srv.l1()
        finally:
            c.close()
        assert srv.alive(), srv.log()[-3000:]


def test_lookup_flood_on_a_hot_prefix_costs_other_clients_no_hits(tmp_path):
    """Regression: an entry counted its lookup holds in 16 bits, so once 65,535 lookups that
    were never retrieved held a hot chunk (a client that looks up and ends sessions; the
    bench's 8- and 64-client hit cases), every client's lookup of that prefix was answered
    as a miss until the holds expired (300 s)."""
    model = "faults-hot"
    # Holds are bounded in number by --max-sessions (65,536 by default, issue 27 finding 6):
    # raised here so that more than 65,535 holds can pile up on one entry.
    with F.kvd_server(tmp_path, l1_gb=8 * OBJ / (1 << 30),
                      extra=["--max-sessions", "200000"]) as srv:
        c = H.TPCluster(srv.url, "lmcache_driven", model, tp=1, shape=SHAPE)
        flood = None
        try:
            toks = [(i * 7) % 50_000 + 1 for i in range(CHUNK)]  # faults_flood.py's prompt
            assert c.store(F.rid("hot"), toks, list(range(c.blocks_per_chunk))) == [True]
            assert c.lookup(F.rid("before"), toks) == CHUNK
            flood = subprocess.Popen(
                [sys.executable, str(HERE / "faults_flood.py"), srv.url, model, "240", "2",
                 "600", str(CHUNK)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                start_new_session=True)
            held = lambda: (srv.l1() or {}).get("lookup_locks", 0)  # noqa: E731
            assert F.wait_until(lambda: held() > 66_000, 200, step=0.5), \
                f"the flood held only {held()} lookups"
            os.killpg(flood.pid, 9)
            flood.communicate()
            flood = None
            assert held() > 65_535  # the holds stay (read TTL 300 s)
            victim = F.rid("victim")
            assert c.lookup(victim, toks) == CHUNK, "a flooded hot prefix missed"
            blocks = list(range(LOAD, LOAD + c.blocks_per_chunk))
            assert c.retrieve(victim, toks, blocks, end=CHUNK) == [True]
        finally:
            if flood is not None:
                os.killpg(flood.pid, 9)
                flood.communicate()
            c.close()
        assert srv.alive(), srv.log()[-3000:]


def test_kvd_killed_and_restarted_clients_fail_then_recover(tmp_path):
    srv = F.KvdServer(tmp_path, l1_gb=0.05).start()
    c = None
    try:
        c = H.TPCluster(srv.url, "lmcache_driven", "faults-restart", tp=2, mq_timeout=5.0,
                        heartbeat_interval=1.0, shape=SHAPE)
        bpc = c.blocks_per_chunk
        src = list(range(2 * bpc))
        a = H.unique_tokens(2 * CHUNK)
        assert F.store(c, F.rid("before"), a, src, 2 * CHUNK) == [True, True]
        assert F.lookup(c, F.rid("before-lookup"), a) == 2 * CHUNK

        srv.kill9()
        assert F.wait_until(lambda: not F.healthy(c), 20), "clients never noticed the dead server"
        b = H.unique_tokens(2 * CHUNK)
        res = F.store(c, F.rid("while-down"), b, src, 2 * CHUNK, timeout=6.0)
        assert not all(r is True for r in res), f"store succeeded with no server: {res}"
        assert F.lookup(c, F.rid("while-down-lookup"), b, timeout=10.0) == 0

        srv.start()  # same port, fresh process, empty cache
        assert F.wait_until(lambda: F.healthy(c), 60), "clients did not recover"
        for r in range(c.tp):
            c.fill_random(r, src, seed=500 + r)
        want = [c.snapshot_blocks(r, src) for r in range(c.tp)]
        d = H.unique_tokens(2 * CHUNK)
        assert F.store(c, F.rid("after"), d, src, 2 * CHUNK) == [True, True]
        req = F.rid("after-lookup")
        assert F.lookup(c, req, d) == 2 * CHUNK
        dst = list(range(LOAD, LOAD + 2 * bpc))
        for r in range(c.tp):
            c.zero_blocks(r, dst)
        assert F.retrieve(c, req, d, dst, 2 * CHUNK) == [True, True]
        F.end_session(c, req)
        for r in range(c.tp):
            assert_blocks_equal(c.snapshot_blocks(r, dst), want[r], f"rank {r} after restart")
        # The old server's cache died with it.
        assert F.lookup(c, F.rid("old"), a) == 0
        assert srv.alive()
    finally:
        if c is not None:
            c.close()
        srv.stop()


def victim_latencies(url: str, model: str, seconds: float) -> dict[str, list[float]]:
    """Round trips of one well-behaved client, measured in a process of its own (the
    adapters' threads in this one would add GIL waits): faults_victim.py."""
    r = subprocess.run([sys.executable, str(HERE / "faults_victim.py"), url, model, str(seconds)],
                       capture_output=True, text=True, timeout=seconds + 120)
    assert r.returncode == 0, r.stdout + r.stderr
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("VICTIM ")][-1]
    return json.loads(line[len("VICTIM "):])


def p(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))] if s else float("nan")


def test_flooding_client_does_not_stall_others(tmp_path, record_property):
    model = "faults-flood"
    secs = 6.0
    with F.kvd_server(tmp_path, l1_gb=0.05) as srv:
        # A registered instance of the model, so lookups hash and probe L1 for real.
        seg = F.Segment(f"kvd_flood_{os.getpid()}", F.RAW_LAYER_BYTES)
        reg = F.RawClient(srv.url)
        try:
            assert F.register_raw(reg, 4242, model, seg.name) is None
            base = victim_latencies(srv.url, model, 3.0)
            flood = subprocess.Popen(
                [sys.executable, str(HERE / "faults_flood.py"), srv.url, model, str(secs + 2),
                 "4", "512", str(64 * CHUNK)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                start_new_session=True)
            try:
                time.sleep(1.0)  # let the backlog build up
                under = victim_latencies(srv.url, model, secs)
            finally:
                rc, out = reap_child(flood, timeout=secs + 60)
            assert rc == 0, out
            sent = int(out.split("sent=")[1].split()[0])
        finally:
            reg.close()
            seg.close()
        assert srv.alive(), srv.log()[-3000:]
    figures = {
        "flood_requests_sent": sent,
        "lookup_p50_ms_alone": 1e3 * p(base["lookup"], 0.5),
        "lookup_p99_ms_alone": 1e3 * p(base["lookup"], 0.99),
        "lookup_p50_ms_flooded": 1e3 * p(under["lookup"], 0.5),
        "lookup_p99_ms_flooded": 1e3 * p(under["lookup"], 0.99),
        "chunk_size_p99_ms_alone": 1e3 * p(base["chunk_size"], 0.99),
        "chunk_size_p99_ms_flooded": 1e3 * p(under["chunk_size"], 0.99),
        "victim_lookups_flooded": len(under["lookup"]),
    }
    for k, v in figures.items():
        record_property(k, round(v, 3) if isinstance(v, float) else v)
    print("flood figures:", figures)
    slack = 4.0 if F.sanitizer_build() else 1.0
    assert figures["victim_lookups_flooded"] >= 10, figures
    assert figures["lookup_p99_ms_flooded"] <= 250 * slack, figures
    assert figures["chunk_size_p99_ms_flooded"] <= 100 * slack, figures
