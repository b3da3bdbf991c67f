#include "keys/chunk_key_memo.h"

#include <cstring>
#include <random>

#include "common/mutex.h"
#include "keys/token_hash.h"

namespace kvd::keys {
namespace {

constexpr uint64_t kMul1 = 0x9e3779b97f4a7c15ull;
constexpr uint64_t kMul2 = 0xc2b2ae3d27d4eb4full;

inline uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

inline uint64_t Fold(uint64_t h) {
  h ^= h >> 33;
  h *= kMul2;
  h ^= h >> 29;
  return h;
}

// A fast keyed mix of `n` bytes (a multiple of 8 not required), four independent lanes.
uint64_t Mix(uint64_t seed, const uint8_t* p, size_t n) {
  uint64_t a = seed, b = seed ^ kMul1, c = Rotl(seed, 17), d = seed * kMul2;
  while (n >= 32) {
    uint64_t w[4];
    std::memcpy(w, p, 32);
    a = Rotl(a ^ (w[0] * kMul1), 29) * kMul2;
    b = Rotl(b ^ (w[1] * kMul1), 29) * kMul2;
    c = Rotl(c ^ (w[2] * kMul1), 29) * kMul2;
    d = Rotl(d ^ (w[3] * kMul1), 29) * kMul2;
    p += 32;
    n -= 32;
  }
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    a = Rotl(a ^ (w * kMul1), 29) * kMul2;
    p += 8;
    n -= 8;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p, n);
  b ^= tail * kMul1;
  return Fold(a ^ Rotl(b, 13) ^ Rotl(c, 27) ^ Rotl(d, 41));
}

}  // namespace

struct ChunkKeyMemo::Set {
  struct Way {
    uint64_t tag = 0;
    uint64_t domain = 0;
    uint64_t stamp = 0;  // 0: empty
    Hash32 prev{};
    Hash32 key{};
  };
  Mutex mu;
  Way ways[kWays] KVD_GUARDED_BY(mu);
};

uint64_t ChunkKeyMemo::EntryBytes(uint32_t chunk_size) {
  return sizeof(Set) / kWays + uint64_t{chunk_size} * sizeof(uint32_t);
}

ChunkKeyMemo::ChunkKeyMemo(uint64_t capacity_bytes, uint32_t chunk_size)
    : chunk_size_(chunk_size), seed_((uint64_t{std::random_device{}()} << 32) ^ std::random_device{}()) {
  if (chunk_size == 0) return;
  const uint64_t entries = capacity_bytes / EntryBytes(chunk_size);
  num_sets_ = static_cast<size_t>(entries / kWays);
  if (num_sets_ == 0) return;
  sets_ = std::make_unique<Set[]>(num_sets_);
  tokens_ = std::make_unique<uint32_t[]>(num_sets_ * kWays * chunk_size);
}

ChunkKeyMemo::~ChunkKeyMemo() = default;

uint64_t ChunkKeyMemo::Domain(std::string_view cache_salt) const {
  return Mix(seed_ ^ 0x5a17, reinterpret_cast<const uint8_t*>(cache_salt.data()), cache_salt.size());
}

uint64_t ChunkKeyMemo::Tag(uint64_t domain, const Hash32& prev, const uint32_t* tokens) const {
  const uint64_t h = Mix(seed_ ^ domain, prev.data(), prev.size());
  return Mix(h, reinterpret_cast<const uint8_t*>(tokens), size_t{chunk_size_} * sizeof(uint32_t));
}

bool ChunkKeyMemo::Find(uint64_t domain, uint64_t tag, const Hash32& prev, const uint32_t* tokens,
                        Hash32* key) {
  const size_t s = static_cast<size_t>(tag % num_sets_);
  Set& set = sets_[s];
  MutexLock lock(&set.mu);
  for (size_t w = 0; w < kWays; ++w) {
    Set::Way& way = set.ways[w];
    if (way.stamp == 0 || way.tag != tag || way.domain != domain || way.prev != prev) continue;
    const uint32_t* stored = tokens_.get() + (s * kWays + w) * chunk_size_;
    if (std::memcmp(stored, tokens, size_t{chunk_size_} * sizeof(uint32_t)) != 0) continue;
    *key = way.key;
    way.stamp = clock_.fetch_add(1, std::memory_order_relaxed) + 1;
    return true;
  }
  return false;
}

void ChunkKeyMemo::Insert(uint64_t domain, uint64_t tag, const Hash32& prev, const uint32_t* tokens,
                          const Hash32& key) {
  const size_t s = static_cast<size_t>(tag % num_sets_);
  Set& set = sets_[s];
  MutexLock lock(&set.mu);
  size_t victim = 0;
  for (size_t w = 0; w < kWays; ++w) {
    const Set::Way& way = set.ways[w];
    if (way.stamp != 0 && way.tag == tag && way.domain == domain && way.key == key) return;  // raced
    if (way.stamp < set.ways[victim].stamp) victim = w;
  }
  Set::Way& way = set.ways[victim];
  way.tag = tag;
  way.domain = domain;
  way.prev = prev;
  way.key = key;
  way.stamp = clock_.fetch_add(1, std::memory_order_relaxed) + 1;
  std::memcpy(tokens_.get() + (s * kWays + victim) * chunk_size_, tokens,
              size_t{chunk_size_} * sizeof(uint32_t));
}

size_t ChunkKeyMemo::HashChain(uint64_t domain, const Hash32& prev, std::span<const uint32_t> tokens,
                               uint32_t chunk_size, std::span<Hash32> out) {
  if (num_sets_ == 0 || chunk_size != chunk_size_) {
    HashTokenChain(prev, tokens, chunk_size, out);
    return 0;
  }
  size_t found = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const Hash32& p = i == 0 ? prev : out[i - 1];
    const uint32_t* t = tokens.data() + i * chunk_size;
    const uint64_t tag = Tag(domain, p, t);
    if (Find(domain, tag, p, t, &out[i])) {
      found++;
      continue;
    }
    out[i] = HashTokenChunk(p, std::span<const uint32_t>(t, chunk_size));
    Insert(domain, tag, p, t, out[i]);
  }
  hits_.fetch_add(found, std::memory_order_relaxed);
  misses_.fetch_add(out.size() - found, std::memory_order_relaxed);
  return found;
}

ChunkKeyMemo::Stats ChunkKeyMemo::stats() const {
  Stats s;
  s.hits = hits_.load(std::memory_order_relaxed);
  s.misses = misses_.load(std::memory_order_relaxed);
  s.entries = num_sets_ * kWays;
  s.bytes = num_sets_ * (sizeof(Set) + kWays * uint64_t{chunk_size_} * sizeof(uint32_t));
  return s;
}

}  // namespace kvd::keys
