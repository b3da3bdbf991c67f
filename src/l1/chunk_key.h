// ChunkKey: identity of one chunk entry in the L1 table.
//
// A chunk is identified by the model, the tensor-parallel world size, the cache salt (tenant
// isolation) and the chained BLAKE3 hash of its tokens. The per-rank, per-group objects of a
// chunk live inside the entry as slots (see l1_cache.h), so they are not part of the key.
// Plain value type; safe to copy and share between threads like any std::string holder.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace kvd::l1 {

struct ChunkKey {
  std::string model_name;
  int32_t world_size = 0;
  std::string cache_salt;
  std::array<uint8_t, 32> chunk_hash{};

  bool operator==(const ChunkKey&) const = default;
};

// Hash functor for unordered containers. The chunk hash is already uniform, so its first
// 8 bytes are used directly and mixed with the hashes of the other fields.
struct ChunkKeyHash {
  size_t operator()(const ChunkKey& key) const noexcept;
};

}  // namespace kvd::l1
