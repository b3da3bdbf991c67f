#!/usr/bin/env python3
"""Writes the seed corpora of kvd's fuzz targets (tests/fuzz/*_fuzzer.cc).

    make_seeds.py OUT_DIR [--golden tests/wire_golden]

creates OUT_DIR/request/, OUT_DIR/payload/, OUT_DIR/stream/, OUT_DIR/descriptor/, OUT_DIR/zmtp/,
OUT_DIR/http_json/ (HTTP bodies for each route; see http_json_seeds) and OUT_DIR/cachegen/
(small object descriptions for the CacheGen decoder target; see cachegen_seeds) from:

* frames captured from the real lmcache 0.5.6 client (tests/wire_golden/*.json, each
  {"op", "request_frames_hex", "response_frames_hex"}), one seed per captured request, plus
  the ext-1 descriptors found in them for the descriptor target;
* requests packed here the way the client packs them (maps keyed by field name, every field
  present, ext type 1 descriptors), addressed to what the request fuzzer registers up front
  (model "fz", instances 1, 2, 3 over /kvd_fuzz_kv_<id>, engine-driven instance 9), as whole
  flows: store -> lookup -> query -> retrieve -> end_session, TP=2, engine-driven
  prepare/commit, eviction pressure, lock TTL expiry, registration over the wire, and
  CacheBlend's ops (blend_seeds; their captures are in tests/wire_golden/blend/).

Standard library only (a small msgpack writer and reader live below), so `make fuzz` needs
no virtual environment. Input format: see tests/fuzz/fuzz_common.h.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import sys
from pathlib import Path

FRAME_SEP = b"\xc1\xc1\xc1\xc1"
MESSAGE_SEP = b"\xc1\xc1\xc1\xc2"

# ---------------------------------------------------------------------------------------
# msgpack (the subset the protocol uses)
# ---------------------------------------------------------------------------------------


class Ext:
    def __init__(self, code: int, data: bytes) -> None:
        self.code, self.data = code, data


def pack(o) -> bytes:
    if o is None:
        return b"\xc0"
    if o is True:
        return b"\xc3"
    if o is False:
        return b"\xc2"
    if isinstance(o, int):
        if 0 <= o < 128:
            return bytes([o])
        if -32 <= o < 0:
            return struct.pack("b", o)
        if 0 <= o < 1 << 8:
            return b"\xcc" + struct.pack(">B", o)
        if 0 <= o < 1 << 16:
            return b"\xcd" + struct.pack(">H", o)
        if 0 <= o < 1 << 32:
            return b"\xce" + struct.pack(">I", o)
        if 0 <= o < 1 << 64:
            return b"\xcf" + struct.pack(">Q", o)
        if -(1 << 7) <= o:
            return b"\xd0" + struct.pack(">b", o)
        if -(1 << 15) <= o:
            return b"\xd1" + struct.pack(">h", o)
        if -(1 << 31) <= o:
            return b"\xd2" + struct.pack(">i", o)
        return b"\xd3" + struct.pack(">q", o)
    if isinstance(o, float):
        return b"\xcb" + struct.pack(">d", o)
    if isinstance(o, str):
        b = o.encode()
        n = len(b)
        if n < 32:
            return bytes([0xA0 | n]) + b
        if n < 1 << 8:
            return b"\xd9" + struct.pack(">B", n) + b
        if n < 1 << 16:
            return b"\xda" + struct.pack(">H", n) + b
        return b"\xdb" + struct.pack(">I", n) + b
    if isinstance(o, (bytes, bytearray)):
        n = len(o)
        if n < 1 << 8:
            return b"\xc4" + struct.pack(">B", n) + bytes(o)
        if n < 1 << 16:
            return b"\xc5" + struct.pack(">H", n) + bytes(o)
        return b"\xc6" + struct.pack(">I", n) + bytes(o)
    if isinstance(o, (list, tuple)):
        n = len(o)
        head = bytes([0x90 | n]) if n < 16 else (
            b"\xdc" + struct.pack(">H", n) if n < 1 << 16 else b"\xdd" + struct.pack(">I", n))
        return head + b"".join(pack(x) for x in o)
    if isinstance(o, dict):
        n = len(o)
        head = bytes([0x80 | n]) if n < 16 else (
            b"\xde" + struct.pack(">H", n) if n < 1 << 16 else b"\xdf" + struct.pack(">I", n))
        return head + b"".join(pack(k) + pack(v) for k, v in o.items())
    if isinstance(o, Ext):
        n = len(o.data)
        fixed = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
        if n in fixed:
            return bytes([fixed[n], o.code & 0xFF]) + o.data
        if n < 1 << 8:
            return b"\xc7" + struct.pack(">Bb", n, o.code) + o.data
        if n < 1 << 16:
            return b"\xc8" + struct.pack(">Hb", n, o.code) + o.data
        return b"\xc9" + struct.pack(">Ib", n, o.code) + o.data
    raise TypeError(type(o))


def ext1_payloads(buf: bytes) -> list[bytes]:
    """The data of every ext type 1 object in one msgpack document (best effort)."""
    out: list[bytes] = []

    def rd(p: int) -> int:
        b = buf[p]
        p += 1
        if b <= 0x7F or b >= 0xE0 or b in (0xC0, 0xC2, 0xC3):
            return p
        if 0x80 <= b <= 0x8F:
            for _ in range(2 * (b & 0x0F)):
                p = rd(p)
            return p
        if 0x90 <= b <= 0x9F:
            for _ in range(b & 0x0F):
                p = rd(p)
            return p
        if 0xA0 <= b <= 0xBF:
            return p + (b & 0x1F)
        sizes = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8,
                 0xCA: 4, 0xCB: 8}
        if b in sizes:
            return p + sizes[b]
        if b in (0xC4, 0xD9):
            return p + 1 + buf[p]
        if b in (0xC5, 0xDA):
            return p + 2 + struct.unpack_from(">H", buf, p)[0]
        if b in (0xC6, 0xDB):
            return p + 4 + struct.unpack_from(">I", buf, p)[0]
        if b in (0xDC, 0xDD, 0xDE, 0xDF):
            n = struct.unpack_from(">H" if b in (0xDC, 0xDE) else ">I", buf, p)[0]
            p += 2 if b in (0xDC, 0xDE) else 4
            for _ in range(n * (2 if b in (0xDE, 0xDF) else 1)):
                p = rd(p)
            return p
        fixext = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}
        if b in fixext:
            n, code, p = fixext[b], struct.unpack_from(">b", buf, p)[0], p + 1
        elif b in (0xC7, 0xC8, 0xC9):
            w = {0xC7: ">B", 0xC8: ">H", 0xC9: ">I"}[b]
            n = struct.unpack_from(w, buf, p)[0]
            p += struct.calcsize(w)
            code = struct.unpack_from(">b", buf, p)[0]
            p += 1
        else:
            raise ValueError(f"bad msgpack byte {b:#x}")
        if code == 1:
            out.append(buf[p:p + n])
        return p + n

    try:
        rd(0)
    except (IndexError, ValueError, struct.error):
        pass
    return out


# ---------------------------------------------------------------------------------------
# Requests the way the lmcache 0.5.6 client packs them
# ---------------------------------------------------------------------------------------

OPS = {
    "register_kv_cache": 1, "unregister_kv_cache": 2, "store": 6, "retrieve": 7, "lookup": 8,
    "query_prefetch_status": 9, "wait_prefetch_status": 10, "query_prefetch_lookup_hits": 11,
    "free_lookup_locks": 12, "end_session": 13, "register_engine_driven": 14,
    "unregister_engine_driven": 15, "prepare_store": 16, "commit_store": 17,
    "prepare_retrieve": 18, "commit_retrieve": 19, "clear": 20, "get_chunk_size": 21,
    "ping": 22, "report_block_allocation": 23, "noop": 24, "get_experimental": 32,
    "cb_register_rope": 25, "cb_unregister_rope": 26, "cb_retrieve_pre_computed": 27,
    "cb_unified_lookup": 28, "cb_protocol_handshake": 33,
}  # cb_reorder_plan has no frozen id: Msgs.op sends its name

CHUNK = 32          # the request fuzzer's kvd chunk size
MODEL = "fz"
SEGMENT = "/kvd_fuzz_kv_5"  # the request fuzzer leaves it free for registrations
KV_PLANE = 16 * 16 * 1 * 8  # [2, 16 blocks, 16 tokens, 1 head, 8] per layer


def tokens(n: int, seed: int) -> list[int]:
    return [(seed * 1000003 + i * 7919) % 50000 for i in range(n)]


def key(toks, start, end, rid, worker=0, ws=1, salt="", model=MODEL, readers=1) -> dict:
    return {
        "model_name": model, "world_size": ws, "worker_id": worker, "token_ids": toks,
        "start": start, "end": end, "request_id": rid, "cache_salt": salt,
        "request_configs": None, "num_kv_readers": readers,
    }


class Msgs:
    """Builds one seed: a list of messages, each [uid, op, payload...]."""

    def __init__(self) -> None:
        self.msgs: list[list[bytes]] = []
        self.uid = 0

    def op(self, name, *payloads) -> "Msgs":
        opf = pack(OPS[name]) if name in OPS else pack(name)
        self.msgs.append([pack(self.uid), opf, *[pack(p) for p in payloads]])
        self.uid += 1
        return self

    def raw(self, frames: list[bytes]) -> "Msgs":
        self.msgs.append(frames)
        return self

    def tick(self, seconds: int) -> "Msgs":
        self.msgs.append([b"t" + bytes([seconds])])
        return self

    def bytes(self) -> bytes:
        return MESSAGE_SEP.join(FRAME_SEP.join(m) for m in self.msgs)


def cpu_shm_descriptor(shape, stride, offset=0, dtype="bfloat16", name=SEGMENT,
                       nbytes=2 * 2 * KV_PLANE * 2) -> bytes:
    return pack({
        "type": "cpu_shm", "version": 1,
        "metadata": {"dtype": dtype, "shape": list(shape), "stride": list(stride),
                     "storage_offset": offset, "device_uuid": "cpu"},
        "shm_name": name, "nbytes": nbytes,
    })


def nhd_layer(layer: int) -> bytes:
    return cpu_shm_descriptor([2, 16, 16, 1, 8], [KV_PLANE, 128, 8, 8, 1],
                              offset=layer * 2 * KV_PLANE)


def descriptor_seeds() -> dict[str, bytes]:
    cuda = pack({
        "type": "cuda", "version": 1,
        "metadata": {"dtype": "bfloat16", "shape": [2, 16, 16, 1, 8],
                     "stride": [KV_PLANE, 128, 8, 8, 1], "storage_offset": 0,
                     "device_uuid": "GPU-00000000-0000-0000-0000-000000000000"},
        "handle": [0, b"c" + bytes(64), 4 * KV_PLANE, 0, b"", 0, bytes(64), True],
    })
    raw = pack({
        "type": "cuda_raw", "version": 1,
        "metadata": {"dtype": "float16", "shape": [16, 16, 576], "stride": [9216, 576, 1],
                     "storage_offset": 0, "device_uuid": "GPU-0"},
        "ipc_handle": bytes(range(64)), "alloc_offset": 4096, "nbytes": 16 * 9216 * 2,
    })
    return {
        "cpu_shm_nhd": nhd_layer(0),
        "cpu_shm_nhd_layer1": nhd_layer(1),
        # HND physical order: [2, NB, H, BS, D]
        "cpu_shm_hnd": cpu_shm_descriptor([2, 16, 2, 16, 8], [2 * 16 * 16 * 8, 256, 128, 8, 1],
                                          nbytes=2 * 16 * 2 * 16 * 8 * 2),
        # block-first [NB, 2, BS, H, D]
        "cpu_shm_block_first": cpu_shm_descriptor([16, 2, 16, 1, 8], [256, 128, 8, 8, 1]),
        # one plane, rank 4, padded rows
        "cpu_shm_rank4_padded": cpu_shm_descriptor([16, 16, 2, 8], [16 * 40, 40, 16, 1],
                                                   dtype="float32", nbytes=16 * 16 * 40 * 4),
        # MLA latent [NB, BS, 576]
        "cpu_shm_mla": cpu_shm_descriptor([16, 16, 576], [16 * 576, 576, 1],
                                          nbytes=16 * 16 * 576 * 2),
        # non-contiguous token stride (tokens interleaved with another tensor)
        "cpu_shm_strided": cpu_shm_descriptor([2, 4, 16, 1, 8], [1024, 256, 16, 8, 1],
                                              nbytes=2 * 1024 * 2),
        "cpu_shm_escape_name": cpu_shm_descriptor([2, 16, 16, 1, 8], [KV_PLANE, 128, 8, 8, 1],
                                                  name="/../../etc/passwd"),
        "cuda": cuda,
        "cuda_raw": raw,
    }


def register_frames(instance_id: int, ws: int = 1, layers: int = 2, descs=None) -> list:
    descs = descs or [Ext(1, nhd_layer(layer)) for layer in range(layers)]
    groups = [{"engine_group_id": 0, "layer_indices": list(range(len(descs))),
               "tokens_per_block": 16, "sw_size_tokens": -1, "extra_object_group_tag": 0,
               "recurrent_state": False}]
    return [instance_id, descs, MODEL, ws, "vllm",
            {"kv_layout": "NHD", "num_kv_heads": 1, "tokens_per_block": 16, "head_dim": 8},
            groups]


def flow_seeds() -> dict[str, bytes]:
    s: dict[str, bytes] = {}
    t64 = tokens(64, 1)

    s["simple_ops"] = (Msgs().op("get_chunk_size").op("noop").op("get_experimental")
                       .op("ping", None).op("ping", 1).op("clear").op("clear", True)
                       .op("query_prefetch_status", "nope")
                       .op("wait_prefetch_status", "nope", 0.5)
                       .op("query_prefetch_lookup_hits", "nope")
                       .op("end_session", "nope")
                       .op("report_block_allocation", 1, MODEL,
                           [{"req_id": "r", "new_block_ids": [1, 2], "new_token_ids": [5, 6]}])
                       .op("subscribe_kv_events", 1, 2, 3, 4).op("p2p_unlock_objects", [])
                       .raw([pack(99), pack(77)]).raw([pack(100)]).bytes())

    s["store_lookup_retrieve"] = (
        Msgs().op("store", key(t64, 0, 64, "r1"), 1, [[0, 1, 2, 3]], b"")
        .op("lookup", key(t64, 0, 64, "r1", worker=None), 1)
        .op("query_prefetch_status", "r1")
        .op("retrieve", key(t64, 0, 64, "r1"), 1, [[4, 5, 6, 7]], b"", 0)
        .op("retrieve", key(t64, 0, 64, "r1"), 1, [[4, 5, 6, 7]], b"", 40)
        .op("end_session", "r1").bytes())

    s["tp2"] = (
        Msgs().op("store", key(t64, 0, 64, "r2", worker=0, ws=2), 2, [[0, 1, 2, 3]], b"")
        .op("store", key(t64, 0, 64, "r2", worker=1, ws=2), 3, [[8, 9, 10, 11]], b"")
        .op("lookup", key(t64, 0, 64, "r2", worker=None, ws=2, readers=1), 2)
        .op("query_prefetch_status", "r2")
        .op("retrieve", key(t64, 0, 64, "r2", worker=0, ws=2), 2, [[12, 13, 14, 15]], b"", 0)
        .op("free_lookup_locks", key(t64, 0, 64, "r2", worker=None, ws=2), 2)
        .op("retrieve", key(t64, 32, 64, "r2", worker=1, ws=2), 3, [[1, 2]], b"", 0)
        .bytes())

    s["partial_store_then_lookup"] = (
        Msgs().op("store", key(t64, 32, 64, "r3"), 1, [[0, 1]], b"")
        .op("lookup", key(t64, 0, 64, "r3", worker=None), 1)
        .op("query_prefetch_status", "r3")
        .op("store", key(t64, 0, 32, "r3"), 1, [[2, 3]], b"")
        .op("lookup", key(t64, 0, 64, "r3", worker=None), 1)
        .op("wait_prefetch_status", "r3", 1.0).bytes())

    ed = (Msgs().op("prepare_store", key(t64, 0, 64, "e1"), 9)
          .op("commit_store", key(t64, 0, 64, "e1"), 9, b"")
          .op("lookup", key(t64, 0, 64, "e1", worker=None), 1)
          .op("prepare_retrieve", key(t64, 0, 64, "e1"), 9)
          .op("commit_retrieve", key(t64, 0, 64, "e1"), 9)
          .op("prepare_store", key(tokens(64, 2), 0, 64, "e2"), 9)
          .tick(90)
          .op("commit_store", key(tokens(64, 2), 0, 64, "e2"), 9, b"pickled?")
          .op("unregister_engine_driven", 9))
    s["engine_driven"] = ed.bytes()

    s["register_engine_driven"] = (
        Msgs().op("register_engine_driven", {
            "instance_id": 11, "model_name": MODEL, "world_size": 1, "block_size": 16,
            "num_layers": 2, "hidden_dim_size": 8, "dtype_str": "bfloat16", "use_mla": True,
            "num_physical_slots": None})
        .op("prepare_store", key(t64, 0, 64, "e3"), 11)
        .op("commit_store", key(t64, 0, 64, "e3"), 11)
        .op("prepare_retrieve", key(t64, 0, 64, "e3"), 11).bytes())

    evict = Msgs()
    for i in range(12):
        tk = tokens(64, 100 + i)
        evict.op("store", key(tk, 0, 64, f"ev{i}"), 1, [[0, 1, 2, 3]], b"")
        if i % 3 == 0:
            evict.op("lookup", key(tk, 0, 64, f"ev{i}", worker=None), 1)
    evict.op("lookup", key(tokens(64, 100), 0, 64, "ev0", worker=None), 1)
    s["eviction_pressure"] = evict.bytes()

    ttl = Msgs()
    for i in range(8):
        tk = tokens(64, 200 + i)
        ttl.op("store", key(tk, 0, 64, f"tt{i}"), 1, [[0, 1, 2, 3]], b"")
        ttl.op("lookup", key(tk, 0, 64, f"tt{i}", worker=None), 1)
    ttl.op("store", key(tokens(64, 300), 0, 64, "tt9"), 1, [[0, 1, 2, 3]], b"")
    ttl.tick(40)
    ttl.op("store", key(tokens(64, 301), 0, 64, "tt10"), 1, [[0, 1, 2, 3]], b"")
    ttl.tick(200)
    ttl.op("store", key(t64, 0, 64, "tt11"), 2, [[0, 1, 2, 3]], b"")
    s["lock_ttl_and_reap"] = ttl.bytes()

    s["register_over_wire"] = (
        Msgs().op("register_kv_cache", *register_frames(5))
        .op("store", key(t64, 0, 64, "w1"), 5, [[0, 1, 2, 3]], b"")
        .op("register_kv_cache", *register_frames(5))
        .op("retrieve", key(t64, 0, 64, "w1"), 5, [[15, 14, 13, 12]], b"", 0)
        .op("unregister_kv_cache", 5)
        .op("store", key(t64, 0, 64, "w1"), 5, [[0, 1, 2, 3]], b"").bytes())

    bad = [Ext(1, cpu_shm_descriptor([2, 16, 16, 1, 8], [KV_PLANE, 128, 8, 8, 1],
                                     name="/../../tmp/x"))]
    s["register_bad_name"] = Msgs().op("register_kv_cache", *register_frames(6, descs=bad)).bytes()

    s["bad_values"] = (
        Msgs().op("store", key(t64, 0, 64, "b1"), 1, [[0, 1, 2, 99]], b"")
        .op("store", key(t64, 0, 64, "b1"), 1, [[0, 1, 2, -1]], b"")
        .op("store", key(t64, 0, 64, "b1"), 1, [[0, 1]], b"")
        .op("store", key(t64, 0, 64, "b1"), 1, [[0, 1, 2, 3], [0, 1, 2, 3]], b"")
        .op("store", key(t64, 0, 48, "b1"), 1, [[0, 1, 2]], b"")
        .op("store", key(t64, 0, 64, "b1", ws=3, worker=2), 1, [[0, 1, 2, 3]], b"")
        .op("store", key(t64, 0, 64, "b1"), 4242, [[0, 1, 2, 3]], b"")
        .op("store", key([2**32 + 5] * 64, 0, 64, "b2"), 1, [[0, 1, 2, 3]], b"")
        .op("retrieve", key(t64, 0, 64, "b1"), 9, [[0, 1, 2, 3]], b"", 2**62)
        .op("lookup", key(t64, 0, 64, "b1", worker=None, salt="x" * 129), 1)
        .op("lookup", key(t64, 0, 64, "b1", worker=None, model="m@x"), 1)
        .op("store", [1, 2, 3], 1, [[0]], b"").bytes())
    return s


def match(old_st: int, cur_st: int, n: int = CHUNK, hash_: bytes = bytes(range(32))) -> dict:
    """A CBMatchResult as the client packs the dataclass."""
    return {"old_st": old_st, "old_ed": old_st + n, "cur_st": cur_st, "cur_ed": cur_st + n,
            "hash": hash_}


def blend_seeds() -> dict[str, bytes]:
    """CacheBlend's ops (cb_*), packed as the 0.5.6 RequestClient packs them: every
    argument form of cb_register_rope (8 payloads, 7 from a client before kv_quant, nil lists,
    skipped groups), retrieve with match results, unified lookup, handshake, reorder by name,
    and values each decoder must refuse."""
    s: dict[str, bytes] = {}
    t96 = tokens(96, 7)
    cos_sin = Ext(1, cpu_shm_descriptor([64, 8], [8, 1], dtype="float32", nbytes=64 * 8 * 4))
    s["blend_flow"] = (
        Msgs().op("cb_protocol_handshake", 1).op("cb_protocol_handshake", 2)
        .op("cb_register_rope", 1, [cos_sin], 8, True, [0], [[0, 8]], [8], "")
        .op("cb_register_rope", 1, [cos_sin], 8, False, [0, -1], [[], [0, 4]], [8, 8], "fp8_e4m3")
        .op("cb_register_rope", 1, [cos_sin], 8, True, [0], [[0, 8]], [8])
        .op("store", key(t96[:64], 0, 64, "bl1"), 1, [[0, 1, 2, 3]], b"")
        .op("cb_unified_lookup", key(t96, 0, 96, "bl2", worker=None), 1)
        .op("cb_unified_lookup", key(t96, 0, 96, "bl2", worker=None), 1)
        .op("cb_retrieve_pre_computed", key(t96, 0, 96, "bl2"), [match(0, 32), match(32, 64, 8)],
            [[4, 5, 6, 7, 8, 9]], 1, b"stub_ipc_handle")
        .op("cb_reorder_plan", key(t96, 0, 96, "bl3", worker=None), 0, 50)
        .op("cb_unregister_rope", 1).op("end_session", "bl2").bytes())
    s["blend_nope_and_nil_lists"] = (
        Msgs().op("cb_register_rope", 2, [], 64, False, [], [], [], "")
        .op("cb_register_rope", 3, None, 64, True, None, None, None, None)
        .op("cb_register_rope", 3, [cos_sin, cos_sin], 8, True, [1, 0, -1], [None, [0, 8], []],
            [], "fp8_e5m2").bytes())
    s["blend_bad_values"] = (
        Msgs().op("cb_register_rope", 1, [cos_sin], 8, True, [1], [], [], "")
        .op("cb_register_rope", 1, [cos_sin], 8, True, [0], [[0, 8, 1]], [], "")
        .op("cb_register_rope", 1, [cos_sin], 8, True, [0], [[-1, 8]], [], "")
        .op("cb_register_rope", 1, [cos_sin], 8, True, [0], [], [], "int8")
        .op("cb_register_rope", 1, [1], 8, True, [0], [], [], "")
        .op("cb_register_rope", 1, [cos_sin], 8, True, [0], [])
        .op("cb_register_rope", 1, [cos_sin], 8, True, [0], [], [], "", None)
        .op("cb_retrieve_pre_computed", key(t96, 0, 96, "b1"), [match(0, 40, 8, b"")], [[1]], 1, b"")
        .op("cb_retrieve_pre_computed", key(t96, 0, 96, "b1"), [match(0, 40, -8)], [[1]], 1, b"")
        .op("cb_retrieve_pre_computed", key(t96, 0, 96, "b1"), [match(0, 40, 8, bytes(65))], [[1]], 1, b"")
        .op("cb_retrieve_pre_computed", key(t96, 0, 96, "b1"), [[0, 8, 0, 8, b"h"]], [[1]], 1, b"")
        .op("cb_retrieve_pre_computed", key(t96, 0, 96, "b1"), [{"old_st": 0}], [[1]], 1, b"")
        .op("cb_unified_lookup", key(t96, 0, 96, "b2", worker=None))
        .op("cb_reorder_plan", key(t96, 0, 96, "b3", worker=None), -1, 50)
        .op("cb_reorder_plan", key(t96, 0, 96, "b3", worker=None), 0, -50)
        .op("cb_protocol_handshake", "1").bytes())
    return s


def golden_seeds(golden_dir: Path) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """(frame seeds, descriptor seeds) from captured golden frames."""
    frames: dict[str, bytes] = {}
    descs: dict[str, bytes] = {}
    if not golden_dir.is_dir():
        return frames, descs
    # CacheBlend's captures are in their own folder (tests/wire_golden/blend/).
    for f in sorted([*golden_dir.glob("*.json"), *golden_dir.glob("blend/*.json")]):
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        docs = doc if isinstance(doc, list) else [doc]
        for i, d in enumerate(docs):
            if not isinstance(d, dict) or "request_frames_hex" not in d:
                continue
            req = d["request_frames_hex"]
            msgs = req if req and isinstance(req[0], list) else [req]
            try:
                raw_msgs = [[bytes.fromhex(h) for h in m] for m in msgs]
            except (TypeError, ValueError):
                continue
            name = f"golden_{'blend_' if f.parent != golden_dir else ''}{f.stem}_{i}"
            frames[name] = MESSAGE_SEP.join(FRAME_SEP.join(m) for m in raw_msgs)
            for m in raw_msgs:
                for fr in m:
                    for j, e in enumerate(ext1_payloads(fr)):
                        descs[f"{name}_ext{j}"] = e
    return frames, descs


def cachegen_seeds() -> dict[str, bytes]:
    """Mode-2 inputs of the cachegen target (tests/fuzz/cachegen_fuzzer.cc): a small
    object description, its values, then (position, xor) damage triples."""
    seeds = {}
    rng = __import__("random").Random(14)
    shapes = [  # kv_size-1, layers-1, tokens-1, hidden-1, dtype, bins-4, anchors, anchor bins-4
        (1, 1, 63, 31, 0, 28, 0, 0), (0, 0, 0, 2, 1, 12, 0, 0), (1, 0, 79, 99, 2, 12, 9, 28),
        (1, 2, 15, 40, 0, 60, 3, 12), (0, 1, 31, 63, 0, 0, 0, 0),
    ]
    for i, (kv, layers, tokens, hidden, dt, bins, anchors, abins) in enumerate(shapes):
        head = bytes([2, i, kv, layers, tokens, hidden, dt, bins, anchors, abins, 20])
        n = (kv + 1) * (layers + 1) * (tokens + 1) * (hidden + 1)
        values = bytes(128 + int(rng.gauss(0, 30)) % 100 for _ in range(n))
        damage = bytes(rng.randrange(256) for _ in range(3 * (i % 3)))
        seeds[f"cachegen_{i}"] = head + values + damage
    return seeds


def stream_seeds() -> dict[str, bytes]:
    """Keys whose token arrays use every integer encoding (fixint, uint8..64, int8..64 with
    positive and negative values, out-of-uint32 values, a non-integer element, a nested
    container), duplicate and non-string map keys, deep nesting in an unknown field, and
    truncated documents: the streaming decoders' edge cases (target "stream")."""
    def key(tokens: bytes, n: int, extra: bytes = b"", pairs: int = 7) -> bytes:
        body = (pack("model_name") + pack("m") + pack("world_size") + pack(1) +
                pack("worker_id") + pack(0) + pack("token_ids") + b"\xdc" + struct.pack(">H", n) +
                tokens + pack("start") + pack(0) + pack("end") + pack(n) +
                pack("request_id") + pack("r") + extra)
        return b"\xde" + struct.pack(">H", pairs) + body
    ints = (b"\x05" + b"\xcc\xff" + b"\xcd\x12\x34" + b"\xce\x89\xab\xcd\xef" +
            b"\xcf" + struct.pack(">Q", 7) + b"\xd0\x7f" + b"\xd1\x00\x10" +
            b"\xd2\x00\x00\x01\x00" + b"\xd3" + struct.pack(">q", 1 << 20))
    neg = b"\xff" + b"\xd0\x80" + b"\xd3" + struct.pack(">q", -(1 << 40))
    big = b"\xcf" + struct.pack(">Q", 1 << 33) + b"\xcf" + struct.pack(">Q", (1 << 64) - 1)
    bad = b"\xc3" + b"\x91\x01" + b"\xa1x"
    deep = pack("request_configs") + b"\x91" * 20 + b"\xc0"
    dup = pack("token_ids") + b"\x90"
    nonstr_key = b"\x01" + pack("v")
    out = {}
    cases = {
        "ints": key(ints, 10), "neg": key(ints + neg, 13), "big": key(ints + big, 12),
        "bad": key(ints + bad, 13), "deep": key(ints, 10, deep, 8),
        "dup": key(ints, 10, dup, 8), "nonstr": key(ints, 10, nonstr_key, 8),
        "short": key(ints, 11), "trailing": key(ints, 10) + b"\xc0",
    }
    for name, k in cases.items():
        for opname, extra in (("lookup", [pack(2)]), ("store", [pack(1), pack([[1, 2]]), pack(b"")]),
                              ("retrieve", [pack(1), pack([1, 2, -3]), pack(b""), pack(0)]),
                              ("prepare_store", [pack(9)])):
            msg = [pack(1), pack(opname), k, *extra]
            out[f"stream_{name}_{opname}"] = FRAME_SEP.join(msg)
    for i in range(1, 6):  # truncated key documents
        cut = key(ints, 10)[: i * 9]
        out[f"stream_cut{i}"] = FRAME_SEP.join([pack(1), pack("lookup"), cut])
    return out


