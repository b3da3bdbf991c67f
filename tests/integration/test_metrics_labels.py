"""lmcache's labels on kvd's /metrics (docs/metrics.md), driven by the real lmcache 0.5.6 client.

1. The same traffic (two models, each with an empty and a non-empty cache_salt; stores,
   lookups, retrieves, a prompt under one chunk, a lookup of a model no worker registered)
   goes to kvd and to the real `lmcache server`; the labelled lookup series
   (`lmcache_mp_lookup*{cache_salt,model_name}`, early exits by reason) and the transfer
   counters (`lmcache_mp_num_*{device}`) must carry the same label sets and values on both,
   and the copy-throughput histograms the same label names, buckets and sample counts.
2. kvd only: beyond --metrics-max-label-sets the pairs are counted under
   {model_name="__other__",cache_salt="__other__"} and the refused pairs in
   kvd_metric_label_sets_refused_total; POST /metrics/reset zeroes the labelled counters.
"""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

import pytest

import kvd_harness as H

CHUNK = H.CHUNK_SIZE
MODELS = ("metrics-model-a", "org/metrics-model-b")
SALTS = ("", 'tenant "x"')
UNREGISTERED = "metrics-model-none"
# Families compared value for value between the two servers.
COMPARED = re.compile(r"^lmcache_mp_(lookup|num_(submitted|finished)_)")
THROUGHPUT = re.compile(r"^lmcache_mp_l0_l1_(store|load)_throughput_GB_per_second_(bucket|count)$")


