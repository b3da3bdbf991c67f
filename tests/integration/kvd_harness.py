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
import random
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
    "LMCACHE_LOG_LEVEL": os.environ.get("LMCACHE_LOG_LEVEL", "WARNING"),
    "LMCACHE_TRACK_USAGE": "false",
    "DO_NOT_TRACK": "1",
    "PYTHONWARNINGS": "ignore",
}
for _k, _v in QUIET_ENV.items():
    os.environ.setdefault(_k, _v)

CHUNK_SIZE = 256
BLOCK_SIZE = 16


# Ports free_port has handed out in this process. The kernel may return a port again once
# the probing socket is closed, so two calls could give one port to a server's ZMQ and
# HTTP listeners (seen: "cannot listen for HTTP ... address already in use").
_handed_out: set[int] = set()
_port_rng = random.Random()


def _ephemeral_start() -> int:
    """First port of the kernel's ephemeral range (where outgoing connections get theirs)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(exclude: set[int] | frozenset[int] = frozenset()) -> int:
    """A currently free TCP port on 127.0.0.1, not in `exclude` and not handed out before by
    this process. It lies below the kernel's ephemeral range: a port from that range that was
    free when probed could be given to some outgoing connection (a client's, or a UCX peer's)
    before the server binds it (seen: a P2P listener that could not start)."""
    high = _ephemeral_start()
    low = max(1024, high - 12000)
    while True:
        port = _port_rng.randrange(low, high)
        if port in exclude or port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port


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
    # Run the server under this command (e.g. a private mount namespace, mount_ns.py).
    prefix: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        # Flags both servers take (kvd is a drop-in for `lmcache server`).
        # The HTTP frontend (default 8080 for both) moves to a free port so
        # parallel servers on one machine do not collide.
        http_port = free_port(exclude={self.port})
        base = [
            "server",
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--l1-size-gb", repr(self.l1_size_gb),
            "--eviction-policy", "LRU",
            "--chunk-size", str(self.chunk_size),
            "--http-port", str(http_port),
        ]
        if self.kind == "kvd":
            binary = os.environ.get("KVD_TEST_KVD_BIN", str(DEFAULT_KVD_BIN))
            # kvd honours LMCACHE_LOG_LEVEL like lmcache; QUIET_ENV sets it to WARNING for
            # the client, and tests read kvd's info lines.
            cmd = [binary, *base, "--log-level", "info"]
        else:
            # The reference only advertises an SHM pool to engine-driven
            # workers when the engine-driven path is loaded (auto), L1 is not
            # lazy and --shm-name is set. Its Prometheus port (9090) moves
            # to a free port too.
            if not self.shm_name:
                self.shm_name = f"kvdtest_{self.port}"
            cmd = [
                lmcache_server_bin(), *base,
                "--supported-transfer-mode", "auto",
                "--no-l1-use-lazy",
                "--shm-name", self.shm_name,
                "--prometheus-port", str(free_port(exclude={self.port, http_port})),
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
                [*self.prefix, *cmd],
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
        except RuntimeError as e:
            self.stop()
            tail = self.log_tail()
            raise RuntimeError(f"{e}; its log ends:\n{tail}" if tail else str(e)) from e
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
_probe_ids = itertools.count(1)


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


class FullAttentionSpec:
    """Stand-in for vLLM's FullAttentionSpec (only what lmcache reads)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size


class KVCacheGroupSpec:
    """Stand-in for vLLM's KVCacheGroupSpec."""

    def __init__(self, layer_names: list[str], kv_cache_spec) -> None:
        self.layer_names = layer_names
        self.kv_cache_spec = kv_cache_spec


