// ChunkKey: identity of one chunk entry in the L1 table: an interned namespace (model, world
// size, cache salt; see namespaces.h) and the chained BLAKE3 hash of the chunk's tokens. The
// per-rank objects of a chunk live inside its entry as slots, so they are not part of the
// key. 36 bytes, trivially copyable.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>

namespace kvd::l1 {

using NamespaceId = uint32_t;

struct ChunkKey {
  NamespaceId ns = 0;
  std::array<uint8_t, 32> chunk_hash{};

  bool operator==(const ChunkKey&) const = default;
};

// Splitmix64's finaliser: a cheap bijective 64-bit mixer.
inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// A 64-bit digest of the key, keyed by `seed` (so that a client cannot aim keys at one
// bucket without knowing the seed). The chunk hash is already uniform; its first 8 bytes are
// mixed with the seed and the namespace.
inline uint64_t ChunkKeyDigest(const ChunkKey& key, uint64_t seed) {
  uint64_t h = 0;
  std::memcpy(&h, key.chunk_hash.data(), sizeof(h));
  return Mix64(h ^ seed ^ Mix64(uint64_t{key.ns} * 0x9e3779b97f4a7c15ULL + seed));
}

struct ChunkKeyHash {
  size_t operator()(const ChunkKey& key) const noexcept { return ChunkKeyDigest(key, 0); }
};

}  // namespace kvd::l1
