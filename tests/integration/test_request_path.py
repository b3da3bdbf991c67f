"""The request loop under hostile and heavy load (issue 11, findings 7 and 11).

Finding 7: no operation on the request loop's thread may take more than about 1 ms.
REGISTER / UNREGISTER (mapping segments, building layouts; for GPU workers pinning L1 and
tearing the CUDA engine down) used to run on it, so every client waited for them. The test
registers large workers and lets them be reaped while another client pings without pause,
then checks the pings' latency against the registrations' own duration and the server's
record of the longest request its loop thread ran itself.

Finding 11: no per-connection memory bound. A flood of maximum-size frames must not grow
kvd's RSS past the bound documented in docs/reliability.md; a frame larger than the
largest legal request drops only that connection; IPv6 hosts (`--host ::`, `::1`) serve.

kvd only: these are kvd's own limits (the reference server has none of them).
"""

from __future__ import annotations

import os
import re
import threading
import time
import urllib.request

import pytest

import faults_util as F
import kvd_harness as H

pytestmark = pytest.mark.skipif(H.server_kind() != "kvd", reason="kvd's own limits")

# DecodeLimits::max_array, and ZmqServer::MaxFrameBytes() = 5 + 9 * max_array + 4 MiB.
MAX_TOKENS = 16 << 20
MAX_FRAME = 5 + 9 * MAX_TOKENS + (4 << 20)
# The documented default bound of bytes of requests queued per connection.
MAX_QUEUED = 2 * MAX_FRAME
# The largest message (ZmqServer::MaxMessageBytes): its largest frame and 16 MiB more.
MAX_MESSAGE = MAX_FRAME + (16 << 20)
# Per connection, messages read and not yet taken by the loop: 1 MiB, plus what one read
# (the reader's 16 KiB buffer) completes.
MAX_PENDING = (1 << 20) + (16 << 10)


def metrics(srv: F.KvdServer) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.http_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            out[k] = float(v)
    return out


def proc_status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


