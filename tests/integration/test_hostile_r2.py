"""Hostile clients, files and peers, round two (issue 27): one test per finding, named after
it (test_r2_findingN_...). Each drives kvd the way the attack was made: raw HTTP, raw frames,
the real lmcache client, a real redis-server or real files.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

import kvd_harness as H
import ops_fixtures as F

pytestmark = pytest.mark.skipif(H.server_kind() != "kvd", reason="kvd's hostile-input behaviour")


def _request(method: str, url: str, body: bytes, content_type: str = "application/json",
             timeout: float = 10.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, method=method, data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


# ---------------------------------------------------------------------------------------
# Finding 1: a deeply nested JSON body crashed kvd (stack overflow echoing it in a 422)
# ---------------------------------------------------------------------------------------


def test_r2_finding1_deeply_nested_json_bodies_are_refused_and_kvd_lives(tmp_path):
    """100,000 nested '[' in the body of every route that reads JSON: each answers 4xx with a
    bounded reply, and kvd keeps serving (its L1 survives)."""
    kvd = F.Kvd(tmp_path / "kvd.log").start()
    try:
        deep = b"[" * 100_000
        deep_obj = b'{"tier": "l1", "keys": ' + b"[" * 100_000 + b"}"
        routes = [
            ("DELETE", "/cache/objects", deep),
            ("DELETE", "/cache/objects", deep_obj),
            ("POST", "/cache/clear", deep),
            ("POST", "/cache/prefetches", deep),
            ("PUT", "/quota/tenant", deep),
        ]
        for method, path, body in routes:
            status, reply = _request(method, kvd.base + path, body)
            assert 400 <= status < 500, (method, path, status, reply[:200])
            assert len(reply) < 4096, (method, path, len(reply))
            assert kvd.proc.poll() is None, kvd.log()[-2000:]
        # A nesting within the bound still gets the usual validation answer.
        status, reply = _request("DELETE", kvd.base + "/cache/objects", b"[" * 60 + b"]" * 60)
        assert status == 422, reply[:200]
        assert kvd.get("/healthcheck")[0] == 200
    finally:
        kvd.stop()


# ---------------------------------------------------------------------------------------
# Finding 5: model names that spell the same tier object key
# ---------------------------------------------------------------------------------------


def test_r2_finding5_model_names_that_collide_in_tier_keys_are_refused(tmp_path):
    """lmcache's tier keys spell '/' as '-SEP-', so "org/model" and "org-SEP-model" would share
    tier objects: a name with "-SEP-" is refused at registration (a store through it fails),
    as a name with '@' is, and "org/model" itself still works."""
    import os

    import faults_util as F

    seg = F.Segment(f"kvd_r2_sep_{os.getpid()}", F.RAW_LAYER_BYTES)
    try:
        with F.kvd_server(tmp_path) as srv:
            c = F.RawClient(srv.url)
            try:
                toks = [7000 + i for i in range(H.CHUNK_SIZE)]
                for iid, model, ok in ((27501, "org-SEP-model", False), (27502, "org@model", False),
                                       (27503, "org/model", True)):
                    F.register_raw(c, iid, model, "/" + seg.name)
                    key = F.cache_key(model, 1, 0, toks, 0, H.CHUNK_SIZE, F.rid("sep"))
                    got = c.call("store", key, iid, [list(range(16))], b"")
                    assert got == [b"", ok], (model, got)
                c.call("unregister_kv_cache", 27503)
            finally:
                c.close()
            assert srv.alive()
    finally:
        seg.close()


# ---------------------------------------------------------------------------------------
# Finding 2: L1 locked by one client through the engine-driven ops
# ---------------------------------------------------------------------------------------

# An engine-driven object of 128 KiB: [2, 1 layer, 256 slots, 128] bf16, as large as the
# bystander's (so L1 fills to its last object).
_F2_REG = {"model_name": "r2-f2-hog", "world_size": 1, "block_size": 16, "num_layers": 1,
           "hidden_dim_size": 128, "dtype_str": "bfloat16", "use_mla": False,
           "num_physical_slots": 256}
_F2_L1_GB = 0.05  # 51 MiB: about 409 of those objects
_F2_ATTEMPTS = 450


def _f2_tokens(seed: int) -> list[int]:
    import os

    base = 3_000_000 + (os.getpid() % 500) * 50_000 + seed * 977
    return [base + i for i in range(H.CHUNK_SIZE)]


def _f2_register_hog(c, iid: int) -> None:
    reply = c.call(14, {**_F2_REG, "instance_id": iid})
    assert reply.get("shm_name"), reply


def _f2_key(FU, seed: int, rid: str) -> dict:
    return FU.cache_key(_F2_REG["model_name"], 1, 0, _f2_tokens(seed), 0, H.CHUNK_SIZE, rid)


def _f2_slots(reply) -> list:
    return ((reply or {}).get("context") or {}).get("slots") or []


def _f2_bystander_stores(FU, srv, c, n: int) -> list:
    """Another tenant (lmcache-driven, its own segment) stores n distinct chunks: the replies."""
    import os

    seg = FU.Segment(f"kvd_r2_f2_b_{os.getpid()}_{srv.port}", FU.RAW_LAYER_BYTES)
    try:
        FU.register_raw(c, 27299, "r2-f2-bystander", "/" + seg.name)
        out = []
        for i in range(n):
            toks = [9_000_000 + (os.getpid() % 500) * 50_000 + i * 977 + j for j in range(H.CHUNK_SIZE)]
            key = FU.cache_key("r2-f2-bystander", 1, 0, toks, 0, H.CHUNK_SIZE, FU.rid("f2-b"))
            out.append(c.call("store", key, 27299, [list(range(16))], b""))
        return out
    finally:
        seg.close()


def test_r2_finding2_uncommitted_prepare_stores_do_not_lock_l1_for_other_tenants(tmp_path):
    """Client A PREPARE_STOREs 450 one-chunk requests of 128 KiB objects into a 51 MiB L1
    and never commits. Before: every slot stayed staging (not evictable) until the write TTL
    (600 s), L1 filled up and every STORE of another tenant failed. Now A holds at most its
    share of L1 (--engine-driven-instance-held-fraction, 0.25 by default): its prepares beyond
    are refused, and the bystander's 20 stores all succeed."""
    import faults_util as FU

    with FU.kvd_server(tmp_path, l1_gb=_F2_L1_GB) as srv:
        c = FU.RawClient(srv.url)
        try:
            _f2_register_hog(c, 27201)
            granted = 0
            for i in range(_F2_ATTEMPTS):
                granted += len(_f2_slots(c.call(16, _f2_key(FU, i, FU.rid(f"f2-hog{i}")), 27201)))
            assert granted >= 50, "the attack was not made: A got almost no slots"
            replies = _f2_bystander_stores(FU, srv, c, 20)
            assert replies == [[b"", True]] * 20, (replies, srv.log()[-3000:])
            assert srv.alive(), srv.log()[-3000:]
        finally:
            c.close()


