"""MiniMax-M3 at TP=8: main K/V caches plus key-only indexer caches, end to end.

Drives the real lmcache 0.5.6 vLLM adapters (one scheduler adapter, eight
worker adapters = vLLM world size 8, one server) against the server under
test in lmcache_driven mode, with the per-rank KV shapes vLLM registers for
MiniMax-M3 at TP=8, --block-size 128 (docs/layouts.md; block count scaled
down from 3559 to NB):

- 60 main caches ``[NB, 1, 128, 256]`` bf16 (packed K/V, single-plane HND),
- 57 indexer caches ``[NB, 128, 128]`` bf16 (layers 3..59, key only),

registered interleaved in layer order (attn 0, attn 1, attn 2, attn 3,
indexer 3, attn 4, indexer 4, ...), as ``MiniMaxM3()`` in
tests/unit/layout/layout_test_util.h builds them. vLLM puts all 117 tensors
in one full-attention KV cache group (block size 128); lmcache 0.5.6 splits
it by physical identity into two EngineGroupInfo entries with the same
engine_group_id 0 (main, indexer), each with tokens_per_block 128, and the
worker adapter expands every request's block-id list into two copies.

One chunk (256 tokens) is 11,599,872 bytes per rank, 8 objects per chunk.
"""

from __future__ import annotations

import gc
import itertools

import pytest
import torch

import kvd_harness as H

SERVER_L1_GB = 0.5  # --l1-size-gb 0.5 (conftest's `server` fixture reads this)

CHUNK = H.CHUNK_SIZE  # 256 (--chunk-size 256)
BS = 128  # vLLM --block-size 128
BPC = CHUNK // BS  # 2 blocks per chunk
NB = 10  # blocks per tensor (3559 in the real deployment)
TP = 8
N_MAIN = 60
FIRST_SPARSE = 3  # layers 3..59 carry an indexer cache -> 57 indexers
MAIN_SHAPE = (NB, 1, BS, 256)
INDEXER_SHAPE = (NB, BS, 128)
OBJECT_BYTES = N_MAIN * CHUNK * 256 * 2 + (N_MAIN - FIRST_SPARSE) * CHUNK * 128 * 2
assert OBJECT_BYTES == 11_599_872

_ids = itertools.count()


def rid(tag: str) -> str:
    return f"m3-{tag}-{next(_ids)}"


def m3_kv_caches() -> dict[str, torch.Tensor]:
    """Registration order as vLLM's MiniMax-M3 model: per layer its attention
    cache, then (sparse layers) its indexer key cache."""
    kv: dict[str, torch.Tensor] = {}
    for layer in range(N_MAIN):
        kv[f"model.layers.{layer}.self_attn.attn"] = torch.zeros(MAIN_SHAPE, dtype=torch.bfloat16)
        if layer >= FIRST_SPARSE:
            kv[f"model.layers.{layer}.self_attn.indexer.k_cache"] = torch.zeros(
                INDEXER_SHAPE, dtype=torch.bfloat16
            )
    return kv


