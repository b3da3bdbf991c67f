"""CacheBlend, differential: the same traffic to `lmcache server --engine-type blend` (0.5.6,
CPU) and to `kvd server --engine-type blend --blend-lmcache-parity`, through the real lmcache
client stubs. Every reply must be equal (handshakes; cb_unified_lookup's prefix coverage and
every non-prefix segment with its positions and storage-key bytes; with
--enable-blend-reorder on both, every cb_reorder_plan answer), except the retrieve:
lmcache has no CPU scatter and answers scatter_ran=False, kvd scatters and answers True.

Then kvd's default mode on the same traffic: it differs from lmcache only where
docs/cacheblend.md says it does (chunk 0 of a stored prompt is matchable).
"""

from __future__ import annotations

import time

import pytest
import torch

import kvd_harness as H

CHUNK = H.CHUNK_SIZE
BS = H.BLOCK_SIZE
BPC = CHUNK // BS
HEAD = 64
MODEL = "blend-diff"
SHAPE = H.ModelShape(num_layers=2, num_blocks=112, block_size=BS, num_kv_heads=2, head_size=HEAD)

pytestmark = pytest.mark.skipif(H.server_kind() != "kvd", reason="starts both servers itself")


def _tokens() -> dict[str, list[int]]:
    names = ["sys", "sys2", "sysx", "a", "b", "c", "miss", "junk"]
    t = {n: H.unique_tokens(CHUNK, salt=i + 11) for i, n in enumerate(names)}
    t["junk"] = t["junk"][:17]
    return t


def _rope_cache(max_pos: int = 4096) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, HEAD, 2, dtype=torch.float32) / HEAD))
    f = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv)
    return torch.cat([f.cos(), f.sin()], dim=-1).contiguous()