def zmtp_seeds() -> dict[str, bytes]:
    """Streams for target "zmtp" (tests/fuzz/zmtp_fuzzer.cc): a control byte (bit 0: a valid
    greeting goes first; bits 1-7: read size - 1), then what a DEALER sends after it."""
    def frame(body: bytes, more: bool = False) -> bytes:
        flags = 1 if more else 0
        if len(body) > 255:
            return bytes([flags | 2]) + len(body).to_bytes(8, "big") + body
        return bytes([flags, len(body)]) + body

    def command(name: bytes, data: bytes) -> bytes:
        body = bytes([len(name)]) + name + data
        if len(body) > 255:
            return bytes([6]) + len(body).to_bytes(8, "big") + body
        return bytes([4, len(body)]) + body

    def prop(name: bytes, value: bytes) -> bytes:
        return bytes([len(name)]) + name + len(value).to_bytes(4, "big") + value

    ready = command(b"READY", prop(b"Socket-Type", b"DEALER") + prop(b"Identity", b""))
    request = frame(pack(1), True) + frame(pack("ping"), True) + frame(pack(None))
    greeting = b"\xff" + b"\0" * 8 + b"\x7f\x03\x01NULL" + b"\0" * 16 + b"\0" * 32
    return {
        "zmtp_request": bytes([1 | (2 << 1)]) + ready + request * 3,
        "zmtp_own_greeting": bytes([0 | (7 << 1)]) + greeting + ready + request,
        "zmtp_ping": bytes([1]) + ready + command(b"PING", b"\x00\x0ahello") + request,
        "zmtp_long_frame": bytes([1 | (63 << 1)]) + ready + frame(b"x" * 3000, True) + frame(b"y"),
        "zmtp_over_frame": bytes([1 | (127 << 1)]) + ready + frame(b"z" * 5000),
        "zmtp_too_many_frames": bytes([1]) + ready + b"".join(frame(b"f", i < 7) for i in range(8)),
        "zmtp_reserved_flags": bytes([1]) + ready + b"\x10\x01x",
    }