class M3Cluster(H.TPCluster):
    """TPCluster with MiniMax-M3 per-rank tensors (blocks are dimension 0 of
    every tensor here, not dimension 1 as in the FlashAttention layout)."""

    def __init__(self, url: str, model_name: str, tp: int = TP, mq_timeout: float = 30.0) -> None:
        import zmq  # noqa: PLC0415
        from lmcache.integration.vllm.kv_cache_groups import (  # noqa: PLC0415
            create_engine_group_infos_from_vllm,
        )
        from lmcache.integration.vllm.vllm_multi_process_adapter import (  # noqa: PLC0415
            LMCacheMPSchedulerAdapter,
            LMCacheMPWorkerAdapter,
            ParallelStrategy,
        )

        self.url = url
        self.mode = "lmcache_driven"
        self.model_name = model_name
        self.tp = tp
        self.shape = H.ModelShape(num_layers=N_MAIN, num_blocks=NB, block_size=BS)
        self.mq_timeout = mq_timeout
        self.ctx = zmq.Context.instance()
        self.scheduler = None
        self.workers = []
        self.kv = []
        self.group_infos = []
        self._closed = False

        extra = {
            "lmcache.mp.mq_timeout": mq_timeout,
            "lmcache.mp.heartbeat_interval": 5.0,
            "lmcache.mp.mp_transfer_mode": self.mode,
        }

        def strategy(rank: int) -> ParallelStrategy:
            return ParallelStrategy(
                mla_only=False, vllm_world_size=tp, vllm_worker_id=rank,
                tp_size=tp, pp_size=1, n_servers=1,
            )

        try:
            self.scheduler = LMCacheMPSchedulerAdapter(
                server_urls=[url], context=self.ctx, model_name=model_name,
                vllm_block_size=BS, parallel_strategy=strategy(0), extra_config=extra,
            )
            self.chunk_size = self.scheduler.lmcache_tokens_per_chunk
            self.blocks_per_chunk = self.scheduler.num_blocks_per_chunk()
            # vLLM >= 0.24 packed K/V main cache: kv_layout HND.
            layout_hints = {"kv_layout": "HND"}
            for rank in range(tp):
                w = LMCacheMPWorkerAdapter(
                    server_url=url, context=self.ctx, model_name=model_name,
                    vllm_block_size=BS, parallel_strategy=strategy(rank), extra_config=extra,
                )
                self.workers.append(w)
                kv = m3_kv_caches()
                # One vLLM KV cache group (full attention, block size 128)
                # holding all 117 tensors, as LMCacheMPConnector converts it.
                groups = create_engine_group_infos_from_vllm(
                    H.KVCacheConfig(list(kv), BS), kv, layout_hints=layout_hints
                )
                self.group_infos.append(groups)
                w.register_kv_caches(kv, engine_group_infos=groups, layout_hints=layout_hints)
                self.kv.append(w.kv_caches)
        except BaseException:
            self.close()
            raise

    # Blocks are dimension 0 of both tensor kinds.
    def fill_random(self, rank: int, block_ids: list[int], seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        idx = torch.tensor(block_ids, dtype=torch.long)
        for t in self.kv[rank].values():
            # Random bit patterns (any bf16, NaNs included): compared as bits.
            bits = torch.randint(-(2**15), 2**15, (len(block_ids), *t.shape[1:]),
                                 generator=gen, dtype=torch.int32).to(torch.int16)
            t[idx] = bits.view(torch.bfloat16)

    def zero_all(self, rank: int) -> None:
        for t in self.kv[rank].values():
            t.zero_()

    def snapshot_blocks(self, rank: int, block_ids: list[int]) -> dict[str, torch.Tensor]:
        idx = torch.tensor(block_ids, dtype=torch.long)
        return {name: t[idx].clone() for name, t in self.kv[rank].items()}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def check_rank(c: M3Cluster, rank: int, dst: list[int], expected: dict[str, torch.Tensor]) -> None:
    """Destination blocks hold `expected` bit for bit; every other block is zero."""
    idx = torch.tensor(dst, dtype=torch.long)
    others = torch.tensor([b for b in range(NB) if b not in dst], dtype=torch.long)
    kv = c.kv[rank]
    assert list(kv) == list(expected)
    for name, t in kv.items():
        kind = "indexer" if "indexer" in name else "main"
        got, want = bits(t[idx]), bits(expected[name])
        same = got == want
        if not bool(same.all()):
            bad = (~same).nonzero()
            raise AssertionError(
                f"rank {rank} {kind} cache {name}: {int((~same).sum())} of {same.numel()} "
                f"elements differ in the destination blocks; first at "
                f"(dst block #{int(bad[0][0])}, {tuple(bad[0][1:].tolist())})"
            )
        rest = bits(t[others])
        if bool(rest.any()):
            raise AssertionError(
                f"rank {rank} {kind} cache {name}: {int((rest != 0).sum())} elements of "
                f"non-destination blocks {others.tolist()} are no longer zero"
            )


@pytest.fixture(scope="module")
def m3(server):
    c = M3Cluster(server.url, model_name="kvd-it-minimax-m3")
    try:
        yield c
    finally:
        c.close()
        gc.collect()


def test_engine_group_infos_as_lmcache_sends_them(m3):
    """One engine group split into main + indexer infos, 128 tokens/block."""
    names = list(m3.kv[0])
    assert len(names) == N_MAIN + (N_MAIN - FIRST_SPARSE) == 117
    for groups in m3.group_infos:
        assert [g.engine_group_id for g in groups] == [0, 0]
        assert [g.tokens_per_block for g in groups] == [BS, BS]
        main, idx = groups
        assert len(main.layer_indices) == 60 and len(idx.layer_indices) == 57
        assert all("indexer" not in names[i] for i in main.layer_indices)
        assert all("indexer" in names[i] for i in idx.layer_indices)
    # The adapter sends the request's one block list once per info.
    w = m3.workers[0]
    op = m3._op(list(range(CHUNK)), [3, 4], 0, CHUNK)
    assert w._block_ids_per_group(op) == [[3, 4], [3, 4]]


def test_tp8_store_lookup_retrieve_every_byte(m3, check_server_alive):
    c = m3
    toks = H.unique_tokens(2 * CHUNK + 100)  # 2 full chunks + a 100-token tail
    src = [1, 2, 3, 4]  # the blocks holding tokens [0, 512)
    for r in range(TP):
        c.fill_random(r, src, seed=9000 + r)  # distinct per rank
    expected = [c.snapshot_blocks(r, src) for r in range(TP)]
    assert not torch.equal(bits(expected[0]["model.layers.5.self_attn.attn"]),
                           bits(expected[1]["model.layers.5.self_attn.attn"]))

    req = rid("store")
    assert c.lookup(req, toks) == 0, "fresh prompt must miss before it is stored"
    res = c.store(req, toks, src)
    c.end_session(req)
    assert res == [True] * TP, f"store results per rank: {res}"
    assert c.wait_for_hit(toks, 2 * CHUNK) == 2 * CHUNK

    req = rid("load")
    hit = c.lookup(req, toks)
    assert hit == 2 * CHUNK, f"expected 512 hit tokens, got {hit}"

    dst = [6, 7, 8, 9]  # disjoint from the source blocks
    for r in range(TP):
        c.zero_all(r)  # every block of every tensor zero before the load
    ok = c.retrieve(req, toks, dst, end=hit)
    c.end_session(req)
    assert ok == [True] * TP, f"retrieve results per rank: {ok}"
    for r in range(TP):
        check_rank(c, r, dst, expected[r])


def test_lookup_misses_when_one_rank_did_not_store(m3, check_server_alive):
    c = m3
    toks = H.unique_tokens(CHUNK + 10)
    src = [1, 2]
    for r in range(TP):
        c.fill_random(r, src, seed=7000 + r)
    req = rid("partial-store")
    assert c.lookup(req, toks) == 0
    res = c.store(req, toks, src, ranks=tuple(range(TP - 1)))  # rank 7 never stores
    c.end_session(req)
    assert res == [True] * (TP - 1), f"store results per rank: {res}"
    # Barrier: a later all-rank store is visible, so the 7 stores are too.
    c.settle()
    assert c.probe(toks) == 0, "a chunk that rank 7 never stored must not hit"