def test_r2_finding2_uncommitted_prepare_retrieves_do_not_pin_l1_for_other_tenants(tmp_path):
    """Client A stores 450 chunks of 128 KiB (prepare + commit) and PREPARE_RETRIEVEs each right
    after, never COMMIT_RETRIEVE, so every object it stored stays pinned. Before: the pins
    held until the read TTL (300 s), L1 filled with pinned objects and another tenant's stores
    failed. Now A's pins are bounded like its staging and the bystander's stores succeed."""
    import faults_util as FU

    with FU.kvd_server(tmp_path, l1_gb=_F2_L1_GB) as srv:
        c = FU.RawClient(srv.url)
        try:
            _f2_register_hog(c, 27202)
            pinned = 0
            for i in range(_F2_ATTEMPTS):
                key = _f2_key(FU, 1000 + i, FU.rid(f"f2-pin{i}"))
                if _f2_slots(c.call(16, key, 27202)):
                    c.call(17, key, 27202)  # committed: the object is resident
                reply = c.call(18, _f2_key(FU, 1000 + i, FU.rid(f"f2-pinr{i}")), 27202)
                pinned += len((reply or {}).get("context", {}).get("slots") or [])
            assert pinned >= 50, "the attack was not made: A pinned almost nothing"
            replies = _f2_bystander_stores(FU, srv, c, 20)
            assert replies == [[b"", True]] * 20, (replies, srv.log()[-3000:])
        finally:
            c.close()


def test_r2_finding2_prepared_ops_expire_while_the_client_keeps_pinging(tmp_path):
    """--engine-driven-hold-timeout-seconds 2: A's uncommitted PREPARE_STORE and
    PREPARE_RETRIEVE are dropped about 2 s later although A keeps pinging (before: the write
    and read TTLs, 600 and 300 s), the staging object goes back to L1, and the expiries are
    counted in /metrics."""
    import time

    import faults_util as FU

    with FU.kvd_server(tmp_path, l1_gb=_F2_L1_GB,
                       extra=["--engine-driven-hold-timeout-seconds", "2"]) as srv:
        c = FU.RawClient(srv.url)
        try:
            _f2_register_hog(c, 27203)
            stored = _f2_key(FU, 2000, FU.rid("f2-exp-s"))
            assert _f2_slots(c.call(16, stored, 27203))
            assert c.call(17, stored, 27203) is True
            assert _f2_slots(c.call(18, _f2_key(FU, 2000, FU.rid("f2-exp-r")), 27203))
            assert _f2_slots(c.call(16, _f2_key(FU, 2001, FU.rid("f2-exp-w")), 27203))
            pending = (srv.status() or {}).get("pending_engine_driven")
            assert pending == {"stores": 1, "retrieves": 1}, srv.status()
            used = srv.l1()["used_bytes"]
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline:
                c.call("ping", 27203)
                if (srv.status() or {}).get("pending_engine_driven") == {"stores": 0, "retrieves": 0}:
                    break
                time.sleep(0.2)
            assert (srv.status() or {}).get("pending_engine_driven") == {"stores": 0, "retrieves": 0}
            assert srv.l1()["used_bytes"] < used, "the expired staging object still holds L1"
            with urllib.request.urlopen(f"http://127.0.0.1:{srv.http_port}/metrics", timeout=5) as r:
                metrics = r.read().decode()
            assert "kvd_engine_driven_staging_expired_total 1" in metrics, metrics[-2000:]
            assert "kvd_engine_driven_pins_expired_total 1" in metrics
        finally:
            c.close()


