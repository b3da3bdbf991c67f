"""Helpers for the fault and isolation tests (test_faults.py, test_isolation.py).

* KvdServer: a kvd (or reference) server the test owns, with its own flags (small TTLs,
  an explicit --shm-name so a SIGKILLed server's pool can be removed), its HTTP /status when
  the binary serves one, SIGKILL and restart on the same port.
* RawClient: a bare ZMQ DEALER speaking the wire protocol with msgspec (for requests the
  adapters would never send, and for timing without the adapters' threads).
* Salted / fault-tolerant versions of the TPCluster flows (the harness's do not pass a
  cache_salt and assume a healthy server).
* Segment: a POSIX shared-memory segment created and removed by the test.

Loopback only; every process and segment created here is cleaned up by its owner.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import kvd_harness as H

_ids = itertools.count(1)


def rid(tag: str) -> str:
    return f"{tag}-{os.getpid()}-{next(_ids)}"


# ---------------------------------------------------------------------------------------
# Server under test
# ---------------------------------------------------------------------------------------


def kvd_binary() -> str:
    return os.environ.get("KVD_TEST_KVD_BIN", str(H.DEFAULT_KVD_BIN))


_flag_cache: dict[str, str] = {}


def kvd_help() -> str:
    b = kvd_binary()
    if b not in _flag_cache:
        try:
            r = subprocess.run([b, "server", "--help"], capture_output=True, text=True, timeout=60)
            _flag_cache[b] = r.stdout + r.stderr
        except (OSError, subprocess.TimeoutExpired):
            _flag_cache[b] = ""
    return _flag_cache[b]


def kvd_has_flag(flag: str) -> bool:
    return flag in kvd_help()


def harness_sets_http_port(kind: str) -> bool:
    """Whether kvd_harness.ServerProc already passes --http-port (a free port)."""
    return "--http-port" in H.ServerProc(kind=kind, port=1, l1_size_gb=0.01).command()


def http_port_of(pid: int) -> int | None:
    """The --http-port a running kvd was started with (None: none, or 0 = disabled)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    port = None
    for i, a in enumerate(argv[:-1]):
        if a == b"--http-port":
            port = int(argv[i + 1])
        elif a.startswith(b"--http-port="):
            port = int(a.split(b"=", 1)[1])
    return port or None


def sanitizer_build() -> bool:
    """Running against a sanitizer build (slower: give timing tests more room)."""
    return bool(os.environ.get("KVD_TEST_SANITIZER"))


class KvdServer:
    """A server process owned by one test: start, status, SIGKILL, restart, stop."""

    def __init__(self, tmp_path: Path, l1_gb: float = 0.05, extra: list[str] | None = None,
                 port: int | None = None) -> None:
        self.kind = H.server_kind()
        self.port = port or H.free_port()
        self.http_port = None
        self.extra = list(extra or [])
        self.shm_name = f"kvd_faulttest_{os.getpid()}_{self.port}"
        if self.kind == "kvd":
            self.extra += ["--shm-name", self.shm_name]
            if kvd_has_flag("--http-port") and not harness_sets_http_port(self.kind):
                self.extra += ["--http-host", "127.0.0.1", "--http-port", str(H.free_port())]
        self.l1_gb = l1_gb
        self.tmp = tmp_path
        self.starts = 0
        self.proc: H.ServerProc | None = None

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.tmp / f"{self.kind}-{self.port}-{self.starts}.log"

    def start(self) -> "KvdServer":
        self.starts += 1
        self.proc = H.ServerProc(kind=self.kind, port=self.port, l1_size_gb=self.l1_gb,
                                 log_path=self.log_path, extra_args=self.extra)
        if self.kind == "lmcache":
            self.proc.shm_name = self.shm_name
        self.proc.start(ready_timeout=120)
        self.http_port = http_port_of(self.proc.proc.pid) if self.kind == "kvd" else None
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None and self.proc.proc is not None
        return self.proc.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def status(self) -> dict | None:
        if not self.http_port:
            return None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/status",
                                        timeout=5) as r:
                return json.loads(r.read())
        except Exception:
            return None

    def l1(self) -> dict | None:
        s = self.status()
        return s.get("l1") if s else None

    def kill9(self) -> None:
        """SIGKILL: no cleanup runs in the server; its pool segment stays in /dev/shm."""
        assert self.proc is not None and self.proc.proc is not None
        os.killpg(self.proc.proc.pid, signal.SIGKILL)
        self.proc.proc.wait(timeout=30)
        self.remove_pool()

    def remove_pool(self) -> None:
        for name in (self.shm_name, "lmcache_l1_pool_" + self.shm_name):
            try:
                os.unlink(f"/dev/shm/{name}")
            except OSError:
                pass

    def stop(self) -> int | None:
        rc = self.proc.stop() if self.proc is not None else None
        self.remove_pool()
        return rc


