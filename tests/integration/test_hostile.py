"""Hostile and broken clients (issue 11): one test per finding, named after it.

A client that lies or dies must not make kvd read or write memory that is not the client's,
let a late copy overwrite another tenant's object, or kill the server. Each test drives the
real lmcache 0.5.6 client where the attack can be made with it, and raw frames (the RawClient
of faults_util, msgspec-encoded exactly like the client's) where the real client would never
send such a request.

Finding 2 (stale device copies) needs an asynchronous device engine; it is covered by
tests/unit/server/stale_device_copy_test.cc (a gated threaded engine, also run under TSan)
and the l1 unit tests named Finding2*. Findings 5, 7, 9 and 11 have their own tests where
they are fixed.
"""

from __future__ import annotations

import mmap
import os
import time

import pytest

import faults_util as F
import kvd_harness as H

CHUNK = H.CHUNK_SIZE
SERVER_L1_GB = 0.25

kvd_only = pytest.mark.skipif(H.server_kind() != "kvd", reason="kvd's hostile-client behaviour")
pytestmark = kvd_only

# One raw layer (faults_util.RAW_LAYER_*): [2, 16 blocks, 16 tokens, 2 heads, 64] bf16, so the
# 16 blocks of a segment hold exactly one 256-token chunk.
BLOCKS = [list(range(16))]
PLANE = 16 * 16 * 2 * 64 * 2  # bytes of the K (or V) plane of the raw layer


class Mapped(F.Segment):
    """A test-owned segment the test also maps, to fill and read its bytes."""

    def __init__(self, tag: str, nbytes: int = F.RAW_LAYER_BYTES) -> None:
        super().__init__(f"kvd_hostile_{tag}_{os.getpid()}", nbytes)
        self._fd = os.open(self.path, os.O_RDWR)
        self.mem = mmap.mmap(self._fd, nbytes)

    def fill(self, seed: int) -> bytes:
        data = bytes((i * 131 + seed * 7919 + (i >> 8)) & 0xFF for i in range(self.nbytes))
        self.mem[:] = data
        return data

    def zero(self) -> None:
        self.mem[:] = bytes(self.nbytes)

    def bytes(self) -> bytes:
        return bytes(self.mem[:])

    def close(self) -> None:
        try:
            self.mem.close()
        except (BufferError, ValueError):
            pass
        os.close(self._fd)
        super().close()


def tokens(seed: int, n: int = CHUNK) -> list[int]:
    base = 1000 + (os.getpid() % 500) * 20_000 + seed * 977
    return [base + i for i in range(n)]


def store(c: F.RawClient, iid: int, model: str, toks: list[int], rid: str | None = None):
    key = F.cache_key(model, 1, 0, toks, 0, CHUNK, rid or F.rid("store"))
    return c.call("store", key, iid, BLOCKS, b"")


def retrieve(c: F.RawClient, iid: int, model: str, toks: list[int], rid: str | None = None):
    rid = rid or F.rid("retrieve")
    key = F.cache_key(model, 1, None, toks, 0, CHUNK, rid)
    c.call("lookup", key, 1)
    key = F.cache_key(model, 1, 0, toks, 0, CHUNK, rid)
    return c.call("retrieve", key, iid, BLOCKS, b"", 0)


@pytest.fixture()
def raw(server):
    c = F.RawClient(server.url)
    registered: list[int] = []
    c.registered = registered
    yield c
    for iid in registered:
        try:
            c.call("unregister_kv_cache", iid, timeout=10)
        except TimeoutError:
            pass
    c.close()
    assert server.alive(), f"kvd died\n{server.log_tail()}"


def register(c: F.RawClient, iid: int, model: str, name: str, nbytes: int = F.RAW_LAYER_BYTES):
    c.registered.append(iid)
    return F.register_raw(c, iid, model, name, nbytes)


def new_segments(before: set[str]) -> list[str]:
    mine = f"lmcache_kv_{os.getpid()}_"
    return sorted(n for n in set(os.listdir("/dev/shm")) - before if n.startswith(mine))


# ---------------------------------------------------------------------------------------
# Finding 1: foreign segments
# ---------------------------------------------------------------------------------------


