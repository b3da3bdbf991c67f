// DevicePlan: a layout::KvLayout flattened into the plain arrays the CUDA kernels read
// (copy_math.h), bound to the device addresses where the registered tensors are mapped.
// Host-only C++: built and tested without CUDA. `EmulateChunk` runs the kernels' exact index
// math on the host, so tests can check the kernels' plan against cpu_copy.cc for every
// layout, with host buffers standing in for device memory.
//
// Immutable once built; share freely across threads.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "layout/layout.h"
#include "transfer/cuda/copy_math.h"

namespace kvd::transfer::cuda {

struct DevicePlan {
  std::vector<DevGroup> groups;
  std::vector<DevLayer> layers;
  std::vector<DevRun> runs;
  uint32_t chunk_tokens = 0;
  uint64_t object_bytes = 0;
  uint32_t tiles_per_chunk = 0;
  uint32_t ids_per_chunk = 0;              // packed block ids one chunk needs
  // Per block-id list of the layout: where its ids start in the packed ids (UINT32_MAX:
  // no group uses the list) and how many blocks it has per chunk.
  std::vector<uint32_t> list_offset;
  std::vector<uint32_t> list_blocks_per_chunk;
  uint32_t max_tile_bytes = 0;
  uint32_t min_vec = 16;                   // smallest word size of any layer (for logs)
};

// `mapping_base[i]` / `mapping_bytes[i]`: device address and length of registered tensor
// i's mapping (for "cuda" descriptors: allocation base + storage_offset_bytes and the
// storage size). Fails (InvalidArgument) when the layout exceeds the kernels' limits
// (kMaxGroups, kMaxIdsPerChunk, 2^31-byte tiles, 2^31 blocks) or a view does not fit its
// mapping.
Result<DevicePlan> BuildDevicePlan(const layout::KvLayout& layout,
                                   std::span<const uint64_t> mapping_base,
                                   std::span<const uint64_t> mapping_bytes);

// Writes the plan's ids_per_chunk block ids of chunk `chunk` (an index into the request's
// block lists, which ValidateBlockIds accepted) in the order the kernels read them.
void PackChunkIds(const DevicePlan& plan, const std::vector<std::vector<int64_t>>& block_ids,
                  int64_t chunk, int32_t* out);

// Host execution of the kernels' math for one chunk: gather (to_object) the chunk's tiles
// into `object`, or scatter `object` into the tensors, rows before `skip_tokens`
// (chunk-relative) untouched. Addresses in the plan must be host addresses here.
void EmulateChunk(const DevicePlan& plan, const int32_t* packed_ids, uint8_t* object,
                  bool to_object, int64_t skip_tokens);

std::string DescribePlan(const DevicePlan& plan);

}  // namespace kvd::transfer::cuda