class KVCacheConfig:
    """Stand-in for vLLM's KVCacheConfig: one full-attention group, as vLLM
    builds for a plain Llama-like model."""

    def __init__(self, layer_names: list[str], block_size: int) -> None:
        self.kv_cache_groups = [KVCacheGroupSpec(list(layer_names), FullAttentionSpec(block_size))]


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
        enable_kv_events: bool = False,
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
                    enable_kv_events=enable_kv_events,
                )
                self.workers.append(w)
                kv = {
                    f"model.layers.{layer}.self_attn.attn": torch.randn(
                        self.shape.layer_shape, generator=gen
                    ).to(dtype)
                    for layer in range(self.shape.num_layers)
                }
                # What LMCacheMPConnector.register_kv_caches does: group infos
                # from vLLM's KV cache config, layout hints {"kv_layout": "NHD"}.
                kv_cache_config = KVCacheConfig(list(kv), self.shape.block_size)
                groups = create_engine_group_infos_from_vllm(
                    kv_cache_config, kv, layout_hints=layout_hints
                )
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

    def full_snapshot(self, rank: int) -> list:
        return [t.clone() for t in self.kv[rank].values()]

    # -- flows --------------------------------------------------------------

    def _check_healthy(self, what: str) -> None:
        # A failed heartbeat PING puts an adapter in degraded mode: lookups
        # answer 0 and stores/retrieves are silently dropped. Say so.
        if not self.scheduler.is_healthy:
            raise AssertionError(f"{what}: scheduler adapter is unhealthy (a PING failed or timed out)")
        for r, w in enumerate(self.workers):
            if not w.is_healthy:
                raise AssertionError(f"{what}: worker {r} adapter is unhealthy (a PING failed or timed out)")

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
        self._check_healthy(f"store {request_id}")
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
        self._check_healthy(f"lookup {request_id}")
        s.maybe_submit_lookup_request(request_id, list(token_ids))
        deadline = time.monotonic() + timeout
        while True:
            res = s.check_lookup_result(request_id)
            if res is not None:
                self._check_healthy(f"lookup {request_id} result")
                return int(res)
            if time.monotonic() > deadline:
                raise TimeoutError(f"lookup {request_id} did not finish in {timeout}s")
            time.sleep(0.005)

    def probe(self, token_ids: list[int]) -> int:
        """One lookup under a fresh request id that leaves nothing behind
        (frees the read locks the lookup took, ends the session)."""
        req = f"probe-{next(_probe_ids)}"
        hit = self.lookup(req, token_ids)
        if hit:
            self.scheduler.free_lookup_locks(list(token_ids), 0, hit, req)
        self.end_session(req)
        return hit

    def wait_for_hit(self, token_ids: list[int], expected: int, timeout: float = 10.0) -> int:
        """Poll lookups until `expected` tokens hit (or more, or timeout).

        The reference server answers STORE before the stored objects become
        visible (lmcache_driven: finish_write runs from a completion-drain
        thread a few ms later), so a lookup right after a store may miss.
        Returns the last hit count seen.
        """
        deadline = time.monotonic() + timeout
        while True:
            hit = self.probe(token_ids)
            if hit >= expected or time.monotonic() > deadline:
                return hit
            time.sleep(0.01)

    def settle(self, timeout: float = 10.0) -> None:
        """Barrier: every store submitted so far by every rank is visible.

        Stores one control chunk from all ranks and waits until it hits.
        Each rank's requests are served in order (the reference runs them
        on one affinity thread per client and commits in completion order),
        so the earlier stores are committed too.
        """
        toks = unique_tokens(self.chunk_size)
        blk = list(range(1, 1 + self.blocks_per_chunk))
        req = f"settle-{next(_probe_ids)}"
        res = self.store(req, toks, blk)
        self.end_session(req)
        if res != [True] * self.tp:
            raise AssertionError(f"settle: control store failed: {res}")
        hit = self.wait_for_hit(toks, self.chunk_size, timeout)
        if hit != self.chunk_size:
            raise AssertionError(f"settle: control chunk not visible after {timeout}s (hit {hit})")

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
        self._check_healthy(f"retrieve {request_id}")
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