def test_finding1_segment_of_another_uid_is_refused(raw):
    """A segment owned by another user is never mapped (owner checked with fstat)."""
    seg = Mapped("uid")
    try:
        seg.fill(1)
        os.chown(seg.path, 65534, 65534)  # nobody's
        register(raw, 11001, "hostile-uid", "/" + seg.name)
        assert store(raw, 11001, "hostile-uid", tokens(1)) == [b"", False], (
            "kvd read a segment owned by another uid")
        os.chown(seg.path, os.geteuid(), os.getegid())  # control: kvd's own uid is accepted
        register(raw, 11002, "hostile-uid", "/" + seg.name)
        assert store(raw, 11002, "hostile-uid", tokens(2)) == [b"", True]
    finally:
        seg.close()


def test_finding1_kvds_own_pool_is_refused(raw, server):
    """kvd's L1 pool is not a client tensor: no STORE through it (reads other tenants'
    objects), no RETRIEVE into it (overwrites them)."""
    pool = f"kvd_l1_pool_{server.proc.pid}"
    assert os.path.exists(f"/dev/shm/{pool}")
    register(raw, 11010, "hostile-pool", "/" + pool)
    assert store(raw, 11010, "hostile-pool", tokens(10)) == [b"", False], (
        "kvd accepted its own L1 pool as a client KV cache")


def test_finding1_segment_of_another_instance_is_refused(server, raw):
    """A victim worker (the real client) maps its KV; an attacker registers the victim's
    segment as its own: refused, so it can neither read the victim's KV (STORE through it)
    nor write into it (RETRIEVE into it)."""
    before = set(os.listdir("/dev/shm"))
    victim = H.TPCluster(server.url, mode="lmcache_driven", model_name="hostile-victim", tp=1)
    try:
        segs = new_segments(before)
        assert segs, "the victim's KV segments were not found in /dev/shm"
        shape = victim.shape
        nbytes = 2 * shape.num_blocks * shape.block_size * shape.num_kv_heads * shape.head_size * 2
        plane = shape.num_blocks * shape.block_size * shape.num_kv_heads * shape.head_size
        desc = F.cpu_shm_descriptor(
            "/" + segs[0], shape.layer_shape,
            (plane, shape.block_size * shape.num_kv_heads * shape.head_size,
             shape.num_kv_heads * shape.head_size, shape.head_size, 1), nbytes)
        groups = [{"engine_group_id": 0, "layer_indices": [0], "tokens_per_block": 16,
                   "sw_size_tokens": -1, "extra_object_group_tag": 0, "recurrent_state": False}]
        raw.registered.append(11020)
        raw.call("register_kv_cache", 11020, [desc], "hostile-thief", 1, "vllm",
                 {"kv_layout": "NHD", "num_kv_heads": shape.num_kv_heads,
                  "tokens_per_block": 16, "head_dim": shape.head_size}, groups)
        key = F.cache_key("hostile-thief", 1, 0, tokens(20), 0, CHUNK, F.rid("thief"))
        assert raw.call("store", key, 11020, BLOCKS, b"") == [b"", False], (
            "an attacker registered the victim worker's segment and read its KV")
        # The victim itself is unaffected.
        toks = H.unique_tokens(CHUNK)
        assert victim.store(F.rid("victim"), toks, list(range(16))) == [True]
    finally:
        victim.close()


def test_finding1_allowed_uid_and_prefix_flags(tmp_path):
    """--allowed-shm-uid admits another owner; --allowed-shm-prefix limits the names."""
    ok = Mapped("prefixok")
    other = Mapped("otherprefix")
    try:
        for s in (ok, other):
            s.fill(3)
            os.chown(s.path, 65534, 65534)
        prefix = f"kvd_hostile_prefixok_"
        extra = ["--allowed-shm-uid", str(os.geteuid()), "65534", "--allowed-shm-prefix", prefix]
        with F.kvd_server(tmp_path, extra=extra) as srv:
            assert srv.alive(), srv.log()
            c = F.RawClient(srv.url)
            try:
                F.register_raw(c, 1, "hostile-flags", "/" + ok.name)
                assert store(c, 1, "hostile-flags", tokens(30)) == [b"", True], srv.log()
                F.register_raw(c, 2, "hostile-flags", "/" + other.name)
                assert store(c, 2, "hostile-flags", tokens(31)) == [b"", False]
            finally:
                c.close()
            assert "allowed-shm-prefix" in srv.log()
    finally:
        ok.close()
        other.close()