class Pinger(threading.Thread):
    """PING round trips without pause on its own connection; keeps every latency."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.latencies: list[float] = []
        self.failures = 0

    def run(self) -> None:
        c = F.RawClient(self.url)
        try:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                try:
                    ok = c.call("ping", None, timeout=30)
                except TimeoutError:
                    self.failures += 1
                    continue
                self.latencies.append(time.perf_counter() - t0)
                if ok is not True:
                    self.failures += 1
        finally:
            c.close()


def register_wide(c: F.RawClient, instance_id: int, model: str, segments: list[F.Segment]):
    """REGISTER_KV_CACHE of one layer per segment (a wide model: many segments to map)."""
    descs = [F.cpu_shm_descriptor("/" + s.name, F.RAW_LAYER_SHAPE, F.RAW_LAYER_STRIDE, s.nbytes)
             for s in segments]
    groups = [{"engine_group_id": 0, "layer_indices": list(range(len(segments))),
               "tokens_per_block": 16, "sw_size_tokens": -1, "extra_object_group_tag": 0,
               "recurrent_state": False}]
    return c.call("register_kv_cache", instance_id, descs, model, 1, "vllm",
                  {"kv_layout": "NHD", "num_kv_heads": 2, "tokens_per_block": 16,
                   "head_dim": 64}, groups, timeout=120)


def test_finding7_register_and_reap_under_load_never_stall_the_request_loop(tmp_path):
    layers = 4000
    segs = [F.Segment(f"kvd_f7_{os.getpid()}_{i}", F.RAW_LAYER_BYTES) for i in range(layers)]
    try:
        # The shortest reap timeout kvd takes is 30 s.
        with F.kvd_server(tmp_path, extra=["--worker-reap-timeout-seconds", "30",
                                           "--worker-registration-grace-seconds", "30"]) as srv:
            pinger = Pinger(srv.url)
            pinger.start()
            c = F.RawClient(srv.url)
            reg_seconds = []
            try:
                time.sleep(0.3)
                for i in range(4):
                    t0 = time.perf_counter()
                    assert register_wide(c, 700 + i, "f7-model", segs) is None
                    reg_seconds.append(time.perf_counter() - t0)
                assert c.call("unregister_kv_cache", 700) is None
                # The other three never ping: reaped after the 30 s grace by the maintenance
                # thread, while the pings go on.
                assert F.wait_until(lambda: (srv.status() or {}).get("instances") == [], 60), \
                    srv.status()
                time.sleep(0.3)
            finally:
                pinger.stop.set()
                pinger.join(timeout=60)
                c.close()
            m = metrics(srv)
    finally:
        for s in segs:
            s.close()
    longest_ping = max(pinger.latencies)
    longest_reg = max(reg_seconds)
    print(f"registrations {[round(s * 1e3, 1) for s in reg_seconds]} ms; "
          f"{len(pinger.latencies)} pings, longest {longest_ping * 1e3:.1f} ms")
    assert pinger.failures == 0
    assert len(pinger.latencies) > 100
    # The registrations themselves are slow (thousands of segments to map) ...
    assert longest_reg > 0.04, reg_seconds
    # ... but never delay another client's request by their duration,
    assert longest_ping < longest_reg / 2, (longest_ping, reg_seconds)
    # and the longest request the loop's thread ran itself was a short op: ~0.1 ms when
    # nothing else runs, bounded loosely because wall time also counts being descheduled
    # on a loaded machine.
    inline = {k: v for k, v in m.items() if k.startswith("kvd_request_loop_longest_inline_seconds")}
    assert inline, "no kvd_request_loop_longest_inline_seconds in /metrics"
    print(f"longest inline op: {inline}")
    (name, longest_inline), = inline.items()
    assert 'op="register' not in name and 'op="unregister' not in name, inline
    assert longest_inline < min(0.05, longest_reg / 4), inline


def max_size_store_frames(instance_id: int) -> list[bytes]:
    """A STORE whose key frame is as large as a legal frame gets: MAX_TOKENS tokens, each
    a 9-byte uint64 (legal: the decoder takes any int64)."""
    import msgspec

    enc = msgspec.msgpack.encode
    head = {"model_name": "flood", "world_size": 1, "worker_id": 0}
    tail = {"start": 0, "end": 256, "request_id": "flood", "cache_salt": "",
            "request_configs": None, "num_kv_readers": 1}
    body = bytearray(b"\xde" + (len(head) + 1 + len(tail)).to_bytes(2, "big"))
    for k, v in head.items():
        body += enc(k) + enc(v)
    body += enc("token_ids") + b"\xdd" + MAX_TOKENS.to_bytes(4, "big")
    body += b"\xcf\x00\x00\x00\x00\x00\x00\x00\x07" * MAX_TOKENS
    for k, v in tail.items():
        body += enc(k) + enc(v)
    assert len(body) <= MAX_FRAME
    return [bytes(body), enc(instance_id), enc([[0] * 16]), enc(b"")]


@pytest.mark.release_kvd
def test_finding11_flood_of_max_size_frames_keeps_rss_within_the_documented_bound(tmp_path):
    import msgspec
    import zmq

    frames = max_size_store_frames(4242)
    n = 10
    # docs/reliability.md: per connection, the requests queued (at most MAX_QUEUED bytes,
    # or one request), one message being received and one read but not yet queued, the
    # messages read and not yet taken, and the decoded tokens of each request being decoded
    # (4 bytes per token, one per pool thread).
    threads = min(max(os.cpu_count() or 2, 2), 16)
    bound = MAX_QUEUED + 2 * MAX_MESSAGE + MAX_PENDING + threads * 4 * MAX_TOKENS
    assert n * len(frames[0]) > bound  # the flood is larger than what kvd may hold
    # Under AddressSanitizer, freed memory waits in its quarantine (quarantine_size_mb, 256 MiB
    # by default) before it is reused, and RSS counts it: one freed 144 MiB frame more or less
    # decides the check there (767 MiB against the 753 MiB bound in one fresh-clone run, about
    # 700 MiB in three reruns). The plain run checks the bound itself.
    if os.environ.get("KVD_TEST_SANITIZER") == "asan":
        bound += 256 * 2**20
    # Whether one flood reaches the queue bound is a race between the loop reading the next
    # 144 MiB message and the pool decoding the earlier ones, on the same CPUs (1-4 of 10
    # refused in most runs, 0 in one CI run): floods are repeated, at most 4, until one is
    # refused something. The RSS bound holds for every flood.
    refused = 0.0
    with F.kvd_server(tmp_path) as srv:
        ctx = zmq.Context()
        c = F.RawClient(srv.url, ctx)
        try:
            assert c.call("ping", None) is True
            for flood in range(4):
                s = ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.LINGER, 0)
                s.connect(srv.url)
                try:
                    time.sleep(0.5)
                    rss0 = proc_status_kib(srv.pid, "VmRSS") * 1024
                    # VmHWM is the peak since start: reset it to the current RSS.
                    with open(f"/proc/{srv.pid}/clear_refs", "w") as f:
                        f.write("5")
                    enc = msgspec.msgpack.encode
                    for uid in range(n):
                        s.send_multipart([enc(uid), enc(6), *frames], copy=False)
                    replies = []
                    while len(replies) < n:
                        assert s.poll(120_000), f"only {len(replies)} of {n} replies"
                        replies.append(msgspec.msgpack.decode(s.recv_multipart()[-1]))
                    peak = proc_status_kib(srv.pid, "VmHWM") * 1024
                finally:
                    s.close(0)
                assert c.call("ping", None) is True  # still serving
                growth = peak - rss0
                total = metrics(srv).get('kvd_requests_refused_total{op="store"}', 0)
                print(f"flood {flood + 1}: {n} frames of {len(frames[0]) / 2**20:.0f} MiB; RSS grew "
                      f"{growth / 2**20:.0f} MiB (bound {bound / 2**20:.0f} MiB); "
                      f"{total - refused:.0f} refused")
                refused = total
                assert all(r == [b"", False] for r in replies), replies
                assert growth <= bound, (growth, bound)
                if refused >= 1:
                    break
        finally:
            c.close()
            ctx.term()
    assert refused >= 1  # the bound was reached and enforced


def test_finding11_one_message_of_many_large_frames_is_refused_while_it_arrives(tmp_path):
    """Regression: ZMQ_MAXMSGSIZE bounds each frame, not a message, and libzmq buffered a
    whole multipart message before kvd saw it: one message of 8 x 100 MiB frames grew kvd's
    RSS by about 800 MiB. kvd's ZMTP reader closes the connection once the message passes
    the largest legal size, holding at most one message's worth."""
    import msgspec
    import zmq

    enc = msgspec.msgpack.encode
    frame = b"\x01" * (100 << 20)
    with F.kvd_server(tmp_path) as srv:
        ctx = zmq.Context()
        bad = ctx.socket(zmq.DEALER)
        bad.setsockopt(zmq.LINGER, 0)
        bad.setsockopt(zmq.RECONNECT_IVL, 10_000)  # do not come back within the test
        bad.connect(srv.url)
        good = F.RawClient(srv.url, ctx)
        try:
            assert good.call("ping", None) is True
            time.sleep(0.3)
            rss0 = proc_status_kib(srv.pid, "VmRSS") * 1024
            with open(f"/proc/{srv.pid}/clear_refs", "w") as f:
                f.write("5")
            bad.send_multipart([enc(1), enc(6)] + [frame] * 8, copy=False)
            deadline = time.monotonic() + 60
            closed = 0.0
            while time.monotonic() < deadline and closed == 0:
                time.sleep(0.2)
                closed = metrics(srv).get("kvd_zmtp_protocol_errors_total", 0)
            assert closed == 1, "the connection was not closed"
            peak = proc_status_kib(srv.pid, "VmHWM") * 1024
            assert good.call("get_chunk_size") == 256  # everyone else is still served
        finally:
            bad.close(0)
            good.close()
            ctx.term()
    growth = peak - rss0
    print(f"8 x 100 MiB frames in one message: RSS grew {growth / 2**20:.0f} MiB "
          f"(bound {(MAX_MESSAGE + MAX_PENDING) / 2**20:.0f} MiB)")
    assert growth <= MAX_MESSAGE + MAX_PENDING + (32 << 20), growth


