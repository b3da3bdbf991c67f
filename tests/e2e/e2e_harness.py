"""Harness of the end-to-end tests: a cache server (kvd or the reference `lmcache
server`) on loopback, and real vLLM processes (vllm_worker.py) that talk to it through
lmcache's LMCacheMPConnector.

Reusable pieces (see conftest.py for the fixtures built on them):

- CacheServer(kind, logdir): start / kill (SIGKILL) / restart on the same port,
  metrics() from its Prometheus `/metrics`, registered_instances() (kvd only).
- VllmProcess(settings, log_path): one vLLM process; start() (or launch() then
  wait_ready()), generate(), reset_prefix_cache(), metrics() (vLLM's own counters),
  close(). Settings are those of vllm_worker.py; vllm_settings() builds them for a block
  size and an optional connector.

Everything listens on 127.0.0.1 with free ports and per-process shared-memory names, so
several runs on one machine never collide.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests" / "integration"))
from kvd_harness import free_port, wait_until_answers  # noqa: E402

CHUNK = 256
PREFIX = "KVD-E2E "

# No network, no telemetry, no model hub: everything is local.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "LMCACHE_DISABLE_BANNER": "1",
    "LMCACHE_TRACK_USAGE": "false",
    "PYTHONWARNINGS": "ignore",
    "TOKENIZERS_PARALLELISM": "false",
}


def server_kind() -> str:
    kind = os.environ.get("KVD_E2E_SERVER", "kvd").strip().lower()
    if kind not in ("kvd", "lmcache"):
        raise ValueError(f"KVD_E2E_SERVER must be 'kvd' or 'lmcache', got {kind!r}")
    return kind


def kvd_bin() -> str:
    return os.environ.get("KVD_E2E_KVD_BIN", str(REPO_ROOT / "build" / "kvd"))


def parse_prometheus(text: str) -> dict[str, float]:
    """Sums every sample of a metric over its labels: {name: total}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if not m:
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + v
    return out


