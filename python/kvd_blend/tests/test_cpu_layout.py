"""kvd_blend.cpu_layout against vLLM-CPU's own cache writer (the VEC kernels' layout)."""

from __future__ import annotations

import pytest
import torch

from kvd_blend import cpu_layout

ops = pytest.importorskip("vllm._custom_ops")


@pytest.mark.parametrize("isa,bs,hs", [("vec", 32, 64), ("vec", 128, 128), ("vec16", 32, 80)])
def test_reads_back_what_vllm_wrote(isa, bs, hs):
    nb, nh, n = 5, 3, 70
    cache = torch.zeros(nb, nh, bs, 2 * hs)
    key_cache, value_cache = cache.view(nb, nh, 2 * bs, hs).chunk(2, dim=2)
    g = torch.Generator().manual_seed(bs + hs)
    k, v = torch.randn(n, nh, hs, generator=g), torch.randn(n, nh, hs, generator=g)
    slots = torch.randperm(nb * bs, generator=g)[:n]
    ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, slots, isa, k_scale=1.0,
                                   v_scale=1.0, kv_cache_dtype="auto")
    assert torch.equal(cpu_layout.read_k(cache, slots), k)
    assert torch.equal(cpu_layout.read_v(cache, slots), v)
    mine = torch.zeros_like(cache)
    cpu_layout.write_kv(mine, slots, k, v)
    assert torch.equal(mine, cache)


def test_refuses_a_cache_of_another_rank():
    with pytest.raises(ValueError, match="NB, NH, BS, 2\\*HS"):
        cpu_layout.read_k(torch.zeros(2, 3, 4), torch.tensor([0]))