@contextmanager
def kvd_server(tmp_path: Path, **kw):
    s = KvdServer(tmp_path, **kw).start()
    try:
        yield s
    finally:
        s.stop()


# ---------------------------------------------------------------------------------------
# Raw wire client
# ---------------------------------------------------------------------------------------

OP = {
    "register_kv_cache": 1, "unregister_kv_cache": 2, "store": 6, "retrieve": 7, "lookup": 8,
    "query_prefetch_status": 9, "wait_prefetch_status": 10, "free_lookup_locks": 12, "end_session": 13,
    "get_chunk_size": 21, "ping": 22, "noop": 24,
}


class RawClient:
    """One DEALER socket; payloads are msgspec-encoded like the real client's."""

    def __init__(self, url: str, ctx=None) -> None:
        import msgspec
        import zmq

        self.zmq = zmq
        self.enc = msgspec.msgpack.Encoder()
        self.dec = msgspec.msgpack.Decoder()
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(url)
        self.uid = 0

    def send(self, op: str | int, *payloads) -> int:
        self.uid += 1
        opv = OP.get(op, op) if isinstance(op, str) else op
        self.sock.send_multipart([self.enc.encode(self.uid), self.enc.encode(opv),
                                  *[self.enc.encode(p) for p in payloads]])
        return self.uid

    def recv(self, timeout: float = 30.0):
        """(uid, decoded reply) of the next reply; TimeoutError if none arrives."""
        if not self.sock.poll(int(timeout * 1000), self.zmq.POLLIN):
            raise TimeoutError("no reply")
        frames = self.sock.recv_multipart()
        return self.dec.decode(frames[0]), self.dec.decode(frames[-1])

    def call(self, op: str | int, *payloads, timeout: float = 30.0):
        uid = self.send(op, *payloads)
        while True:
            got, reply = self.recv(timeout)
            if got == uid:
                return reply

    def close(self) -> None:
        self.sock.close(0)


def cache_key(model: str, world_size: int, worker_id, tokens: list[int], start: int, end: int,
              request_id: str, salt: str = "") -> dict:
    """IPCCacheServerKey as msgspec encodes it (a map keyed by field name)."""
    return {"model_name": model, "world_size": world_size, "worker_id": worker_id,
            "token_ids": tokens, "start": start, "end": end, "request_id": request_id,
            "cache_salt": salt, "request_configs": None, "num_kv_readers": 1}


def cpu_shm_descriptor(shm_name: str, shape, stride, nbytes: int, offset: int = 0,
                       dtype: str = "bfloat16"):
    """The ext-1 object a CpuShm KV tensor travels as in lmcache 0.5.6."""
    import msgspec

    data = msgspec.msgpack.encode({
        "type": "cpu_shm", "version": 1,
        "metadata": {"dtype": dtype, "shape": list(shape), "stride": list(stride),
                     "storage_offset": offset, "device_uuid": "cpu"},
        "shm_name": shm_name, "nbytes": nbytes,
    })
    return msgspec.msgpack.Ext(1, data)


# One registered layer for raw registrations: [2, 16 blocks, 16 tokens, 2 heads, 64] bf16.
RAW_LAYER_SHAPE = (2, 16, 16, 2, 64)
RAW_LAYER_STRIDE = (16 * 16 * 2 * 64, 16 * 2 * 64, 2 * 64, 64, 1)
RAW_LAYER_BYTES = 2 * 16 * 16 * 2 * 64 * 2


