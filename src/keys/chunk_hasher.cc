// Chained token-chunk hashing (see chunk_hasher.h).
//
// Stateless and thread-safe; the only heap use is growing the caller's vector.
#include "keys/chunk_hasher.h"

#include <algorithm>
#include <string>

namespace kvd::keys {
namespace {

constexpr size_t kEncodeBatchTokens = 256;  // 1 KiB of encoded tokens on the stack
constexpr int64_t kMaxToken = int64_t{0xFFFFFFFF};

Status TokenOutOfRange(size_t index, int64_t value) {
  return Status::InvalidArgument("token at index " + std::to_string(index) + " has value " +
                                 std::to_string(value) + ", which does not fit in uint32 [0, 2^32)");
}

// Feeds prev || BE32(tokens) into a fresh hash; on a bad token returns its offset
// within `tokens` through *bad and false.
bool HashChunkInto(const Hash32& prev, std::span<const int64_t> tokens, Hash32* result, size_t* bad) {
  Blake3Hasher hasher;
  hasher.Update(prev.data(), prev.size());
  uint8_t encoded[kEncodeBatchTokens * 4];
  for (size_t start = 0; start < tokens.size(); start += kEncodeBatchTokens) {
    const size_t n = std::min(kEncodeBatchTokens, tokens.size() - start);
    const int64_t* t = tokens.data() + start;
    bool ok = true;
    for (size_t i = 0; i < n; ++i) {
      const int64_t v = t[i];
      ok &= (v >= 0) & (v <= kMaxToken);
      const uint32_t u = static_cast<uint32_t>(v);
      encoded[4 * i + 0] = static_cast<uint8_t>(u >> 24);
      encoded[4 * i + 1] = static_cast<uint8_t>(u >> 16);
      encoded[4 * i + 2] = static_cast<uint8_t>(u >> 8);
      encoded[4 * i + 3] = static_cast<uint8_t>(u);
    }
    if (!ok) {
      for (size_t i = 0; i < n; ++i) {
        if (t[i] < 0 || t[i] > kMaxToken) {
          *bad = start + i;
          return false;
        }
      }
    }
    hasher.Update(encoded, 4 * n);
  }
  *result = hasher.Finalize();
  return true;
}

}  // namespace

const Hash32& NoneHash() {
  static const Hash32 none_hash = [] {
    const uint8_t seed[12] = {};  // int64 0 big-endian (8 bytes) || uint32 token 0 big-endian (4 bytes)
    return Blake3(seed, sizeof(seed));
  }();
  return none_hash;
}

Result<Hash32> HashChunk(const Hash32& prev, std::span<const int64_t> chunk_tokens, size_t index_base) {
  Hash32 h;
  size_t bad = 0;
  if (!HashChunkInto(prev, chunk_tokens, &h, &bad)) {
    return TokenOutOfRange(index_base + bad, chunk_tokens[bad]);
  }
  return h;
}

Status AppendChainedChunkHashes(std::span<const int64_t> tokens, uint32_t chunk_size, size_t first_chunk,
                                const Hash32& prev, std::vector<Hash32>* out) {
  if (chunk_size == 0) return Status::InvalidArgument("chunk_size must be positive");
  const size_t full_chunks = tokens.size() / chunk_size;
  if (first_chunk >= full_chunks) return Status::Ok();
  // Copy `prev` before growing *out: callers pass out->back() (SessionTable extends a
  // request's chain), which the reserve below may free.
  Hash32 chain = prev;
  const size_t original_size = out->size();
  out->reserve(original_size + (full_chunks - first_chunk));
  for (size_t c = first_chunk; c < full_chunks; ++c) {
    const size_t base = c * chunk_size;
    size_t bad = 0;
    if (!HashChunkInto(chain, tokens.subspan(base, chunk_size), &chain, &bad)) {
      out->resize(original_size);
      return TokenOutOfRange(base + bad, tokens[base + bad]);
    }
    out->push_back(chain);
  }
  return Status::Ok();
}

Result<std::vector<Hash32>> ComputeChunkHashes(std::span<const int64_t> tokens, uint32_t chunk_size) {
  std::vector<Hash32> hashes;
  Status st = AppendChainedChunkHashes(tokens, chunk_size, 0, NoneHash(), &hashes);
  if (!st.ok()) return st;
  return hashes;
}

}  // namespace kvd::keys
