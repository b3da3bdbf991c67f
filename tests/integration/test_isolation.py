"""Isolation: tenants, models, shared-memory names and network exposure.

1. A prefix stored under one cache_salt never hits, and never loads, under another salt or
   with no salt; a prefix stored under one model never hits or loads under another model
   (or another world size) — checked with the real lmcache 0.5.6 adapters.
2. Shared-memory names from clients cannot escape /dev/shm: REGISTER_KV_CACHE with a
   descriptor naming "/../../tmp/x", "a/b", "..", a NUL byte, an over-long name or a
   /dev/shm symlink to a file elsewhere is refused (the instance cannot store), kvd maps
   no file outside /dev/shm, and a plain name in the same request shape works.
3. kvd listens on 127.0.0.1 unless told otherwise (ZMQ and HTTP), and warns whenever the
   address it is given binds every interface — checked inside a private network namespace
   (`unshare -rn`, loopback only) so the test never exposes a port; skipped without it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import pytest

import faults_util as F
import kvd_harness as H

CHUNK = H.CHUNK_SIZE
SHAPE = H.ModelShape(num_blocks=256)
LOAD = 128
kvd_only = pytest.mark.skipif(H.server_kind() != "kvd", reason="kvd-specific")


@pytest.fixture(scope="module")
def tenants(server):
    c = H.TPCluster(server.url, "lmcache_driven", "iso-model-a", tp=2, shape=SHAPE)
    try:
        yield c
    finally:
        c.close()


def fill(c: H.TPCluster, blocks: list[int], seed: int) -> list:
    for r in range(c.tp):
        c.fill_random(r, blocks, seed=seed + r)
    return [c.snapshot_blocks(r, blocks) for r in range(c.tp)]


def zeroed(c: H.TPCluster, blocks: list[int]) -> bool:
    import torch

    return all(int(torch.count_nonzero(s.view(torch.int16))) == 0
               for r in range(c.tp) for s in c.snapshot_blocks(r, blocks))


def same(a: list, b: list) -> bool:
    import torch

    return all(torch.equal(x.view(torch.int16), y.view(torch.int16)) for x, y in zip(a, b))


def test_cache_salt_isolates_tenants(tenants):
    c = tenants
    bpc = c.blocks_per_chunk
    src = list(range(2 * bpc))
    dst = list(range(LOAD, LOAD + 2 * bpc))
    toks = H.unique_tokens(2 * CHUNK + 7)
    end = 2 * CHUNK
    want_a = fill(c, src, seed=100)
    assert F.store(c, F.rid("salt-a"), toks, src, end, salt="tenant-a") == [True, True]
    assert c.probe(toks) == 0  # unsalted: nothing
    req = F.rid("salt-a-look")
    assert F.lookup(c, req, toks, salt="tenant-a") == end
    c.scheduler.free_lookup_locks(list(toks), 0, end, req, cache_salt="tenant-a")
    F.end_session(c, req)

    for salt in ("tenant-b", "", "tenant-a ", "TENANT-A"):
        req = F.rid("salt-other")
        assert F.lookup(c, req, toks, salt=salt) == 0, f"hit under salt {salt!r}"
        for r in range(c.tp):
            c.zero_blocks(r, dst)
        res = F.retrieve(c, req, toks, dst, end, salt=salt)
        F.end_session(c, req)
        assert not any(x is True for x in res), f"retrieve under salt {salt!r} succeeded: {res}"
        assert zeroed(c, dst), f"retrieve under salt {salt!r} wrote into the blocks"

    # The same tokens stored without a salt (other bytes) do not leak into tenant-a's view.
    fill(c, src, seed=200)
    assert F.store(c, F.rid("salt-none"), toks, src, end) == [True, True]
    req = F.rid("salt-a-again")
    assert F.lookup(c, req, toks, salt="tenant-a") == end
    for r in range(c.tp):
        c.zero_blocks(r, dst)
    assert F.retrieve(c, req, toks, dst, end, salt="tenant-a") == [True, True]
    F.end_session(c, req)
    for r in range(c.tp):
        assert same(c.snapshot_blocks(r, dst), want_a[r]), f"rank {r}: tenant-a got other bytes"


@kvd_only
def test_invalid_salts_are_refused(server):
    """Salts the client library would refuse ('/', '@', NUL, > 128 chars) sent raw."""
    c = F.RawClient(server.url)
    seg = F.Segment(f"kvd_iso_salt_{os.getpid()}", F.RAW_LAYER_BYTES)
    try:
        assert F.register_raw(c, 9101, "iso-raw-salt", seg.name) is None
        toks = list(range(1, CHUNK + 1))
        for salt in ("a/b", "x@y", "nul\x00", "s" * 129, "..\\x"):
            key = F.cache_key("iso-raw-salt", 1, 0, toks, 0, CHUNK, F.rid("bad-salt"), salt=salt)
            assert c.call("store", key, 9101, [list(range(16))], b"") == [b"", False], salt
            lk = dict(key, worker_id=None)
            c.call("lookup", lk, 1)
            assert c.call("query_prefetch_status", key["request_id"]) in (0, None)
        assert server.alive()
    finally:
        c.call("unregister_kv_cache", 9101)
        c.close()
        seg.close()


def test_model_and_world_size_isolate(server, tenants):
    a = tenants  # model iso-model-a, TP=2
    b = H.TPCluster(server.url, "lmcache_driven", "iso-model-b", tp=2, shape=SHAPE)
    a1 = H.TPCluster(server.url, "lmcache_driven", "iso-model-a", tp=1, shape=SHAPE)
    try:
        bpc = a.blocks_per_chunk
        src = list(range(2 * bpc))
        dst = list(range(LOAD, LOAD + 2 * bpc))
        toks = H.unique_tokens(2 * CHUNK)
        fill(a, src, seed=300)
        assert F.store(a, F.rid("model-a"), toks, src, 2 * CHUNK) == [True, True]
        assert a.wait_for_hit(toks, 2 * CHUNK) == 2 * CHUNK
        for other, what in ((b, "model iso-model-b"), (a1, "world size 1")):
            req = F.rid("model-other")
            assert F.lookup(other, req, toks) == 0, f"hit under {what}"
            for r in range(other.tp):
                other.zero_blocks(r, dst)
            res = F.retrieve(other, req, toks, dst, 2 * CHUNK)
            F.end_session(other, req)
            assert not any(x is True for x in res), f"retrieve under {what} succeeded: {res}"
            assert zeroed(other, dst), f"retrieve under {what} wrote into the blocks"
    finally:
        b.close()
        a1.close()


# ---------------------------------------------------------------------------------------
# Shared-memory names
# ---------------------------------------------------------------------------------------


def mapped_paths(pid: int) -> set[str]:
    out = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    out.add(parts[5].strip())
    except OSError:
        pass
    return out


@kvd_only
def test_shm_names_cannot_escape_dev_shm(server, tmp_path):
    pid = os.getpid()
    outside = f"/tmp/kvd_iso_escape_{pid}"
    link = f"kvd_iso_link_{pid}"
    target = F.Segment("outside", F.RAW_LAYER_BYTES, path=outside)  # a file kvd must not map
    good = F.Segment(f"kvd_iso_ok_{pid}", F.RAW_LAYER_BYTES)
    os.symlink(outside, f"/dev/shm/{link}")
    c = F.RawClient(server.url)
    bad_names = [
        f"/../../tmp/kvd_iso_escape_{pid}",
        f"../../tmp/kvd_iso_escape_{pid}",
        f"{good.name}/../../../tmp/kvd_iso_escape_{pid}",
        f"/{good.name}/x",
        "/..", "..", "/", "", f"/kvd_iso_ok_{pid}\x00/../../tmp/x",
        "/" + "n" * 300,
        f"/{link}",  # a symlink in /dev/shm to a file elsewhere
    ]
    toks = list(range(7, CHUNK + 7))
    try:
        for i, name in enumerate(bad_names):
            iid = 9200 + i
            F.register_raw(c, iid, "iso-shm", name)
            key = F.cache_key("iso-shm", 1, 0, toks, 0, CHUNK, F.rid("shm-bad"))
            res = c.call("store", key, iid, [list(range(16))], b"")
            assert res == [b"", False], f"instance registered with shm name {name!r}: {res}"
        maps = mapped_paths(server.proc.pid)
        assert not any(p.startswith(outside) for p in maps), "kvd mapped a file outside /dev/shm"
        assert not [p for p in maps if "kvd_iso_link" in p], "kvd followed a /dev/shm symlink"
        # Control: the same request with a plain name works.
        F.register_raw(c, 9299, "iso-shm", "/" + good.name)
        key = F.cache_key("iso-shm", 1, 0, toks, 0, CHUNK, F.rid("shm-good"))
        assert c.call("store", key, 9299, [list(range(16))], b"") == [b"", True]
        assert server.alive()
    finally:
        for i in range(len(bad_names)):
            c.call("unregister_kv_cache", 9200 + i)
        c.call("unregister_kv_cache", 9299)
        c.close()
        os.unlink(f"/dev/shm/{link}")
        target.close()
        good.close()


# ---------------------------------------------------------------------------------------
# Network exposure
# ---------------------------------------------------------------------------------------


def start_plain_kvd(args: list[str], log_path, prefix: list[str] | None = None):
    cmd = [*(prefix or []), F.kvd_binary(), "server", "--l1-size-gb", "0.01",
           "--eviction-policy", "LRU", "--log-level", "info", *args]
    logf = open(log_path, "wb")
    try:
        return subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    finally:
        logf.close()


def stop(p: subprocess.Popen) -> int:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
    return p.returncode


@kvd_only
def test_binds_loopback_by_default(tmp_path):
    port = H.free_port()
    shm = f"kvd_iso_bind_{os.getpid()}"
    args = ["--port", str(port), "--shm-name", shm]
    http_port = None
    if F.kvd_has_flag("--http-port"):
        http_port = H.free_port()
        args += ["--http-port", str(http_port)]  # no --http-host: the default
    p = start_plain_kvd(args, tmp_path / "kvd.log")  # no --host: the default
    try:
        H.wait_until_answers(f"tcp://127.0.0.1:{port}", 60, p)
        assert F.listening_addresses(port) == {"127.0.0.1"}
        if http_port:
            assert F.wait_until(lambda: F.listening_addresses(http_port), 10)
            assert F.listening_addresses(http_port) == {"127.0.0.1"}
        log = (tmp_path / "kvd.log").read_text(errors="replace")
        assert "all interfaces" not in log
    finally:
        assert stop(p) == 0
        try:
            os.unlink(f"/dev/shm/{shm}")
        except OSError:
            pass


def unshare_works() -> bool:
    if not shutil.which("unshare"):
        return False
    try:
        return subprocess.run(["unshare", "-rn", "true"], timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# IPv6 spellings need IPv6 on the namespace's loopback; they are accepted when bind works.
WILDCARDS = ["0.0.0.0", "*", "0", "0x0", "00.0.0.0", "::", "[::]", "::0", "0:0:0:0:0:0:0:0"]
SPECIFIC = ["127.0.0.1", "localhost", "127.0.0.2"]


@kvd_only
@pytest.mark.parametrize("host", WILDCARDS + SPECIFIC)
def test_warns_exactly_when_bound_to_all_interfaces(host, tmp_path):
    if not unshare_works():
        pytest.skip("needs `unshare -rn` (a private network namespace) to bind safely")
    port = H.free_port()
    log = tmp_path / "kvd.log"
    args = ["--host", host, "--port", str(port), "--shm-name", f"kvd_iso_ns_{os.getpid()}"]
    if F.kvd_has_flag("--http-port"):
        args += ["--http-port", "0"]
    # Inside the namespace (only a loopback device, down) nothing is reachable from outside.
    p = start_plain_kvd(args, log, prefix=["unshare", "-rn"])
    try:
        ok = F.wait_until(lambda: "listening on" in log.read_text(errors="replace")
                          or p.poll() is not None, 60)
        text = log.read_text(errors="replace")
        assert ok, text
        if p.poll() is not None:
            if ":" in host and "No such device" in text:
                pytest.skip("kvd cannot bind IPv6 here (ZMQ_IPV6 is not enabled on its socket)")
            pytest.fail(f"kvd did not start with --host {host!r}:\n{text}")
        warned = "all interfaces" in text
        assert warned == (host in WILDCARDS), f"--host {host!r}: warning={warned}\n{text}"
    finally:
        stop(p)
        try:
            os.unlink(f"/dev/shm/kvd_iso_ns_{os.getpid()}")
        except OSError:
            pass