def _traffic(url: str, t: dict[str, list[int]], tag: str, reorder: bool = False) -> list:
    """Runs the scripted traffic; returns what each reply said, in order. With `reorder`
    (the server runs with --enable-blend-reorder) it asks for reorder plans too."""
    from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey  # noqa: PLC0415
    from lmcache.v1.platform.devices.cpu.shm import CpuShmTensorWrapper  # noqa: PLC0415

    def key(tokens, rid, worker):
        return IPCCacheServerKey(model_name=MODEL, world_size=1, worker_id=worker, token_ids=tuple(tokens),
                                 start=0, end=len(tokens) // CHUNK * CHUNK, request_id=rid, num_kv_readers=1)

    out: list = []
    c = H.TPCluster(url, "lmcache_driven", MODEL, tp=1, shape=SHAPE, heartbeat_interval=600.0)
    client = H.make_request_client(url)
    try:
        iid = c.workers[0].instance_id
        out.append(("handshake 1", tuple(client.cb_protocol_handshake(1).result(timeout=20))))
        out.append(("handshake 2", tuple(client.cb_protocol_handshake(2).result(timeout=20))))
        cache = _rope_cache()
        shared = cache.clone()  # wrap() moves its storage into POSIX SHM, unlinked when it dies
        cos_sin = CpuShmTensorWrapper.wrap(shared)
        out.append(("rope", client.cb_register_rope(iid, [cos_sin], HEAD, True, [0], [[0, HEAD]],
                                                    [HEAD]).result(timeout=60)))
        blocks = list(range(1, 1 + 3 * BPC))
        c.fill_random(0, blocks, seed=5)
        assert c.store(f"{tag}-s1", t["sys"] + t["a"] + t["b"], blocks) == [True]
        c.end_session(f"{tag}-s1")
        assert c.store(f"{tag}-s2", t["sys2"] + t["c"], blocks[: 2 * BPC]) == [True]
        c.end_session(f"{tag}-s2")
        # lmcache registers a store's fingerprints on a background thread after the STORE
        # has answered; a lookup right after can miss them (about 1 run in 5 here). Both
        # servers get the same pause, so the replies compared are the settled ones.
        time.sleep(1.0)

        prompts = {
            "permuted": t["sysx"] + t["b"] + t["a"],
            "prefix-then-other": t["sys"] + t["b"] + t["c"],
            "doc-first": t["a"] + t["sys"],
            "unaligned": t["junk"] + t["a"] + t["miss"],
            "miss": t["miss"] + t["sysx"],
        }
        results = {}
        for name, prompt in prompts.items():
            rid = f"{tag}-{name}"
            res, deadline = None, time.monotonic() + 30
            while res is None and time.monotonic() < deadline:
                res = client.cb_unified_lookup(key(prompt, rid, None), 1).result(timeout=20)
            assert res is not None, f"{name}: no answer"
            segs = [(m.old_st, m.old_ed, m.cur_st, m.cur_ed, bytes(m.hash)) for m in res.non_prefix_segments]
            tail = [(m.old_st, m.cur_st, bytes(m.hash)) for m in res.segmented_prefix_segments]
            out.append((f"lookup {name}", res.prefix_coverage_tokens, segs, tail))
            results[name] = (prompt, rid, res)
        if reorder:
            # Stored: sys + a + b and sys2 + c. Prompts made of their documents in another
            # order, a question (miss) last; keep_prefix keeps sys in place.
            asks = {
                "reordered": (t["sys"] + t["b"] + t["a"] + t["miss"], 0),
                "reordered-keep": (t["sys"] + t["b"] + t["a"] + t["miss"], CHUNK),
                "two-docs": (t["c"] + t["sys2"] + t["miss"], 0),
                "permuted": (prompts["permuted"], 0),
                "keep-mismatch": (t["c"] + t["sys2"] + t["miss"], 5),
            }
            for name, (p, keep) in asks.items():
                plan = client.cb_reorder_plan(key(p, f"{tag}-ro-{name}", None), keep, 5000).result(timeout=60)
                out.append((f"reorder {name}", list(plan)))
        # The retrieve of the permuted prompt into fresh blocks.
        prompt, rid, res = results["permuted"]
        dst = list(range(1 + 3 * BPC, 1 + 6 * BPC))
        _, ran = client.cb_retrieve_pre_computed(key(prompt, rid, 0), res.non_prefix_segments, [dst], iid,
                                                 b"").result(timeout=60)
        out.append(("retrieve ran", ran))
        for _, rid, _ in results.values():
            c.end_session(rid)
        client.cb_unregister_rope(iid).result(timeout=20)
    finally:
        client.close()
        c.close()
    return out


def _server(tmp_path, kind: str, extra: list[str]) -> H.ServerProc:
    return H.ServerProc(kind=kind, port=H.free_port(), l1_size_gb=0.5,
                        log_path=tmp_path / f"{kind}.log", extra_args=extra).start(ready_timeout=120)


def test_kvd_parity_mode_answers_as_lmcache_blend_server(tmp_path):
    t = _tokens()
    ref = _server(tmp_path, "lmcache", ["--engine-type", "blend", "--enable-blend-reorder"])
    try:
        want = _traffic(ref.url, t, "ref", reorder=True)
    finally:
        ref.stop()
    kvd = _server(tmp_path, "kvd", ["--engine-type", "blend", "--blend-lmcache-parity",
                                    "--enable-blend-reorder"])
    try:
        got = _traffic(kvd.url, t, "kvd", reorder=True)
        assert kvd.alive()
    finally:
        kvd.stop()
    assert want[-1] == ("retrieve ran", False), want[-1]  # lmcache: no CPU scatter
    assert got[-1] == ("retrieve ran", True), got[-1]
    assert got[:-1] == want[:-1]
    # The traffic means something: lmcache itself found non-prefix segments, at aligned and
    # unaligned positions, and a prefix.
    lookups = {w[0]: w for w in want if w[0].startswith("lookup")}
    assert [s[:4] for s in lookups["lookup permuted"][2]] == [(512, 768, 256, 512), (256, 512, 512, 768)]
    assert lookups["lookup prefix-then-other"][1] == CHUNK
    assert [s[2] for s in lookups["lookup unaligned"][2]] == [17]
    assert lookups["lookup miss"][2] == []
    # lmcache's planner reordered the prompts made of stored documents, and kvd's did the same.
    plans = {w[0]: w[1] for w in want if w[0].startswith("reorder")}
    assert plans["reorder reordered"] == t["sys"] + t["a"] + t["b"] + t["miss"]
    assert plans["reorder reordered-keep"] == plans["reorder reordered"]
    assert plans["reorder two-docs"] == t["sys2"] + t["c"] + t["miss"]
    assert plans["reorder keep-mismatch"] == []


def test_kvd_default_mode_differs_only_where_documented(tmp_path):
    """Default mode (chunk 0 matchable): the document stored first, at position 0, is found
    after another prefix; the rest equals parity mode."""
    t = _tokens()
    parity = _server(tmp_path, "kvd", ["--engine-type", "blend", "--blend-lmcache-parity"])
    try:
        want = _traffic(parity.url, t, "par")
    finally:
        parity.stop()
    kvd = _server(tmp_path, "kvd", ["--engine-type", "blend"])
    try:
        got = _traffic(kvd.url, t, "def")
    finally:
        kvd.stop()
    g = {x[0]: x for x in got}
    w = {x[0]: x for x in want}
    # "doc-first" = a + sys: sys was chunk 0 of a stored prompt; only the default mode finds it.
    assert [s[:4] for s in w["lookup doc-first"][2]] == [(256, 512, 0, 256)]
    assert [s[:4] for s in g["lookup doc-first"][2]] == [(256, 512, 0, 256), (0, 256, 256, 512)]
    for name in w:
        if name != "lookup doc-first":
            assert g[name] == w[name], name
