"""GET and DELETE /cache/objects and POST /cache/prefetches against kvd with an fs tier, next
to the real `lmcache server` 0.5.6 with the same adapter: kvd's answers reflect the tier it is
configured with (its objects, their lmcache file names and sizes; deleting removes the files
and the accounting), and where both servers can answer, kvd answers as the reference does
(adapter selection errors word for word, the delete reply's shape).

Where they differ (docs/operations.md): lmcache's fs adapter cannot list (503), kvd lists
what the tier holds; kvd's warm prefetch over HTTP answers 501 with tiers (a LOOKUP loads
from them).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from kvd_harness import ServerProc, TPCluster, free_port
from tiers_util import Prompt, wait_until

MODEL = "org/Http-Tier-Model"


def call(port: int, method: str, path: str, body=None) -> tuple[int, object]:
    data = json.dumps(body).encode() if body is not None else (b"" if method != "GET" else None)
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def file_name(key: dict) -> str:
    """lmcache's fs object name of an EncodedObjectKey."""
    name = (f"{key['model_name'].replace('/', '-SEP-')}@0x{key['kv_rank']:08x}@"
            f"{key['object_group_id']:x}@{key['chunk_hash_hex']}")
    if key["cache_salt"]:
        name += "@" + key["cache_salt"]
    return name + ".data"


def data_files(d: str) -> dict[str, int]:
    return {f: os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".data")}


def shape(v):
    if isinstance(v, dict):
        return {k: shape(x) for k, x in v.items()}
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    return type(v).__name__


@pytest.fixture
def servers(tmp_path: Path):
    dirs = [tempfile.mkdtemp(prefix="kvd-http-tier-") for _ in range(2)]
    procs = []
    ports = {}
    try:
        for kind, d in (("kvd", dirs[0]), ("lmcache", dirs[1])):
            http = free_port()
            extra = ["--l2-adapter", json.dumps({"type": "fs", "base_path": d}),
                     "--http-host", "127.0.0.1", "--http-port", str(http)]
            srv = ServerProc(kind=kind, port=free_port(), l1_size_gb=0.25,
                             log_path=tmp_path / f"{kind}.log", extra_args=extra)
            procs.append(srv.start())
            ports[kind] = http
        deadline = time.monotonic() + 60
        while True:
            try:
                if call(ports["lmcache"], "GET", "/healthcheck")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the reference's HTTP API did not come up"
            time.sleep(0.2)
        yield procs[0], ports["kvd"], ports["lmcache"], dirs[0]
    finally:
        for p in procs:
            p.stop()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def test_cache_objects_list_and_delete_what_the_fs_tier_holds(servers):
    kvd, kvd_http, ref_http, tier_dir = servers
    cluster = TPCluster(kvd.url, "lmcache_driven", MODEL, tp=2)
    try:
        Prompt(cluster, chunks=3, seed=5).store(cluster, "http-tier-1")
        wait_until(lambda: len(data_files(tier_dir)) == 6, timeout=30, what="6 objects on disk")

        st, page = call(kvd_http, "GET", "/cache/objects")
        assert st == 200, page
        assert page["adapter"] == "fs" and page["shared"] is False
        assert page["next_page_token"] is None
        on_disk = data_files(tier_dir)
        listed = {file_name(e["key"]): e["size_bytes"] for e in page["entries"]}
        assert listed == on_disk, "every object of the tier, under lmcache's name, with its size"
        assert {e["key"]["model_name"] for e in page["entries"]} == {MODEL}
        assert {e["key"]["kv_rank"] for e in page["entries"]} == {0x02000200, 0x02010201}

        st, first = call(kvd_http, "GET", "/cache/objects?page_size=4")
        assert st == 200 and len(first["entries"]) == 4 and first["next_page_token"]
        st, rest = call(kvd_http, "GET", f"/cache/objects?page_size=4&page_token={first['next_page_token']}")
        assert st == 200 and len(rest["entries"]) == 2 and rest["next_page_token"] is None
        assert {file_name(e["key"]) for e in first["entries"] + rest["entries"]} == set(on_disk)
        assert call(kvd_http, "GET", "/cache/objects?model_name=other")[1]["entries"] == []

        # The reference's fs adapter cannot list (the difference docs/operations.md names).
        st, ref = call(ref_http, "GET", "/cache/objects")
        assert st == 503 and "does not support listing" in ref["detail"]
        # Adapter selection: the same status and words.
        for path in ["/cache/objects?adapter=resp"]:
            assert call(kvd_http, "GET", path) == call(ref_http, "GET", path)
        bad = {"keys": [], "adapter": "resp"}
        assert call(kvd_http, "DELETE", "/cache/objects", bad) == call(ref_http, "DELETE", "/cache/objects", bad)

        victims = [e["key"] for e in page["entries"][:2]]
        st, got = call(kvd_http, "DELETE", "/cache/objects", {"tier": "l2", "keys": victims})
        assert st == 200 and got == {"deleted": 2, "skipped": 0, "ok": True}, got
        assert set(data_files(tier_dir)) == set(on_disk) - {file_name(k) for k in victims}
        assert len(call(kvd_http, "GET", "/cache/objects")[1]["entries"]) == 4
        st, again = call(kvd_http, "DELETE", "/cache/objects", {"keys": victims})
        assert st == 200 and again["deleted"] == 0, "already gone"
        st, ref = call(ref_http, "DELETE", "/cache/objects", {"tier": "l2", "keys": victims})
        assert st == 200 and shape(ref) == shape(got), (ref, got)

        # POST /metrics/reset: counters count from zero again, gauges stay.
        def scrape() -> dict[str, float]:
            with urllib.request.urlopen(f"http://127.0.0.1:{kvd_http}/metrics", timeout=10) as r:
                lines = r.read().decode().splitlines()
            return {l.rsplit(" ", 1)[0]: float(l.rsplit(" ", 1)[1]) for l in lines if l and l[0] != "#"}
        before = scrape()
        stores = 'lmcache_mp_num_submitted_stores_total{device="cpu"}'
        assert before[stores] == 2  # one STORE per rank
        assert before["lmcache_mp_l1_write_chunks_total"] == 6
        req = urllib.request.Request(f"http://127.0.0.1:{kvd_http}/metrics/reset", method="POST", data=b"")
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200 and r.read() == b"ok"
        after = scrape()
        assert after[stores] == 0
        assert after["lmcache_mp_l1_write_chunks_total"] == 0
        assert after["lmcache_mp_l1_memory_usage_bytes"] == before["lmcache_mp_l1_memory_usage_bytes"] > 0

        # A registered model with a full chunk: kvd has tiers but no warm prefetch over HTTP.
        tokens = list(range(256))
        body = {"model_name": MODEL, "world_size": 2, "token_ids": tokens}
        st, pre = call(kvd_http, "POST", "/cache/prefetches", body)
        assert st == 501 and "1 configured L2 adapter" in pre["detail"], pre
        st, noop = call(kvd_http, "POST", "/cache/prefetches", dict(body, token_ids=tokens[:10]))
        assert (st, noop) == (202, {"chunks": 0, "status": "noop"})
        st, unreg = call(kvd_http, "POST", "/cache/prefetches", dict(body, world_size=4))
        assert st == 503 and "no layout registered for model_name=" in unreg["detail"]
    finally:
        cluster.close()
