"""Tiers behind L1, through the real lmcache 0.5.6 client (docs/tiers.md):

* warm restart: kvd stopped and started again on the same fs tier hits and retrieves
  byte-exact a prompt stored before the restart;
* compatibility both ways with the real `lmcache server`: objects stored through one
  server are hit and retrieved byte-exact through the other, on a shared fs directory and a
  shared Redis (standalone, resp adapter); kvd's objects have lmcache's names;
* Redis Cluster: objects stored through the valkey adapter with cluster_mode by one kvd are
  spread over the three masters and read by another;
* valkey adapter both ways with lmcache's own (glide): on a 3-master cluster with key_prefix
  and ttl_seconds, and on one server (cluster_mode false) with database_id;
* faults: a Redis killed in the middle of a run (kvd keeps serving from L1, counts the
  errors, reconnects when it returns), a truncated file (a miss, the prefix shrinks), a full
  disk (a counted error);
* QUERY_PREFETCH_STATUS answers nil while a lookup's prefetch runs.

Real redis-server processes on free loopback ports, started and stopped here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from kvd_harness import ServerProc, TPCluster, free_port
from mount_ns import private_mount_prefix
from tiers_util import Prompt, Redis, RedisCluster, metric, wait_until

MODEL = "org/Tiered-Model-1"


@pytest.fixture
def tmpdir_tier():
    d = tempfile.mkdtemp(prefix="kvd-tier-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def start(kind: str, adapter: str | list[str], tmp_path: Path, name: str, extra=(),
          prefix=()) -> ServerProc:
    adapters = [adapter] if isinstance(adapter, str) else adapter
    args: list[str] = []
    for a in adapters:
        args += ["--l2-adapter", a]
    srv = ServerProc(kind=kind, port=free_port(), l1_size_gb=0.25,
                     log_path=tmp_path / f"{name}.log", extra_args=[*args, *extra],
                     prefix=list(prefix))
    return srv.start()


def cluster_for(srv: ServerProc) -> TPCluster:
    return TPCluster(srv.url, "lmcache_driven", MODEL, tp=2)


def data_files(d: str) -> list[str]:
    return sorted(f for f in os.listdir(d) if f.endswith(".data"))


def http_port(srv: ServerProc) -> int:
    cmd = srv.command()
    return int(cmd[cmd.index("--http-port") + 1])


def kvd_metrics(srv: ServerProc) -> str:
    port = srv._http_port  # set by start_kvd below
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def start_kvd(adapter, tmp_path: Path, name: str, extra=(), prefix=()) -> ServerProc:
    """kvd with a known HTTP port (for /metrics and /status)."""
    port = free_port()
    srv = start("kvd", adapter, tmp_path, name, extra=[*extra, "--http-port", str(port)],
                prefix=prefix)
    srv._http_port = port
    return srv


def status(srv: ServerProc) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{srv._http_port}/status", timeout=10) as r:
        return json.loads(r.read())


# ---------------------------------------------------------------------------------------------
# Warm restart


def test_warm_restart_from_fs_hits_and_is_byte_exact(tmpdir_tier, tmp_path):
    adapter = json.dumps({"type": "fs", "base_path": tmpdir_tier})
    srv = start_kvd(adapter, tmp_path, "kvd1")
    try:
        c = cluster_for(srv)
        p = Prompt(c, chunks=4, seed=11)
        p.store(c, "warm-1")
        wait_until(lambda: len(data_files(tmpdir_tier)) == 8, what="8 objects on disk")
        c.close()
    finally:
        srv.stop()
    srv = start_kvd(adapter, tmp_path, "kvd2")
    try:
        c = cluster_for(srv)
        assert p.check_retrieve(c, "warm-2", chunks=4) == 4
        m = kvd_metrics(srv)
        assert metric(m, "lmcache_mp_lookup_hit_l2_tokens_total") == 4 * 256
        assert metric(m, "lmcache_mp_l2_prefetch_load_completed_chunks_total") == 8
        c.close()
    finally:
        srv.stop()


def test_concurrent_lookups_of_one_prefix_all_hit_from_the_tier(tmpdir_tier, tmp_path):
    """Regression: lookups of one prefix that arrive while a first lookup's prefetch is still
    loading it counted its chunks before they were in L1, and answered 0 hits."""
    adapter = json.dumps({"type": "fs", "base_path": tmpdir_tier})
    srv = start_kvd(adapter, tmp_path, "kvd1")
    try:
        c = cluster_for(srv)
        p = Prompt(c, chunks=6, seed=17)
        p.store(c, "conc-0")
        wait_until(lambda: len(data_files(tmpdir_tier)) == 12, what="12 objects on disk")
        c.close()
    finally:
        srv.stop()
    srv = start_kvd(adapter, tmp_path, "kvd2")
    try:
        c = cluster_for(srv)
        s = c.scheduler
        ids = [f"conc-{i}" for i in range(1, 5)]
        for rid in ids:  # all submitted before any result is read
            s.maybe_submit_lookup_request(rid, list(p.tokens))
        hits = {}
        deadline = time.monotonic() + 30
        while len(hits) < len(ids) and time.monotonic() < deadline:
            for rid in ids:
                if rid not in hits:
                    res = s.check_lookup_result(rid)
                    if res is not None:
                        hits[rid] = int(res)
            time.sleep(0.005)
        assert hits == {rid: 6 * 256 for rid in ids}, hits
        for rid in ids:
            s.free_lookup_locks(list(p.tokens), 0, 6 * 256, rid)
            c.end_session(rid)
        assert p.check_retrieve(c, "conc-after", chunks=6) == 6
        c.close()
    finally:
        srv.stop()


def test_skip_l1_moves_chunks_to_the_tier_once_every_rank_is_there(tmpdir_tier, tmp_path):
    """--l2-store-policy skip_l1 through the server, TP=2: once both ranks' objects of a
    chunk are on disk the chunk leaves L1; a lookup then brings it back from the tier, and the
    retrieve is byte-exact."""
    adapter = json.dumps({"type": "fs", "base_path": tmpdir_tier})
    srv = start_kvd(adapter, tmp_path, "kvd1", extra=["--l2-store-policy", "skip_l1"])
    try:
        c = cluster_for(srv)
        p = Prompt(c, chunks=3, seed=31)
        p.store(c, "skip-1")
        wait_until(lambda: len(data_files(tmpdir_tier)) == 6, what="6 objects on disk")
        wait_until(lambda: status(srv)["l2_policies"]["skip_l1_removed_chunks"] == 3,
                   what="3 chunks removed from L1")
        st = status(srv)
        assert st["l2_policies"]["store_policy"] == "skip_l1"
        assert st["l2_policies"]["skip_l1_waiting_chunks"] == 0
        assert metric(kvd_metrics(srv), "kvd_l1_entries") == 0
        assert p.check_retrieve(c, "skip-2", chunks=3) == 3  # loaded back from the tier
        assert metric(kvd_metrics(srv), "lmcache_mp_lookup_hit_l2_tokens_total") == 3 * 256
        c.close()
    finally:
        srv.stop()


def test_truncated_file_is_a_miss_and_the_prefix_shrinks(tmpdir_tier, tmp_path):
    adapter = json.dumps({"type": "fs", "base_path": tmpdir_tier})
    srv = start_kvd(adapter, tmp_path, "kvd1")
    try:
        c = cluster_for(srv)
        p = Prompt(c, chunks=4, seed=21)
        p.store(c, "trunc-1")
        wait_until(lambda: len(data_files(tmpdir_tier)) == 8, what="8 objects on disk")
        c.close()
    finally:
        srv.stop()
    # Chunk 2's rank-1 object loses its tail; chunk 3's rank-0 object is overwritten with
    # garbage of the same length (a length check cannot see it; docs/tiers.md).
    from kvd_harness import unique_tokens  # noqa: F401,PLC0415

    import blake3  # noqa: PLC0415
    import struct  # noqa: PLC0415

    prev = blake3.blake3(b"\0" * 12).digest()
    hashes = []
    for i in range(4):
        prev = blake3.blake3(prev + b"".join(struct.pack(">I", t) for t in p.tokens[i * 256:(i + 1) * 256])).digest()
        hashes.append(prev.hex())
    victim = Path(tmpdir_tier) / f"org-SEP-Tiered-Model-1@0x02010201@0@{hashes[2]}.data"
    assert victim.exists()
    size = victim.stat().st_size
    with open(victim, "r+b") as f:
        f.truncate(size // 3)
    srv = start_kvd(adapter, tmp_path, "kvd2")
    try:
        c = cluster_for(srv)
        assert p.check_retrieve(c, "trunc-2", chunks=2) == 2
        m = kvd_metrics(srv)
        assert metric(m, "lmcache_mp_l2_load_failed_chunks_total", reason="corrupted") == 1
        c.close()
    finally:
        srv.stop()


# ---------------------------------------------------------------------------------------------
# Compatibility with the real lmcache server, both ways


def _both_ways(adapter: str, count_objects, tmp_path: Path, src_kind: str, dst_kind: str):
    src = start(src_kind, adapter, tmp_path, f"{src_kind}-src") if src_kind != "kvd" else start_kvd(adapter, tmp_path, "kvd-src")
    try:
        c = cluster_for(src)
        p = Prompt(c, chunks=3, seed=31)
        p.store(c, "compat-1")
        wait_until(lambda: count_objects() >= 6, timeout=30, what="6 objects in the tier")
        c.close()
    finally:
        src.stop()
    dst = start(dst_kind, adapter, tmp_path, f"{dst_kind}-dst") if dst_kind != "kvd" else start_kvd(adapter, tmp_path, "kvd-dst")
    try:
        c = cluster_for(dst)
        deadline = time.monotonic() + 20
        while True:  # the reference answers a prefetch in its own time
            n = p.check_retrieve(c, f"compat-{time.monotonic()}")
            if n == 3 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert n == 3, f"{dst_kind} hit {n} of 3 chunks stored through {src_kind}"
        c.close()
    finally:
        dst.stop()


@pytest.mark.parametrize("direction", ["kvd_to_lmcache", "lmcache_to_kvd"])
def test_fs_objects_are_shared_with_lmcache(direction, tmpdir_tier, tmp_path):
    adapter = json.dumps({"type": "fs", "base_path": tmpdir_tier})
    src, dst = ("kvd", "lmcache") if direction == "kvd_to_lmcache" else ("lmcache", "kvd")
    _both_ways(adapter, lambda: len(data_files(tmpdir_tier)), tmp_path, src, dst)
    names = data_files(tmpdir_tier)
    assert all(re.fullmatch(r"org-SEP-Tiered-Model-1@0x020([01])020\1@0@[0-9a-f]{64}\.data", n)
               for n in names), names


@pytest.mark.parametrize("direction", ["kvd_to_lmcache", "lmcache_to_kvd"])
def test_resp_objects_are_shared_with_lmcache(direction, tmp_path):
    r = Redis().start()
    try:
        adapter = json.dumps({"type": "resp", "host": "127.0.0.1", "port": r.port})
        src, dst = ("kvd", "lmcache") if direction == "kvd_to_lmcache" else ("lmcache", "kvd")
        _both_ways(adapter, lambda: len(r.keys()), tmp_path, src, dst)
        keys = r.keys()
        assert all(re.fullmatch(r"org/Tiered-Model-1@020([01])020\1@0@[0-9a-f]{64}", k) for k in keys), keys
    finally:
        r.close()


def test_fs_native_reads_what_fs_wrote(tmpdir_tier, tmp_path):
    """lmcache's fs and fs_native name and fill files alike: kvd writes with fs, the
    reference reads with fs_native."""
    w = json.dumps({"type": "fs", "base_path": tmpdir_tier})
    r = json.dumps({"type": "fs_native", "base_path": tmpdir_tier, "num_workers": 2})
    src = start_kvd(w, tmp_path, "kvd-src")
    try:
        c = cluster_for(src)
        p = Prompt(c, chunks=2, seed=41)
        p.store(c, "fsn-1")
        wait_until(lambda: len(data_files(tmpdir_tier)) == 4, what="4 objects on disk")
        c.close()
    finally:
        src.stop()
    dst = start("lmcache", r, tmp_path, "lmcache-fsn")
    try:
        c = cluster_for(dst)
        deadline = time.monotonic() + 20
        n = 0
        while n < 2 and time.monotonic() < deadline:
            n = p.check_retrieve(c, f"fsn-{time.monotonic()}")
            time.sleep(0.2)
        assert n == 2
        c.close()
    finally:
        dst.stop()


# ---------------------------------------------------------------------------------------------
# Redis Cluster


def test_valkey_cluster_spreads_objects_and_a_second_kvd_reads_them(tmp_path):
    rc = RedisCluster().start()
    try:
        adapter = json.dumps({"type": "valkey", "startup_nodes": rc.startup_nodes,
                              "cluster_mode": True, "key_prefix": "kvdit", "ttl_seconds": 3600})
        srv = start_kvd(adapter, tmp_path, "kvd-c1")
        try:
            c = cluster_for(srv)
            p = Prompt(c, chunks=6, seed=51)
            p.store(c, "vk-1")
            wait_until(lambda: len(rc.keys()) == 12, what="12 objects in the cluster")
            c.close()
        finally:
            srv.stop()
        per_node = [len(ks) for ks in rc.assert_keys_on_their_slot_owners().values()]
        assert sum(per_node) == 12, per_node
        k = rc.keys()[0]
        assert re.fullmatch(r"kvdit@org/Tiered-Model-1@020([01])020\1@0@[0-9a-f]{64}", k), k
        owner = next(n for n in rc.nodes if k in n.keys())
        ttl = int(owner.cli("TTL", k).strip())
        assert 3500 < ttl <= 3600
        srv = start_kvd(adapter, tmp_path, "kvd-c2")
        try:
            c = cluster_for(srv)
            assert p.check_retrieve(c, "vk-2", chunks=6) == 6
            c.close()
        finally:
            srv.stop()
    finally:
        rc.close()


def _require_lmcache_valkey() -> None:
    try:
        import glide_sync  # noqa: F401,PLC0415  (lmcache's valkey adapter needs it)
    except ImportError:
        pytest.fail("valkey-glide-sync is not in the venv: run scripts/setup-venv.sh")


@pytest.mark.parametrize("direction", ["kvd_to_lmcache", "lmcache_to_kvd"])
def test_valkey_cluster_objects_are_shared_with_lmcache(direction, tmp_path):
    """lmcache's own valkey adapter (glide, cluster_mode) and kvd's on one 3-master cluster,
    with the same key_prefix and ttl_seconds: the same names, slots, bytes and expiry."""
    _require_lmcache_valkey()
    rc = RedisCluster().start()
    try:
        adapter = json.dumps({"type": "valkey", "startup_nodes": rc.startup_nodes,
                              "cluster_mode": True, "key_prefix": "shared",
                              "ttl_seconds": 3600, "num_workers": 2})
        src, dst = ("kvd", "lmcache") if direction == "kvd_to_lmcache" else ("lmcache", "kvd")
        _both_ways(adapter, lambda: len(rc.keys()), tmp_path, src, dst)
        per_node = rc.assert_keys_on_their_slot_owners()
        keys = [k for ks in per_node.values() for k in ks]
        assert len(keys) == 6, per_node
        assert all(re.fullmatch(r"shared@org/Tiered-Model-1@020([01])020\1@0@[0-9a-f]{64}", k)
                   for k in keys), keys
        for n in rc.nodes:
            for k in per_node[n.port]:
                assert 3500 < int(n.cli("TTL", k).strip()) <= 3600, (src, k)
    finally:
        rc.close()


@pytest.mark.parametrize("direction", ["kvd_to_lmcache", "lmcache_to_kvd"])
def test_valkey_standalone_objects_are_shared_with_lmcache(direction, tmp_path):
    """cluster_mode false: one server (only the first of startup_nodes is used, by both),
    database_id selects the logical database, key_prefix as in a cluster."""
    _require_lmcache_valkey()
    r = Redis().start()
    try:
        unused = free_port()  # a second seed nobody listens on: both use the first only
        adapter = json.dumps({"type": "valkey",
                              "startup_nodes": f"127.0.0.1:{r.port},127.0.0.1:{unused}",
                              "key_prefix": "solo", "database_id": 3, "num_workers": 2})
        in_db3 = lambda: [k for k in r.cli("-n", "3", "--scan").splitlines()  # noqa: E731
                          if k and not k.endswith(".kvdsum")]  # objects, not kvd's checksums
        src, dst = ("kvd", "lmcache") if direction == "kvd_to_lmcache" else ("lmcache", "kvd")
        _both_ways(adapter, lambda: len(in_db3()), tmp_path, src, dst)
        keys = in_db3()
        assert len(keys) == 6 and not r.keys(), (keys, r.keys())
        assert all(re.fullmatch(r"solo@org/Tiered-Model-1@020([01])020\1@0@[0-9a-f]{64}", k)
                   for k in keys), keys
        assert all(r.cli("-n", "3", "TTL", k).strip() == "-1" for k in keys)
    finally:
        r.close()


def test_valkey_password_in_username_is_shared_with_lmcache(tmp_path):
    """lmcache 0.5.6 hands `username` to glide as the password (and `password` as the user
    name): on a server with requirepass it logs in only with the password in `username`.
    kvd takes a `username` without a `password` as that password, so the same JSON works."""
    _require_lmcache_valkey()
    r = Redis(password="tier-secret").start()
    try:
        adapter = json.dumps({"type": "valkey", "startup_nodes": f"127.0.0.1:{r.port}",
                              "username": "tier-secret", "num_workers": 2})
        _both_ways(adapter, lambda: len(r.keys()), tmp_path, "lmcache", "kvd")
        assert len(r.keys()) == 6
    finally:
        r.close()


# ---------------------------------------------------------------------------------------------
# Faults


def test_redis_killed_mid_run_kvd_serves_from_l1_and_reconnects(tmp_path):
    r = Redis().start()
    try:
        adapter = json.dumps({"type": "resp", "host": "127.0.0.1", "port": r.port,
                              "num_workers": 2})
        srv = start_kvd(adapter, tmp_path, "kvd-kill")
        try:
            c = cluster_for(srv)
            a = Prompt(c, chunks=2, seed=61)
            a.store(c, "kill-a")
            wait_until(lambda: len(r.keys()) == 4, what="4 objects in redis")
            r.kill()
            # L1-resident chunks keep working; new stores work; lookups answer.
            b = Prompt(c, chunks=2, seed=62)
            t0 = time.monotonic()
            b.store(c, "kill-b")
            assert a.check_retrieve(c, "kill-a2", chunks=2) == 2
            assert b.check_retrieve(c, "kill-b2", chunks=2) == 2
            miss = Prompt(c, chunks=1, seed=63)
            assert c.lookup("kill-miss", miss.tokens) == 0
            assert time.monotonic() - t0 < 15
            wait_until(lambda: metric(kvd_metrics(srv), "lmcache_mp_l2_store_failed_chunks_total") >= 4,
                       what="failed tier writes counted")
            st = status(srv)
            assert st["tiers"][0]["healthy"] is False
            # The node returns (empty): kvd reconnects and writes again.
            r.start()
            d = Prompt(c, chunks=1, seed=64)
            deadline = time.monotonic() + 20
            while not r.keys() and time.monotonic() < deadline:
                d = Prompt(c, chunks=1, seed=int(time.monotonic() * 1000) % 100000)
                d.store(c, f"kill-d-{time.monotonic()}")
                time.sleep(0.3)
            assert r.keys(), "kvd did not write to redis after it came back"
            c.close()
        finally:
            srv.stop()
    finally:
        r.close()


def test_full_disk_is_a_counted_error(tmp_path):
    """A tier on a full disk: its writes fail and are counted (reason no_space), no
    temporaries are left, L1 still serves. The disk is a 1 MiB tmpfs mounted in kvd's own
    mount namespace (`unshare -m` as root, else an unprivileged user namespace: mount_ns.py);
    the test reads it through /proc/<pid>/root. Skipped, saying why, where neither works."""
    prefix, why = private_mount_prefix()
    if prefix is None:
        pytest.skip(why)
    mnt = tempfile.mkdtemp(prefix="kvd-full-")
    mount_then_run = [*prefix, "sh", "-c", 'mount -t tmpfs -o size=1m tmpfs "$0" && exec "$@"',
                      mnt]
    try:
        adapter = json.dumps({"type": "fs", "base_path": mnt})
        srv = start_kvd(adapter, tmp_path, "kvd-full", prefix=mount_then_run)
        try:
            seen = f"/proc/{srv.proc.pid}/root{mnt}"  # the tmpfs, as kvd sees it
            with open(f"/proc/{srv.proc.pid}/mounts") as f:
                assert any(l.split()[1:3] == [mnt, "tmpfs"] for l in f), "no tmpfs on the tier"
            c = cluster_for(srv)
            p = Prompt(c, chunks=4, seed=71)  # 8 objects of 512 KiB: 1 MiB holds at most 1
            p.store(c, "full-1")
            wait_until(lambda: metric(kvd_metrics(srv), "lmcache_mp_l2_store_failed_chunks_total",
                                      reason="no_space") >= 6, what="no-space errors counted")
            assert srv.alive()
            assert p.check_retrieve(c, "full-2", chunks=4) == 4  # L1 still serves
            assert not [f for f in os.listdir(seen) if f.endswith(".tmp")], "temporaries left"
            c.close()
        finally:
            srv.stop()
    finally:
        shutil.rmtree(mnt, ignore_errors=True)


def test_prefetch_status_is_nil_while_the_tier_loads(tmp_path):
    """A Redis paused for 2 s (CLIENT PAUSE) holds the lookup's prefetch: the lookup
    answers "still running" (QUERY_PREFETCH_STATUS nil) meanwhile, then the hit count."""
    r = Redis().start()
    try:
        adapter = json.dumps({"type": "resp", "host": "127.0.0.1", "port": r.port})
        srv = start_kvd(adapter, tmp_path, "kvd-nil")
        try:
            c = cluster_for(srv)
            p = Prompt(c, chunks=2, seed=81)
            p.store(c, "nil-1")
            wait_until(lambda: len(r.keys()) == 4, what="4 objects in redis")
            c.close()
        finally:
            srv.stop()
        srv = start_kvd(adapter, tmp_path, "kvd-nil2")
        try:
            c = cluster_for(srv)
            assert r.cli("CLIENT", "PAUSE", "2000", "ALL").strip() == "OK"
            s = c.scheduler
            s.maybe_submit_lookup_request("nil-2", list(p.tokens))
            seen_none = False
            t0 = time.monotonic()
            res = None
            while time.monotonic() - t0 < 20:
                res = s.check_lookup_result("nil-2")
                if res is None:
                    seen_none = True
                else:
                    break
                time.sleep(0.02)
            assert seen_none, "the lookup never reported 'still running'"
            assert res == 2 * 256
            assert time.monotonic() - t0 >= 1.0
            c.end_session("nil-2")
            c.close()
        finally:
            srv.stop()
    finally:
        r.close()