def register_raw(c: "RawClient", instance_id: int, model: str, shm_name: str,
                 nbytes: int = RAW_LAYER_BYTES, world_size: int = 1):
    """REGISTER_KV_CACHE of one CpuShm layer, framed as the 0.5.6 client frames it."""
    desc = cpu_shm_descriptor(shm_name, RAW_LAYER_SHAPE, RAW_LAYER_STRIDE, nbytes)
    groups = [{"engine_group_id": 0, "layer_indices": [0], "tokens_per_block": 16,
               "sw_size_tokens": -1, "extra_object_group_tag": 0, "recurrent_state": False}]
    return c.call("register_kv_cache", instance_id, [desc], model, world_size, "vllm",
                  {"kv_layout": "NHD", "num_kv_heads": 2, "tokens_per_block": 16,
                   "head_dim": 64}, groups)


class Segment:
    """A POSIX shared-memory segment (or, with path=, a plain file) this test owns."""

    def __init__(self, name: str, nbytes: int, path: str | None = None) -> None:
        self.path = path or f"/dev/shm/{name.lstrip('/')}"
        self.name = name
        self.nbytes = nbytes
        with open(self.path, "wb") as f:
            f.truncate(nbytes)

    def close(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass


# ---------------------------------------------------------------------------------------
# TPCluster flows with a cache_salt, tolerant of an unhealthy server
# ---------------------------------------------------------------------------------------


def op(token_ids, block_ids, start, end, skip=0):
    from lmcache.integration.vllm.vllm_multi_process_adapter import LoadStoreOp

    return LoadStoreOp(token_ids=list(token_ids), block_ids=[list(block_ids)], start=start,
                       end=end, skip_first_n_tokens=skip)


def store(c: H.TPCluster, request_id: str, toks, blocks, end: int, salt: str = "",
          timeout: float = 30.0) -> list[bool | None]:
    """Per rank: True/False as the server answered, None if nothing came back."""
    o = op(toks, blocks, 0, end)
    for w in c.workers:
        w.batched_submit_store_requests([request_id], [o], w.create_recorded_event(),
                                        cache_salts=[salt])
    out: list[bool | None] = []
    for w in c.workers:
        fut = w.store_futures.get(request_id)
        try:
            out.append(None if fut is None else bool(fut.result(timeout=timeout)))
        except Exception:
            out.append(None)
        try:
            w.get_finished({request_id})
        except Exception:
            pass
    return out


def lookup(c: H.TPCluster, request_id: str, toks, salt: str = "", timeout: float = 30.0) -> int:
    s = c.scheduler
    s.maybe_submit_lookup_request(request_id, list(toks), cache_salt=salt)
    deadline = time.monotonic() + timeout
    while True:
        r = s.check_lookup_result(request_id)
        if r is not None:
            return int(r)
        if time.monotonic() > deadline:
            raise TimeoutError(f"lookup {request_id}")
        time.sleep(0.005)


def retrieve(c: H.TPCluster, request_id: str, toks, blocks, end: int, salt: str = "",
             timeout: float = 30.0) -> list[bool | None]:
    o = op(toks, blocks, 0, end)
    for w in c.workers:
        w.batched_submit_retrieve_requests([request_id], [o], w.create_recorded_event(),
                                           cache_salts=[salt])
    out: list[bool | None] = []
    for w in c.workers:
        entry = w.retrieve_futures.get(request_id)
        if entry is None:
            out.append(None)
            continue
        try:
            ok = bool(entry[0].result(timeout=timeout))
            _stores, _recv = w.get_finished(set())
            out.append(ok and request_id not in w.get_failed_request_ids())
        except Exception:
            out.append(None)
    return out


def end_session(c: H.TPCluster, request_id: str) -> None:
    try:
        c.end_session(request_id)
    except Exception:
        pass


def healthy(c: H.TPCluster) -> bool:
    return c.scheduler.is_healthy and all(w.is_healthy for w in c.workers)


def wait_until(pred, timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


def listening_addresses(port: int) -> set[str]:
    """Local addresses with a TCP socket in LISTEN state on `port` (IPv4 and IPv6)."""
    out: set[str] = set()
    for path, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = Path(path).read_text().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            parts = ln.split()
            local, state = parts[1], parts[3]
            addr_hex, port_hex = local.split(":")
            if state != "0A" or int(port_hex, 16) != port:
                continue
            if not v6:
                b = bytes.fromhex(addr_hex)[::-1]
                out.add(".".join(str(x) for x in b))
            else:
                words = [bytes.fromhex(addr_hex[i:i + 8])[::-1] for i in range(0, 32, 8)]
                raw = b"".join(words)
                import ipaddress

                out.add(str(ipaddress.IPv6Address(raw)))
    return out
