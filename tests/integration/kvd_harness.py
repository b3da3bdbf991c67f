"""Shared helpers for the kvd integration suite and tools/capture_golden.py.

Everything here drives the *real* lmcache 0.5.6 client code (the vLLM
multiprocess adapters) against a cache server started as a subprocess: either
kvd (``build/kvd``) or the reference ``lmcache server`` from the venv.

The adapters are used the way vLLM's LMCacheMPConnector uses them:
one LMCacheMPSchedulerAdapter (scheduler process) and one
LMCacheMPWorkerAdapter per TP rank, each worker with its own CPU KV tensors
in the FlashAttention layout [2, num_blocks, block_size, num_kv_heads,
head_size] per layer.
"""

from __future__ import annotations

import gc
import itertools
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_KVD_BIN = REPO_ROOT / "build" / "kvd"

# Quiet, offline lmcache (banner, usage telemetry, python warnings).
QUIET_ENV = {
    "LMCACHE_DISABLE_BANNER": "1",
    "LMCACHE_TRACK_USAGE": "false",
    "DO_NOT_TRACK": "1",
    "PYTHONWARNINGS": "ignore",
}
for _k, _v in QUIET_ENV.items():
    os.environ.setdefault(_k, _v)

CHUNK_SIZE = 256
BLOCK_SIZE = 16


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shm_lmcache_entries() -> set[str]:
    """Names in /dev/shm that lmcache-style servers/clients create."""
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("lmcache_")}
    except FileNotFoundError:
        return set()


# ---------------------------------------------------------------------------
# Server process
# ---------------------------------------------------------------------------


def server_kind() -> str:
    kind = os.environ.get("KVD_TEST_SERVER", "kvd").strip().lower()
    if kind not in ("kvd", "lmcache"):
        raise ValueError(f"KVD_TEST_SERVER must be 'kvd' or 'lmcache', got {kind!r}")
    return kind


def lmcache_server_bin() -> str:
    """The `lmcache` console script of the venv running this interpreter."""
    override = os.environ.get("KVD_TEST_LMCACHE_BIN")
    if override:
        return override
    cand = Path(sys.executable).parent / "lmcache"
    return str(cand)


@dataclass
class ServerProc:
    """A cache server subprocess (kvd or reference lmcache) on loopback."""

    kind: str
    port: int
    l1_size_gb: float
    chunk_size: int = CHUNK_SIZE
    log_path: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    shm_name: str = ""

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        base = [
            "server",
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--l1-size-gb", repr(self.l1_size_gb),
            "--eviction-policy", "LRU",
            "--chunk-size", str(self.chunk_size),
        ]
        if self.kind == "kvd":
            binary = os.environ.get("KVD_TEST_KVD_BIN", str(DEFAULT_KVD_BIN))
            cmd = [binary, *base]
        else:
            # The reference only advertises an SHM pool to engine-driven
            # workers when the engine-driven path is loaded (auto), L1 is not
            # lazy and --shm-name is set; its HTTP (8080) and Prometheus
            # (9090) ports are moved to free ports so parallel runs coexist.
            self.shm_name = f"kvdtest_{self.port}"
            cmd = [
                lmcache_server_bin(), *base,
                "--supported-transfer-mode", "auto",
                "--no-l1-use-lazy",
                "--shm-name", self.shm_name,
                "--http-port", str(free_port()),
                "--prometheus-port", str(free_port()),
            ]
        env_extra = os.environ.get("KVD_TEST_SERVER_ARGS", "")
        return cmd + shlex.split(env_extra) + list(self.extra_args)

    def start(self, ready_timeout: float = 90.0) -> "ServerProc":
        cmd = self.command()
        if self.kind == "kvd" and not Path(cmd[0]).exists():
            raise FileNotFoundError(
                f"kvd binary not found at {cmd[0]} (build it with `make build`, "
                "or run with KVD_TEST_SERVER=lmcache)"
            )
        env = dict(os.environ)
        env.update(QUIET_ENV)
        logf = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # own process group: we can kill it all
            )
        finally:
            if logf is not subprocess.DEVNULL:
                logf.close()
        try:
            wait_until_answers(self.url, ready_timeout, self.proc)
        except BaseException:
            self.stop()
            raise
        return self

    def log_tail(self, n: int = 40) -> str:
        if not self.log_path or not Path(self.log_path).exists():
            return ""
        lines = Path(self.log_path).read_text(errors="replace").splitlines()
        lines = [ln for ln in lines if "Warning" not in ln and "warnings.warn" not in ln]
        return "\n".join(lines[-n:])

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float = 20.0) -> int | None:
        """SIGTERM (graceful: lets the server unlink its SHM), then SIGKILL."""
        if self.proc is None:
            return None
        p = self.proc
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=10)
        else:
            # Reap any children left in its process group.
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return p.returncode


