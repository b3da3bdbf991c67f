// CPU execution of a layout plan: gathers a chunk's paged blocks into the canonical
// object and scatters an object back into paged blocks. It is also the reference the
// CUDA kernels are tested against. Pure functions over caller-owned memory: the caller
// guarantees that block ids were validated (ValidateBlockIds) and that the buffers stay
// mapped for the duration of the call. Safe to run concurrently on disjoint outputs.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "layout/layout.h"

namespace kvd::transfer {

// Checks block_ids against the layout for `num_chunks` chunks: one list per engine
// group, each with num_chunks × chunk_tokens / tokens_per_block ids in [0, num_blocks).
Status ValidateBlockIds(const layout::KvLayout& layout,
                        const std::vector<std::vector<int64_t>>& block_ids, int64_t num_chunks);

// `tensor_bases[i]` is the first byte of registered tensor i's mapping.
// `chunk` indexes chunks within the request's block lists (0 = its first chunk).
void GatherChunk(const layout::KvLayout& layout, std::span<uint8_t* const> tensor_bases,
                 const std::vector<std::vector<int64_t>>& block_ids, int64_t chunk,
                 uint8_t* object);

// Writes every token of the chunk at or after `skip_tokens` (chunk-relative).
void ScatterChunk(const layout::KvLayout& layout, std::span<uint8_t* const> tensor_bases,
                  const std::vector<std::vector<int64_t>>& block_ids, int64_t chunk,
                  const uint8_t* object, int64_t skip_tokens);

}  // namespace kvd::transfer