def write(dirpath: Path, seeds: dict[str, bytes]) -> None:
    dirpath.mkdir(parents=True, exist_ok=True)
    for name, data in seeds.items():
        digest = hashlib.sha1(data).hexdigest()[:12]
        (dirpath / f"{name}-{digest}").write_bytes(data)


def http_json_seeds() -> dict[str, bytes]:
    """Inputs of target "http_json" (tests/fuzz/http_json_fuzzer.cc): a control byte (bits
    0-2: the route, 7 = a raw request; 3-4: the Content-Type; 5: a foreign Origin; 6:
    chunked; 7: also ParseJsonBody directly), then the body."""
    key = {"chunk_hash_hex": "ab" * 32, "model_name": "m", "kv_rank": 0, "cache_salt": ""}
    bodies = {
        0: [b"", b"{}", b'{"tier": "l1", "force": true}', b'{"tier": "l2"}', b'{"force": "yes"}'],
        1: [json.dumps({"tier": "all", "keys": [key], "force": 1}).encode(), b'{"keys": []}',
            json.dumps({"keys": [dict(key, kv_rank="7", layout_tag="0a")], "adapter": "fs"}).encode()],
        2: [json.dumps({"model_name": 'llama"3', "world_size": 2, "token_ids": list(range(300)),
                        "cache_salt": "s"}).encode(),
            b'{"model_name": "m", "world_size": 1.0, "token_ids": ["1", 2.0]}'],
        3: [b'{"limit_gb": 1.5}', b'{"limit_gb": -1}', b'{"limit_gb": 1e308}', b"[]"],
        4: [b""],
        5: [b"ignored"],
        6: [b""],
    }
    seeds = {}
    for route, items in bodies.items():
        for i, body in enumerate(items):
            seeds[f"http_route{route}_{i}"] = bytes([0x80 | route]) + body
            seeds[f"http_route{route}_{i}_chunked_text"] = bytes([route | (2 << 3) | 0x40]) + body
    seeds["http_nested"] = bytes([0x80 | 1]) + b'{"keys": ' + b"[" * 200 + b"}"
    seeds["http_origin"] = bytes([0 | 0x20]) + b"{}"
    raw = (b"POST /cache/clear HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           b"Expect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\n{}\n\r\n0\r\n\r\n")
    seeds["http_raw_chunked"] = bytes([7]) + raw
    seeds["http_raw_pipelined"] = bytes([7]) + b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\n\r\n"
    seeds["http_raw_loglevel"] = bytes([7]) + b"GET /loglevel?logger_name=kvd&level=debug HTTP/1.1\r\n\r\n"
    return seeds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--golden", type=Path,
                    default=Path(__file__).resolve().parents[1] / "wire_golden")
    args = ap.parse_args()
    flows = {**flow_seeds(), **blend_seeds()}
    gframes, gdescs = golden_seeds(args.golden)
    write(args.out / "request", {**flows, **gframes})
    write(args.out / "payload", {**flows, **gframes})
    write(args.out / "stream", {**flows, **gframes, **stream_seeds()})
    write(args.out / "descriptor", {**descriptor_seeds(), **gdescs})
    write(args.out / "cachegen", cachegen_seeds())
    write(args.out / "zmtp", zmtp_seeds())
    write(args.out / "http_json", http_json_seeds())
    print(f"seeds: {len(flows)} packed flows, {len(gframes)} golden requests, "
          f"{len(descriptor_seeds()) + len(gdescs)} descriptors -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