# ---------------------------------------------------------------------------------------
# Finding 4: re-registration keeps the old mapping
# ---------------------------------------------------------------------------------------


def test_finding4_reregistration_with_another_segment_rebuilds(raw):
    """A worker that registers again with another segment (same id, model, world size and
    tensor count) gets a new mapping: its stores read the new segment and its retrieves
    write into it, never into memory it no longer uses."""
    old, new = Mapped("reg_old"), Mapped("reg_new")
    try:
        old.fill(41)
        want = new.fill(42)
        register(raw, 12001, "hostile-rereg", "/" + old.name)
        assert store(raw, 12001, "hostile-rereg", tokens(40)) == [b"", True]
        register(raw, 12001, "hostile-rereg", "/" + new.name)  # the worker moved
        toks = tokens(41)
        assert store(raw, 12001, "hostile-rereg", toks) == [b"", True]
        old_before = old.bytes()
        new.zero()
        assert retrieve(raw, 12001, "hostile-rereg", toks)[1] is True
        assert new.bytes() == want, "the store read, or the retrieve wrote, the old segment"
        assert old.bytes() == old_before, "a retrieve wrote into the segment the worker left"
    finally:
        old.close()
        new.close()


# ---------------------------------------------------------------------------------------
# Finding 6: PREPARE_STORE / PREPARE_RETRIEVE check model and world size
# ---------------------------------------------------------------------------------------


def slots_of(reply) -> list:
    """The slots of a PREPARE_STORE reply ({context: {slots, chunk_indices}}; refused:
    no slots)."""
    return ((reply or {}).get("context") or {}).get("slots") or []


def test_finding6_prepare_ops_check_model_and_world_size(raw):
    """An engine-driven instance of model A cannot prepare slots for model B's keys (it
    would write objects that B's workers then load) nor read B's objects."""
    reg = {"instance_id": 13001, "model_name": "hostile-ed-a", "world_size": 1,
           "block_size": 16, "num_layers": 1, "hidden_dim_size": 16, "dtype_str": "bfloat16",
           "use_mla": False, "num_physical_slots": 256}
    raw.registered.append(13001)
    reply = raw.call(14, reg)
    assert reply.get("shm_name"), reply
    toks = tokens(60)
    other = F.cache_key("hostile-ed-b", 1, 0, toks, 0, CHUNK, F.rid("ed-other"))
    reply = raw.call(16, other, 13001)
    assert not slots_of(reply), f"PREPARE_STORE for another model got slots: {reply}"
    other_ws = F.cache_key("hostile-ed-a", 2, 0, toks, 0, CHUNK, F.rid("ed-ws"))
    assert not slots_of(raw.call(16, other_ws, 13001))
    # Control: its own model works, and another model cannot read what it stored.
    own = F.cache_key("hostile-ed-a", 1, 0, toks, 0, CHUNK, F.rid("ed-own"))
    reply = raw.call(16, own, 13001)
    assert slots_of(reply), reply
    assert raw.call(17, own, 13001) is True
    b_key = F.cache_key("hostile-ed-b", 1, 0, toks, 0, CHUNK, F.rid("ed-read"))
    reply = raw.call(18, b_key, 13001)
    assert reply.get("success") is not True, f"PREPARE_RETRIEVE across models: {reply}"


# ---------------------------------------------------------------------------------------
# Finding 3: SIGBUS
# ---------------------------------------------------------------------------------------


def test_finding3_truncated_client_segment_fails_only_that_request(raw):
    """A client truncates its segment after registering: kvd's next copy would touch pages
    beyond the file's end (SIGBUS). That request fails cleanly; kvd and every other client
    carry on; the client is fine again once its segment is whole."""
    seg = F.Segment(f"kvd_hostile_trunc_{os.getpid()}", F.RAW_LAYER_BYTES)
    bystander = Mapped("bystander")
    try:
        bystander.fill(5)
        register(raw, 14001, "hostile-trunc", "/" + seg.name)
        register(raw, 14002, "hostile-trunc-b", "/" + bystander.name)
        stored = tokens(70)
        assert store(raw, 14001, "hostile-trunc", stored) == [b"", True]
        os.truncate(seg.path, 0)  # the hostile move
        assert store(raw, 14001, "hostile-trunc", tokens(71)) == [b"", False]
        assert retrieve(raw, 14001, "hostile-trunc", stored)[1] is False
        assert store(raw, 14002, "hostile-trunc-b", tokens(72)) == [b"", True]
        os.truncate(seg.path, F.RAW_LAYER_BYTES)  # whole again (zeros)
        assert store(raw, 14001, "hostile-trunc", tokens(73)) == [b"", True]
        assert retrieve(raw, 14001, "hostile-trunc", stored)[1] is True
    finally:
        seg.close()
        bystander.close()


