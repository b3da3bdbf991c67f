"""P2P between kvd servers (docs/p2p.md), with real parts on loopback: three kvd processes
whose P2P nodes talk UCX over TCP, Debian's redis-server as the fleet directory, and the real
lmcache 0.5.6 client:

* a prompt stored through kvd A is hit and retrieved byte-exact through kvd B and kvd C
  (TP=1 and TP=2, both transfer modes), loaded from A's L1 over UCX;
* a peer that does not present the fleet's secret gets nothing (and a peer that does then
  gets the same prompt);
* a peer killed after storing is a miss for the others (no wrong bytes, the lookup ends in
  time), and once restarted (a new incarnation, at the same address) it is never read
  through the entries of its earlier life: they are removed from the directory;
* a stalled peer (SIGSTOP) costs a lookup no more than --p2p-load-timeout, and serves again
  once resumed;
* the directory down: L1 keeps serving, lookups of what only a peer holds are misses, and
  the failures are counted.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from kvd_harness import ServerProc, TPCluster, free_port
from tiers_util import Prompt, Redis, RedisCluster, metric, wait_until

MODEL = "org/P2p-Model-1"
PREFIX = "{kvd-p2p}:"


def secret_file(tmp_path: Path, name: str, secret: str) -> Path:
    p = tmp_path / name
    p.write_text(secret + "\n")
    p.chmod(0o600)
    return p


class Node:
    """One kvd with P2P on: UCX over TCP on a free loopback port."""

    def __init__(self, tmp_path: Path, name: str, redis: Redis | str, secret: Path,
                 p2p_port: int | None = None, extra=()) -> None:
        directory = redis if isinstance(redis, str) else f"redis://127.0.0.1:{redis.port}"
        self.p2p_port = p2p_port or free_port()
        self.http_port = free_port()
        self.srv = ServerProc(
            kind="kvd", port=free_port(exclude={self.p2p_port, self.http_port}),
            l1_size_gb=0.25, log_path=tmp_path / f"{name}.log",
            extra_args=["--http-port", str(self.http_port),
                        "--p2p-advertise-url", f"127.0.0.1:{self.p2p_port}",
                        "--p2p-directory", directory,
                        "--p2p-secret-file", str(secret),
                        "--p2p-ucx-tls", "tcp",
                        "--p2p-lookup-timeout", "2", "--p2p-load-timeout", "5",
                        *extra])
        self.srv.start()

    @property
    def url(self) -> str:
        return self.srv.url

    def metrics(self) -> str:
        import urllib.request  # noqa: PLC0415
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics", timeout=10) as r:
            return r.read().decode()

    def status(self) -> dict:
        import json  # noqa: PLC0415
        import urllib.request  # noqa: PLC0415
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/status", timeout=10) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        self.srv.stop()


def chunk_entries(redis: Redis) -> list[str]:
    return [k for k in redis.cli("--scan", "--pattern", PREFIX + "chunk:*").splitlines() if k]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("p2p")
    redis = Redis().start()
    secret = secret_file(tmp, "secret", "fleet-secret-1")
    nodes = []
    try:
        for name in ("a", "b", "c"):
            nodes.append(Node(tmp, name, redis, secret))
        yield redis, nodes
    finally:
        for n in nodes:
            n.stop()
        redis.close()


@pytest.mark.parametrize("tp,mode", [(1, "lmcache_driven"), (2, "lmcache_driven"),
                                     (2, "engine_driven")])
def test_prompt_stored_through_a_is_retrieved_byte_exact_through_b_and_c(fleet, tp, mode):
    redis, (a, b, c) = fleet
    before = len(chunk_entries(redis))
    ca = TPCluster(a.url, mode, MODEL, tp=tp)
    cb = TPCluster(b.url, mode, MODEL, tp=tp)
    cc = TPCluster(c.url, mode, MODEL, tp=tp)
    try:
        p = Prompt(ca, chunks=4, seed=100 + 10 * tp + len(mode))
        p.store(ca, f"store-{tp}-{mode}")
        # One directory entry per chunk (every rank's object of it), published by A.
        wait_until(lambda: len(chunk_entries(redis)) == before + 4, what="4 chunks published")
        loaded_before = metric(b.metrics(), "kvd_l2_loaded_objects_total", l2_name="p2p")
        served_before = metric(a.metrics(), "kvd_p2p_served_objects_total")
        # Byte-exact through B and C (Prompt.check_retrieve compares every rank's blocks).
        assert p.check_retrieve(cb, f"b-{tp}-{mode}", chunks=4) == 4
        assert p.check_retrieve(cc, f"c-{tp}-{mode}", chunks=4) == 4
        # B loaded every rank's object of the 4 chunks from its peer tier.
        assert metric(b.metrics(), "kvd_l2_loaded_objects_total", l2_name="p2p") >= loaded_before + 4 * tp
        # A served them (B's and C's reads), and says so on /metrics and /status.
        assert metric(a.metrics(), "kvd_p2p_served_objects_total") >= served_before + 8 * tp
        assert a.status()["metrics"]["kvd_p2p_served_bytes_total"]["series"][0]["value"] > 0
    finally:
        for cl in (ca, cb, cc):
            cl.close()


def test_kv_events_say_which_chunks_came_from_a_peer(fleet):
    """B's KV-event stream: a "loaded" record, medium "P2P", names the chunks B loaded from A
    (with lmcache's hashes); lmcache's adapter passes medium-P2P records by."""
    from test_kv_events import Subscriber, lmcache_hashes  # noqa: PLC0415
    redis, (a, b, _) = fleet
    model = MODEL + "-events"
    ca = TPCluster(a.url, "lmcache_driven", model, tp=2)
    cb = TPCluster(b.url, "lmcache_driven", model, tp=2)
    sub = Subscriber(b.url, instance_id=5151, model=model)
    try:
        assert sub.next_batch().enabled
        p = Prompt(ca, chunks=2, seed=61)
        before = len(chunk_entries(redis))
        p.store(ca, "events-store")
        wait_until(lambda: len(chunk_entries(redis)) == before + 2, what="2 chunks published")
        assert p.check_retrieve(cb, "events-b", chunks=2) == 2
        deadline = time.monotonic() + 10
        loaded = []
        while not loaded and time.monotonic() < deadline:
            loaded = [r for r in sub.next_batch().events if r.kind == "loaded"]
        assert loaded, "no loaded record"
        assert all(r.medium == "P2P" and r.model_name == model for r in loaded)
        assert sorted(h for r in loaded for h in r.block_hashes) == sorted(lmcache_hashes(p.tokens))
        assert metric(b.metrics(), "kvd_kv_events_loaded_records_total") >= 1
    finally:
        sub.close()
        ca.close()
        cb.close()


def test_a_peer_without_the_secret_gets_nothing(fleet, tmp_path):
    redis, (a, b, _) = fleet
    wrong = secret_file(tmp_path, "wrong", "not-the-fleet-secret")
    d = Node(tmp_path, "d", redis, wrong)
    ca = TPCluster(a.url, "lmcache_driven", MODEL, tp=1)
    cd = TPCluster(d.url, "lmcache_driven", MODEL, tp=1)
    cb = TPCluster(b.url, "lmcache_driven", MODEL, tp=1)
    try:
        before = len(chunk_entries(redis))
        p = Prompt(ca, chunks=3, seed=7)
        p.store(ca, "secret-store")
        wait_until(lambda: len(chunk_entries(redis)) == before + 3, what="3 chunks published")
        assert p.check_retrieve(cd, "secret-d") == 0
        # D found the owners but A refused its reads: counted as failed loads, not hits.
        assert metric(d.metrics(), "lmcache_mp_l2_load_failed_chunks_total", l2_name="p2p",
                      reason="unavailable") >= 1
        assert metric(d.metrics(), "kvd_l2_loaded_objects_total", l2_name="p2p") == 0
        assert metric(a.metrics(), "kvd_p2p_unauthenticated_asks_total") >= 1
        assert p.check_retrieve(cb, "secret-b", chunks=3) == 3
    finally:
        for cl in (ca, cd, cb):
            cl.close()
        d.stop()


def test_a_redis_cluster_directory(tmp_path):
    """The directory on a 3-master Redis Cluster, each kvd given another master as its seed:
    every fleet key lands on the master of the prefix's slot, and B hits what A stored."""
    rc = RedisCluster().start()
    secret = secret_file(tmp_path, "secret", "fleet-secret-5")
    a = b = None
    try:
        a = Node(tmp_path, "a", f"redis-cluster://127.0.0.1:{rc.nodes[0].port}", secret)
        b = Node(tmp_path, "b", f"redis-cluster://127.0.0.1:{rc.nodes[1].port}", secret)
        ca = TPCluster(a.url, "lmcache_driven", MODEL, tp=2)
        cb = TPCluster(b.url, "lmcache_driven", MODEL, tp=2)
        p = Prompt(ca, chunks=3, seed=51)
        p.store(ca, "cluster-store")

        def chunk_keys() -> list[str]:
            return [k for k in rc.keys() if k.startswith(PREFIX + "chunk:")]
        wait_until(lambda: len(chunk_keys()) == 3, what="3 chunks published")
        owners = {port for port, ks in rc.assert_keys_on_their_slot_owners().items() if ks}
        assert len(owners) == 1, owners  # one slot: one master holds every key of the fleet
        assert p.check_retrieve(cb, "cluster-b", chunks=3) == 3
        ca.close()
        cb.close()
    finally:
        for n in (a, b):
            if n is not None:
                n.stop()
        rc.close()


def test_killed_peer_is_a_miss_and_its_restart_is_not_read_through_old_entries(tmp_path):
    redis = Redis().start()
    secret = secret_file(tmp_path, "secret", "fleet-secret-2")
    a = Node(tmp_path, "a", redis, secret)
    b = Node(tmp_path, "b", redis, secret)
    a2 = None
    try:
        ca = TPCluster(a.url, "lmcache_driven", MODEL, tp=1)
        p = Prompt(ca, chunks=3, seed=21)
        p.store(ca, "kill-store")
        wait_until(lambda: len(chunk_entries(redis)) == 3, what="3 chunks published")
        ca.close()
        os.killpg(a.srv.proc.pid, signal.SIGKILL)
        a.srv.proc.wait(10)
        cb = TPCluster(b.url, "lmcache_driven", MODEL, tp=1)
        t0 = time.monotonic()
        assert p.check_retrieve(cb, "kill-b1") == 0
        # Bounded by the load timeout (5 s) and the lookup timeout (2 s), not a hang.
        assert time.monotonic() - t0 < 12
        # A again, at the same address: a new incarnation with an empty L1.
        a2 = Node(tmp_path, "a2", redis, secret, p2p_port=a.p2p_port)
        ca2 = TPCluster(a2.url, "lmcache_driven", MODEL, tp=1)
        assert p.check_retrieve(cb, "kill-b2") == 0
        # The lookups removed the entries of A's earlier life.
        wait_until(lambda: chunk_entries(redis) == [], what="stale entries removed")
        ca2.close()
        cb.close()
    finally:
        for n in (a, b, a2):
            if n is not None:
                n.stop()
        redis.close()


def test_a_stalled_peer_costs_a_bounded_miss_and_serves_again_once_resumed(tmp_path):
    """A peer that stops answering (SIGSTOP: its process frozen, its sockets open) costs a
    lookup at most the load timeout; once it resumes, it is healthy and serves again."""
    redis = Redis().start()
    secret = secret_file(tmp_path, "secret", "fleet-secret-4")
    a = Node(tmp_path, "a", redis, secret)
    b = Node(tmp_path, "b", redis, secret)
    c = Node(tmp_path, "c", redis, secret)
    try:
        ca = TPCluster(a.url, "lmcache_driven", MODEL, tp=1)
        cb = TPCluster(b.url, "lmcache_driven", MODEL, tp=1)
        p = Prompt(ca, chunks=3, seed=41)
        p.store(ca, "stall-store")
        wait_until(lambda: len(chunk_entries(redis)) == 3, what="3 chunks published")
        os.killpg(a.srv.proc.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            assert p.check_retrieve(cb, "stall-b") == 0
            # --p2p-load-timeout 5 (plus a lookup): not the 30 s default, not a hang.
            assert time.monotonic() - t0 < 12
        finally:
            os.killpg(a.srv.proc.pid, signal.SIGCONT)
        assert a.srv.alive()
        cc = TPCluster(c.url, "lmcache_driven", MODEL, tp=1)
        assert p.check_retrieve(cc, "stall-c", chunks=3) == 3
        assert metric(b.metrics(), "kvd_p2p_load_misses_total") >= 1
        for cl in (ca, cb, cc):
            cl.close()
    finally:
        for n in (a, b, c):
            n.stop()
        redis.close()


def test_directory_down_l1_keeps_serving_and_peer_lookups_miss(tmp_path):
    redis = Redis().start()
    secret = secret_file(tmp_path, "secret", "fleet-secret-3")
    a = Node(tmp_path, "a", redis, secret)
    b = Node(tmp_path, "b", redis, secret)
    try:
        ca = TPCluster(a.url, "lmcache_driven", MODEL, tp=1)
        cb = TPCluster(b.url, "lmcache_driven", MODEL, tp=1)
        p = Prompt(ca, chunks=2, seed=31)
        p.store(ca, "down-store")
        wait_until(lambda: len(chunk_entries(redis)) == 2, what="2 chunks published")
        redis.kill()
        # A's own L1 still hits.
        assert p.check_retrieve(ca, "down-a", chunks=2) == 2
        # B cannot ask the directory: a miss within the lookup timeout, counted.
        t0 = time.monotonic()
        assert p.check_retrieve(cb, "down-b") == 0
        assert time.monotonic() - t0 < 12
        assert metric(b.metrics(), "kvd_l2_lookup_errors_total", l2_name="p2p") >= 1
        assert metric(b.metrics(), "kvd_p2p_lookup_failures_total") >= 1
        # B's own stores still work and hit.
        q = Prompt(cb, chunks=2, seed=32)
        q.store(cb, "down-b-store")
        assert q.check_retrieve(cb, "down-b-own", chunks=2) == 2
        ca.close()
        cb.close()
    finally:
        a.stop()
        b.stop()
        redis.close()


def test_an_unreachable_directory_stops_kvd_at_startup_naming_it(tmp_path):
    """Fail fast: a kvd whose fleet directory cannot be reached does not start, and says
    which directory (and P2P listener) it tried."""
    import subprocess  # noqa: PLC0415
    from kvd_harness import DEFAULT_KVD_BIN  # noqa: PLC0415
    secret = secret_file(tmp_path, "secret", "fleet-secret-6")
    dead = free_port()
    p2p = free_port(exclude={dead})
    binary = os.environ.get("KVD_TEST_KVD_BIN", str(DEFAULT_KVD_BIN))
    r = subprocess.run([binary, "server", "--l1-size-gb", "0.25", "--eviction-policy", "LRU",
                        "--port", str(free_port(exclude={dead, p2p})), "--http-port", "0",
                        "--p2p-advertise-url", f"127.0.0.1:{p2p}",
                        "--p2p-directory", f"redis://127.0.0.1:{dead}",
                        "--p2p-secret-file", str(secret), "--p2p-ucx-tls", "tcp"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert f"directory 127.0.0.1:{dead}" in r.stdout + r.stderr, r.stdout + r.stderr

