// scatter_math: the index math of the CacheBlend per-token scatter, shared by the CPU
// executor (scatter.cc) and, later, a CUDA kernel. Header-only, no std containers, no
// allocation; KVD_BLEND_HD (rope_math.h) marks the functions __host__ __device__ under
// nvcc.
//
// A match puts rows [0, n) of a stored chunk object at the request's token positions
// cur_st .. cur_st + n - 1 (cur_st need not be block-aligned). Position `pos` of a
// request lives in the engine's paged cache at
//   block  = block_ids[pos / tokens_per_block]      (the request's block table)
//   offset = pos % tokens_per_block                 (token slot inside that block)
// and one token row of one layer tensor (one K or V plane) is addressed through the
// layout's TensorAccess (layout/layout.h): the block's plane starts at
//   base_offset + kv * kv_stride + block * block_stride
// bytes into the tensor's mapping, and the row's r-th byte run at
//   plane + run.offset + offset * run.token_stride.
// The object side is the canonical [kv_size][layers][chunk_tokens][hidden] per kernel
// group, groups back to back at object_offset.
//
// Every value these functions see was validated by PlanScatter (scatter.h): positions
// are non-negative and inside the block table, block ids are inside the tensor.
#pragma once

#include <cstdint>

#include "blend/rope_math.h"

namespace kvd::blend {

// How lmcache 0.5.6 names the outcome of a retrieve that was asked to scatter (its
// RetrieveReason), for the cases the plan decides.
enum class RetrieveReason : uint8_t {
  kOk,                    // every match fits the allocation: scatter it
  kMatchesBeyondAlloc,    // every match at or beyond the allocation: nothing to do yet
  kMatchesStraddleAlloc,  // some matched tokens inside the allocation, some beyond: refuse
};

// lmcache's wire bool `scatter_ran`: false only when the client must fall back to a full
// recompute of the request.
KVD_BLEND_HD constexpr bool ScatterRan(RetrieveReason r) {
  return r != RetrieveReason::kMatchesStraddleAlloc;
}

struct TokenSlot {
  int64_t block;   // block id
  int64_t offset;  // token slot inside the block
};

// Where position `pos` goes; `ids` is the engine group's block table.
KVD_BLEND_HD TokenSlot SlotOf(int64_t pos, int64_t tokens_per_block, const int64_t* ids) {
  return {ids[pos / tokens_per_block], pos % tokens_per_block};
}

// Tokens the block table covers: the positions a scatter may write.
KVD_BLEND_HD constexpr int64_t CoveredTokens(int64_t num_block_ids, int64_t tokens_per_block) {
  return num_block_ids * tokens_per_block;
}

// The all-or-nothing rule against slot_bound (the fewest tokens any kernel group's block
// table covers): `cur_st`/`cur_ed` are each match's [start, end) in request positions.
KVD_BLEND_HD RetrieveReason ClassifyAgainstBound(const int64_t* cur_st, const int64_t* cur_ed,
                                                 int64_t n, int64_t slot_bound) {
  bool any_beyond = false, all_beyond = true;
  for (int64_t i = 0; i < n; ++i) {
    if (cur_ed[i] > slot_bound) any_beyond = true;
    if (cur_st[i] < slot_bound) all_beyond = false;
  }
  if (!any_beyond) return RetrieveReason::kOk;
  return all_beyond ? RetrieveReason::kMatchesBeyondAlloc : RetrieveReason::kMatchesStraddleAlloc;
}

// Bytes from the tensor mapping's start to the first byte of `block`'s plane `kv`.
KVD_BLEND_HD int64_t PlaneOffset(int64_t base_offset, int64_t kv, int64_t kv_stride, int64_t block,
                                 int64_t block_stride) {
  return base_offset + kv * kv_stride + block * block_stride;
}

// Bytes from a block plane's start to token slot `offset`'s part of one byte run.
KVD_BLEND_HD int64_t RunOffset(int64_t run_offset, int64_t run_token_stride, int64_t offset) {
  return run_offset + offset * run_token_stride;
}

// Bytes from the object's start to row `row` of (plane kv, layer) of a kernel group.
KVD_BLEND_HD uint64_t ObjectRowOffset(uint64_t group_offset, int64_t kv, int64_t layers,
                                      int64_t layer, int64_t chunk_tokens, int64_t row,
                                      int64_t row_bytes) {
  return group_offset +
         static_cast<uint64_t>(((kv * layers + layer) * chunk_tokens + row) * row_bytes);
}

// Whether (plane kv, layer access `layer` of `layers`) of a kernel group holds keys:
// plane 0 of a two-plane group; the first half of the accesses of a group that reads
// each tensor twice (vLLM's CPU cache: K halves of every layer, then V halves); every
// access of another one-plane group (key-only, MLA, packed [K|V] heads).
KVD_BLEND_HD constexpr bool IsKeyAccess(int64_t kv_size, bool split_kv_accesses, int64_t kv,
                                        int64_t layer, int64_t layers) {
  if (kv_size == 2) return kv == 0;
  if (split_kv_accesses) return layer < layers / 2;
  return true;
}

}  // namespace kvd::blend
