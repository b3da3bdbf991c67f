#include "l1/chunk_key.h"

#include <cstring>
#include <functional>
#include <string_view>

namespace kvd::l1 {
namespace {

// Finaliser from the splitmix64 generator: a cheap bijective 64-bit mixer.
uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace

size_t ChunkKeyHash::operator()(const ChunkKey& key) const noexcept {
  uint64_t h = 0;
  std::memcpy(&h, key.chunk_hash.data(), sizeof(h));
  const uint64_t model = std::hash<std::string_view>{}(key.model_name);
  const uint64_t salt = std::hash<std::string_view>{}(key.cache_salt);
  const uint64_t ws = static_cast<uint32_t>(key.world_size);
  // Each field goes through the mixer once, with a different odd multiplier, so that swapping
  // equal values between fields does not cancel out.
  uint64_t extra = Mix64(model * 0x9e3779b97f4a7c15ULL ^ Mix64(salt + 0x632be59bd9b4e019ULL) ^
                         (ws << 32 | ws));
  return static_cast<size_t>(h ^ extra);
}

}  // namespace kvd::l1
