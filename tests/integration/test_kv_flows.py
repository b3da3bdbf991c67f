"""End-to-end KV flows driven by the real lmcache 0.5.6 vLLM adapters.

Each test runs for both transfer modes (the `cluster` fixture is
parametrized): lmcache_driven (CpuShmTensorWrapper registration, the server
copies between the workers' SHM-backed KV tensors and L1) and engine_driven
(prepare/commit; the workers copy through the server's SHM pool).

Deployment emulated: vLLM TP=2 (world size 2), one server, a Llama-like
model with 4 layers, FlashAttention layout [2, 128 blocks, 16, 2 heads, 64]
bf16 per layer, chunk size 256 (16 blocks per chunk).
"""

from __future__ import annotations

import itertools

import pytest
import torch

import kvd_harness as H

CHUNK = H.CHUNK_SIZE
BS = H.BLOCK_SIZE
BPC = CHUNK // BS  # blocks per chunk

_ids = itertools.count()


def rid(tag: str) -> str:
    """A request id never used before (the reference server caches chunk
    hashes per request id, so ids must be unique per prompt)."""
    return f"{tag}-{next(_ids)}"


def blocks(first: int, n: int) -> list[int]:
    return list(range(first, first + n))


def as_bits(t: torch.Tensor) -> torch.Tensor:
    """Bitwise view (compare raw bytes, not float values)."""
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.uint8)


def assert_same_bytes(actual: list[torch.Tensor], expected: list[torch.Tensor], what: str) -> None:
    assert len(actual) == len(expected)
    for layer, (a, e) in enumerate(zip(actual, expected)):
        assert a.shape == e.shape, (what, layer, a.shape, e.shape)
        same = as_bits(a) == as_bits(e)
        if not bool(same.all()):
            bad = (~same).nonzero()
            raise AssertionError(
                f"{what}: layer {layer}: {int((~same).sum())} of {same.numel()} elements "
                f"differ; first differing index {tuple(bad[0].tolist())}"
            )


def store_prompt(c: H.TPCluster, n_tokens: int, src_first: int = 1, seed: int | None = None,
                 tokens: list[int] | None = None):
    """A vLLM request that misses, computes its KV (random data in the source
    blocks) and stores all its full chunks from both ranks.

    Returns (tokens, src_blocks, per-rank snapshots of the stored blocks).
    """
    toks = tokens if tokens is not None else H.unique_tokens(n_tokens)
    n_full = len(toks) // CHUNK
    src = blocks(src_first, n_full * BPC)
    seed = seed if seed is not None else (toks[0] % 100_000)
    for r in range(c.tp):
        c.fill_random(r, src, seed=seed * 10 + r)
    expected = [c.snapshot_blocks(r, src) for r in range(c.tp)]
    req = rid("store")
    assert c.lookup(req, toks) == 0, "fresh prompt must miss before it is stored"
    results = c.store(req, toks, src)
    c.end_session(req)
    assert results == [True] * c.tp, f"store results per rank: {results}"
    seen = c.wait_for_hit(toks, n_full * CHUNK)
    assert seen == n_full * CHUNK, f"stored {n_full} chunks but lookups see {seen} tokens"
    return toks, src, expected


def expected_after_retrieve(before: list[torch.Tensor], dst: list[int], data: list[torch.Tensor]):
    """Whole-tensor expectation: `before` with blocks `dst` replaced by `data`."""
    idx = torch.tensor(dst, dtype=torch.long)
    out = []
    for t, d in zip(before, data):
        e = t.clone()
        e[:, idx] = d
        out.append(e)
    return out


# ---------------------------------------------------------------------------
# (a) store full chunks from both TP workers, lookup, retrieve, compare bytes
# ---------------------------------------------------------------------------


