"""Operating kvd: HTTP endpoints, metrics, the dashboard in a real browser, worker
liveness across a server restart, clean shutdown, stale shared memory, and logs.

Run:  /tmp/lmvenv/bin/python -m pytest tests/integration/test_operations.py -q
Needs build/kvd (or KVD_TEST_KVD_BIN). Tests that drive the real lmcache 0.5.6 client
skip when it is not importable; the dashboard test skips when chromium is absent.
Set KVD_OPS_SCREENSHOT_DIR to keep the dashboard screenshot.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ops_fixtures as F  # noqa: E402

needs_lmcache = pytest.mark.skipif(F.lmcache_available() is not None,
                                   reason=str(F.lmcache_available()))


@pytest.fixture
def make_kvd(tmp_path):
    """Factory for kvd processes; every one is stopped and its segment removed after."""
    made: list[F.Kvd] = []

    def make(**kw) -> F.Kvd:
        k = F.Kvd(log_path=tmp_path / f"kvd{len(made)}.log", **kw)
        made.append(k)
        return k

    yield make
    for k in made:
        k.cleanup()


@pytest.fixture
def kvd(make_kvd):
    return make_kvd().start()


def wait_for(pred, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------------------
# Endpoints
# ---------------------------------------------------------------------------


def test_endpoints_answer_with_the_documented_shapes(kvd):
    assert kvd.get_json("/healthcheck") == {"status": "healthy"}
    assert kvd.get_json("/version").startswith("kvd-")  # lmcache's shape: a JSON string
    v = kvd.get_json("/api/version")
    assert v["name"] == "kvd" and v["version"] and v["lmcache_protocol"] == "0.5.6"
    conf = kvd.get_json("/conf")
    assert conf["zmq"]["port"] == kvd.port
    assert conf["http"]["http_port"] == kvd.http_port
    assert conf["l1"]["shm_name"] == kvd.shm_name
    assert conf["l1"]["eviction_policy"] == "LRU"
    assert conf["workers"]["worker_reap_timeout_seconds"] == 120
    assert kvd.get_json("/config") == conf  # LMCache's path
    st = kvd.get_json("/status")
    assert st["is_healthy"] is True
    assert st["l1"]["total_bytes"] > 0 and st["l1"]["used_bytes"] == 0
    assert st["instances"] == [] and st["sessions"] == 0
    status, ctype, body = kvd.get("/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    assert "# TYPE lmcache_mp_l1_usage_ratio gauge" in body
    status, ctype, body = kvd.get("/dashboard")
    assert status == 200 and ctype.startswith("text/html") and "<canvas" in body
    assert kvd.get_json("/") == {"status": "ok", "service": "LMCache HTTP API"}  # not a browser
    status, _, body = kvd.get("/nope")
    assert status == 404 and "nope" in json.loads(body)["error"]
    ts = kvd.get_json("/api/timeseries")
    assert len(ts["t"]) >= 1 and ts["interval_seconds"] == 1.0


def test_raw_requests_are_counted_per_op(kvd):
    replies = F.raw_requests(kvd.url, [F.OP_NOOP] * 5 + [F.OP_GET_CHUNK_SIZE] * 3 + [F.OP_PING])
    assert replies[:5] == ["OK"] * 5 and replies[5] == 256 and replies[-1] is True
    _, _, text = kvd.get("/metrics")
    assert F.metric(text, 'kvd_requests_total{op="get_chunk_size"}') == 3
    # The healthcheck probe itself sends NOOPs through the loop: at least ours.
    assert F.metric(text, 'kvd_requests_total{op="noop"}') >= 5
    assert F.metric(text, 'kvd_request_duration_seconds_count{op="get_chunk_size"}') == 3
    assert F.metric(text, 'kvd_request_duration_seconds_bucket{op="get_chunk_size",le="+Inf"}') == 3
    ops = kvd.get_json("/status")["ops"]
    assert ops["get_chunk_size"]["requests"] == 3 and ops["ping"]["requests"] == 1


def test_disable_metrics_answers_404_and_the_rest_works(make_kvd):
    k = make_kvd(extra=["--disable-metrics"]).start()
    assert k.get("/metrics")[0] == 404
    assert k.get_json("/healthcheck") == {"status": "healthy"}
    assert k.get_json("/conf")["http"]["metrics_enabled"] is False


def test_http_port_zero_runs_without_http(make_kvd, tmp_path):
    k = make_kvd(http_port=0)
    k.spawn()
    F.raw_requests(k.url, [F.OP_NOOP])  # ZMQ serves
    assert "HTTP disabled" in k.log()
    assert k.stop() == 0


def test_http_port_in_use_fails_startup_with_one_clear_line(make_kvd):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        taken = s.getsockname()[1]
        k = make_kvd(http_port=taken)
        k.spawn()
        rc = k.wait(timeout=15)
    assert rc == 1
    errors = [ln for ln in k.log().splitlines() if "[error]" in ln]
    assert len(errors) == 1, k.log()
    assert f"127.0.0.1:{taken}" in errors[0] and "address already in use" in errors[0]
    assert "--http-port" in errors[0]
    assert not k.shm_path.exists(), "a failed start must not leave its L1 segment"


@needs_lmcache
def test_status_and_metrics_follow_real_client_traffic(kvd):
    w = F.OneWorker(kvd.url, model="ops-status")
    try:
        st = kvd.get_json("/status")
        assert len(st["instances"]) == 1
        inst = st["instances"][0]
        assert inst["model_name"] == "ops-status" and inst["world_size"] == 1
        assert inst["mode"] == "lmcache_driven"
        assert "bfloat16" in inst["layout"] and "group" in inst["layout"]
        chunk = w.chunk_size
        # bytes of one chunk object: layers x K/V x tokens x heads x head_size x 2 bytes
        assert inst["object_bytes_per_chunk"] == F.OneWorker.NUM_LAYERS * 2 * chunk * 2 * 64 * 2

        tokens = F.fresh_tokens(3 * chunk)
        bpc = chunk // F.OneWorker.BLOCK_SIZE
        assert w.store("s1", tokens, list(range(3 * bpc)))
        assert w.lookup("l1", tokens) == 3 * chunk
        assert w.retrieve("l1", tokens, list(range(3 * bpc, 6 * bpc)), end=3 * chunk)
        assert w.blocks_equal(list(range(3 * bpc)), list(range(3 * bpc, 6 * bpc)))
        assert w.lookup("l2", F.fresh_tokens(2 * chunk)) == 0

        st = kvd.get_json("/status")
        assert st["l1"]["entries"] == 3
        assert st["l1"]["used_bytes"] >= 3 * inst["object_bytes_per_chunk"]
        c = st["counters"]
        assert c["lookup_tokens"] == 5 * chunk and c["hit_tokens"] == 3 * chunk
        assert c["stored_chunks"] == 3 and c["retrieved_chunks"] == 3

        _, _, text = kvd.get("/metrics")
        m = lambda name: F.metric(text, name)  # noqa: E731
        # lmcache's labels: (model_name, cache_salt) on lookups, device on transfers.
        labels = '{cache_salt="",model_name="ops-status"}'
        assert m("lmcache_mp_lookups_requests_total" + labels) == 2
        assert m("lmcache_mp_lookup_requested_tokens_total" + labels) == 5 * chunk
        assert m("lmcache_mp_lookup_hit_tokens_total" + labels) == 3 * chunk
        assert m('lmcache_mp_num_finished_stores_total{device="cpu"}') == 1
        assert m('lmcache_mp_num_finished_retrieves_total{device="cpu"}') == 1
        assert m("lmcache_mp_l1_write_chunks_total") == 3
        assert m("lmcache_mp_l1_read_chunks_total") == 3
        assert m("kvd_stored_bytes_total") == 3 * inst["object_bytes_per_chunk"]
        assert m("kvd_retrieved_bytes_total") == 3 * inst["object_bytes_per_chunk"]
        assert m("lmcache_mp_l1_memory_usage_bytes") == st["l1"]["used_bytes"]
        assert 0 < m("lmcache_mp_l1_usage_ratio") < 1
        assert m("kvd_registered_instances") == 1
        assert m('kvd_requests_total{op="store"}') == 1
        assert m('kvd_requests_total{op="register_kv_cache"}') == 1
        # Where a transfer's server time went: each phase once per request, and the phases
        # up to the copy within the request's duration (reply comes after it).
        for op in ("store", "retrieve"):
            inside = 0.0
            for phase in ("queue", "decode", "hash", "index", "copy"):
                assert m(f'kvd_request_phase_seconds_count{{op="{op}",phase="{phase}"}}') == 1, \
                    (op, phase)
                inside += m(f'kvd_request_phase_seconds_sum{{op="{op}",phase="{phase}"}}')
            assert 0 < inside <= m(f'kvd_request_duration_seconds_sum{{op="{op}"}}') + 1e-6, op
            wait_for(lambda: F.metric(kvd.get("/metrics")[2],
                                      f'kvd_request_phase_seconds_count{{op="{op}",phase="reply"}}')
                     == 1, 5, f"the reply phase of {op}")

        # POST /clear-cache drops everything: the prompt misses afterwards.
        status, _, body = F.http("POST", kvd.base + "/clear-cache")
        assert status == 200 and json.loads(body)["cleared_entries"] == 3
        assert kvd.get_json("/status")["l1"]["entries"] == 0
        assert w.lookup("l3", tokens) == 0
    finally:
        w.close()
    wait_for(lambda: kvd.get_json("/status")["instances"] == [], 10, "the worker to unregister")


# ---------------------------------------------------------------------------
# Dashboard in a real headless browser
# ---------------------------------------------------------------------------


def run_chromium(args: list[str], tmp_path: Path, timeout: float = 90) -> subprocess.CompletedProcess:
    exe = F.chromium_binary()
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--no-default-browser-check", "--disable-extensions",
           "--hide-scrollbars", f"--user-data-dir={tmp_path / 'chromium-profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(F.chromium_binary() is None,
                    reason="chromium not installed (apt-get install chromium; "
                           "scripts/install-deps.sh installs it)")
@needs_lmcache
def test_dashboard_shows_live_values_in_headless_chromium(kvd, tmp_path):
    w = F.OneWorker(kvd.url, model="ops-dashboard")
    stop = threading.Event()
    errors: list[BaseException] = []

    def traffic():
        chunk = w.chunk_size
        bpc = chunk // F.OneWorker.BLOCK_SIZE
        i = 0
        try:
            while not stop.is_set():
                tokens = F.fresh_tokens(2 * chunk)
                w.store(f"d{i}", tokens, list(range(2 * bpc)))
                w.lookup(f"q{i}", tokens if i % 3 else F.fresh_tokens(2 * chunk))
                if i % 3:
                    w.retrieve(f"q{i}", tokens, list(range(2 * bpc, 4 * bpc)), end=2 * chunk)
                w.end_session(f"q{i}")
                i += 1
                time.sleep(0.05)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=traffic, daemon=True)
    t.start()
    try:
        time.sleep(4)  # a few 1-second samples with traffic in them
        dom = run_chromium(["--virtual-time-budget=6000", "--dump-dom", kvd.base + "/"], tmp_path)
        shot = tmp_path / "dashboard.png"
        run_chromium(["--virtual-time-budget=6000", "--window-size=1600,1250",
                      f"--screenshot={shot}", kvd.base + "/"], tmp_path)
    finally:
        stop.set()
        t.join(timeout=30)
        w.close()
    assert not errors, errors
    html = dom.stdout
    assert 'data-live="1"' in html, f"the page never rendered live data:\n{dom.stderr[-2000:]}"
    m = re.search(r'id="total-requests">([^<]*)<', html)
    assert m and m.group(1) not in ("", "0"), m and m.group(0)
    assert re.search(r'id="instance-count">1<', html)
    assert "ops-dashboard" in html  # the instances table
    assert "lmcache-driven" in html
    assert re.search(r'id="l1-pct">\d', html)
    ops_table = re.search(r'<table id="ops">.*?</table>', html, re.S).group(0)
    assert "<td>store</td>" in ops_table and "<td>lookup</td>" in ops_table, ops_table
    assert shot.exists() and shot.stat().st_size > 20_000
    keep = os.environ.get("KVD_OPS_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / "dashboard.png")


# ---------------------------------------------------------------------------
# Worker liveness across a server restart (real client)
# ---------------------------------------------------------------------------


@needs_lmcache
def test_client_reregisters_after_server_restart_and_works_again(make_kvd):
    first = make_kvd().start()
    w = F.OneWorker(first.url, model="ops-restart", heartbeat_interval=1.0, mq_timeout=5.0)
    try:
        chunk = w.chunk_size
        bpc = chunk // F.OneWorker.BLOCK_SIZE
        assert w.store("before", F.fresh_tokens(chunk), list(range(bpc)))  # starts the heartbeat
        assert first.stop() == 0

        wait_for(lambda: not w.worker.is_healthy, 15, "the client to notice the server is gone")
        second = make_kvd(port=first.port, http_port=first.http_port, shm_name=first.shm_name)
        second.start()
        # The heartbeat's recovery callback re-registers the KV caches.
        insts = wait_for(lambda: second.get_json("/status")["instances"], 20,
                         "the worker to re-register with the restarted server")
        assert insts[0]["model_name"] == "ops-restart"
        wait_for(lambda: w.worker.is_healthy, 10, "the client to report healthy again")

        tokens = F.fresh_tokens(2 * chunk)
        assert w.store("after", tokens, list(range(2 * bpc)))
        assert w.lookup("after-l", tokens) == 2 * chunk
        assert w.retrieve("after-l", tokens, list(range(2 * bpc, 4 * bpc)), end=2 * chunk)
        assert w.blocks_equal(list(range(2 * bpc)), list(range(2 * bpc, 4 * bpc)))
        assert "registered instance" in second.log()
        second_pinged = wait_for(
            lambda: second.get_json("/status")["instances"][0]["pinged"], 5,
            "a PING from the re-registered worker")
        assert second_pinged
    finally:
        w.close()


# ---------------------------------------------------------------------------
# Shutdown and shared memory
# ---------------------------------------------------------------------------


@needs_lmcache
def test_sigterm_with_a_registered_worker_exits_0_and_removes_the_segment(kvd):
    w = F.OneWorker(kvd.url, model="ops-term", mq_timeout=5.0)
    try:
        chunk = w.chunk_size
        bpc = chunk // F.OneWorker.BLOCK_SIZE
        assert w.store("t0", F.fresh_tokens(2 * chunk), list(range(2 * bpc)))
        assert kvd.shm_path.exists()
        # A burst of stores, then SIGTERM while they are being served.
        from lmcache.integration.vllm.vllm_multi_process_adapter import LoadStoreOp  # noqa: PLC0415

        rids = [f"burst{i}" for i in range(6)]
        ops = [LoadStoreOp(token_ids=F.fresh_tokens(2 * chunk), block_ids=[list(range(2 * bpc))],
                           start=0, end=2 * chunk) for _ in rids]
        w.worker.batched_submit_store_requests(rids, ops, w.worker.create_recorded_event())
        time.sleep(0.02)
        t0 = time.monotonic()
        kvd.signal(signal.SIGTERM)
        assert kvd.wait(timeout=15) == 0
        assert time.monotonic() - t0 < 10
        # Every store the client submitted resolves (done, or failed): none hangs.
        for rid in rids:
            try:
                w.worker.store_futures[rid].result(timeout=10)
            except TimeoutError:  # pragma: no cover - only if the message never arrived
                pass
    finally:
        w.close()
    assert not kvd.shm_path.exists(), "the L1 segment must be removed on SIGTERM"
    log = kvd.log()
    assert "released 1 worker registration(s)" in log
    assert "kvd stopped" in log


def test_sigint_exits_0_and_removes_the_segment(kvd):
    assert kvd.shm_path.exists()
    kvd.signal(signal.SIGINT)
    assert kvd.wait(timeout=15) == 0
    assert not kvd.shm_path.exists()


def test_a_second_signal_exits_at_once(kvd):
    # Stopped, the process collects both signals; resumed, it gets them back to back:
    # the first starts the clean shutdown, the second ends the process (status 1).
    kvd.signal(signal.SIGSTOP)
    kvd.signal(signal.SIGTERM)
    kvd.signal(signal.SIGINT)
    kvd.signal(signal.SIGCONT)
    assert kvd.wait(timeout=10) == 1
    assert "kvd stopped" not in kvd.log()
    # Even then the L1's memory does not stay behind in /dev/shm.
    assert not kvd.shm_path.exists(), "a forced exit must still remove the L1 segment"


def test_timeouts_double_sigterm_stops_cleanly_and_removes_the_segment(kvd):
    # GNU timeout (and some supervisors) send SIGTERM to the process and then to its
    # group: one stop request that arrives twice. It used to count as a second signal:
    # exit 1 at once, the L1 segment left in /dev/shm.
    assert kvd.shm_path.exists()
    kvd.signal(signal.SIGTERM)
    time.sleep(0.01)
    kvd.signal(signal.SIGTERM)
    assert kvd.wait(timeout=15) == 0
    assert "kvd stopped" in kvd.log()
    assert not kvd.shm_path.exists()


def test_http_endpoints_close_with_the_server(kvd):
    assert kvd.get("/healthcheck")[0] == 200
    kvd.signal(signal.SIGTERM)
    assert kvd.wait(timeout=15) == 0
    with pytest.raises(OSError):  # the port is closed once stopped
        F.http("GET", kvd.base + "/healthcheck", timeout=1)


def test_stale_segment_after_kill_9_is_replaced_on_restart(make_kvd):
    first = make_kvd().start()
    first.signal(signal.SIGKILL)
    first.wait(timeout=10)
    assert first.shm_path.exists(), "kill -9 leaves the segment behind"
    second = make_kvd(shm_name=first.shm_name).start()
    assert "already exists" in second.log()
    assert second.get_json("/status")["l1"]["used_bytes"] == 0
    assert second.stop() == 0
    assert not second.shm_path.exists()


def test_segment_of_a_running_kvd_is_not_taken(make_kvd):
    first = make_kvd().start()
    second = make_kvd(shm_name=first.shm_name)
    second.spawn()
    assert second.wait(timeout=15) == 1
    assert f"in use by kvd (pid {first.proc.pid})" in second.log()
    assert first.get_json("/healthcheck") == {"status": "healthy"}
    assert first.shm_path.exists()


# ---------------------------------------------------------------------------
# Logs
# ---------------------------------------------------------------------------


@needs_lmcache
def test_info_log_has_events_but_no_per_request_lines(kvd):
    w = F.OneWorker(kvd.url, model="ops-logs", mq_timeout=5.0)
    try:
        before = len(kvd.log().splitlines())
        chunk = w.chunk_size
        bpc = chunk // F.OneWorker.BLOCK_SIZE
        for i in range(15):
            tokens = F.fresh_tokens(chunk)
            assert w.store(f"g{i}", tokens, list(range(bpc)))
            assert w.lookup(f"h{i}", tokens) == chunk
            assert w.retrieve(f"h{i}", tokens, list(range(bpc, 2 * bpc)), end=chunk)
            w.end_session(f"h{i}")
        F.raw_requests(kvd.url, [F.OP_NOOP, F.OP_PING] * 20)
        time.sleep(0.5)
        during = kvd.log().splitlines()[before:]
        assert len(during) <= 2, "per-request lines at info level:\n" + "\n".join(during)
    finally:
        w.close()
    log = kvd.log()
    assert re.search(r"\[info\] registered instance \d+ model 'ops-logs'", log)
    wait_for(lambda: re.search(r"unregistered instance \d+ \(model 'ops-logs'\)", kvd.log()), 10,
             "the unregister line")


def test_errors_name_the_client_and_the_op(kvd):
    # UNREGISTER of an unknown instance is quiet (debug); a malformed LOOKUP is an error.
    import msgspec  # noqa: PLC0415
    import zmq  # noqa: PLC0415

    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(kvd.url)
    try:
        s.send_multipart([msgspec.msgpack.encode(1), msgspec.msgpack.encode(8), b"\xc1"])
        assert s.poll(5000)
        s.recv_multipart()
    finally:
        s.close(0)
    line = wait_for(lambda: [ln for ln in kvd.log().splitlines() if "[warning]" in ln and "lookup" in ln],
                    5, "a warning for the bad request")
    assert "client-" in line[0]


@needs_lmcache
def test_debug_log_has_one_line_per_request_with_its_phase_times(make_kvd):
    k = make_kvd(extra=["--log-level", "debug"]).start()
    w = F.OneWorker(k.url, model="ops-phases", mq_timeout=5.0)
    try:
        chunk = w.chunk_size
        bpc = chunk // F.OneWorker.BLOCK_SIZE
        tokens = F.fresh_tokens(2 * chunk)
        assert w.store("p1", tokens, list(range(2 * bpc)))
        assert w.lookup("p2", tokens) == 2 * chunk
        assert w.retrieve("p2", tokens, list(range(2 * bpc, 4 * bpc)), end=2 * chunk)
        ms = r"[0-9]+\.[0-9]{3}"
        line = re.compile(rf"\[debug\] (store|retrieve) from client-\w+: ({ms}) ms to reply ready, "
                          rf"({ms}) ms to sent \(ms per phase: queue ({ms}), decode {ms}, "
                          rf"hash {ms}, index {ms}, copy ({ms}), reply ({ms})\)")
        found = wait_for(lambda: {m.group(1): m for m in line.finditer(k.log())}
                         if len(set(m.group(1) for m in line.finditer(k.log()))) == 2 else None,
                         5, "a phase line for the store and the retrieve")
        for m in found.values():
            ready, sent, queue, copy, reply = (float(m.group(i)) for i in range(2, 7))
            assert queue + copy <= ready + 0.002 and sent >= ready, m.group(0)
            assert abs(sent - ready - reply) <= 0.002, m.group(0)
    finally:
        w.close()


def test_log_level_warning_hides_info_lines(make_kvd):
    k = make_kvd(extra=["--log-level", "warning"]).start()
    F.raw_requests(k.url, [F.OP_NOOP] * 3)
    assert k.stop() == 0
    assert "[info]" not in k.log()
