"""Replay golden request frames (tests/wire_golden, captured from the real
lmcache 0.5.6 client) against the server under test, byte for byte.

Only exchanges whose reply does not depend on state the replay cannot
recreate (registered SHM segments, stored chunks) are replayed; the full
store/retrieve flows are covered by test_kv_flows.py with the real client.
"""

from __future__ import annotations

import json

import msgspec
import pytest
import zmq

import kvd_harness as H

GOLDEN = H.REPO_ROOT / "tests" / "wire_golden"

# Replies that must equal the golden reply exactly (same request bytes in,
# same reply bytes out), on a fresh server with --chunk-size 256.
EXACT = [
    "get_chunk_size",        # 256
    "ping",                  # nil instance -> true
    "ping__worker",          # unknown instance id -> true (liveness refresh only)
    "noop",                  # "OK"
    "query_prefetch_status__unknown",  # never-seen request id -> 0
]
# Handlers returning None: the reference replies [uid, op] only; a nil
# response frame (c0) is accepted as well (the 0.5.6 client decodes both).
NONE_REPLY = [
    "end_session",
    "report_block_allocation",
    "free_lookup_locks",
    "clear",
]


def load(stem: str) -> dict:
    return json.loads((GOLDEN / f"{stem}.json").read_text())


def frames_of(doc: dict, key: str) -> list[bytes]:
    return [bytes.fromhex(h) for h in doc[key]]


def exchange(url: str, frames: list[bytes], timeout_ms: int = 10_000) -> list[bytes] | None:
    """Send raw frames from a fresh DEALER; return the reply frames (or None)."""
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(url)
    try:
        s.send_multipart(frames)
        if not s.poll(timeout_ms, zmq.POLLIN):
            return None
        return s.recv_multipart()
    finally:
        s.close(0)


def golden_stems() -> list[str]:
    return sorted(p.stem for p in GOLDEN.glob("*.json") if p.stem != "summary")


# ---------------------------------------------------------------------------
# The golden files themselves
# ---------------------------------------------------------------------------


def test_golden_files_are_complete_and_small():
    from lmcache.v1.multiprocess.transport.zmq_impl.wire import LEGACY_OPERATION_IDS  # noqa: PLC0415

    stems = golden_stems()
    ops = {load(s)["op"] for s in stems}
    wanted = {
        "get_chunk_size", "ping", "noop", "clear", "register_kv_cache", "unregister_kv_cache",
        "store", "retrieve", "lookup", "query_prefetch_status", "wait_prefetch_status",
        "free_lookup_locks", "end_session", "report_block_allocation", "get_experimental",
        "register_kv_cache_engine_driven_context", "unregister_kv_cache_engine_driven_context",
        "prepare_store", "commit_store", "prepare_retrieve", "commit_retrieve",
    }
    assert wanted <= ops, f"missing golden ops: {sorted(wanted - ops)}"
    for s in stems:
        path = GOLDEN / f"{s}.json"
        assert path.stat().st_size < 50_000, f"{path.name} is {path.stat().st_size} bytes"
        doc = load(s)
        req = frames_of(doc, "request_frames_hex")
        rep = frames_of(doc, "response_frames_hex")
        # [uid, op, payload...] -> [uid, op, (response)]
        assert msgspec.msgpack.decode(req[1]) == LEGACY_OPERATION_IDS[doc["op"]], s
        assert rep[:2] == req[:2], f"{s}: reply must echo uid and op frames"
        assert len(rep) in (2, 3), s


# ---------------------------------------------------------------------------
# Replay against the server under test
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("stem", EXACT)
def test_replay_exact_reply(server, stem):
    doc = load(stem)
    req = frames_of(doc, "request_frames_hex")
    want = frames_of(doc, "response_frames_hex")
    got = exchange(server.url, req)
    assert got is not None, f"{stem}: no reply within 10 s"
    assert [f.hex() for f in got] == [f.hex() for f in want], (
        f"{stem}: reply differs from lmcache 0.5.6\n got {[f.hex() for f in got]}\n want {doc['response_frames_hex']}"
    )


@pytest.mark.parametrize("stem", NONE_REPLY)
def test_replay_none_reply(server, stem):
    doc = load(stem)
    req = frames_of(doc, "request_frames_hex")
    got = exchange(server.url, req)
    assert got is not None, f"{stem}: no reply within 10 s"
    assert got[:2] == req[:2], f"{stem}: uid/op not echoed: {[f.hex() for f in got]}"
    assert got[2:] in ([], [b"\xc0"]), f"{stem}: expected no response frame (or nil), got {[f.hex() for f in got[2:]]}"


def test_replay_get_experimental(server):
    doc = load("get_experimental")
    req = frames_of(doc, "request_frames_hex")
    got = exchange(server.url, req)
    assert got is not None and got[:2] == req[:2] and len(got) == 3
    caps = msgspec.msgpack.decode(got[2])
    assert isinstance(caps, list) and all(isinstance(c, str) for c in caps), caps


def test_replay_lookup_before_any_registration(server):
    """A lookup for a model no worker registered is acked, and its prefetch
    status is then 0 hits (the golden lookup's model is unknown here)."""
    lookup = frames_of(load("lookup"), "request_frames_hex")
    got = exchange(server.url, lookup)
    assert got is not None and got[:2] == lookup[:2]
    assert got[2:] in ([], [b"\xc0"]), [f.hex() for f in got]
    # QUERY_PREFETCH_STATUS for the lookup's request id (golden-req-b).
    q = frames_of(load("query_prefetch_status"), "request_frames_hex")
    key = msgspec.msgpack.decode(lookup[2])
    assert msgspec.msgpack.decode(q[2]) == key["request_id"]
    got = exchange(server.url, q)
    assert got is not None and got[:2] == q[:2]
    assert got[2:] == [b"\x00"], f"expected 0 hit chunks, got {[f.hex() for f in got[2:]]}"


def test_replay_frames_from_one_client_keep_uids(server):
    """Several requests on one DEALER: each reply carries its own uid."""
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(server.url)
    try:
        enc = msgspec.msgpack.encode
        sent = {}
        for uid, op in [(0, 21), (1, 24), (2, 21), (300, 24), (70000, 21)]:
            s.send_multipart([enc(uid), enc(op)])
            sent[enc(uid)] = enc(op)
        got = {}
        for _ in sent:
            assert s.poll(10_000, zmq.POLLIN), f"missing replies; have {sorted(got)}"
            f = s.recv_multipart()
            got[f[0]] = f
        assert set(got) == set(sent)
        for uid, f in got.items():
            assert f[1] == sent[uid]
            expect = enc(256) if f[1] == enc(21) else enc("OK")
            assert f[2:] == [expect], [x.hex() for x in f]
    finally:
        s.close(0)
