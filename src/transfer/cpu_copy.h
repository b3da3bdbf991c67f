// CPU execution of a layout plan: gathers a chunk's paged blocks into the canonical
// object and scatters an object back into paged blocks. It is also the reference the
// CUDA kernels are tested against. Pure functions over caller-owned memory: the caller
// guarantees that block ids were validated (ValidateBlockIds) and that the buffers stay
// mapped for the duration of the call. Safe to run concurrently on disjoint outputs.
//
// Every byte written by ScatterChunk is an element of a registered view at a validated
// block id (BuildLayout checked that the view fits its mapping and does not overlap
// itself), so a scatter never writes outside a registered buffer.
//
// The copies return false when a bus error cut them short (a mapping whose file was
// truncated under it, or a tmpfs page that could not be allocated; see bus_error_guard.h):
// some bytes may have been written, and the caller must treat the whole copy as failed.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "layout/layout.h"

namespace kvd::transfer {

// Checks block_ids against the layout for `num_chunks` chunks: exactly one list per
// engine_group_info (layout.num_engine_groups), each with at least num_chunks ×
// chunk_tokens / tokens_per_block ids, the ones used in [0, num_blocks).
Status ValidateBlockIds(const layout::KvLayout& layout,
                        const std::vector<std::vector<int64_t>>& block_ids, int64_t num_chunks);

// `tensor_bases[i]` is the first byte of registered tensor i's mapping.
// `chunk` indexes chunks within the request's block lists (0 = its first chunk).
// `object` has layout.object_bytes bytes.
bool GatherChunk(const layout::KvLayout& layout, std::span<uint8_t* const> tensor_bases,
                 const std::vector<std::vector<int64_t>>& block_ids, int64_t chunk,
                 uint8_t* object);

// Writes every token of the chunk at or after `skip_tokens` (chunk-relative; <= 0:
// all, >= chunk_tokens: none). Tokens before it are not touched, in any group.
bool ScatterChunk(const layout::KvLayout& layout, std::span<uint8_t* const> tensor_bases,
                  const std::vector<std::vector<int64_t>>& block_ids, int64_t chunk,
                  const uint8_t* object, int64_t skip_tokens);

// Several chunks at once, the work (chunk × group × K/V plane × layer) spread over
// `threads` threads; threads <= 1 runs on the caller's thread. Same bytes as calling
// GatherChunk / ScatterChunk once per task. Objects of different tasks must not
// overlap; for scatters, tasks must not name the same destination blocks.
struct ChunkTask {
  int64_t chunk = 0;           // index into the request's block lists
  uint8_t* object = nullptr;   // layout.object_bytes bytes
  int64_t skip_tokens = 0;     // scatter only, as in ScatterChunk
};
bool GatherChunks(const layout::KvLayout& layout, std::span<uint8_t* const> tensor_bases,
                  const std::vector<std::vector<int64_t>>& block_ids,
                  std::span<const ChunkTask> tasks, int threads);
bool ScatterChunks(const layout::KvLayout& layout, std::span<uint8_t* const> tensor_bases,
                   const std::vector<std::vector<int64_t>>& block_ids,
                   std::span<const ChunkTask> tasks, int threads);

}  // namespace kvd::transfer