def test_store_lookup_retrieve_roundtrip(cluster, check_server_alive):
    c = cluster
    toks, src, expected = store_prompt(c, 3 * CHUNK + 100)  # 3 full chunks + partial tail

    req = rid("load")
    hit = c.lookup(req, toks)
    assert hit == 3 * CHUNK, f"expected exactly the 3 full chunks to hit, got {hit} tokens"

    dst = blocks(64, 3 * BPC)  # other blocks, freshly zeroed
    for r in range(c.tp):
        c.zero_blocks(r, dst)
    before = [c.full_snapshot(r) for r in range(c.tp)]
    ok = c.retrieve(req, toks, dst, end=hit)
    c.end_session(req)
    assert ok == [True] * c.tp, f"retrieve results per rank: {ok}"
    for r in range(c.tp):
        assert_same_bytes(c.snapshot_blocks(r, dst), expected[r], f"rank {r} retrieved blocks")
        # Nothing outside the destination blocks may change.
        want = expected_after_retrieve(before[r], dst, expected[r])
        assert_same_bytes(c.full_snapshot(r), want, f"rank {r} whole KV cache after retrieve")


def test_partial_tail_is_not_stored(cluster, check_server_alive):
    c = cluster
    toks, _src, _exp = store_prompt(c, 3 * CHUNK + 100)
    # Complete the partial 4th chunk with new tokens: if the server had kept
    # anything for the 100-token tail, a 4th chunk could hit.
    longer = toks + H.unique_tokens(CHUNK - 100)
    req = rid("tail")
    assert c.lookup(req, longer) == 3 * CHUNK
    c.scheduler.free_lookup_locks(longer, 0, 3 * CHUNK, req)
    c.end_session(req)


def test_incremental_store_across_steps(cluster, check_server_alive):
    """vLLM stores a long prefill in several steps: [0,512) then [512,768)."""
    c = cluster
    toks = H.unique_tokens(3 * CHUNK + 7)
    src = blocks(1, 3 * BPC)
    for r in range(c.tp):
        c.fill_random(r, src, seed=4242 + r)
    expected = [c.snapshot_blocks(r, src) for r in range(c.tp)]
    req = rid("incr")
    assert c.lookup(req, toks) == 0
    assert c.store(req, toks, src[: 2 * BPC], start=0, end=2 * CHUNK) == [True, True]
    assert c.store(req, toks, src[2 * BPC:], start=2 * CHUNK, end=3 * CHUNK) == [True, True]
    c.end_session(req)
    assert c.wait_for_hit(toks, 3 * CHUNK) == 3 * CHUNK

    req2 = rid("incr-load")
    assert c.lookup(req2, toks) == 3 * CHUNK
    dst = blocks(70, 3 * BPC)
    for r in range(c.tp):
        c.zero_blocks(r, dst)
    assert c.retrieve(req2, toks, dst, end=3 * CHUNK) == [True, True]
    c.end_session(req2)
    for r in range(c.tp):
        assert_same_bytes(c.snapshot_blocks(r, dst), expected[r], f"rank {r}")


# ---------------------------------------------------------------------------
# (b) shared prefix of 2 chunks, then divergence
# ---------------------------------------------------------------------------


def test_shared_prefix_hits_exactly_two_chunks(cluster, check_server_alive):
    c = cluster
    toks, _src, expected = store_prompt(c, 3 * CHUNK + 50)
    other = toks[: 2 * CHUNK] + H.unique_tokens(CHUNK + 80)  # diverges in chunk 2
    assert other[2 * CHUNK] != toks[2 * CHUNK]

    req = rid("prefix")
    hit = c.lookup(req, other)
    assert hit == 2 * CHUNK, f"shared 2-chunk prefix must hit 512 tokens, got {hit}"

    dst = blocks(80, 2 * BPC)
    for r in range(c.tp):
        c.zero_blocks(r, dst)
    assert c.retrieve(req, other, dst, end=hit) == [True, True]
    c.end_session(req)
    for r in range(c.tp):
        want = [e[:, : 2 * BPC] for e in expected[r]]
        assert_same_bytes(c.snapshot_blocks(r, dst), want, f"rank {r} shared-prefix blocks")


