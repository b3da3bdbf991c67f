"""Helpers for the tier tests: real Debian redis-server processes (standalone and a
3-master cluster) on free loopback ports, started and stopped by the tests, and a
store / lookup / retrieve round trip through the real lmcache client."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from kvd_harness import TPCluster, free_port, unique_tokens

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


def require_redis() -> None:
    if not (os.access(REDIS_SERVER, os.X_OK) and os.access(REDIS_CLI, os.X_OK)):
        pytest.fail("redis-server is not installed: run scripts/install-deps.sh")


def _bus_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port + 10000))
            return True
        except OSError:
            return False


class Redis:
    """One redis-server on 127.0.0.1:<port>, data in a temporary directory."""

    def __init__(self, cluster: bool = False, port: int | None = None,
                 password: str | None = None) -> None:
        require_redis()
        self.cluster = cluster
        self.password = password  # requirepass (the default user's password)
        while port is None:
            p = free_port()
            if not cluster or (p < 55000 and _bus_free(p)):
                port = p
        self.port = port
        self.dir = tempfile.mkdtemp(prefix="kvd-redis-")
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Redis":
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", self.dir, "--protected-mode", "no",
                "--loglevel", "warning", "--logfile", os.path.join(self.dir, "redis.log")]
        if self.password:
            args += ["--requirepass", self.password]
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file",
                     os.path.join(self.dir, "nodes.conf"), "--cluster-node-timeout", "2000",
                     "--cluster-require-full-coverage", "no"]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.cli("PING").strip() == "PONG":
                return self
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on {self.port} did not start")

    def cli(self, *args: str) -> str:
        auth = ["--no-auth-warning", "-a", self.password] if self.password else []
        r = subprocess.run([REDIS_CLI, "-p", str(self.port), *auth, *args], capture_output=True,
                           text=True, timeout=20)
        return r.stdout

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def keys(self, pattern: str = "*") -> list[str]:
        """The object keys (not the checksums kvd keeps beside its objects, '*.kvdsum')."""
        return [k for k in self.cli("--scan", "--pattern", pattern).splitlines()
                if k and not k.endswith(".kvdsum")]

    def sum_keys(self) -> list[str]:
        return [k for k in self.cli("--scan", "--pattern", "*.kvdsum").splitlines() if k]


class RedisCluster:
    def __init__(self) -> None:
        self.nodes = [Redis(cluster=True) for _ in range(3)]

    def start(self) -> "RedisCluster":
        for n in self.nodes:
            n.start()
        r = subprocess.run([REDIS_CLI, "--cluster", "create",
                            *[f"127.0.0.1:{n.port}" for n in self.nodes],
                            "--cluster-replicas", "0", "--cluster-yes"],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError("redis-cli --cluster create failed: " + r.stdout + r.stderr)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all("cluster_state:ok" in n.cli("CLUSTER", "INFO") for n in self.nodes):
                return self
            time.sleep(0.05)
        raise RuntimeError("cluster did not reach cluster_state:ok")

    @property
    def startup_nodes(self) -> str:
        return ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def keys(self) -> list[str]:
        out: list[str] = []
        for n in self.nodes:
            out += n.keys()
        return out

    def close(self) -> None:
        for n in self.nodes:
            n.close()

    def slot_owner(self, key: str) -> int:
        """The port of the master that owns `key`'s hash slot, by the cluster's own count
        (CLUSTER KEYSLOT) and each master's own slot ranges (its 'myself' line)."""
        slot = int(self.nodes[0].cli("CLUSTER", "KEYSLOT", key).strip())
        for n in self.nodes:
            mine = next(l for l in n.cli("CLUSTER", "NODES").splitlines() if "myself" in l)
            for r in mine.split()[8:]:
                lo, _, hi = r.partition("-")
                if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                    return n.port
        raise AssertionError(f"no master owns slot {slot} of {key}")

    def assert_keys_on_their_slot_owners(self) -> dict[int, list[str]]:
        """Every object is on the master that owns its slot; returns the keys per port.
        (Which masters hold objects depends on the keys' hashes: a few keys can all fall on
        one master, so a test asserts where each key is, not how many masters got one.)"""
        per_node = {n.port: n.keys() for n in self.nodes}
        for port, ks in per_node.items():
            for k in ks:
                assert self.slot_owner(k) == port, (k, port, per_node)
        return per_node


def metric(text: str, name: str, **labels) -> float:
    """The sum of `name`'s samples in Prometheus text whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head != name and not head.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def wait_until(pred, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Prompt:
    """A prompt of `chunks` full chunks with random KV on every rank of a cluster."""

    def __init__(self, cluster: TPCluster, chunks: int, seed: int) -> None:
        self.tokens = unique_tokens(chunks * cluster.chunk_size)
        self.blocks = list(range(1, 1 + chunks * cluster.blocks_per_chunk))
        self.chunks = chunks
        self.seed = seed

    def store(self, cluster: TPCluster, request_id: str) -> None:
        for r in range(cluster.tp):
            cluster.fill_random(r, self.blocks, seed=self.seed + r)
        self.snapshot = [cluster.snapshot_blocks(r, self.blocks) for r in range(cluster.tp)]
        assert cluster.store(request_id, self.tokens, self.blocks) == [True] * cluster.tp
        cluster.end_session(request_id)

    def check_retrieve(self, cluster: TPCluster, request_id: str, chunks: int | None = None) -> int:
        """Lookup, then retrieve what hit into zeroed blocks; asserts byte-exact. Returns
        the hit chunk count."""
        import torch  # noqa: PLC0415

        hit = cluster.lookup(request_id, self.tokens)
        n = hit // cluster.chunk_size
        if chunks is not None:
            assert n == chunks, f"lookup hit {n} chunks, expected {chunks}"
        if n == 0:
            cluster.end_session(request_id)
            return 0
        for r in range(cluster.tp):
            cluster.zero_blocks(r, self.blocks)
        assert cluster.retrieve(request_id, self.tokens, self.blocks, end=hit) == [True] * cluster.tp
        bpc = cluster.blocks_per_chunk
        for r in range(cluster.tp):
            got = cluster.snapshot_blocks(r, self.blocks[: n * bpc])
            want = [t[:, : n * bpc] for t in self.snapshot[r]]
            for a, b in zip(got, want):
                assert torch.equal(a, b), f"rank {r}: retrieved bytes differ"
        cluster.end_session(request_id)
        return n
