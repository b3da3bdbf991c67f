"""P2P with a real vLLM (docs/p2p.md): two kvd servers on one Debian redis-server as the fleet
directory, UCX over TCP on loopback. A vLLM on kvd A computes a prompt (cold); then a vLLM on
kvd B, which never saw it, serves the same prompt: its connector gets external hits (B loaded
A's chunks over UCX) and its output is token-identical to A's, which was computed from scratch.

kvd only: `lmcache server` cannot be the peer (NIXL is not UCX's wire).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import tempfile
import time

import pytest

from e2e_harness import CHUNK, VllmProcess, free_port, vllm_settings

PROMPT_LEN = 1000
MAX_TOKENS = 8
FULL_HIT = 3 * CHUNK  # 768: three full chunks of a 1000-token prompt


class Redis:
    """Debian's redis-server on a free loopback port, data in a temporary directory."""

    def __init__(self) -> None:
        server = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not os.access(server, os.X_OK):
            pytest.fail("redis-server is not installed: run scripts/install-deps.sh")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="kvd-e2e-redis-")
        self.proc = subprocess.Popen(
            [server, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--protected-mode", "no"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cli = shutil.which("redis-cli") or "/usr/bin/redis-cli"
        deadline = time.monotonic() + 20
        while subprocess.run([cli, "-p", str(self.port), "PING"], capture_output=True,
                             text=True).stdout.strip() != "PONG":
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def _prompt() -> list[int]:
    rng = random.Random(28)
    return [rng.randrange(3, 2000) for _ in range(PROMPT_LEN)]


@pytest.mark.parametrize("mode", ["lmcache_driven", "engine_driven"])
def test_vllm_on_b_gets_external_hits_from_what_a_vllm_on_a_computed(
        mode, server_kind, model_dir, start_server, logdir, tmp_path):
    if server_kind != "kvd":
        pytest.skip("P2P between servers is kvd's (lmcache 0.5.6 uses NIXL)")
    redis = Redis()
    secret = tmp_path / "secret"
    secret.write_text("e2e-fleet\n")
    secret.chmod(0o600)

    def p2p_args() -> list[str]:
        return ["--p2p-advertise-url", f"127.0.0.1:{free_port()}",
                "--p2p-directory", f"redis://127.0.0.1:{redis.port}",
                "--p2p-secret-file", str(secret), "--p2p-ucx-tls", "tcp"]

    pa = pb = None
    try:
        a = start_server(extra_args=p2p_args())
        b = start_server(extra_args=p2p_args())
        prompt = _prompt()
        # Both vLLMs load at once (B asks for the prompt only once A stored it). Their
        # adapters' pings get 10 s: a ping waiting for a core while the other loads must not
        # mark a server unhealthy.
        pa = VllmProcess(vllm_settings(model_dir, 128, a, mode, heartbeat=10.0),
                         logdir / f"vllm-p2p-a-{mode}.log").launch()
        pb = VllmProcess(vllm_settings(model_dir, 128, b, mode, heartbeat=10.0),
                         logdir / f"vllm-p2p-b-{mode}.log").launch()
        out_a, cached_a = pa.wait_ready().generate([prompt], MAX_TOKENS)
        assert cached_a == [0]
        # A stored the prompt's three chunks (the store is asynchronous).
        deadline = time.monotonic() + 30
        while a.metrics().get("lmcache_mp_l1_write_chunks_total", 0) < 3:
            assert time.monotonic() < deadline, "kvd A did not store the prompt"
            time.sleep(0.2)
        pa.close()

        v0 = pb.wait_ready().metrics()
        out_b, cached_b = pb.generate([prompt], MAX_TOKENS)
        v1 = pb.metrics()
        pb.close()
        external = v1.get("vllm:external_prefix_cache_hits", 0) - v0.get(
            "vllm:external_prefix_cache_hits", 0)
        assert (cached_b[0], external) == (FULL_HIT, FULL_HIT), (cached_b, external)
        # A computed every token (nothing cached): B's output from A's KV must be the same.
        assert out_b == out_a, (out_a, out_b)
        # B loaded them from its peer tier, its only tier (every object of the three chunks).
        assert b.metrics().get("kvd_l2_loaded_objects_total", 0) >= 3, b.metrics()
    finally:
        for p in (pa, pb):
            if p is not None:
                p.close()
        redis.close()