def test_diverging_first_chunk_misses(cluster, check_server_alive):
    c = cluster
    toks, _src, _exp = store_prompt(c, 2 * CHUNK)
    other = list(toks)
    other[5] += 1  # one token differs inside chunk 0 -> chained hashes all differ
    req = rid("div0")
    assert c.lookup(req, other) == 0
    c.end_session(req)


# ---------------------------------------------------------------------------
# (c) unknown prompt, end_session
# ---------------------------------------------------------------------------


def test_unknown_prompt_misses_and_end_session(cluster, server, check_server_alive):
    c = cluster
    toks = H.unique_tokens(4 * CHUNK + 3)
    req = rid("unknown")
    assert c.lookup(req, toks) == 0
    # The adapter sends END_SESSION fire-and-forget; send one more through a
    # real RequestClient to see the server answer it.
    c.end_session(req)
    client = H.make_request_client(server.url)
    try:
        assert client.end_session(req).result(timeout=15) is None
        assert client.end_session(rid("never-seen")).result(timeout=15) is None
        assert client.ping(None).result(timeout=15) is True
    finally:
        client.close()
    # A lookup shorter than one chunk hits nothing and must still finish.
    req2 = rid("short")
    assert c.lookup(req2, toks[:100]) == 0
    c.end_session(req2)


# ---------------------------------------------------------------------------
# (e) a chunk stored by only one TP rank is not a hit
# ---------------------------------------------------------------------------


def test_chunk_stored_by_one_rank_only_is_not_a_hit(cluster, check_server_alive):
    c = cluster
    toks = H.unique_tokens(3 * CHUNK)
    src = blocks(1, 3 * BPC)
    for r in range(c.tp):
        c.fill_random(r, src, seed=777 + r)
    req = rid("one-rank")
    assert c.lookup(req, toks) == 0
    assert c.store(req, toks, src, ranks=(0,)) == [True]  # rank 1 never stores
    c.end_session(req)
    c.settle()  # rank 0's objects are committed by now
    req2 = rid("one-rank-look")
    assert c.lookup(req2, toks) == 0, "rank 1 has no object for any chunk: no hit"
    c.end_session(req2)

    # Both ranks store chunks 0-1, only rank 1 stores chunk 2: 2 chunks hit.
    toks2 = H.unique_tokens(3 * CHUNK)
    req3 = rid("mixed")
    assert c.lookup(req3, toks2) == 0
    assert c.store(req3, toks2, src[: 2 * BPC], start=0, end=2 * CHUNK) == [True, True]
    assert c.store(req3, toks2, src[2 * BPC:], start=2 * CHUNK, end=3 * CHUNK, ranks=(1,)) == [True]
    c.end_session(req3)
    c.settle()
    req4 = rid("mixed-look")
    assert c.lookup(req4, toks2) == 2 * CHUNK
    c.scheduler.free_lookup_locks(toks2, 0, 2 * CHUNK, req4)
    c.end_session(req4)


# ---------------------------------------------------------------------------
# Retrieve variants vLLM produces
# ---------------------------------------------------------------------------


def test_retrieve_from_nonzero_start(cluster, check_server_alive):
    """vLLM already holds chunk 0 (APC): it loads [256, 768) and frees the
    lookup lock of [0, 256)."""
    c = cluster
    toks, _src, expected = store_prompt(c, 3 * CHUNK)
    req = rid("start256")
    assert c.lookup(req, toks) == 3 * CHUNK
    c.scheduler.free_lookup_locks(toks, 0, CHUNK, req)
    dst = blocks(90, 2 * BPC)
    for r in range(c.tp):
        c.zero_blocks(r, dst)
    assert c.retrieve(req, toks, dst, start=CHUNK, end=3 * CHUNK) == [True, True]
    c.end_session(req)
    for r in range(c.tp):
        want = [e[:, BPC:] for e in expected[r]]
        assert_same_bytes(c.snapshot_blocks(r, dst), want, f"rank {r} chunks 1-2")