def parse(text: str) -> dict[tuple[str, tuple], float]:
    """(name, sorted label pairs) -> value of every sample line."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, rest = head.partition("{")
        labels = tuple(sorted(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', rest)))
        out[(name, labels)] = float(value)
    return out


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return parse(r.read().decode())


def total(m: dict, name: str) -> float:
    return sum(v for (n, _), v in m.items() if n == name)


def start(kind: str, tmp: Path, extra=()) -> tuple[H.ServerProc, int]:
    http = H.free_port()
    srv = H.ServerProc(kind=kind, port=H.free_port(), l1_size_gb=0.1, log_path=tmp / f"{kind}.log",
                       extra_args=["--http-host", "127.0.0.1", "--http-port", str(http), *extra])
    srv.start()
    deadline = time.monotonic() + 60
    while True:  # the reference's HTTP API comes up after its ZMQ port
        try:
            scrape(http)
            return srv, http
        except OSError:
            if time.monotonic() > deadline:
                srv.stop()
                raise
            time.sleep(0.2)


def scheduler(url: str, model: str):
    """A scheduler adapter alone (no worker registers `model`)."""
    import zmq
    from lmcache.integration.vllm.vllm_multi_process_adapter import (
        LMCacheMPSchedulerAdapter,
        ParallelStrategy,
    )

    return LMCacheMPSchedulerAdapter(
        server_urls=[url], context=zmq.Context.instance(), model_name=model,
        vllm_block_size=H.BLOCK_SIZE,
        parallel_strategy=ParallelStrategy(mla_only=False, vllm_world_size=1, vllm_worker_id=0,
                                           tp_size=1, pp_size=1, n_servers=1),
        extra_config={"lmcache.mp.mq_timeout": 30.0})


def lookup(s, rid: str, tokens: list[int], salt: str) -> int:
    s.maybe_submit_lookup_request(rid, list(tokens), cache_salt=salt)
    deadline = time.monotonic() + 30
    while (res := s.check_lookup_result(rid)) is None:
        assert time.monotonic() < deadline, f"lookup {rid} did not finish"
        time.sleep(0.005)
    return int(res)


def transfer(c: H.TPCluster, rid: str, tokens: list[int], blocks: list[int], end: int, salt: str,
             store: bool) -> None:
    op = c._op(tokens, blocks, 0, end)
    for w in c.workers:
        ev = w.create_recorded_event()
        submit = w.batched_submit_store_requests if store else w.batched_submit_retrieve_requests
        submit([rid], [op], ev, cache_salts=[salt])
    for w in c.workers:
        fut = w.store_futures[rid] if store else w.retrieve_futures[rid][0]
        assert fut.result(timeout=30), f"{'store' if store else 'retrieve'} {rid}"
        w.get_finished({rid} if store else set())


def traffic(url: str, http: int) -> None:
    """Per model (TP 2, CPU workers) and salt: store 2 chunks, look up a 3-chunk prompt (2 hit),
    retrieve the hit; per model a prompt under one chunk; then a model nobody registered."""
    written = 0
    for model in MODELS:
        c = H.TPCluster(url, "lmcache_driven", model, tp=2)
        try:
            bpc = c.blocks_per_chunk
            tokens = H.unique_tokens(3 * CHUNK + 5)
            for i, salt in enumerate(SALTS):
                rid = f"{model}-{i}"
                transfer(c, rid + "-s", tokens, list(range(3 * bpc)), 2 * CHUNK, salt, store=True)
                # lmcache commits stores after answering them: wait until the objects are in.
                written += 2 * c.tp
                deadline = time.monotonic() + 10
                while total(scrape(http), "lmcache_mp_l1_write_chunks_total") < written:
                    assert time.monotonic() < deadline, "stored chunks never became visible"
                    time.sleep(0.02)
                assert lookup(c.scheduler, rid, tokens, salt) == 2 * CHUNK
                transfer(c, rid, tokens, list(range(64, 64 + 2 * bpc)), 2 * CHUNK, salt, store=False)
                c.end_session(rid)
            assert lookup(c.scheduler, f"{model}-short", H.unique_tokens(100), "") == 0
        finally:
            c.close()
    s = scheduler(url, UNREGISTERED)
    try:
        assert lookup(s, "none", H.unique_tokens(2 * CHUNK), "t") == 0
    finally:
        s.shutdown()


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    if H.server_kind() != "kvd":
        pytest.skip("compares kvd with the reference")
    tmp = tmp_path_factory.mktemp("metrics-labels")
    out = {}
    for kind in ("kvd", "lmcache"):
        srv, http = start(kind, tmp)
        try:
            traffic(srv.url, http)
            # lmcache counts a transfer finished from its copy stream, after answering it.
            deadline = time.monotonic() + 10
            while True:
                m = scrape(http)
                if all(total(m, f"lmcache_mp_num_finished_{x}_total") ==
                       total(m, f"lmcache_mp_num_submitted_{x}_total") for x in ("stores", "retrieves")):
                    break
                assert time.monotonic() < deadline, "transfers never finished"
                time.sleep(0.05)
            out[kind] = m
        finally:
            srv.stop()
    return out


def test_lookup_and_transfer_series_match_the_reference(both):
    kvd = {k: v for k, v in both["kvd"].items() if COMPARED.match(k[0])}
    ref = {k: v for k, v in both["lmcache"].items() if COMPARED.match(k[0])}
    # The reference exports these families; kvd must have every one of its label sets, with
    # the same values (kvd's extra early-exit reason never occurs here).
    assert set(kvd) == set(ref), (sorted(set(kvd) ^ set(ref)))
    diff = {k: (kvd[k], ref[k]) for k in kvd if kvd[k] != ref[k]}
    assert not diff, diff
    # What the traffic implies, so that both servers being wrong the same way fails too.
    a = (("cache_salt", ""), ("model_name", MODELS[0]))
    salted = (("cache_salt", 'tenant \\"x\\"'), ("model_name", MODELS[1]))
    assert kvd[("lmcache_mp_lookups_requests_total", a)] == 2
    assert kvd[("lmcache_mp_lookup_requested_tokens_total", a)] == 3 * CHUNK
    assert kvd[("lmcache_mp_lookup_hit_tokens_total", salted)] == 2 * CHUNK
    assert kvd[("lmcache_mp_lookup_hit_l1_keys_total", salted)] == 4  # 2 chunks x 2 ranks
    assert kvd[("lmcache_mp_lookup_early_exit_requests_total", a + (("reason", "empty_chunk_hashes"),))] == 1
    none = (("cache_salt", "t"), ("model_name", UNREGISTERED), ("reason", "no_gpu_context"))
    assert kvd[("lmcache_mp_lookup_early_exit_requests_total", none)] == 1
    assert kvd[("lmcache_mp_num_finished_stores_total", (("device", "cpu"),))] == 8
    assert kvd[("lmcache_mp_num_submitted_retrieves_total", (("device", "cpu"),))] == 8


def test_throughput_histograms_have_the_references_shape(both):
    def shape(m):
        """(series, labels but engine_id) -> summed value: instance ids differ per run."""
        out = {}
        for (n, labels), v in m.items():
            if THROUGHPUT.match(n):
                key = (n, tuple(kv for kv in labels if kv[0] != "engine_id"))
                out[key] = out.get(key, 0) + (v if n.endswith("_count") else 1)
        return out

    kvd, ref = shape(both["kvd"]), shape(both["lmcache"])
    assert set(kvd) == set(ref), sorted(set(kvd) ^ set(ref))
    counts = {k: v for k, v in kvd.items() if k[0].endswith("_count")}
    assert counts == {k: v for k, v in ref.items() if k[0].endswith("_count")}
    # One sample per rank and copy: 2 salts x 2 ranks per model and direction.
    assert sorted(counts.values()) == [4.0] * 4
    les = {dict(k[1])["le"] for k in kvd if k[0].endswith("_bucket")}
    assert les == {"0.0", "5.0", "10.0", "25.0", "50.0", "75.0", "100.0", "250.0", "500.0",
                   "750.0", "1000.0", "2500.0", "5000.0", "7500.0", "10000.0", "+Inf"}


def test_pairs_beyond_the_cap_go_to_other_and_reset_zeroes_the_series(tmp_path):
    if H.server_kind() != "kvd":
        pytest.skip("kvd-specific")
    srv, http = start("kvd", tmp_path, extra=["--metrics-max-label-sets", "2"])
    try:
        s = scheduler(srv.url, UNREGISTERED)
        try:
            for i, salt in enumerate(["a", "b", "c", "d", "c"]):
                lookup(s, f"cap-{i}", H.unique_tokens(CHUNK), salt)
        finally:
            s.shutdown()
        m = scrape(http)
        name = "lmcache_mp_lookups_requests_total"
        kept = {dict(k[1])["cache_salt"]: v for k, v in m.items() if k[0] == name}
        assert kept == {"a": 1, "b": 1, "__other__": 3}, kept
        other = (("cache_salt", "__other__"), ("model_name", "__other__"))
        assert m[(name, other)] == 3
        assert m[("kvd_metric_label_sets", (("family", "lookup"),))] == 2
        assert m[("kvd_metric_label_sets_refused_total", (("family", "lookup"),))] == 2  # c, d

        req = urllib.request.Request(f"http://127.0.0.1:{http}/metrics/reset", method="POST", data=b"")
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200
        m = scrape(http)
        assert all(v == 0 for (n, _), v in m.items() if n.startswith("lmcache_mp_lookup")), \
            {k: v for k, v in m.items() if k[0].startswith("lmcache_mp_lookup") and v}
        assert m[("kvd_metric_label_sets_refused_total", (("family", "lookup"),))] == 0
        assert m[("kvd_metric_label_sets", (("family", "lookup"),))] == 2  # a gauge: kept
    finally:
        srv.stop()