# ---------------------------------------------------------------------------------------
# Finding 7: Connections — no cap, no descriptor reserve, a busy loop on EMFILE, metrics
# that miss how connections end
# ---------------------------------------------------------------------------------------

_ZMTP_GREETING = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL" + b"\x00" * 16 + b"\x00" * 32
_READY_BODY = b"\x05READY" + b"\x0bSocket-Type" + (6).to_bytes(4, "big") + b"DEALER"
_ZMTP_READY = b"\x04" + bytes([len(_READY_BODY)]) + _READY_BODY


def _raw_zmtp(port: int, handshake: bool = False):
    """A raw TCP connection to the request port; with `handshake`, it sends a DEALER's greeting
    and READY (and then nothing, as an idle client)."""
    import socket

    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    if handshake:
        s.sendall(_ZMTP_GREETING + _ZMTP_READY)
    return s


def _closed_by_kvd(s, timeout: float) -> bool:
    """Whether kvd closes `s` within `timeout` (what it sent before, greeting and READY, is
    read and dropped)."""
    import socket
    import time

    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        s.settimeout(left)
        try:
            if not s.recv(4096):
                return True
        except socket.timeout:
            return False
        except OSError:  # reset
            return True


def _zmtp_metrics(kvd) -> dict[str, float]:
    """kvd_zmtp_* samples of /metrics, keyed by name{labels}."""
    status, _, text = kvd.get("/metrics")
    assert status == 200
    out = {}
    for line in text.splitlines():
        if line.startswith("kvd_zmtp_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _zmtp_settled(kvd) -> dict[str, float]:
    """The kvd_zmtp_* samples once no connection is open (kvd's /healthcheck probes its own
    request port with a connection of its own, closed at once)."""
    import time

    deadline = time.monotonic() + 5
    while True:
        m = _zmtp_metrics(kvd)
        if m.get("kvd_zmtp_connections", 0) == 0 or time.monotonic() > deadline:
            return m
        time.sleep(0.05)


def _client_works(kvd, timeout_ms: int = 3000) -> bool:
    try:
        return F.raw_requests(kvd.url, [F.OP_GET_CHUNK_SIZE], timeout_ms=timeout_ms)[0] == H.CHUNK_SIZE
    except TimeoutError:
        return False


def test_r2_finding7_connections_beyond_the_per_address_cap_are_closed(tmp_path):
    """--max-connections-per-address 4: of 10 connections that never finish their handshake,
    the oldest are closed as new ones come (at most 4 stay), and a real client still gets in
    (it replaces the oldest unfinished handshake). Four connections that finished their
    handshake are never closed for a newcomer: the fifth is closed at once (counted as
    rejected), and gets in once one of them leaves. Before: no cap at all."""
    import time

    kvd = F.Kvd(tmp_path / "kvd.log", extra=["--max-connections-per-address", "4"]).start()
    socks = []
    try:
        _zmtp_settled(kvd)
        raw = [_raw_zmtp(kvd.port) for _ in range(10)]
        socks += raw
        time.sleep(0.5)
        closed = [s for s in raw if _closed_by_kvd(s, 0.2)]
        assert len(closed) == 6, len(closed)
        assert closed == raw[:6], "the oldest unfinished handshakes go first"
        assert _client_works(kvd)
        m = _zmtp_metrics(kvd)
        assert m['kvd_zmtp_connections_evicted_total'] >= 7, m

        for s in raw:
            s.close()
        _zmtp_settled(kvd)
        idle = [_raw_zmtp(kvd.port, handshake=True) for _ in range(4)]
        socks += idle
        time.sleep(0.3)
        assert not _client_works(kvd, timeout_ms=1000)
        assert not any(_closed_by_kvd(s, 0.1) for s in idle), "a handshaked connection was closed"
        m = _zmtp_metrics(kvd)
        assert m['kvd_zmtp_connections_rejected_total{reason="per_address"}'] >= 1, m
        idle[0].close()
        time.sleep(0.3)
        assert _client_works(kvd)
        assert kvd.proc.poll() is None
    finally:
        for s in socks:
            s.close()
        kvd.stop()


class _LimitedKvd(F.Kvd):
    """kvd under RLIMIT_NOFILE = 256 (soft and hard, so kvd cannot raise it)."""

    def spawn(self):
        import resource
        import subprocess

        def limit():
            resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=limit)
        return self


