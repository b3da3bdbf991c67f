"""CacheBlend (`--engine-type blend`) end to end through the real lmcache 0.5.6 client.

A vLLM-like TP=1 worker (CpuShmTensorWrapper KV registration, FlashAttention layout bf16)
stores a system prompt followed by a document; a later prompt holds the same document after
a different prefix. The lmcache RequestClient stubs then send the blend ops as the blend
connector would: cb_protocol_handshake, cb_register_rope (a NeoX cos/sin cache in POSIX shared
memory), cb_unified_lookup (polled while it answers None), cb_retrieve_pre_computed. The
document's KV must land in the new blocks with V byte-identical and K re-rotated from its
stored positions to the new ones, and /metrics must count it in the lmcache_blend_* families.
kvd only: lmcache's own blend server has no CPU scatter (it answers scatter_ran=False).
"""

from __future__ import annotations

import time
import urllib.request

import pytest
import torch

import kvd_harness as H

CHUNK = H.CHUNK_SIZE
BS = H.BLOCK_SIZE
BPC = CHUNK // BS
HEAD = 64
MODEL = "blend-model"
HTTP_PORT = H.free_port()
SERVER_L1_GB = 0.25
SERVER_EXTRA_ARGS = ["--engine-type", "blend", "--http-port", str(HTTP_PORT)]
SHAPE = H.ModelShape(num_layers=2, num_blocks=72, block_size=BS, num_kv_heads=2, head_size=HEAD)

pytestmark = pytest.mark.skipif(H.server_kind() != "kvd",
                                reason="lmcache's blend server has no CPU scatter")


def rope_cache(max_pos: int, rot_dim: int) -> torch.Tensor:
    """vLLM's NeoX cos/sin cache: [max_pos, rot_dim], cosines then sines, float32."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).contiguous()


def rotate_neox(k: torch.Tensor, cache: torch.Tensor, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """K [tokens, heads, HEAD] from positions `old` to `new` (per token), in float64."""
    half = HEAD // 2
    c = cache.double()
    oc, os_ = c[old, :half], c[old, half:]
    nc, ns = c[new, :half], c[new, half:]
    dcos = (nc * oc + ns * os_)[:, None, :]
    dsin = (ns * oc - nc * os_)[:, None, :]
    x = k.double()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * dcos - x2 * dsin, x2 * dcos + x1 * dsin], dim=-1)


def metrics() -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{HTTP_PORT}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("lmcache_blend_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_document_after_another_prefix_is_found_and_scattered_re_rotated(server):
    from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey  # noqa: PLC0415
    from lmcache.v1.platform.devices.cpu.shm import CpuShmTensorWrapper  # noqa: PLC0415

    def key(tokens: list[int], rid: str, worker: int | None) -> IPCCacheServerKey:
        return IPCCacheServerKey(model_name=MODEL, world_size=1, worker_id=worker,
                                 token_ids=tuple(tokens), start=0, end=len(tokens) // CHUNK * CHUNK,
                                 request_id=rid, num_kv_readers=1)

    c = H.TPCluster(server.url, "lmcache_driven", MODEL, tp=1, shape=SHAPE, heartbeat_interval=600.0)
    client = None
    try:
        client = H.make_request_client(server.url)
        iid = c.workers[0].instance_id
        assert tuple(client.cb_protocol_handshake(1).result(timeout=10)) == (1, True)
        cache = rope_cache(4096, HEAD)
        shared = cache.clone()  # wrap() moves its storage into POSIX SHM, unlinked when it dies
        cos_sin = CpuShmTensorWrapper.wrap(shared)
        assert client.cb_register_rope(iid, [cos_sin], HEAD, True, [0], [[0, HEAD]], [HEAD]).result(timeout=30) is None

        system, doc = H.unique_tokens(CHUNK, salt=1), H.unique_tokens(CHUNK, salt=2)
        src = list(range(1, 1 + 2 * BPC))  # system in 1..16, doc in 17..32
        c.fill_random(0, src, seed=77)
        stored = c.snapshot_blocks(0, src)
        assert c.store("blend-store", system + doc, src) == [True]
        c.end_session("blend-store")
        before = metrics()

        # Another prefix (two new chunks), then the same document: at 512, stored at 256.
        prompt = H.unique_tokens(CHUNK, salt=3) + H.unique_tokens(CHUNK, salt=4) + doc
        res, deadline = None, time.monotonic() + 20
        while res is None and time.monotonic() < deadline:
            res = client.cb_unified_lookup(key(prompt, "blend-q", None), 1).result(timeout=10)
        assert res is not None, "cb_unified_lookup never answered"
        assert res.prefix_coverage_tokens == 0
        segs = [(m.old_st, m.old_ed, m.cur_st, m.cur_ed) for m in res.non_prefix_segments]
        assert segs == [(256, 512, 512, 768)], segs

        dst = list(range(24, 72))  # positions 512..767 land in blocks 56..71
        c.zero_blocks(0, dst)
        handle, ran = client.cb_retrieve_pre_computed(key(prompt, "blend-q", 0), res.non_prefix_segments,
                                                      [dst], iid, b"").result(timeout=30)
        assert ran is True
        got = c.snapshot_blocks(0, dst[32:48])
        positions = torch.arange(CHUNK)
        for layer, (g, s) in enumerate(zip(got, stored)):
            src_doc = s[:, BPC:2 * BPC]  # [2, 16 blocks, BS, H, D]
            assert torch.equal(g[1].view(torch.int16), src_doc[1].view(torch.int16)), f"layer {layer}: V differs"
            k_old = src_doc[0].reshape(CHUNK, SHAPE.num_kv_heads, HEAD)
            k_new = g[0].reshape(CHUNK, SHAPE.num_kv_heads, HEAD)
            ref = rotate_neox(k_old, cache, 256 + positions, 512 + positions)
            err = (k_new.double() - ref).abs().max().item()
            assert err <= 2 ** -6 * max(1.0, ref.abs().max().item()), f"layer {layer}: K off by {err}"
            assert not torch.equal(k_new.view(torch.int16), k_old.view(torch.int16)), "K was not rotated"
        # A repeated call is a no-op that still answers True.
        _, again = client.cb_retrieve_pre_computed(key(prompt, "blend-q", 0), res.non_prefix_segments,
                                                   [dst], iid, b"").result(timeout=30)
        assert again is True
        c.end_session("blend-q")

        after = metrics()
        def moved(name: str) -> float:
            return after.get(name, 0.0) - before.get(name, 0.0)
        assert after.get("lmcache_blend_fingerprints_registered_total", 0) >= 2
        assert moved("lmcache_blend_lookup_requests_total") >= 1
        assert moved("lmcache_blend_lookup_non_prefix_hit_tokens_total") == CHUNK
        assert moved("lmcache_blend_retrieve_chunks_total") == 1
        assert moved("lmcache_blend_scatter_tokens_total") == CHUNK
        client.cb_unregister_rope(iid).result(timeout=10)
    finally:
        if client is not None:
            client.close()
        c.close()