def test_finding11_frame_over_the_largest_legal_request_drops_only_its_connection(tmp_path):
    import msgspec
    import zmq

    enc = msgspec.msgpack.encode
    with F.kvd_server(tmp_path) as srv:
        ctx = zmq.Context()
        bad = ctx.socket(zmq.DEALER)
        bad.setsockopt(zmq.LINGER, 0)
        bad.connect(srv.url)
        good = F.RawClient(srv.url, ctx)
        try:
            oversize = b"\xc4" * (MAX_FRAME + 1)  # never decoded: kvd refuses its header
            bad.send_multipart([enc(1), enc(21), oversize], copy=False)
            assert not bad.poll(3000), "an oversized frame was answered"
            assert good.call("get_chunk_size") == 256
            assert good.call("ping", None) is True
        finally:
            bad.close(0)
            good.close()
            ctx.term()


@pytest.mark.parametrize("host,connect", [("::1", ["[::1]"]), ("::", ["[::1]", "127.0.0.1"])])
def test_finding11_ipv6_hosts_serve(tmp_path, host, connect):
    import subprocess

    import msgspec
    import zmq

    port = H.free_port()
    shm = f"kvd_ipv6_{os.getpid()}_{port}"
    http_port = H.free_port(exclude={port})
    cmd = [F.kvd_binary(), "server", "--host", host, "--port", str(port), "--l1-size-gb", "0.05",
           "--eviction-policy", "LRU", "--shm-name", shm, "--http-host", "127.0.0.1",
           "--http-port", str(http_port)]
    log_path = tmp_path / "kvd.log"
    with open(log_path, "wb") as logf:
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                             start_new_session=True)
    ctx = zmq.Context()
    try:
        enc = msgspec.msgpack.encode
        for where in connect:
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.IPV6, 1)
            s.connect(f"tcp://{where}:{port}")
            deadline = time.time() + 30
            reply = None
            while time.time() < deadline and reply is None and p.poll() is None:
                s.send_multipart([enc(7), enc(21)])
                if s.poll(1000):
                    reply = msgspec.msgpack.decode(s.recv_multipart()[-1])
            s.close(0)
            assert reply == 256, (where, log_path.read_text(errors="replace")[-2000:])
        # The health check probes the loop through the same address family.
        deadline = time.time() + 15
        code = None
        while time.time() < deadline and code != 200:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthcheck",
                                            timeout=5) as r:
                    code = r.status
            except Exception:
                time.sleep(0.5)
        assert code == 200, log_path.read_text(errors="replace")[-2000:]
    finally:
        ctx.term()
        if p.poll() is None:
            os.killpg(p.pid, 15)
        assert p.wait(timeout=30) == 0
        try:
            os.unlink(f"/dev/shm/{shm}")
        except OSError:
            pass
