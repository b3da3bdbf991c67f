#!/usr/bin/env python3
"""Capture golden ZMQ frames between the real lmcache 0.5.6 client and the
reference `lmcache server`.

A logging ROUTER<->DEALER proxy sits between the client adapters (vLLM's
LMCacheMPSchedulerAdapter / LMCacheMPWorkerAdapter, plus direct calls on the
real RequestClient for ops the adapters do not send) and a reference server
started as a subprocess. Every request the client sends and every reply the
server returns is recorded (without the ZMQ routing identity), and one JSON
file per operation is written:

    {"op": name, "request_frames_hex": [...], "response_frames_hex": [...],
     "notes": "...", ...decoded views for humans...}

Usage (from the repo root, with the venv from scripts/setup-venv.sh):

    .venv/bin/python tools/capture_golden.py [--out tests/wire_golden]
    .venv/bin/python tools/capture_golden.py --blend [--out tests/wire_golden/blend]

--blend captures CacheBlend's ops instead (cb_register_rope, cb_unregister_rope,
cb_retrieve_pre_computed, cb_unified_lookup, cb_protocol_handshake, cb_reorder_plan)
against `lmcache server --engine-type blend --enable-blend-reorder`, sent by the real
RequestClient stubs (no adapter sends them), into their own folder. That server also has an
fs L2 tier (a temporary folder), so a lookup's first poll finds its legs loading.

Everything runs on 127.0.0.1; the server is stopped at the end.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

import kvd_harness as H  # noqa: E402

import msgspec  # noqa: E402
import zmq  # noqa: E402


# ---------------------------------------------------------------------------
# Logging proxy
# ---------------------------------------------------------------------------


@dataclass
class Frameset:
    seq: int
    t: float
    client: bytes
    direction: str  # "req" | "rep"
    frames: list[bytes]
    phase: str


class LoggingProxy(threading.Thread):
    """ROUTER (clients connect here) -> one DEALER per client -> server."""

    def __init__(self, backend_url: str) -> None:
        super().__init__(name="golden-proxy", daemon=True)
        self.ctx = zmq.Context()
        self.front = self.ctx.socket(zmq.ROUTER)
        self.front.setsockopt(zmq.LINGER, 0)
        self.front.bind("tcp://127.0.0.1:0")
        self.url = self.front.getsockopt_string(zmq.LAST_ENDPOINT)
        self.backend_url = backend_url
        self.backends: dict[bytes, zmq.Socket] = {}
        self.sock_owner: dict[zmq.Socket, bytes] = {}
        self.log: list[Frameset] = []
        self.phase = "init"
        self._seq = 0
        self._lock = threading.Lock()
        self._halt = threading.Event()

    def _record(self, client: bytes, direction: str, frames: list[bytes]) -> None:
        with self._lock:
            self._seq += 1
            self.log.append(Frameset(self._seq, time.time(), client, direction, list(frames), self.phase))

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.front, zmq.POLLIN)
        while not self._halt.is_set():
            for sock, _ev in poller.poll(20):
                if sock is self.front:
                    ident, *frames = self.front.recv_multipart()
                    back = self.backends.get(ident)
                    if back is None:
                        back = self.ctx.socket(zmq.DEALER)
                        back.setsockopt(zmq.LINGER, 0)
                        back.connect(self.backend_url)
                        self.backends[ident] = back
                        self.sock_owner[back] = ident
                        poller.register(back, zmq.POLLIN)
                    self._record(ident, "req", frames)
                    back.send_multipart(frames)
                else:
                    ident = self.sock_owner[sock]
                    frames = sock.recv_multipart()
                    self._record(ident, "rep", frames)
                    self.front.send_multipart([ident, *frames])
        for s in self.backends.values():
            s.close(0)
        self.front.close(0)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)
        self.ctx.term()


# ---------------------------------------------------------------------------
# Pretty decoding (for humans reading the JSON; the hex frames are the truth)
# ---------------------------------------------------------------------------


def _jsonable(obj):
    if isinstance(obj, bytes):
        try:
            txt = obj.decode("ascii")
            if txt.isprintable():
                return {"bin": txt}
        except UnicodeDecodeError:
            pass
        return {"bin_hex": obj.hex()}
    if isinstance(obj, msgspec.msgpack.Ext):
        inner = None
        try:
            inner = _jsonable(msgspec.msgpack.decode(obj.data))
        except Exception:  # noqa: BLE001
            pass
        return {"ext_code": obj.code, "data_hex": obj.data.hex(), "data_msgpack": inner}
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def decode_frame(b: bytes):
    try:
        return _jsonable(msgspec.msgpack.decode(b, ext_hook=lambda code, data: msgspec.msgpack.Ext(code, data)))
    except Exception as exc:  # noqa: BLE001
        return {"undecodable": str(exc)}


def op_name(op_frame: bytes) -> str:
    from lmcache.v1.multiprocess.transport.zmq_impl.wire import decode_operation  # noqa: PLC0415

    return decode_operation(op_frame)


# ---------------------------------------------------------------------------
# Scenario
# ---------------------------------------------------------------------------

GOLDEN_SHAPE = H.ModelShape(num_layers=2, num_blocks=72, block_size=16, num_kv_heads=2, head_size=64)


def small_tokens(n: int, salt: int) -> list[int]:
    """Token ids < 128 (one msgpack byte each) so the frames stay small."""
    return [((i * 7 + salt * 13) % 127) + 1 for i in range(n)]


def run_scenario(proxy: LoggingProxy, server: H.ServerProc) -> dict[str, str]:
    """Drives every operation through the proxy. Returns {phase: description}."""
    from lmcache.v1.multiprocess.custom_types import (  # noqa: PLC0415
        BlockAllocationRecord,
        IPCCacheServerKey,
    )

    url = proxy.url
    CH = H.CHUNK_SIZE
    phases: dict[str, str] = {}

    def phase(name: str, desc: str) -> None:
        time.sleep(0.2)  # let in-flight replies land in the previous phase
        proxy.phase = name
        phases[name] = desc

    # -- lmcache_driven (CpuShmTensorWrapper) --------------------------------
    phase("ld-init", "lmcache_driven: scheduler + 2 TP workers start and register (CpuShmTensorWrapper)")
    ld = H.TPCluster(url, "lmcache_driven", "golden-model", tp=2, shape=GOLDEN_SHAPE,
                     heartbeat_interval=600.0, mq_timeout=30.0)
    engine = None
    direct = None
    try:
        toks_a = small_tokens(2 * CH + 10, salt=1)  # 2 full chunks + 10-token tail
        src = list(range(1, 1 + 2 * (CH // 16)))
        for r in range(2):
            ld.fill_random(r, src, seed=11 + r)

        phase("ld-lookup-miss", "scheduler LOOKUP of a prompt not stored yet (2 chunks + 10 tokens), polled with QUERY_PREFETCH_STATUS")
        assert ld.lookup("golden-req-a", toks_a) == 0
        phase("ld-store", "both TP workers STORE the 2 full chunks of request golden-req-a (block ids 1..32)")
        assert ld.store("golden-req-a", toks_a, src) == [True, True]
        phase("ld-end-session", "scheduler END_SESSION for golden-req-a")
        ld.end_session("golden-req-a")

        phase("ld-lookup-hit", "scheduler LOOKUP of the stored prompt (request golden-req-b), 2 chunks hit")
        assert ld.lookup("golden-req-b", toks_a) == 2 * CH
        phase("ld-retrieve", "both workers RETRIEVE [0, 512) of golden-req-b into block ids 40..71")
        dst = list(range(40, 40 + 2 * (CH // 16)))
        assert ld.retrieve("golden-req-b", toks_a, dst, end=2 * CH) == [True, True]
        ld.end_session("golden-req-b")

        phase("ld-free-locks", "scheduler LOOKUP (golden-req-c) then FREE_LOOKUP_LOCKS for [0, 512) (no retrieve)")
        assert ld.lookup("golden-req-c", toks_a) == 2 * CH
        ld.scheduler.free_lookup_locks(toks_a, 0, 2 * CH, "golden-req-c")
        ld.end_session("golden-req-c")

        phase("ld-retrieve-miss", "workers RETRIEVE a prompt that was never stored (golden-req-d): server answers ok=false")
        toks_d = small_tokens(CH, salt=5)
        assert ld.lookup("golden-req-d", toks_d) == 0
        assert ld.retrieve("golden-req-d", toks_d, list(range(1, 17)), end=CH) == [False, False]
        ld.end_session("golden-req-d")

        phase("ld-report-blocks", "scheduler REPORT_BLOCK_ALLOCATION (fire and forget)")
        ld.scheduler.report_block_allocations(
            [BlockAllocationRecord(req_id="golden-req-e", new_block_ids=[3, 4], new_token_ids=[1, 2, 3])]
        )
        time.sleep(0.3)

        # -- direct RequestClient calls (ops the adapters do not send) ----------
        direct = H.make_request_client(url)
        phase("direct-ping", "direct RequestClient.ping(None) (what the scheduler heartbeat sends)")
        assert direct.ping(None).result(timeout=10) is True
        phase("direct-ping-worker", "direct RequestClient.ping(instance_id of TP worker 0) (what a worker heartbeat sends)")
        assert direct.ping(ld.workers[0].instance_id).result(timeout=10) is True
        phase("direct-noop", "direct RequestClient.noop()")
        direct.noop().result(timeout=10)
        phase("direct-get-chunk-size", "direct RequestClient.get_chunk_size()")
        direct.get_chunk_size().result(timeout=10)
        phase("direct-get-experimental", "direct RequestClient.get_experimental()")
        direct.get_experimental().result(timeout=10)
        phase("direct-wait-prefetch", "direct LOOKUP (key with worker_id nil, num_kv_readers 1) then WAIT_PREFETCH_STATUS(request_id, 5.0)")
        key = IPCCacheServerKey(
            model_name="golden-model", world_size=2, worker_id=None, token_ids=tuple(toks_a),
            start=0, end=2 * CH, request_id="golden-req-w", num_kv_readers=1,
        )
        direct.lookup(key, 2).result(timeout=10)
        direct.wait_prefetch_status("golden-req-w", 5.0).result(timeout=10)
        direct.free_lookup_locks(key, 2).result(timeout=10)
        direct.end_session("golden-req-w").result(timeout=10)
        phase("direct-query-pending", "direct LOOKUP immediately followed by QUERY_PREFETCH_STATUS polls (the first poll usually finds the prefetch still running)")
        key_p = IPCCacheServerKey(
            model_name="golden-model", world_size=2, worker_id=None, token_ids=tuple(toks_a),
            start=0, end=2 * CH, request_id="golden-req-p", num_kv_readers=1,
        )
        f_lookup = direct.lookup(key_p, 2)
        polls = [direct.query_prefetch_status("golden-req-p")]
        f_lookup.result(timeout=10)
        deadline = time.monotonic() + 10
        while polls[-1].result(timeout=10) is None and time.monotonic() < deadline:
            polls.append(direct.query_prefetch_status("golden-req-p"))
        direct.free_lookup_locks(key_p, 2).result(timeout=10)
        direct.end_session("golden-req-p").result(timeout=10)
        phase("direct-query-unknown", "direct QUERY_PREFETCH_STATUS for a request id the server never saw")
        direct.query_prefetch_status("golden-req-unknown").result(timeout=10)

        # -- engine_driven --------------------------------------------------------
        phase("ed-init", "engine_driven: 2 TP workers register with REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT")
        engine = H.TPCluster(url, "engine_driven", "golden-model-ed", tp=2, shape=GOLDEN_SHAPE,
                             heartbeat_interval=600.0, mq_timeout=30.0)
        toks_e = small_tokens(2 * CH + 10, salt=9)
        for r in range(2):
            engine.fill_random(r, src, seed=21 + r)
        phase("ed-store", "engine_driven STORE of 2 chunks: PREPARE_STORE (slots in the server SHM pool) + COMMIT_STORE per worker")
        assert engine.lookup("golden-ed-a", toks_e) == 0
        assert engine.store("golden-ed-a", toks_e, src) == [True, True]
        engine.end_session("golden-ed-a")
        phase("ed-store-cached", "engine_driven STORE of the same 2 chunks again: PREPARE_STORE answers no slots (all cached)")
        assert engine.store("golden-ed-a2", toks_e, src) == [True, True]
        engine.end_session("golden-ed-a2")
        phase("ed-retrieve", "engine_driven lookup hit + PREPARE_RETRIEVE / COMMIT_RETRIEVE per worker")
        assert engine.lookup("golden-ed-b", toks_e) == 2 * CH
        assert engine.retrieve("golden-ed-b", toks_e, dst, end=2 * CH) == [True, True]
        engine.end_session("golden-ed-b")
        phase("ed-retrieve-miss", "engine_driven PREPARE_RETRIEVE for chunks never stored")
        toks_m = small_tokens(CH, salt=17)
        assert engine.lookup("golden-ed-c", toks_m) == 0
        assert engine.retrieve("golden-ed-c", toks_m, list(range(1, 17)), end=CH) == [False, False]
        engine.end_session("golden-ed-c")

        phase("clear", "scheduler reset_cache(): CLEAR(force=False)")
        assert ld.scheduler.reset_cache() is True

        phase("ed-shutdown", "engine_driven workers shut down: UNREGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT")
        engine.close()
        engine = None
        phase("ld-shutdown", "lmcache_driven workers shut down: UNREGISTER_KV_CACHE")
        ld.close()
    finally:
        if direct is not None:
            direct.close()
        if engine is not None:
            engine.close()
        ld.close()
        gc.collect()
    time.sleep(0.3)
    return phases


# ---------------------------------------------------------------------------
# Selection and output
# ---------------------------------------------------------------------------

# (file stem, op, preferred phase, notes)
SELECT = [
    ("get_chunk_size", "get_chunk_size", "direct-get-chunk-size",
     "No payload frames. Reply: msgpack int (the server's --chunk-size, 256). Sent by the scheduler and by every worker at start."),
    ("ping", "ping", "direct-ping",
     "Payload: [instance_id=nil] (scheduler heartbeat). Reply: msgpack true."),
    ("ping__worker", "ping", "direct-ping-worker",
     "Payload: [instance_id] = a worker's 63-bit uuid-derived instance id (not the pid). Reply: true."),
    ("noop", "noop", "direct-noop", "No payload. Reply: msgpack str \"OK\"."),
    ("get_experimental", "get_experimental", "direct-get-experimental",
     "No payload. Reply: list[str] of experimental capabilities; 0.5.6 answers [\"kv_event_stream\"]. Workers send it at start (the adapter waits up to mq_timeout, then assumes [])."),
    ("clear", "clear", "clear",
     "Payload: [force=false] (RequestClient.clear has a defaulted bool, always sent). Reply: handler returns None, so the server sends only [uid, op] (no response frame)."),
    ("register_kv_cache", "register_kv_cache", "ld-init",
     "lmcache_driven worker registration. Payloads: instance_id, list of ext-1 descriptors (msgpack ext type 1 whose data is a msgpack map tagged type=cpu_shm; NOT a pickle), model_name, world_size=2, engine_type=\"vllm\" (EngineType value string), layout_hints {kv_layout: NHD}, engine_group_infos [EngineGroupInfo map]. Reply: None -> [uid, op] only."),
    ("unregister_kv_cache", "unregister_kv_cache", "ld-shutdown",
     "Payload: [instance_id]. Reply: None -> [uid, op] only."),
    ("store", "store", "ld-store",
     "lmcache_driven STORE from TP worker: key (IPCCacheServerKey map, worker_id=rank), instance_id, block_ids [[...32 ids]], event handle (CPU StubEvent: b\"stub_ipc_handle\"). Reply: [event_handle_bin, ok_bool]."),
    ("retrieve", "retrieve", "ld-retrieve",
     "lmcache_driven RETRIEVE after a lookup hit: key, instance_id, block_ids, event handle, skip_first_n_tokens=0. Reply: [event_handle_bin, true]."),
    ("retrieve__miss", "retrieve", "ld-retrieve-miss",
     "RETRIEVE of chunks never stored (lookup hit 0). Reply: [event_handle_bin, false]."),
    ("lookup", "lookup", "ld-lookup-hit",
     "Scheduler LOOKUP: key with worker_id nil, start 0, end = full chunks (512), token_ids = whole prompt (522), num_kv_readers 1; payload 2 = tp_size (2). Reply: None -> [uid, op] only (ack; result is polled)."),
    ("query_prefetch_status", "query_prefetch_status", "ld-lookup-hit",
     "Payload: [request_id]. Reply: msgpack int = hit chunks (2) once the prefetch finished, nil while running (nil replies carry no response frame)."),
    ("query_prefetch_status__pending", "query_prefetch_status", None,
     "A poll while the prefetch is still running: the handler returns None, so the reply has no response frame (only [uid, op]). Not every capture run sees one."),
    ("query_prefetch_status__unknown", "query_prefetch_status", "direct-query-unknown",
     "QUERY_PREFETCH_STATUS for a request id the server never saw."),
    ("wait_prefetch_status", "wait_prefetch_status", "direct-wait-prefetch",
     "Payload: [request_id, timeout float64 seconds]. Reply: hit chunks (int) or nothing on timeout."),
    ("free_lookup_locks", "free_lookup_locks", "ld-free-locks",
     "Scheduler FREE_LOOKUP_LOCKS: key (worker_id nil, range [0, 512)), tp_size. Reply: None -> [uid, op] only."),
    ("end_session", "end_session", "ld-end-session",
     "Payload: [request_id] (single frame in 0.5.6). Reply: None -> [uid, op] only."),
    ("report_block_allocation", "report_block_allocation", "ld-report-blocks",
     "Payloads: instance_id (the scheduler process pid here), model_name, [BlockAllocationRecord map {req_id, new_block_ids, new_token_ids}]. Reply: None -> [uid, op] only."),
    ("register_kv_cache_engine_driven_context", "register_kv_cache_engine_driven_context", "ed-init",
     "Payload: RegisterEngineDrivenContextPayload map. Reply: RegisterEngineDrivenContextResponse map {shm_name, pool_size} (the reference answers the L1 pool's POSIX shm name, no leading slash, and its size)."),
    ("unregister_kv_cache_engine_driven_context", "unregister_kv_cache_engine_driven_context", "ed-shutdown",
     "Payload: [instance_id]. Reply: None -> [uid, op] only."),
    ("prepare_store", "prepare_store", "ed-store",
     "Payloads: key (worker_id=rank), instance_id. Reply: PrepareStoreResponse map {context: {slots: [{offset, length, shape, dtype}], chunk_indices: [...]}}."),
    ("prepare_store__all_cached", "prepare_store", "ed-store-cached",
     "PREPARE_STORE when every chunk is already cached."),
    ("commit_store", "commit_store", "ed-store",
     "Payloads: key, instance_id, data=b\"\" (SHM mode). Reply: true."),
    ("prepare_retrieve", "prepare_retrieve", "ed-retrieve",
     "Payloads: key, instance_id. Reply: PrepareRetrieveResponse map {success, data: b\"\", context: {slots: [...]}}."),
    ("prepare_retrieve__miss", "prepare_retrieve", "ed-retrieve-miss",
     "PREPARE_RETRIEVE for chunks the lookup did not find."),
    ("commit_retrieve", "commit_retrieve", "ed-retrieve",
     "Payloads: key, instance_id. Reply: bool."),
]


# ---------------------------------------------------------------------------
# CacheBlend scenario (--blend)
# ---------------------------------------------------------------------------

BLEND_MODEL = "golden-blend"


def rope_cache(max_pos: int, rot_dim: int):
    """A NeoX cos/sin cache as vLLM's RotaryEmbedding builds it: [max_pos, rot_dim], the
    cos half then the sin half, float32."""
    import torch  # noqa: PLC0415

    inv_freq = 1.0 / (10000 ** (torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).contiguous()


def send_without_contract(client, operation: str, payloads: list, n_params: int):
    """Sends `operation` with only its first `n_params` parameters, through the real
    MessageQueueClient (its encoder, uid counter and socket), as a client whose contract
    had that many parameters did. The 0.5.6 stubs cannot: they bind every parameter,
    defaults included. Returns the future (the 0.5.6 server may never answer)."""
    from lmcache.v1.multiprocess.futures import MessagingFuture  # noqa: PLC0415
    from lmcache.v1.multiprocess.rpc import RpcSpec, get_rpc_spec  # noqa: PLC0415
    from lmcache.v1.multiprocess.transport.zmq_impl.mq import MessageQueueClient  # noqa: PLC0415

    full = get_rpc_spec(operation)
    params = list(full.signature.parameters.values())[:n_params]
    spec = RpcSpec(operation=operation, signature=full.signature.replace(parameters=params),
                   payload_types=full.payload_types[:n_params], response_type=full.response_type)
    mq = client._message_queue_client
    fut = MessagingFuture()
    mq.input_queue.put(MessageQueueClient.WrappedRequest(
        request_uid=next(mq._request_counter), future=fut, rpc_spec=spec,
        request_payloads=list(payloads)))
    mq._polling_loop.notify()
    return fut


def run_blend_scenario(proxy: LoggingProxy, server: H.ServerProc) -> dict[str, str]:
    """Drives every CacheBlend op through the proxy with the real RequestClient stubs."""
    from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey  # noqa: PLC0415
    from lmcache.v1.platform.devices.cpu.shm import CpuShmTensorWrapper  # noqa: PLC0415

    url = proxy.url
    CH = H.CHUNK_SIZE
    phases: dict[str, str] = {}

    def phase(name: str, desc: str) -> None:
        time.sleep(0.2)  # let in-flight replies land in the previous phase
        proxy.phase = name
        phases[name] = desc

    def key(tokens: list[int], rid: str, worker: int | None) -> IPCCacheServerKey:
        return IPCCacheServerKey(
            model_name=BLEND_MODEL, world_size=1, worker_id=worker, token_ids=tuple(tokens),
            start=0, end=len(tokens) // CH * CH, request_id=rid, num_kv_readers=1)

    phase("cb-init", "lmcache_driven TP=1 worker registers its KV (CpuShmTensorWrapper)")
    ld = H.TPCluster(url, "lmcache_driven", BLEND_MODEL, tp=1, shape=GOLDEN_SHAPE,
                     heartbeat_interval=600.0, mq_timeout=30.0)
    direct = None
    try:
        iid = ld.workers[0].instance_id
        direct = H.make_request_client(url)
        # wrap() moves the tensor's storage into POSIX SHM, unlinked when the tensor dies.
        cos_sin_tensor = rope_cache(1024, 64)
        cos_sin = CpuShmTensorWrapper.wrap(cos_sin_tensor)

        phase("cb-handshake", "cb_protocol_handshake(1): the version 0.5.6 speaks")
        assert tuple(direct.cb_protocol_handshake(1).result(timeout=10)) == (1, True)
        phase("cb-handshake-mismatch", "cb_protocol_handshake(2): a version the server does not speak")
        assert tuple(direct.cb_protocol_handshake(2).result(timeout=10)) == (1, False)

        phase("cb-register-rope", "cb_register_rope(iid, [cos/sin cache], 64, True, [0], [[0, 64]], [64]) with kv_quant omitted: the stub binds the default, 8 payloads")
        direct.cb_register_rope(iid, [cos_sin], 64, True, [0], [[0, 64]], [64]).result(timeout=10)
        phase("cb-register-rope-kv-quant", "cb_register_rope by keyword with kv_quant=\"fp8_e4m3\", group_rot [[]] (skip group 0), group_head_size []")
        direct.cb_register_rope(instance_id=iid, cos_sin_caches_ipc=[cos_sin], head_size=64,
                                is_neox_style=False, group_to_cache=[-1], group_rot=[[]],
                                group_head_size=[], kv_quant="fp8_e4m3").result(timeout=10)
        phase("cb-register-rope-v3", "the deprecated alias cb_register_rope_v3 (7 parameters): still 8 payloads on the wire")
        direct.cb_register_rope_v3(iid, [cos_sin], 64, True, [0], [], []).result(timeout=10)
        phase("cb-register-rope-7", "cb_register_rope with 7 payloads (a client from before kv_quant), through the real MessageQueueClient")
        fut7 = send_without_contract(direct, "cb_register_rope",
                                     [iid, [cos_sin], 64, True, [0], [[0, 64]], [64]], 7)
        try:
            fut7.result(timeout=3)
        except Exception:  # noqa: BLE001 - the 0.5.6 server drops it: no reply
            pass

        phase("cb-store", "the worker STOREs a 2-chunk prompt (fingerprints registered on worker 0)")
        toks_a = small_tokens(2 * CH, salt=1)
        src = list(range(1, 1 + 2 * (CH // 16)))
        ld.fill_random(0, src, seed=31)
        assert ld.store("golden-blend-a", toks_a, src) == [True]
        ld.end_session("golden-blend-a")
        time.sleep(0.5)

        phase("cb-unified-lookup", "cb_unified_lookup of [new chunk] + the stored prompt, polled until the map arrives (nil while loading)")
        toks_b = small_tokens(CH, salt=3) + toks_a
        kb = key(toks_b, "golden-blend-b", None)
        res = None
        deadline = time.monotonic() + 20
        while res is None and time.monotonic() < deadline:
            res = direct.cb_unified_lookup(kb, 1).result(timeout=10)
            if res is None:
                time.sleep(0.05)
        assert res is not None, "cb_unified_lookup never resolved"
        phase("cb-retrieve", "cb_retrieve_pre_computed(worker key, the lookup's non-prefix segments, [[48 block ids]], iid, stub handle)")
        dst = list(range(10, 10 + 3 * (CH // 16)))
        direct.cb_retrieve_pre_computed(key(toks_b, "golden-blend-b", 0), res.non_prefix_segments,
                                        [dst], iid, b"stub_ipc_handle").result(timeout=30)
        ld.end_session("golden-blend-b")

        phase("cb-unified-lookup-prefix", "cb_unified_lookup of the stored prompt + a new chunk: the first call usually finds the prefix leg loading (nil), the next ones the map")
        kp = key(toks_a + small_tokens(CH, salt=5), "golden-blend-p", None)
        res = None
        deadline = time.monotonic() + 20
        while res is None and time.monotonic() < deadline:
            res = direct.cb_unified_lookup(kp, 1).result(timeout=10)
        ld.end_session("golden-blend-p")

        phase("cb-unified-lookup-miss", "cb_unified_lookup of a prompt nothing matches")
        kc = key(small_tokens(CH, salt=7), "golden-blend-c", None)
        res = None
        deadline = time.monotonic() + 20
        while res is None and time.monotonic() < deadline:
            res = direct.cb_unified_lookup(kc, 1).result(timeout=10)
        ld.end_session("golden-blend-c")

        phase("cb-reorder", "cb_reorder_plan([new chunk] + the stored prompt, keep_prefix 0, budget 200 ms), sent by name")
        direct.cb_reorder_plan(key(toks_b, "golden-blend-d", None), 0, 200).result(timeout=10)
        phase("cb-reorder-keep", "cb_reorder_plan of a prompt nothing matches, keep_prefix 16, budget 50 ms")
        direct.cb_reorder_plan(key(small_tokens(CH, salt=9), "golden-blend-e", None), 16, 50).result(timeout=10)

        phase("cb-unregister-rope", "cb_unregister_rope(iid)")
        direct.cb_unregister_rope(iid).result(timeout=10)
        phase("cb-shutdown", "the worker shuts down")
        ld.close()
    finally:
        if direct is not None:
            direct.close()
        ld.close()
        gc.collect()
    time.sleep(0.3)
    return phases


BLEND_SELECT = [
    ("cb_protocol_handshake", "cb_protocol_handshake", "cb-handshake",
     "Payload: [client_version=1]. Reply: tuple[int, bool] as an array: [1, true]."),
    ("cb_protocol_handshake__mismatch", "cb_protocol_handshake", "cb-handshake-mismatch",
     "Payload: [client_version=2]. Reply: [1, false]."),
    ("cb_register_rope", "cb_register_rope", "cb-register-rope",
     "8 payloads: instance_id, [ext-1 cpu_shm descriptor of the float32 [1024, 64] cos/sin cache], head_size 64, is_neox_style true, group_to_cache [0], group_rot [[0, 64]], group_head_size [64], kv_quant \"\" (omitted by the caller, bound by the stub). Reply: None -> [uid, op] only."),
    ("cb_register_rope__kv_quant", "cb_register_rope", "cb-register-rope-kv-quant",
     "Keyword call: is_neox_style false, group_to_cache [-1], group_rot [[]] (the wire form of 'skip this group'), group_head_size [], kv_quant \"fp8_e4m3\". Reply: None -> [uid, op] only."),
    ("cb_register_rope__v3_alias", "cb_register_rope", "cb-register-rope-v3",
     "Through the deprecated alias cb_register_rope_v3 (7 parameters): it forwards to cb_register_rope, so the wire carries 8 payloads (kv_quant \"\"), group_rot [] and group_head_size []. Reply: None -> [uid, op] only."),
    ("cb_register_rope__7_payloads", "cb_register_rope", "cb-register-rope-7",
     "7 payloads (no kv_quant), what a client from before kv_quant sent; the 0.5.6 stubs cannot send it (they bind every parameter), so it went through the real MessageQueueClient with a 7-parameter contract. The 0.5.6 server does not answer it (payload count mismatch, logged), hence no response frames; kvd accepts it."),
    ("cb_unified_lookup", "cb_unified_lookup", "cb-unified-lookup",
     "Payloads: key (worker_id nil, [new chunk] + the stored 2-chunk prompt, end 768), tp_size 1. Reply: the CBUnifiedLookupResult map once both legs are in L1: {prefix_coverage_tokens, non_prefix_segments: [{old_st, old_ed, cur_st, cur_ed, hash: bin}], segmented_prefix_segments}."),
    ("cb_unified_lookup__loading", "cb_unified_lookup", None,
     "The first poll of a lookup, while its legs load (the server has an fs L2 tier, so its prefetches run asynchronously): the handler returns None, so the reply has no response frame (only [uid, op]); the client polls again."),
    ("cb_unified_lookup__prefix", "cb_unified_lookup", "cb-unified-lookup-prefix",
     "The stored 2-chunk prompt + a new chunk: the reply once loaded (prefix_coverage_tokens 512)."),
    ("cb_unified_lookup__miss", "cb_unified_lookup", "cb-unified-lookup-miss",
     "Nothing matches: {prefix_coverage_tokens: 0, non_prefix_segments: [], segmented_prefix_segments: []}."),
    ("cb_retrieve_pre_computed", "cb_retrieve_pre_computed", "cb-retrieve",
     "Payloads: key (worker_id 0), match_results (the lookup's non-prefix segments), block_ids [[48 ids]], instance_id, event_ipc_handle b\"stub_ipc_handle\". Reply: tuple[bytes, bool] as [event_handle: bin, scatter_ran]."),
    ("cb_reorder_plan", "cb_reorder_plan", "cb-reorder",
     "Op frame: the str \"cb_reorder_plan\" (no frozen id). Payloads: key, keep_prefix 0, budget_ms 200. Reply: list[int], the reordered token ids (empty: keep the order)."),
    ("cb_reorder_plan__keep", "cb_reorder_plan", "cb-reorder-keep",
     "Nothing cached to copy: keep_prefix 16, budget_ms 50. Reply: [] (keep the order)."),
    ("cb_unregister_rope", "cb_unregister_rope", "cb-unregister-rope",
     "Payload: [instance_id]. Reply: None -> [uid, op] only."),
]


def pair_exchanges(log: list[Frameset]) -> list[dict]:
    """Match each request with the reply carrying the same (client, uid frame)."""
    pending: dict[tuple[bytes, bytes], Frameset] = {}
    out = []
    for fs in log:
        if fs.direction == "req":
            if len(fs.frames) >= 2 and fs.frames[1] != b"":
                pending[(fs.client, fs.frames[0])] = fs
        else:
            req = pending.pop((fs.client, fs.frames[0]), None)
            if req is None:
                continue
            out.append({"req": req, "rep": fs, "op": op_name(req.frames[1])})
    for (_client, _uid), req in pending.items():
        out.append({"req": req, "rep": None, "op": op_name(req.frames[1])})
    out.sort(key=lambda x: x["req"].seq)
    return out


def write_golden(exchanges: list[dict], phases: dict[str, str], out_dir: Path, meta: dict,
                 select: list | None = None) -> list[str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, op, want_phase, notes in SELECT if select is None else select:
        cands = [x for x in exchanges if x["op"] == op and x["rep"] is not None]
        if want_phase is None:
            chosen = [x for x in cands if len(x["rep"].frames) == 2]  # pending polls
            chosen.sort(key=lambda x: x["req"].phase != "direct-query-pending")
        else:
            chosen = [x for x in cands if x["req"].phase == want_phase]
            if not chosen:  # a request the server never answered
                chosen = [x for x in exchanges if x["op"] == op and x["req"].phase == want_phase]
        if (op == "query_prefetch_status" and want_phase == "ld-lookup-hit") or (
                op == "cb_unified_lookup" and want_phase is not None):
            # Prefer the poll that carried the final answer.
            final = [x for x in chosen if len(x["rep"].frames) >= 3]
            chosen = final or chosen
        if not chosen:
            print(f"note: no captured exchange for {stem} (op {op}, phase {want_phase})", file=sys.stderr)
            stale = out_dir / f"{stem}.json"
            if stale.exists() and want_phase is not None:
                stale.unlink()
            continue
        x = chosen[0]
        req, rep = x["req"], x["rep"]
        rep_frames = rep.frames if rep is not None else []
        doc = {
            "op": op,
            "request_frames_hex": [f.hex() for f in req.frames],
            "response_frames_hex": [f.hex() for f in rep_frames],
            "notes": notes,
            "scenario": phases.get(req.phase, req.phase),
            "request_decoded": [decode_frame(f) for f in req.frames],
            "response_decoded": [decode_frame(f) for f in rep_frames],
            "captured_with": meta,
        }
        path = out_dir / f"{stem}.json"
        path.write_text(json.dumps(doc, indent=1) + "\n")
        written.append(path.name)
    return written


def summarize(exchanges: list[dict]) -> dict:
    """Per op: how many captured, request/response frame counts seen."""
    summary: dict[str, dict] = {}
    for x in exchanges:
        s = summary.setdefault(x["op"], {"count": 0, "request_frames": set(), "response_frames": set()})
        s["count"] += 1
        s["request_frames"].add(len(x["req"].frames))
        if x["rep"] is not None:
            s["response_frames"].add(len(x["rep"].frames))
    return {
        op: {"count": v["count"], "request_frames": sorted(v["request_frames"]),
             "response_frames": sorted(v["response_frames"])}
        for op, v in sorted(summary.items())
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None,
                    help="default: tests/wire_golden (tests/wire_golden/blend with --blend)")
    ap.add_argument("--blend", action="store_true",
                    help="capture CacheBlend's ops against `lmcache server --engine-type blend`")
    ap.add_argument("--log", default=None, help="reference server log file (default: temp file)")
    args = ap.parse_args()
    if args.out is None:
        args.out = str(REPO / "tests" / "wire_golden" / ("blend" if args.blend else ""))

    import importlib.metadata as md  # noqa: PLC0415

    meta = {
        "lmcache": md.version("lmcache"),
        "torch": md.version("torch"),
        "pyzmq": md.version("pyzmq"),
        "msgspec": md.version("msgspec"),
        "server_cmd": None,
        "tool": "tools/capture_golden.py",
    }
    # Blend: with an L2 tier (fs) lookups prefetch asynchronously, so the first
    # cb_unified_lookup of a prompt answers nil (loading) and the next ones the result.
    l2_dir = tempfile.mkdtemp(prefix="kvd-golden-l2-")
    blend_args = ["--engine-type", "blend", "--enable-blend-reorder",
                  "--l2-adapter", json.dumps({"type": "fs", "base_path": l2_dir})]
    log_path = Path(args.log) if args.log else Path(os.environ.get("TMPDIR", "/tmp")) / f"kvd-golden-server-{os.getpid()}.log"
    server = H.ServerProc(kind="lmcache", port=H.free_port(), l1_size_gb=1.0, log_path=log_path,
                          shm_name="kvdgoldenblend" if args.blend else "kvdgolden",
                          extra_args=blend_args if args.blend else [])
    cmd = server.command()
    # Ports vary run to run; record the flags that matter.
    shown = ["lmcache"]
    for i, a in enumerate(cmd[1:], start=1):
        shown.append("<free port>" if cmd[i - 1] in ("--port", "--http-port", "--prometheus-port")
                     else a.replace(l2_dir, "<temp dir>"))
    meta["server_cmd"] = " ".join(shown)
    before_shm = H.shm_lmcache_entries()
    print(f"starting reference server (log: {log_path})", flush=True)
    server.start(ready_timeout=120)
    proxy = LoggingProxy(server.url)
    proxy.start()
    try:
        phases = (run_blend_scenario if args.blend else run_scenario)(proxy, server)
    finally:
        try:
            proxy.stop()
        finally:
            server.stop()
            shutil.rmtree(l2_dir, ignore_errors=True)
    exchanges = pair_exchanges(proxy.log)
    written = write_golden(exchanges, phases, Path(args.out), meta,
                           BLEND_SELECT if args.blend else SELECT)
    summary = summarize(exchanges)
    (Path(args.out) / "summary.json").write_text(json.dumps(
        {"captured_with": meta, "phases": phases, "ops": summary}, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    print(f"wrote {len(written)} golden files to {args.out}")
    gc.collect()
    leaked = H.shm_lmcache_entries() - before_shm
    own = {n for n in leaked if n.startswith(f"lmcache_kv_{os.getpid()}_")}
    for n in own:  # this process's client KV segments: remove them
        try:
            os.unlink(f"/dev/shm/{n}")
        except OSError:
            pass
    if leaked - own:
        print(f"WARNING: new /dev/shm entries (other processes?): {sorted(leaked - own)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