def _cpu_seconds(pid: int) -> float:
    import os

    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_r2_finding7_a_descriptor_flood_neither_spins_nor_starves_clients_and_tiers(tmp_path):
    """kvd with 256 descriptors, 400 connections that never handshake: kvd keeps a reserve
    of descriptors (it closes the oldest unfinished handshakes instead of running out), so
    its loop stays idle (under 0.2 s of CPU in 2 s; before: accept failed with EMFILE and the
    loop spun at 100%), a real client is served and a store still reaches the fs tier while
    the flood is held, and after it is gone."""
    import os
    import socket
    import time

    import faults_util as FU

    tier = tmp_path / "tier"
    tier.mkdir()
    kvd = _LimitedKvd(tmp_path / "kvd.log",
                      extra=["--l2-adapter", json.dumps({"type": "fs", "base_path": str(tier)})]).start()
    seg = FU.Segment(f"kvd_r2_f7_{os.getpid()}", FU.RAW_LAYER_BYTES)
    flood = []
    try:
        for _ in range(400):
            try:
                flood.append(socket.create_connection(("127.0.0.1", kvd.port), timeout=0.5))
            except OSError:
                pass
        time.sleep(0.5)
        before = _cpu_seconds(kvd.proc.pid)
        time.sleep(2.0)
        spent = _cpu_seconds(kvd.proc.pid) - before
        assert spent < 0.2, f"kvd's loop used {spent:.2f} s of CPU in 2 s with no requests"
        assert _client_works(kvd, timeout_ms=5000)

        def files() -> int:
            return sum(len(f) for _, _, f in os.walk(tier))

        c = FU.RawClient(kvd.url)
        try:
            FU.register_raw(c, 27701, "f7/model", "/" + seg.name)
            for n, salt in enumerate((1, 2)):
                toks = [11000 + 1000 * salt + i for i in range(H.CHUNK_SIZE)]
                key = FU.cache_key("f7/model", 1, 0, toks, 0, H.CHUNK_SIZE, FU.rid(f"f7-{salt}"))
                assert c.call("store", key, 27701, [list(range(16))], b"", timeout=10) == [b"", True]
                assert FU.wait_until(lambda: files() > n, 10), "the store did not reach the fs tier"
                if n == 0:
                    for s in flood:
                        s.close()
                    flood.clear()
                    time.sleep(0.5)
            c.call("unregister_kv_cache", 27701, timeout=10)
        finally:
            c.close()
        assert _client_works(kvd)
        assert kvd.proc.poll() is None
    finally:
        for s in flood:
            s.close()
        seg.close()
        kvd.stop()


def test_r2_finding7_connections_that_never_handshake_are_closed_after_the_timeout(tmp_path):
    """--handshake-timeout-seconds 1: a connection that sends nothing and one that sends only
    its greeting are closed about 1 s after they connected, and /metrics shows it without any
    other traffic (before: the flag did not exist, the timeout was 30 s, and the counters
    were published only when a socket had an event); a client that finished its handshake
    and then stays idle (as vLLM's do for hours) is not closed."""
    import time

    kvd = F.Kvd(tmp_path / "kvd.log", extra=["--handshake-timeout-seconds", "1"]).start()
    socks = []
    try:
        idle = _raw_zmtp(kvd.port, handshake=True)
        silent = _raw_zmtp(kvd.port)
        half = _raw_zmtp(kvd.port)
        half.sendall(_ZMTP_GREETING)
        socks += [idle, silent, half]
        t0 = time.monotonic()
        assert _closed_by_kvd(silent, 3.0)
        assert _closed_by_kvd(half, 3.0)
        assert 0.7 < time.monotonic() - t0 < 2.5
        assert not _closed_by_kvd(idle, 2.0)
        time.sleep(0.3)
        m = _zmtp_metrics(kvd)
        assert m["kvd_zmtp_handshake_timeouts_total"] == 2, m
        assert m['kvd_zmtp_connections_closed_total{reason="handshake_timeout"}'] == 2, m
        assert m["kvd_zmtp_connections"] == 1, m
    finally:
        for s in socks:
            s.close()
        kvd.stop()