def test_finding3_full_dev_shm_fails_stores_without_a_signal(tmp_path):
    """kvd's L1 pool lives on tmpfs: with /dev/shm full, stores fail (ResourceExhausted)
    instead of kvd dying of SIGBUS, and an engine-driven worker is given no slot it could not
    write. Runs in a private mount namespace with a 16 MiB /dev/shm: `unshare -m` as root,
    else an unprivileged user namespace (mount_ns.py); skipped, saying why, where neither
    is allowed."""
    import json
    import subprocess
    import sys

    from mount_ns import private_mount_prefix

    prefix, why = private_mount_prefix()
    if prefix is None:
        pytest.skip(why)
    helper = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostile_tmpfs.py")
    env = dict(os.environ, HOSTILE_TMPFS_LOG=str(tmp_path / "kvd.log"))
    r = subprocess.run([*prefix, sys.executable, helper, F.kvd_binary(),
                        str(H.free_port())], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    log = (tmp_path / "kvd.log").read_text(errors="replace")
    assert out["alive"], f"kvd died (rc {out.get('returncode')}) when /dev/shm filled up:\n{log[-3000:]}"
    stores = out["stores"]
    assert len(stores) == 200 and None not in stores, stores
    assert stores[0] is True and stores.count(True) < 200, "the tmpfs never filled up?"
    assert stores[-1] is False
    assert out["prepare_slots"] == 0, "an engine-driven worker got a slot tmpfs cannot back"
    assert "is /dev/shm full?" in log


# ---------------------------------------------------------------------------------------
# Finding 8: unbounded sessions
# ---------------------------------------------------------------------------------------


def test_finding8_sessions_are_bounded_and_not_recreated_after_end(tmp_path):
    """A client that opens sessions without end (a LOOKUP per made-up request id) cannot
    grow kvd's session table past --max-sessions: the oldest go, /status counts them. A
    STORE after END_SESSION does not bring the session back for another TTL."""
    seg = Mapped("sessions")
    try:
        seg.fill(8)
        with F.kvd_server(tmp_path, extra=["--max-sessions", "8"]) as srv:
            c = F.RawClient(srv.url)
            try:
                F.register_raw(c, 15001, "hostile-sessions", "/" + seg.name)
                for i in range(40):
                    key = F.cache_key("hostile-sessions", 1, None, tokens(80 + i), 0, CHUNK,
                                      f"flood-{os.getpid()}-{i}")
                    c.call("lookup", key, 1)
                st = srv.status()
                assert st["sessions"] == 8, st
                assert st["sessions_evicted"] == 32, st
                assert 0 < st["session_bytes"] < 8 * 64 * 1024, st
                for i in range(32, 40):
                    c.call("end_session", f"flood-{os.getpid()}-{i}")
                assert srv.status()["sessions"] == 0
                # Late stores of ended requests: served, but no session comes back.
                for i in range(32, 40):
                    assert store(c, 15001, "hostile-sessions", tokens(80 + i),
                                 rid=f"flood-{os.getpid()}-{i}") == [b"", True]
                st = srv.status()
                assert st["sessions"] == 0, st
                assert st["session_bytes"] == 0, st
                c.call("unregister_kv_cache", 15001)
            finally:
                c.close()
            assert srv.alive(), srv.log()
    finally:
        seg.close()


# ---------------------------------------------------------------------------------------
# Finding 10: protocol (WAIT_PREFETCH_STATUS)
# ---------------------------------------------------------------------------------------


def test_finding10_wait_prefetch_status_waits_up_to_its_timeout(tmp_path):
    """WAIT_PREFETCH_STATUS waits while the request's prefetch from the tiers runs, up to
    the client's timeout (it answered at once, ignoring the timeout): nil when the prefetch
    still runs then, the hit count as soon as it ends, 0 when the session ends meanwhile.
    Waiters hold no thread: with --max-workers 2, seven parked waits do not delay another
    client's long LOOKUP (a pool op). A Redis paused for 4 s (CLIENT PAUSE) holds the
    prefetches."""
    import json

    from tiers_util import Prompt, Redis

    r = Redis().start()
    try:
        adapter = json.dumps({"type": "resp", "host": "127.0.0.1", "port": r.port})
        base = ["--l2-adapter", adapter]
        with F.kvd_server(tmp_path, extra=base) as srv:
            c = H.TPCluster(srv.url, "lmcache_driven", "hostile-wait", tp=1)
            # One prompt per request: lookups of one prefix at once share its loads.
            prompts = [Prompt(c, chunks=2, seed=91 + i) for i in range(9)]
            for i, p in enumerate(prompts):
                p.store(c, f"wait-store-{os.getpid()}-{i}")
            deadline = time.monotonic() + 20
            while len(r.cli("KEYS", "*").split()) < 18 and time.monotonic() < deadline:
                time.sleep(0.05)
            c.close()
        with F.kvd_server(tmp_path, extra=[*base, "--max-workers", "2"]) as srv:
            c = H.TPCluster(srv.url, "lmcache_driven", "hostile-wait", tp=1)
            w = F.RawClient(srv.url)
            other = F.RawClient(srv.url)
            try:
                rids = [f"wait-{os.getpid()}-{i}" for i in range(9)]
                assert w.call("wait_prefetch_status", "never-seen", 5.0) == 0  # unknown: 0 at once
                assert r.cli("CLIENT", "PAUSE", "4000", "ALL").strip() == "OK"
                paused = time.monotonic()
                for rid, p in zip(rids, prompts):  # on w's socket: in before the WAITs below
                    toks = list(p.tokens)
                    w.call("lookup", F.cache_key("hostile-wait", 1, None, toks, 0, len(toks), rid), 1)
                # A prefetch that still runs when the timeout passes: nil, after the timeout.
                t0 = time.monotonic()
                assert w.call("wait_prefetch_status", rids[0], 0.3) is None
                waited = time.monotonic() - t0
                assert 0.25 <= waited < 2.0, f"answered after {waited:.2f} s for a 0.3 s timeout"
                # A timeout of 0 (or NaN, or negative) does not wait.
                t0 = time.monotonic()
                assert w.call("wait_prefetch_status", rids[0], 0.0) is None
                assert w.call("wait_prefetch_status", rids[0], float("nan")) is None
                assert w.call("wait_prefetch_status", rids[0], -1.0) is None
                assert time.monotonic() - t0 < 0.5
                # Seven long waits, more than the pool has threads; one session ends meanwhile.
                sent = {w.send("wait_prefetch_status", rid, 30.0): rid for rid in rids[1:8]}
                ended = w.send("wait_prefetch_status", rids[8], 30.0)
                time.sleep(0.1)
                long = [7 + i for i in range(8 * 1024)]  # a 16 KiB+ LOOKUP runs on the pool
                t0 = time.monotonic()
                other.call("lookup", F.cache_key("hostile-unregistered", 1, None, long, 0,
                                                 len(long), f"long-{os.getpid()}"), 1)
                assert time.monotonic() - t0 < 1.5, "a pool op waited for parked waits"
                other.call("end_session", rids[8])
                got, reply = w.recv(timeout=2.0)
                assert (got, reply) == (ended, 0), "END_SESSION did not release its waiter"
                assert time.monotonic() - paused < 3.5, "released only when the pause ended"
                answers = {}
                while len(answers) < len(sent):
                    got, reply = w.recv(timeout=20.0)
                    answers[sent[got]] = (reply, time.monotonic() - paused)
                for rid, (reply, at) in answers.items():
                    assert reply == 2, (rid, reply)  # both chunks, loaded from Redis
                    assert at >= 3.0, f"{rid} answered {at:.2f} s into a 4 s pause"
                assert w.call("wait_prefetch_status", rids[1], 5.0) == 0  # taken once
                for rid in rids:
                    c.end_session(rid)
            finally:
                w.close()
                other.close()
                c.close()
            assert srv.alive(), srv.log()
    finally:
        r.close()
