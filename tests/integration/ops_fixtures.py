"""Helpers for tests/integration/test_operations.py (operating kvd).

Self-contained on purpose (shares nothing with the interop suite): a kvd process
with its HTTP port, small HTTP helpers, a raw ZMQ client for cheap requests, and a
one-worker deployment driven by the real lmcache 0.5.6 client (scheduler adapter +
worker adapter, CPU KV tensors in the vLLM FlashAttention layout).
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import kvd_harness

REPO_ROOT = Path(__file__).resolve().parents[2]
KVD_BIN = Path(os.environ.get("KVD_TEST_KVD_BIN", REPO_ROOT / "build" / "kvd"))

os.environ.setdefault("LMCACHE_DISABLE_BANNER", "1")
os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PYTHONWARNINGS", "ignore")


def free_port() -> int:
    """A free port no test of this process was given before (kvd_harness.free_port)."""
    return kvd_harness.free_port()


def http(method: str, url: str, timeout: float = 5.0) -> tuple[int, str, str]:
    """(status, content type, body) of one request; HTTP errors are returned, not raised."""
    data = b"" if method == "POST" else None
    req = urllib.request.Request(url, method=method, data=data)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def metric(text: str, name: str) -> float | None:
    """Value of one sample line `name value` (name may include {labels})."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


# ---------------------------------------------------------------------------
# kvd process
# ---------------------------------------------------------------------------


@dataclass
class Kvd:
    """A kvd server on loopback with its own ZMQ and HTTP ports."""

    log_path: Path
    port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    shm_name: str = ""
    l1_size_gb: float = 0.25
    extra: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None

    def __post_init__(self) -> None:
        if not self.shm_name:
            self.shm_name = f"kvd_ops_{os.getpid()}_{self.port}"

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def shm_path(self) -> Path:
        return Path("/dev/shm") / self.shm_name

    def command(self) -> list[str]:
        return [
            str(KVD_BIN), "server",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--http-host", "127.0.0.1", "--http-port", str(self.http_port),
            "--l1-size-gb", repr(self.l1_size_gb), "--eviction-policy", "LRU",
            "--shm-name", self.shm_name,
            "--log-level", "info",  # not LMCACHE_LOG_LEVEL (the client's, WARNING in tests)
            *self.extra,
        ]

    def spawn(self) -> "Kvd":
        if not KVD_BIN.exists():
            raise FileNotFoundError(f"kvd binary not found at {KVD_BIN}; build it first")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def start(self, timeout: float = 20.0) -> "Kvd":
        self.spawn()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvd exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if http("GET", self.base + "/healthcheck", timeout=1.0)[0] == 200:
                    return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"kvd did not become healthy in {timeout}s:\n{self.log()}")
            time.sleep(0.05)

    def get(self, path: str) -> tuple[int, str, str]:
        return http("GET", self.base + path)

    def get_json(self, path: str):
        status, _, body = self.get(path)
        assert status == 200, (path, status, body)
        return json.loads(body)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def wait(self, timeout: float = 20.0) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after 20 s; returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(timeout=10)
        return self.proc.returncode

    def cleanup(self) -> None:
        """Never leave a process or a segment behind, even when a test failed."""
        if self.proc is not None and self.proc.poll() is None:
            self.signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        try:
            self.shm_path.unlink()
        except FileNotFoundError:
            pass


# ---------------------------------------------------------------------------
# Raw ZMQ requests (GET_CHUNK_SIZE, NOOP, PING): no lmcache needed
# ---------------------------------------------------------------------------


def raw_requests(url: str, ops: list[int], timeout_ms: int = 5000) -> list:
    """Send each op id (no payload) from one DEALER; returns the decoded replies."""
    import msgspec  # noqa: PLC0415
    import zmq  # noqa: PLC0415

    enc, dec = msgspec.msgpack.encode, msgspec.msgpack.decode
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(url)
    try:
        for uid, op in enumerate(ops, start=1):
            sock.send_multipart([enc(uid), enc(op)])
        out = {}
        while len(out) < len(ops):
            if not sock.poll(timeout_ms, zmq.POLLIN):
                raise TimeoutError(f"{len(ops) - len(out)} raw request(s) unanswered")
            frames = sock.recv_multipart()
            out[dec(frames[0])] = dec(frames[-1])
        return [out[i] for i in range(1, len(ops) + 1)]
    finally:
        sock.close(0)


OP_GET_CHUNK_SIZE, OP_PING, OP_NOOP = 21, 22, 24


# ---------------------------------------------------------------------------
# One vLLM-like worker through the real lmcache client
# ---------------------------------------------------------------------------


def lmcache_available() -> str | None:
    """None when the lmcache 0.5.6 client and torch import; else why not."""
    try:
        import lmcache.integration.vllm.vllm_multi_process_adapter  # noqa: F401, PLC0415
        import torch  # noqa: F401, PLC0415
    except Exception as exc:  # pragma: no cover - depends on the venv
        return f"lmcache client not importable ({exc!r}); run with /tmp/lmvenv/bin/python"
    return None


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