def test_r2_finding7_the_connection_metrics_follow_every_way_a_connection_ends(tmp_path):
    """Each way a connection ends is counted once, by reason, and accepted = open + closed:
    closed by the client, for a protocol error, for not finishing the handshake, to make room
    (evicted); a connection refused at the cap (rejected) is neither accepted nor closed."""
    import time

    kvd = F.Kvd(tmp_path / "kvd.log", extra=["--max-connections-per-address", "3",
                                             "--handshake-timeout-seconds", "1"]).start()
    socks = []
    try:
        m0 = _zmtp_settled(kvd)
        bye = _raw_zmtp(kvd.port, handshake=True)  # closed by the client
        time.sleep(0.2)
        bye.close()
        bad = _raw_zmtp(kvd.port)  # a protocol error
        bad.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b" " * 64)
        assert _closed_by_kvd(bad, 2.0)
        bad.close()
        silent = [_raw_zmtp(kvd.port) for _ in range(4)]  # one evicted, three time out
        socks += silent
        assert _closed_by_kvd(silent[0], 0.5)
        assert all(_closed_by_kvd(s, 3.0) for s in silent[1:])
        idle = [_raw_zmtp(kvd.port, handshake=True) for _ in range(3)]
        socks += idle
        time.sleep(0.3)
        extra = _raw_zmtp(kvd.port, handshake=True)  # rejected: the address has 3
        socks.append(extra)
        assert _closed_by_kvd(extra, 2.0)
        time.sleep(0.3)
        m = {k: v - m0.get(k, 0) if k != "kvd_zmtp_connections" else v
             for k, v in _zmtp_metrics(kvd).items()}
        closed = {r: m.get(f'kvd_zmtp_connections_closed_total{{reason="{r}"}}', 0)
                  for r in ("peer", "protocol_error", "handshake_timeout", "evicted")}
        assert closed == {"peer": 1, "protocol_error": 1, "handshake_timeout": 3, "evicted": 1}, m
        assert m["kvd_zmtp_connections"] == 3, m
        assert m["kvd_zmtp_connections_accepted_total"] == 9, m
        assert m['kvd_zmtp_connections_rejected_total{reason="per_address"}'] == 1, m
        assert m["kvd_zmtp_connections_evicted_total"] == 1, m
        assert m["kvd_zmtp_protocol_errors_total"] == 1 and m["kvd_zmtp_handshake_timeouts_total"] == 3, m
        for s in idle:
            s.close()
        time.sleep(0.3)
        m = _zmtp_metrics(kvd)
        assert m['kvd_zmtp_connections_closed_total{reason="peer"}'] - \
            m0['kvd_zmtp_connections_closed_total{reason="peer"}'] == 4, m
        assert m["kvd_zmtp_connections"] == 0, m
        total = sum(v for k, v in m.items() if k.startswith("kvd_zmtp_connections_closed_total"))
        assert m["kvd_zmtp_connections_accepted_total"] == total + m["kvd_zmtp_connections"], m
    finally:
        for s in socks:
            s.close()
        kvd.stop()


# ---------------------------------------------------------------------------------------
# Finding 8: HTTP admin — slow clients, header floods, state changes from any origin
# ---------------------------------------------------------------------------------------