def test_retrieve_skip_first_n_tokens(cluster, check_server_alive):
    """skip_first_n_tokens=32: the first 2 blocks (APC-shared) are not written."""
    c = cluster
    toks, _src, expected = store_prompt(c, 2 * CHUNK)
    req = rid("skip")
    assert c.lookup(req, toks) == 2 * CHUNK
    dst = blocks(96, 2 * BPC)
    for r in range(c.tp):
        c.zero_blocks(r, dst)
    before = [c.full_snapshot(r) for r in range(c.tp)]
    assert c.retrieve(req, toks, dst, end=2 * CHUNK, skip=2 * BS) == [True, True]
    c.end_session(req)
    for r in range(c.tp):
        want = expected_after_retrieve(before[r], dst[2:], [e[:, 2:] for e in expected[r]])
        assert_same_bytes(c.full_snapshot(r), want, f"rank {r} (first 2 blocks untouched)")


def test_retrieve_of_missing_chunks_fails_cleanly(cluster, check_server_alive):
    """A retrieve for chunks the lookup did not find reports failure and
    writes nothing (never garbage into the engine's blocks)."""
    c = cluster
    toks = H.unique_tokens(2 * CHUNK)
    req = rid("missing")
    assert c.lookup(req, toks) == 0
    dst = blocks(64, 2 * BPC)
    for r in range(c.tp):
        c.fill_random(r, dst, seed=99 + r)
    before = [c.full_snapshot(r) for r in range(c.tp)]
    ok = c.retrieve(req, toks, dst, end=2 * CHUNK)
    c.end_session(req)
    assert ok == [False, False], f"retrieve of never-stored chunks must fail, got {ok}"
    for r in range(c.tp):
        assert_same_bytes(c.full_snapshot(r), before[r], f"rank {r} untouched after failed retrieve")


def test_restore_does_not_overwrite_existing_chunks(cluster, check_server_alive):
    """Storing an already-cached prompt again (other KV bytes) keeps the first
    copy: the server skips chunks that are already resident."""
    c = cluster
    toks, src, first = store_prompt(c, 2 * CHUNK)
    for r in range(c.tp):
        c.fill_random(r, src, seed=31337 + r)
    req = rid("restore")
    # vLLM would not store a hit, but a racing request can; the adapter does
    # not look up first here.
    assert c.store(req, toks, src) == [True, True]
    c.end_session(req)
    c.settle()  # the second store has been fully processed
    req2 = rid("restore-load")
    assert c.lookup(req2, toks) == 2 * CHUNK
    dst = blocks(64, 2 * BPC)
    for r in range(c.tp):
        c.zero_blocks(r, dst)
    assert c.retrieve(req2, toks, dst, end=2 * CHUNK) == [True, True]
    c.end_session(req2)
    for r in range(c.tp):
        assert_same_bytes(c.snapshot_blocks(r, dst), first[r], f"rank {r} keeps first copy")


def test_many_requests_interleaved(cluster, check_server_alive):
    """Several prompts stored, then looked up and retrieved in reverse order."""
    c = cluster
    prompts = []
    for i in range(4):
        prompts.append(store_prompt(c, 2 * CHUNK + 13 * i, seed=5000 + i))
    for toks, _src, expected in reversed(prompts):
        req = rid("multi")
        assert c.lookup(req, toks) == 2 * CHUNK
        dst = blocks(96, 2 * BPC)
        for r in range(c.tp):
            c.zero_blocks(r, dst)
        assert c.retrieve(req, toks, dst, end=2 * CHUNK) == [True, True]
        c.end_session(req)
        for r in range(c.tp):
            assert_same_bytes(c.snapshot_blocks(r, dst), expected[r], f"rank {r}")


