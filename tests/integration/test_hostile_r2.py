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