class OneWorker:
    """Scheduler adapter + one worker adapter (TP 1, lmcache_driven) on CPU tensors."""

    NUM_LAYERS, NUM_BLOCKS, BLOCK_SIZE, HEADS, HEAD_SIZE = 2, 96, 16, 2, 64

    def __init__(self, url: str, model: str = "ops-model", heartbeat_interval: float = 5.0,
                 mq_timeout: float = 20.0) -> None:
        import torch  # noqa: PLC0415
        import zmq  # noqa: PLC0415
        from lmcache.integration.vllm.kv_cache_groups import (  # noqa: PLC0415
            create_engine_group_infos_from_vllm,
        )
        from lmcache.integration.vllm.vllm_multi_process_adapter import (  # noqa: PLC0415
            LMCacheMPSchedulerAdapter,
            LMCacheMPWorkerAdapter,
            ParallelStrategy,
        )

        self.mq_timeout = mq_timeout
        self.ctx = zmq.Context.instance()
        extra = {
            "lmcache.mp.mq_timeout": mq_timeout,
            "lmcache.mp.heartbeat_interval": heartbeat_interval,
            "lmcache.mp.mp_transfer_mode": "lmcache_driven",
        }
        strategy = ParallelStrategy(mla_only=False, vllm_world_size=1, vllm_worker_id=0,
                                    tp_size=1, pp_size=1, n_servers=1)
        self.scheduler = LMCacheMPSchedulerAdapter(
            server_urls=[url], context=self.ctx, model_name=model,
            vllm_block_size=self.BLOCK_SIZE, parallel_strategy=strategy, extra_config=extra)
        self.chunk_size = self.scheduler.lmcache_tokens_per_chunk
        self.worker = LMCacheMPWorkerAdapter(
            server_url=url, context=self.ctx, model_name=model,
            vllm_block_size=self.BLOCK_SIZE, parallel_strategy=strategy, extra_config=extra)
        gen = torch.Generator().manual_seed(7)
        shape = (2, self.NUM_BLOCKS, self.BLOCK_SIZE, self.HEADS, self.HEAD_SIZE)
        kv = {f"model.layers.{i}.self_attn.attn": torch.randn(shape, generator=gen).to(torch.bfloat16)
              for i in range(self.NUM_LAYERS)}
        hints = {"kv_layout": "NHD"}
        groups = create_engine_group_infos_from_vllm(None, kv, layout_hints=hints)
        self.worker.register_kv_caches(kv, engine_group_infos=groups, layout_hints=hints)

    @property
    def kv(self):
        return self.worker.kv_caches

    def _op(self, tokens, blocks, end, start=0):
        from lmcache.integration.vllm.vllm_multi_process_adapter import LoadStoreOp  # noqa: PLC0415

        return LoadStoreOp(token_ids=list(tokens), block_ids=[list(blocks)], start=start, end=end)

    def store(self, rid: str, tokens: list[int], blocks: list[int]) -> bool:
        end = len(tokens) // self.chunk_size * self.chunk_size
        ev = self.worker.create_recorded_event()
        self.worker.batched_submit_store_requests([rid], [self._op(tokens, blocks, end)], ev)
        ok = bool(self.worker.store_futures[rid].result(timeout=self.mq_timeout))
        self.worker.get_finished({rid})
        return ok

    def lookup(self, rid: str, tokens: list[int]) -> int:
        self.scheduler.maybe_submit_lookup_request(rid, list(tokens))
        deadline = time.monotonic() + self.mq_timeout
        while True:
            res = self.scheduler.check_lookup_result(rid)
            if res is not None:
                return int(res)
            if time.monotonic() > deadline:
                raise TimeoutError(f"lookup {rid} did not finish")
            time.sleep(0.005)

    def retrieve(self, rid: str, tokens: list[int], blocks: list[int], end: int) -> bool:
        ev = self.worker.create_recorded_event()
        self.worker.batched_submit_retrieve_requests([rid], [self._op(tokens, blocks, end)], ev)
        fut, _ = self.worker.retrieve_futures[rid]
        ok = bool(fut.result(timeout=self.mq_timeout))
        self.worker.get_finished(set())
        return ok and rid not in self.worker.get_failed_request_ids()

    def end_session(self, rid: str) -> None:
        self.scheduler.end_session(rid)
        self.scheduler.cleanup_lookup_result(rid)

    def blocks_equal(self, a: list[int], b: list[int]) -> bool:
        import torch  # noqa: PLC0415

        ia, ib = torch.tensor(a), torch.tensor(b)
        return all(torch.equal(t[:, ia], t[:, ib]) for t in self.kv.values())

    def close(self) -> None:
        for part in (self.worker, self.scheduler):
            try:
                part.shutdown()
            except Exception:  # pragma: no cover - best effort
                pass
        self.worker.kv_caches = {}
        gc.collect()


_token_base = [1_000 + (os.getpid() % 997) * 100_000]


def fresh_tokens(n: int) -> list[int]:
    """Tokens no other request of this process used."""
    _token_base[0] += 7_919
    return [_token_base[0] + i for i in range(n)]