def wait_until_answers(url: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    """Block until the server at `url` answers GET_CHUNK_SIZE (raw frames).

    Sends [uid, op=21] from a raw DEALER; any reply with the same uid counts.
    Raises RuntimeError if the process exits or nothing answers in time.
    """
    import msgspec  # noqa: PLC0415
    import zmq  # noqa: PLC0415

    enc, dec = msgspec.msgpack.encode, msgspec.msgpack.decode

    ctx = zmq.Context.instance()
    deadline = time.monotonic() + timeout
    uid = 0
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before answering")
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(url)
        try:
            uid += 1
            sock.send_multipart([enc(uid), enc(21)])
            if sock.poll(500, zmq.POLLIN):
                frames = sock.recv_multipart()
                if frames and dec(frames[0]) == uid:
                    return
        finally:
            sock.close(0)
        if time.monotonic() > deadline:
            raise RuntimeError(f"server at {url} did not answer within {timeout}s")
        time.sleep(0.2)


# ---------------------------------------------------------------------------
# Raw client (for ops the adapters do not send)
# ---------------------------------------------------------------------------


def make_request_client(url: str, ctx=None):
    """The real lmcache RequestClient (ZMQ) for direct RPC calls."""
    from lmcache.v1.multiprocess.transport.factory import RequestClientFactory  # noqa: PLC0415

    return RequestClientFactory.create(url, context=ctx)


# ---------------------------------------------------------------------------
# TP cluster: one scheduler adapter + N worker adapters
# ---------------------------------------------------------------------------

_token_counter = itertools.count(1)


def unique_tokens(n: int, salt: int = 0) -> list[int]:
    """A token list nobody else in this process uses (distinct prefix)."""
    k = next(_token_counter)
    base = 100_000 + (os.getpid() % 1000) * 1_000_000 + k * 10_007 + salt * 7
    return [base + i for i in range(n)]


@dataclass
class ModelShape:
    num_layers: int = 4
    num_blocks: int = 128
    block_size: int = BLOCK_SIZE
    num_kv_heads: int = 2
    head_size: int = 64
    dtype_name: str = "bfloat16"

    @property
    def layer_shape(self) -> tuple[int, ...]:
        # vLLM FlashAttention (NHD) layout: [2, num_blocks, block_size, H, D]
        return (2, self.num_blocks, self.block_size, self.num_kv_heads, self.head_size)


class TPCluster:
    """vLLM-like deployment: scheduler adapter + `tp` worker adapters.

    Args:
        url: server URL (tcp://127.0.0.1:PORT).
        mode: "lmcache_driven" (CpuShmTensorWrapper, server copies) or
            "engine_driven" (prepare/commit through the server's SHM pool).
        model_name: model name used in cache keys.
        tp: tensor parallel size (= vLLM world size, one server).
    """

    def __init__(
        self,
        url: str,
        mode: str,
        model_name: str,
        tp: int = 2,
        shape: ModelShape | None = None,
        mq_timeout: float = 30.0,
        heartbeat_interval: float = 5.0,
        seed: int = 1234,
        ctx=None,
    ) -> None:
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

        self.url = url
        self.mode = mode
        self.model_name = model_name
        self.tp = tp
        self.shape = shape or ModelShape()
        self.mq_timeout = mq_timeout
        self.ctx = ctx or zmq.Context.instance()
        self.scheduler = None
        self.workers: list = []
        self.kv: list[dict[str, "torch.Tensor"]] = []
        self._closed = False

        extra = {
            "lmcache.mp.mq_timeout": mq_timeout,
            "lmcache.mp.heartbeat_interval": heartbeat_interval,
            "lmcache.mp.mp_transfer_mode": mode,
        }

        def strategy(rank: int) -> ParallelStrategy:
            return ParallelStrategy(
                mla_only=False,
                vllm_world_size=tp,
                vllm_worker_id=rank,
                tp_size=tp,
                pp_size=1,
                n_servers=1,
            )

        try:
            self.scheduler = LMCacheMPSchedulerAdapter(
                server_urls=[url],
                context=self.ctx,
                model_name=model_name,
                vllm_block_size=self.shape.block_size,
                parallel_strategy=strategy(0),
                extra_config=extra,
            )
            self.chunk_size = self.scheduler.lmcache_tokens_per_chunk
            self.blocks_per_chunk = self.scheduler.num_blocks_per_chunk()

            gen = torch.Generator().manual_seed(seed)
            dtype = getattr(torch, self.shape.dtype_name)
            layout_hints = {"kv_layout": "NHD"}
            for rank in range(tp):
                w = LMCacheMPWorkerAdapter(
                    server_url=url,
                    context=self.ctx,
                    model_name=model_name,
                    vllm_block_size=self.shape.block_size,
                    parallel_strategy=strategy(rank),
                    extra_config=extra,
                )
                self.workers.append(w)
                kv = {
                    f"model.layers.{layer}.self_attn.attn": torch.randn(
                        self.shape.layer_shape, generator=gen
                    ).to(dtype)
                    for layer in range(self.shape.num_layers)
                }
                groups = create_engine_group_infos_from_vllm(None, kv, layout_hints=layout_hints)
                w.register_kv_caches(kv, engine_group_infos=groups, layout_hints=layout_hints)
                # register_kv_caches may re-point the tensors onto POSIX SHM
                # (lmcache_driven); keep the dict the adapter holds.
                self.kv.append(w.kv_caches)
        except BaseException:
            self.close()
            raise

    # -- data helpers -----------------------------------------------------

    def fill_random(self, rank: int, block_ids: list[int], seed: int) -> None:
        import torch  # noqa: PLC0415

        gen = torch.Generator().manual_seed(seed)
        idx = torch.tensor(block_ids, dtype=torch.long)
        for t in self.kv[rank].values():
            vals = torch.randn((2, len(block_ids), *t.shape[2:]), generator=gen).to(t.dtype)
            t[:, idx] = vals

    def zero_blocks(self, rank: int, block_ids: list[int]) -> None:
        import torch  # noqa: PLC0415

        idx = torch.tensor(block_ids, dtype=torch.long)
        for t in self.kv[rank].values():
            t[:, idx] = 0

    def snapshot_blocks(self, rank: int, block_ids: list[int]) -> list:
        """Copies of the given blocks, per layer: [2, len(block_ids), BS, H, D]."""
        import torch  # noqa: PLC0415

        idx = torch.tensor(block_ids, dtype=torch.long)
        return [t[:, idx].clone() for t in self.kv[rank].values()]

    def blocks_bytes(self, rank: int, block_ids: list[int]) -> bytes:
        return b"".join(
            s.contiguous().view(-1).view(dtype=__import__("torch").uint8).numpy().tobytes()
            for s in self.snapshot_blocks(rank, block_ids)
        )

    def full_snapshot(self, rank: int) -> list:
        return [t.clone() for t in self.kv[rank].values()]

    # -- flows --------------------------------------------------------------

    def _op(self, token_ids, block_ids, start, end, skip=0):
        from lmcache.integration.vllm.vllm_multi_process_adapter import LoadStoreOp  # noqa: PLC0415

        return LoadStoreOp(
            token_ids=list(token_ids),
            block_ids=[list(block_ids)],
            start=start,
            end=end,
            skip_first_n_tokens=skip,
        )

    def store(
        self,
        request_id: str,
        token_ids: list[int],
        block_ids: list[int],
        start: int = 0,
        end: int | None = None,
        ranks: tuple[int, ...] | None = None,
        timeout: float | None = None,
    ) -> list[bool]:
        """Store [start, end) (default: all full chunks) from the given ranks.

        `block_ids` are the vLLM blocks holding tokens [start, end).
        Returns each rank's store result (True = server reported success).
        """
        if end is None:
            end = len(token_ids) // self.chunk_size * self.chunk_size
        ranks = tuple(range(self.tp)) if ranks is None else ranks
        timeout = self.mq_timeout if timeout is None else timeout
        op = self._op(token_ids, block_ids, start, end)
        for r in ranks:
            w = self.workers[r]
            # vLLM's wait_for_save: one recorded event, batched submit.
            ev = w.create_recorded_event()
            w.batched_submit_store_requests([request_id], [op], ev)
        results = []
        for r in ranks:
            w = self.workers[r]
            fut = w.store_futures[request_id]
            results.append(bool(fut.result(timeout=timeout)))
            # Drain the adapter's bookkeeping like vLLM's get_finished().
            w.get_finished({request_id})
        return results

    def lookup(self, request_id: str, token_ids: list[int], timeout: float | None = None) -> int:
        """Scheduler lookup: submit, then poll check_lookup_result until done.

        Returns the matched token count (a multiple of the chunk size).
        """
        timeout = self.mq_timeout if timeout is None else timeout
        s = self.scheduler
        s.maybe_submit_lookup_request(request_id, list(token_ids))
        deadline = time.monotonic() + timeout
        while True:
            res = s.check_lookup_result(request_id)
            if res is not None:
                return int(res)
            if time.monotonic() > deadline:
                raise TimeoutError(f"lookup {request_id} did not finish in {timeout}s")
            time.sleep(0.005)

    def retrieve(
        self,
        request_id: str,
        token_ids: list[int],
        block_ids: list[int],
        end: int,
        start: int = 0,
        skip: int = 0,
        ranks: tuple[int, ...] | None = None,
        timeout: float | None = None,
    ) -> list[bool]:
        """Workers load [start, end) into `block_ids`; returns per-rank success."""
        ranks = tuple(range(self.tp)) if ranks is None else ranks
        timeout = self.mq_timeout if timeout is None else timeout
        op = self._op(token_ids, block_ids, start, end, skip)
        for r in ranks:
            w = self.workers[r]
            ev = w.create_recorded_event()
            w.batched_submit_retrieve_requests([request_id], [op], ev)
        results = []
        for r in ranks:
            w = self.workers[r]
            fut, _blocks = w.retrieve_futures[request_id]
            ok = bool(fut.result(timeout=timeout))
            _stores, recv = w.get_finished(set())
            failed = w.get_failed_request_ids()
            assert request_id in recv, (request_id, recv)
            results.append(ok and request_id not in failed)
        return results

    def end_session(self, request_id: str) -> None:
        """vLLM's request_finished: END_SESSION (fire and forget) + cleanup."""
        self.scheduler.end_session(request_id)
        self.scheduler.cleanup_lookup_result(request_id)

    # -- teardown -----------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for w in self.workers:
            try:
                w.shutdown()
            except Exception as exc:  # pragma: no cover - best effort
                print(f"worker shutdown failed: {exc!r}", file=sys.stderr)
        if self.scheduler is not None:
            try:
                self.scheduler.shutdown()
            except Exception as exc:  # pragma: no cover
                print(f"scheduler shutdown failed: {exc!r}", file=sys.stderr)
        # The lmcache_driven CPU path unlinks /dev/shm/lmcache_kv_* when the
        # last view of each migrated storage is garbage-collected.
        self.kv.clear()
        for w in self.workers:
            w.kv_caches = {}
        self.workers.clear()
        self.scheduler = None
        gc.collect()