def _rss_anon_kib(pid: int) -> int:
    """Resident anonymous memory (L1's shared-memory pages, populated in the background, are
    not in it)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


def _raw_http(port: int, request: bytes, timeout: float = 5.0) -> tuple[int, dict, bytes]:
    """Sends `request` as it is on a new connection; (status, headers, body) of the answer."""
    import http.client
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        r = http.client.HTTPResponse(s)
        r.begin()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()


def _timed_healthcheck(port: int, timeout: float = 3.0) -> float:
    """Seconds one GET /healthcheck on a new connection took (timeout: +inf)."""
    import socket
    import time

    t0 = time.monotonic()
    try:
        status, _, _ = _raw_http(port, b"GET /healthcheck HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                       b"Connection: close\r\n\r\n", timeout=timeout)
    except (OSError, socket.timeout):
        return float("inf")
    assert status == 200
    return time.monotonic() - t0


def test_r2_finding8_slow_clients_do_not_starve_healthcheck(tmp_path):
    """16 clients trickling a request one byte every 0.4 s, and 200 connections that send
    nothing, while /healthcheck is asked every 0.3 s: every probe is answered within 1 s
    (before: the tricklers held every HTTP thread and the probe waited for them)."""
    import socket
    import threading
    import time

    kvd = F.Kvd(tmp_path / "kvd.log").start()
    socks: list[socket.socket] = []
    stop = threading.Event()
    try:
        request = b"GET /healthcheck HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        tricklers = [socket.create_connection(("127.0.0.1", kvd.http_port)) for _ in range(16)]
        socks += tricklers
        for _ in range(200):
            socks.append(socket.create_connection(("127.0.0.1", kvd.http_port)))

        def trickle():
            i = 0
            while not stop.wait(0.4):
                for s in tricklers:
                    try:
                        s.send(request[i % (len(request) - 4): i % (len(request) - 4) + 1])
                    except OSError:
                        pass
                i += 1

        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        took = []
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            took.append(_timed_healthcheck(kvd.http_port))
            time.sleep(0.3)
        stop.set()
        t.join()
        assert max(took) < 1.0, [round(x, 3) for x in took]
        assert kvd.proc.poll() is None
    finally:
        stop.set()
        for s in socks:
            s.close()
        kvd.stop()


def test_r2_finding8_a_request_must_arrive_within_the_request_timeout(tmp_path):
    """--http-request-timeout-seconds 1: a client that trickles its request (a byte every
    0.3 s) is answered 408 and disconnected about 1 s after its first byte, and one that
    trickles its body likewise; a request that arrives in time is served."""
    import socket
    import time

    kvd = F.Kvd(tmp_path / "kvd.log", extra=["--http-request-timeout-seconds", "1"]).start()
    try:
        cases = [  # (sent at once, then trickled)
            (b"", b"GET /healthcheck HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"),
            (b"POST /cache/clear HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             b"Content-Length: 14\r\n\r\n", b'{"tier": "l1"}'),
        ]
        for head, trickled in cases:
            with socket.create_connection(("127.0.0.1", kvd.http_port), timeout=5) as s:
                t0 = time.monotonic()
                s.sendall(head)
                got = b""
                for i in range(len(trickled)):
                    try:
                        s.send(trickled[i:i + 1])
                    except OSError:
                        break
                    s.settimeout(0.3)
                    try:
                        chunk = s.recv(4096)
                    except socket.timeout:
                        continue
                    got += chunk
                    if not chunk or b"\r\n\r\n" in got:
                        break
                took = time.monotonic() - t0
                assert got.startswith(b"HTTP/1.1 408"), (head[:20], got[:200])
                assert took < 2.5, took
        assert _timed_healthcheck(kvd.http_port) < 1.0
    finally:
        kvd.stop()


def test_r2_finding8_header_floods_are_refused_and_memory_stays_bounded(tmp_path):
    """Header lines without end (8 MiB of them on each of 4 connections) no longer grow
    kvd's memory (before: +100 MB or more, every line kept): past 100 header lines or 64 KiB
    of request head the request is answered 431 and the connection closed; a request line
    over 8 KiB is answered 414."""
    import socket

    kvd = F.Kvd(tmp_path / "kvd.log").start()
    try:
        # 200 header lines, then the end of the head: refused as a whole.
        many = b"GET /healthcheck HTTP/1.1\r\nHost: 127.0.0.1\r\n" + \
            b"".join(b"X-H%d: v\r\n" % i for i in range(200)) + b"\r\n"
        status, _, body = _raw_http(kvd.http_port, many)
        assert status == 431, (status, body[:200])
        status, _, body = _raw_http(kvd.http_port, b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n")
        assert status == 414, (status, body[:200])

        anon_before = _rss_anon_kib(kvd.proc.pid)
        line = b"X-Flood: " + b"v" * 40 + b"\r\n"
        conns = []
        for _ in range(4):
            s = socket.create_connection(("127.0.0.1", kvd.http_port), timeout=5)
            conns.append(s)
            s.sendall(b"GET /healthcheck HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            n = 0
            try:
                while n < 8 << 20:
                    s.sendall(line * 1000)
                    n += len(line) * 1000
            except OSError:  # refused: reset, or the send blocked on a closed window
                pass
        anon_after = _rss_anon_kib(kvd.proc.pid)
        for s in conns:
            s.close()
        assert anon_after - anon_before < 16 * 1024, (anon_before, anon_after)
        assert _timed_healthcheck(kvd.http_port) < 1.0
    finally:
        kvd.stop()


def _admin_request(port: int, method: str, path: str, body: bytes | None = None,
                   headers: dict | None = None) -> tuple[int, bytes]:
    """One request with exactly these headers (Host included when given; else 127.0.0.1:port)."""
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        hdrs = {"Host": f"127.0.0.1:{port}"}
        hdrs.update(headers or {})
        c.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for k, v in hdrs.items():
            c.putheader(k, v)
        if body is not None:
            c.putheader("Content-Length", str(len(body)))
        c.endheaders(body)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def _store_one_chunk(kvd, seg_name: str, iid: int, model: str) -> None:
    import faults_util as FU

    c = FU.RawClient(kvd.url)
    try:
        FU.register_raw(c, iid, model, "/" + seg_name)
        toks = [9000 + i for i in range(H.CHUNK_SIZE)]
        key = FU.cache_key(model, 1, 0, toks, 0, H.CHUNK_SIZE, FU.rid("f8"))
        assert c.call("store", key, iid, [list(range(16))], b"") == [b"", True]
    finally:
        c.close()


def test_r2_finding8_state_changes_need_post_json_and_same_origin(tmp_path):
    """A web page's requests (another Origin, a form or text body, a DNS-rebound Host) and
    GETs cannot change state: clear the cache, reset metrics, set quotas or the log level.
    Each is refused with a 4xx JSON reply and L1 keeps its entry; the same requests from
    curl on the host (Host 127.0.0.1, no Origin or the same one, JSON body) work."""
    import os

    import faults_util as FU

    seg = FU.Segment(f"kvd_r2_f8_{os.getpid()}", FU.RAW_LAYER_BYTES)
    kvd = F.Kvd(tmp_path / "kvd.log").start()
    try:
        _store_one_chunk(kvd, seg.name, 27801, "f8model")
        assert kvd.get_json("/status")["l1"]["entries"] == 1
        port = kvd.http_port
        evil = {"Origin": "http://evil.example"}
        rebound = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
        attempts = [
            ("POST", "/clear-cache", None, evil),
            ("POST", "/clear-cache", None, {"Origin": "null"}),
            ("POST", "/clear-cache", None, rebound),
            ("POST", "/clear-cache", None, {"Host": f"evil.example:{port}"}),
            ("POST", "/cache/clear", b'{"tier": "l1"}', {"Content-Type": "text/plain"}),
            ("POST", "/cache/clear", b"tier=l1", {"Content-Type": "application/x-www-form-urlencoded"}),
            ("POST", "/cache/clear", b'{"tier": "l1"}', {"Content-Type": "multipart/form-data; boundary=x"}),
            ("POST", "/cache/clear", b'{"tier": "l1"}', {"Content-Type": "application/json", **evil}),
            ("POST", "/cache/clear", b'{"tier": "l1"}', {"Content-Type": "application/json", **rebound}),
            ("POST", "/metrics/reset", None, evil),
            ("PUT", "/quota/t", b'{"limit_gb": 1}', {"Content-Type": "text/plain"}),
            ("PUT", "/quota/t", b'{"limit_gb": 1}', {"Content-Type": "application/json", **evil}),
            ("DELETE", "/cache/objects", b'{"tier": "l1", "keys": []}', {"Content-Type": "text/plain"}),
            ("GET", "/loglevel?logger_name=kvd&level=debug", None, {}),
            ("GET", "/clear-cache", None, {}),
        ]
        for method, path, body, headers in attempts:
            status, reply = _admin_request(port, method, path, body, headers)
            assert 400 <= status < 500, (method, path, headers, status, reply[:200])
            assert isinstance(json.loads(reply), dict), (method, path, reply[:200])
        assert kvd.get_json("/status")["l1"]["entries"] == 1
        assert kvd.get_json("/quota")["users"] == {}
        assert "kvd: INFO" in kvd.get("/loglevel")[2]
        assert "set to DEBUG" not in kvd.log()

        # The same changes as an operator on the host makes them.
        ok = [
            ("POST", "/loglevel?logger_name=kvd&level=debug", None, {}),
            ("PUT", "/quota/t", b'{"limit_gb": 1}', {"Content-Type": "application/json"}),
            ("PUT", "/quota/t", b'{"limit_gb": 1}', {"Content-Type": "application/json; charset=utf-8",
                                                     "Origin": f"http://127.0.0.1:{port}"}),
            ("POST", "/metrics/reset", None, {"Host": f"localhost:{port}"}),
            ("POST", "/cache/clear", b'{"tier": "l1"}', {"Content-Type": "application/json",
                                                         "Origin": f"http://127.0.0.1:{port}"}),
        ]
        for method, path, body, headers in ok:
            status, reply = _admin_request(port, method, path, body, headers)
            assert status == 200, (method, path, status, reply[:200])
        assert kvd.get_json("/status")["l1"]["entries"] == 0
        assert "kvd: DEBUG" in kvd.get("/loglevel")[2]
    finally:
        kvd.stop()
        seg.close()


def test_r2_finding8_admin_token_is_required_and_sufficient(tmp_path):
    """--admin-token: every state change needs `Authorization: Bearer <token>` (401 without
    it or with another token, nothing changed) and needs nothing else; reads stay open."""
    import os

    import faults_util as FU

    seg = FU.Segment(f"kvd_r2_f8t_{os.getpid()}", FU.RAW_LAYER_BYTES)
    kvd = F.Kvd(tmp_path / "kvd.log", extra=["--admin-token", "s3cret-t0ken"]).start()
    try:
        _store_one_chunk(kvd, seg.name, 27802, "f8model")
        port = kvd.http_port
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-t0ken"},
                        {"Authorization": "Basic czNjcmV0LXQwa2Vu"}):
            status, reply = _admin_request(port, "POST", "/clear-cache", None, headers)
            assert status == 401, (headers, status, reply[:200])
        assert kvd.get_json("/status")["l1"]["entries"] == 1
        for path in ("/healthcheck", "/status", "/metrics", "/conf", "/quota", "/loglevel"):
            assert kvd.get(path)[0] == 200, path
        assert "s3cret" not in kvd.get("/conf")[2]
        # The token is enough, whatever Host or Origin say (a browser cannot send it across
        # origins without kvd's consent, which it never gives).
        status, reply = _admin_request(port, "POST", "/clear-cache", None,
                                       {"Authorization": "Bearer s3cret-t0ken",
                                        "Host": f"kvd.example:{port}"})
        assert status == 200, reply[:200]
        assert kvd.get_json("/status")["l1"]["entries"] == 0
    finally:
        kvd.stop()
        seg.close()


# ---------------------------------------------------------------------------------------
# Finding 11 (shutdown part): one SIGTERM with a hung Redis took 31 s, past a 30 s grace
# ---------------------------------------------------------------------------------------


def test_r2_finding11_sigterm_with_a_hung_redis_exits_within_the_grace(tmp_path):
    """A Redis stopped with SIGSTOP accepts connections (the kernel does) and never answers.
    kvd with store-behind writes to it still queued and in flight must exit 0 soon after one
    SIGTERM: what the tier has not answered within the tier's shutdown grace (5 s) is
    abandoned, counted and logged. Before: each write was retried on fresh connections, 5 s
    each, and the shutdown took over 30 s."""
    import os
    import signal
    import time

    from kvd_harness import ServerProc, TPCluster, free_port
    from tiers_util import Prompt, Redis, wait_until

    r = Redis().start()
    srv = None
    stopped = False
    try:
        adapter = json.dumps({"type": "resp", "host": "127.0.0.1", "port": r.port,
                              "num_workers": 2})
        log = tmp_path / "kvd-f11.log"
        srv = ServerProc(kind="kvd", port=free_port(), l1_size_gb=0.25, log_path=log,
                         extra_args=["--l2-adapter", adapter]).start()
        c = TPCluster(srv.url, "lmcache_driven", "org/Hung-Redis-1", tp=2)
        a = Prompt(c, chunks=2, seed=1101)
        a.store(c, "f11-a")
        wait_until(lambda: len(r.keys()) == 4, what="4 objects in redis")
        os.killpg(r.proc.pid, signal.SIGSTOP)
        stopped = True
        b = Prompt(c, chunks=4, seed=1102)  # 8 writes to the hung server
        b.store(c, "f11-b")
        c.close()
        time.sleep(0.5)  # the writes reach the tier's workers
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        try:
            rc = srv.proc.wait(timeout=60)
        except Exception:  # noqa: BLE001
            rc = None
        took = time.monotonic() - t0
        assert rc == 0 and took < 10, (f"SIGTERM with a hung Redis: exit {rc} after {took:.1f} s\n"
                                       + srv.log_tail())
        text = log.read_text(errors="replace")
        assert "abandoned" in text, srv.log_tail()
    finally:
        if stopped:
            os.killpg(r.proc.pid, signal.SIGCONT)
        if srv is not None:
            srv.stop()
        r.close()


# ---------------------------------------------------------------------------------------
# Finding 6: memory per client-controlled size (uid frames, request ids) was unbounded
# ---------------------------------------------------------------------------------------


def _metric(http_port: int, name: str) -> float:
    """The value of one unlabelled series on /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not on /metrics")


