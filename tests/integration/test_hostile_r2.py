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