class CacheServer:
    """kvd or `lmcache server --supported-transfer-mode auto` on loopback."""

    def __init__(self, kind: str, logdir: Path, l1_size_gb: float = 0.5, chunk_size: int = CHUNK,
                 extra_args: list[str] | None = None) -> None:
        self.kind = kind
        self.logdir = Path(logdir)
        self.l1_size_gb = l1_size_gb
        self.chunk_size = chunk_size
        self.extra_args = list(extra_args or [])
        self.port = free_port()
        self.http_port = free_port(exclude={self.port})
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.shm_name = ""

    @property
    def log_path(self) -> Path:
        return self.logdir / f"{self.kind}-{self.port}-{self.starts}.log"

    def command(self) -> list[str]:
        self.shm_name = f"kvd_e2e_{os.getpid()}_{self.port}_{self.starts}"
        base = ["server", "--host", "127.0.0.1", "--port", str(self.port),
                "--l1-size-gb", repr(self.l1_size_gb), "--eviction-policy", "LRU",
                "--chunk-size", str(self.chunk_size), "--http-port", str(self.http_port),
                "--shm-name", self.shm_name]
        if self.kind == "kvd":
            return [kvd_bin(), *base, *self.extra_args]
        # The reference refuses a CPU vLLM's engine-driven registration with its default
        # (lmcache_driven); it advertises its SHM pool only with a non-lazy L1.
        lmcache = str(Path(sys.executable).parent / "lmcache")
        prom = free_port(exclude={self.port, self.http_port})
        return [lmcache, *base, "--supported-transfer-mode", "auto", "--no-l1-use-lazy",
                "--prometheus-port", str(prom), *self.extra_args]

    def start(self, timeout: float = 120.0) -> "CacheServer":
        cmd = self.command()
        if self.kind == "kvd" and not Path(cmd[0]).exists():
            raise FileNotFoundError(f"kvd binary not found at {cmd[0]} (make build)")
        self.logdir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, **OFFLINE_ENV)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        self.starts += 1
        try:
            wait_until_answers(f"tcp://127.0.0.1:{self.port}", timeout, self.proc)
            self._wait_http(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_http(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.metrics()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _signal(self, sig: int, wait: float) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def kill(self) -> None:
        """SIGKILL, as a crash would; removes the shared memory it could not."""
        self._signal(signal.SIGKILL, 10)
        for name in (self.shm_name, self.shm_name.lstrip("/")):
            try:
                os.unlink(f"/dev/shm/{name}")
            except (FileNotFoundError, IsADirectoryError):
                pass

    def stop(self) -> None:
        if self.alive():
            self._signal(signal.SIGTERM, 30)
        self.kill()

    def restart(self, timeout: float = 120.0) -> "CacheServer":
        """Starts again on the same ports (after kill() or stop())."""
        return self.start(timeout)

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics", timeout=10) as r:
            return parse_prometheus(r.read().decode())

    def registered_instances(self) -> int | None:
        """kvd's registered workers; None for the reference (it has no such gauge)."""
        if self.kind != "kvd":
            return None
        return int(self.metrics().get("kvd_registered_instances", 0))

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return ""


class ServerAt:
    """A cache server started elsewhere (try_*.py): all vllm_settings needs of one, its port."""

    def __init__(self, port: int) -> None:
        self.port = port


def vllm_settings(model: str, block_size: int, server: "CacheServer | ServerAt | None" = None,
                  mode: str = "lmcache_driven", heartbeat: float = 2.0,
                  connector_extra: dict | None = None, engine_args: dict | None = None,
                  kv_cache_memory_bytes: int = 64 << 20, max_model_len: int = 4096) -> dict:
    """Settings for vllm_worker.py: no connector when `server` is None."""
    s: dict = {"model": model, "block_size": block_size, "kv_cache_memory_bytes": kv_cache_memory_bytes,
               "max_model_len": max_model_len, "max_num_batched_tokens": max(4096, max_model_len),
               "connector": None, "engine_args": dict(engine_args or {})}
    if server is not None:
        s["connector"] = {"host": "127.0.0.1", "port": server.port, "mode": mode}
        # The adapters ping every `heartbeat` seconds and give up on a ping after as
        # long; a failed load is recomputed (vLLM's default, "fail", fails the request).
        s["connector_extra"] = {"lmcache.mp.heartbeat_interval": heartbeat,
                                "lmcache.mp.mq_timeout": 60.0, **(connector_extra or {})}
        s["kv_load_failure_policy"] = "recompute"
    return s


SHM_DIR = "/dev/shm"
# lmcache's client (CpuShmTensorWrapper) backs each registered CPU KV cache with a POSIX shared
# memory segment "/lmcache_kv_<pid>_<n>", created exclusively and unlinked when the tensor is
# freed. A worker that dies by SIGKILL leaves its segment behind, and a later worker that gets
# the same pid (pids wrap at 32768 on a busy host) then fails at start with "File exists".
_LMCACHE_SEGMENT = re.compile(r"lmcache_kv_(\d+)_\d+")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # PermissionError: alive, another user's
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def remove_stale_lmcache_segments(shm_dir: str = SHM_DIR) -> list[str]:
    """Removes the lmcache KV segments whose creating process is gone; returns their names.
    A live process's segment is never touched."""
    removed = []
    try:
        names = os.listdir(shm_dir)
    except FileNotFoundError:
        return removed
    for name in names:
        m = _LMCACHE_SEGMENT.fullmatch(name)
        if m and not _pid_alive(int(m.group(1))):
            try:
                os.unlink(os.path.join(shm_dir, name))
                removed.append(name)
            except FileNotFoundError:
                pass
    return sorted(removed)


class VllmError(RuntimeError):
    pass


class VllmProcess:
    """One vLLM (vllm_worker.py) process; use as a context manager."""

    def __init__(self, settings: dict, log_path: Path, python: str | None = None,
                 env: dict | None = None) -> None:
        self.settings = settings
        self.log_path = Path(log_path)
        self.python = python or sys.executable
        self.env = dict(os.environ, **OFFLINE_ENV, VLLM_HOST_IP="127.0.0.1", **(env or {}))
        self.proc: subprocess.Popen | None = None
        self._lines: queue.Queue = queue.Queue()
        self._t0 = 0.0
        self.startup_seconds = 0.0

    def __enter__(self) -> "VllmProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self, timeout: float = 600.0) -> "VllmProcess":
        return self.launch().wait_ready(timeout)

    def launch(self) -> "VllmProcess":
        """Starts the process and returns at once (wait_ready() waits for the engine): two
        vLLMs that need no cache server can load side by side."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_lmcache_segments()  # a dead worker's segment must not block a new one
        self._t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [self.python, str(HERE / "vllm_worker.py"), json.dumps(self.settings)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=self.env, start_new_session=True, cwd=str(self.log_path.parent))
        threading.Thread(target=self._pump, daemon=True).start()
        return self

    def wait_ready(self, timeout: float = 600.0) -> "VllmProcess":
        self._read(timeout)
        self.startup_seconds = time.monotonic() - self._t0
        return self

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with open(self.log_path, "w") as log:
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                if line.startswith(PREFIX):
                    self._lines.put(json.loads(line[len(PREFIX):]))
        self._lines.put(None)

    def _read(self, timeout: float) -> dict:
        try:
            r = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise VllmError(f"vLLM did not answer within {timeout}s\n{self.log_tail()}") from None
        if r is None:
            raise VllmError(f"vLLM exited (code {self.proc.poll()})\n{self.log_tail()}")
        if "error" in r:
            raise VllmError(r["error"] + "\n" + r.get("traceback", ""))
        return r

    def call(self, cmd: dict, timeout: float = 300.0) -> dict:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read(timeout)

    def generate(self, prompts: list[list[int]], max_tokens: int = 8) -> tuple[list[list[int]], list[int]]:
        r = self.call({"op": "generate", "prompts": prompts, "max_tokens": max_tokens})
        return r["outputs"], r["num_cached_tokens"]

    def reset_prefix_cache(self, timeout: float = 120.0) -> None:
        """vLLM refuses while blocks are held, e.g. by a finished request whose store the
        server has not completed yet: retried until it succeeds."""
        deadline = time.monotonic() + timeout
        while not self.call({"op": "reset_prefix_cache"})["ok"]:
            if time.monotonic() > deadline:
                raise VllmError(f"reset_prefix_cache refused for {timeout}s")
            time.sleep(0.5)

    def metrics(self) -> dict[str, float]:
        return self.call({"op": "metrics"})["metrics"]

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self.call({"op": "exit"}, timeout=60)
            except (VllmError, OSError, BrokenPipeError):
                pass
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        # The engine core and worker are in the same process group.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(timeout=30)
        self.proc = None
        remove_stale_lmcache_segments()  # what the SIGKILL left behind

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return "\n".join(ln[:300] for ln in lines[-n:])