def test_r2_finding6_oversized_uid_frames_are_dropped_and_open_no_stream(tmp_path):
    """lmcache's request uid is a msgpack int (at most 9 bytes). A KV-event subscription whose
    uid frame is 16 MiB used to open a stream that kept the frame (+37 MB each, up to 4,096
    streams); a PING with one got its 16 MiB echoed back. Both are now dropped before anything
    is kept, and the connection keeps working."""
    import msgspec

    import faults_util as FU

    with FU.kvd_server(tmp_path) as srv:
        c = FU.RawClient(srv.url)
        try:
            enc = msgspec.msgpack.encode
            big_uid = b"\x00" * (16 << 20)
            for i in range(4):
                c.sock.send_multipart([big_uid, enc("subscribe_kv_events"), enc(9000 + i),
                                       enc("r2-uid-model"), enc(0), enc(16)])
            c.sock.send_multipart([big_uid, enc(FU.OP["ping"])])
            # A normal request on the same connection, sent after them, is answered; nothing
            # answers the 16 MiB uids.
            c.sock.send_multipart([enc(77), enc(FU.OP["ping"])])
            uids = []
            while c.sock.poll(2000):
                frames = c.sock.recv_multipart()
                uids.append(frames[0] if len(frames[0]) <= 16 else f"{len(frames[0])} bytes")
            assert uids == [enc(77)], uids
            assert _metric(srv.http_port, "kvd_kv_events_subscribers") == 0
            assert srv.alive()
        finally:
            c.close()