@pytest.mark.parametrize("n_tokens", [CHUNK - 1, CHUNK, CHUNK + 1])
def test_chunk_boundaries(cluster, n_tokens, check_server_alive):
    c = cluster
    toks = H.unique_tokens(n_tokens)
    n_full = n_tokens // CHUNK
    req = rid("edge")
    assert c.lookup(req, toks) == 0
    if n_full:
        src = blocks(1, n_full * BPC)
        for r in range(c.tp):
            c.fill_random(r, src, seed=n_tokens + r)
        assert c.store(req, toks, src) == [True, True]
    c.end_session(req)
    if n_full:
        assert c.wait_for_hit(toks, n_full * CHUNK) == n_full * CHUNK
    req2 = rid("edge-look")
    assert c.lookup(req2, toks) == n_full * CHUNK
    if n_full:
        c.scheduler.free_lookup_locks(toks, 0, n_full * CHUNK, req2)
    c.end_session(req2)


# ---------------------------------------------------------------------------
# Transfer-mode plumbing and reference-specific semantics
# ---------------------------------------------------------------------------


def test_transfer_mode_is_the_requested_one(cluster):
    """lmcache_driven: KV tensors live in POSIX SHM the server maps.
    engine_driven: the server advertised its L1 pool and the workers mapped
    it (no pickle fallback)."""
    import os  # noqa: PLC0415

    from lmcache.v1.multiprocess.transfer_context import (  # noqa: PLC0415
        EngineDrivenContextShm,
        EngineDrivenTransferContext,
        LMCacheDrivenTransferContext,
    )

    for w in cluster.workers:
        ctx = w.transfer_ctx
        if cluster.mode == "lmcache_driven":
            assert isinstance(ctx, LMCacheDrivenTransferContext), type(ctx)
            segs = [n for n in os.listdir("/dev/shm") if n.startswith(f"lmcache_kv_{os.getpid()}_")]
            assert len(segs) >= cluster.shape.num_layers, segs
        else:
            assert isinstance(ctx, EngineDrivenTransferContext), type(ctx)
            edc = ctx.engine_driven_context
            assert isinstance(edc, EngineDrivenContextShm), (
                f"server did not advertise an SHM pool; worker fell back to {type(edc).__name__}"
            )
            assert edc._pool_size > 0 and os.path.exists("/dev/shm/" + edc._shm_name.lstrip("/"))


def test_all_null_block_chunk_is_not_stored(cluster, check_server_alive):
    """lmcache_driven STORE skips chunks whose block ids are all the null
    block (--null-block-id, default 0): the prefix then ends before them."""
    if cluster.mode != "lmcache_driven":
        pytest.skip("engine_driven PREPARE_STORE carries no block ids; the server cannot see null blocks")
    c = cluster
    toks = H.unique_tokens(3 * CHUNK)
    src = blocks(1, 3 * BPC)
    src[BPC: 2 * BPC] = [0] * BPC  # chunk 1 lives in the null block
    for r in range(c.tp):
        c.fill_random(r, [b for b in src if b], seed=606 + r)
    req = rid("null")
    assert c.lookup(req, toks) == 0
    assert c.store(req, toks, src) == [True, True]
    c.end_session(req)
    c.settle()
    assert c.probe(toks) == CHUNK, "only chunk 0 can hit: chunk 1 was not stored"


def test_store_is_visible_once_acknowledged(cluster, check_server_alive):
    """Once every rank's STORE (or COMMIT_STORE) reply has arrived, an
    immediate lookup hits all stored chunks.

    The reference does not guarantee this for lmcache_driven: its STORE reply
    precedes the commit (finish_write runs from a completion-drain thread a
    few ms later), so a lookup right after STORE may miss. Its engine_driven
    COMMIT_STORE commits before replying.
    """
    if H.server_kind() == "lmcache" and cluster.mode == "lmcache_driven":
        pytest.skip("reference lmcache 0.5.6 commits lmcache_driven stores after replying")
    c = cluster
    for i in range(5):
        toks = H.unique_tokens(2 * CHUNK + 1)
        src = blocks(1, 2 * BPC)
        req = rid("visible")
        assert c.lookup(req, toks) == 0
        assert c.store(req, toks, src) == [True, True]
        c.end_session(req)
        assert c.probe(toks) == 2 * CHUNK, f"round {i}: stored chunks not visible right after STORE replies"