def test_r2_finding6_request_ids_over_1_kib_are_refused_and_hold_nothing(tmp_path):
    """A LOOKUP that hits keeps a read-lock hold keyed by its request id for the read TTL
    (300 s). ~1 MiB request ids used to be kept as sent (+1 MB each). Ids over 1 KiB are now
    refused by the decoder (the lookup answers as a failed one and locks nothing); 1 KiB
    still works."""
    import os

    import faults_util as FU

    seg = FU.Segment(f"kvd_r2_rid_{os.getpid()}", FU.RAW_LAYER_BYTES)
    try:
        with FU.kvd_server(tmp_path) as srv:
            c = FU.RawClient(srv.url)
            try:
                model = "r2-rid-model"
                FU.register_raw(c, 27601, model, "/" + seg.name)
                toks = [9100 + i for i in range(H.CHUNK_SIZE)]
                key = FU.cache_key(model, 1, 0, toks, 0, H.CHUNK_SIZE, FU.rid("rid"))
                assert c.call("store", key, 27601, [list(range(16))], b"") == [b"", True]
                def lookup(request_id: str):
                    """LOOKUP, then QUERY_PREFETCH_STATUS until it answers (None: still running)."""
                    import time

                    got = c.call("lookup", FU.cache_key(model, 1, None, toks, 0, H.CHUNK_SIZE,
                                                        request_id), 1)
                    deadline = time.monotonic() + 10
                    while got is None and time.monotonic() < deadline:
                        time.sleep(0.05)
                        got = c.call("query_prefetch_status", request_id)
                    return got

                for i in range(8):
                    # Just under the msgpack reader's 1 MiB string bound, which came first.
                    lookup(f"{i}-" + "x" * ((1 << 20) - 64))
                assert srv.l1()["lookup_locks"] == 0, srv.l1()
                assert lookup("y" * 1024) == 1  # one chunk
                assert srv.l1()["lookup_locks"] == 1, srv.l1()
                c.call("unregister_kv_cache", 27601)
            finally:
                c.close()
            assert srv.alive()
    finally:
        seg.close()
