// Chained token-chunk hashing (see chunk_hasher.h).
//
// Stateless and thread-safe; the only heap use is growing the caller's vector.
#include "keys/chunk_hasher.h"

#include "keys/token_hash.h"

#include <algorithm>
#include <string>

namespace kvd::keys {
namespace {

constexpr size_t kEncodeBatchTokens = 512;  // tokens narrowed on the stack
constexpr int64_t kMaxToken = int64_t{0xFFFFFFFF};


// Checks `tokens` and hashes prev || BE32(tokens) into *result; on a bad token returns
// its offset within `tokens` through *bad and false.
bool HashChunkInto(const Hash32& prev, std::span<const int64_t> tokens, Hash32* result, size_t* bad) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] > kMaxToken) {
      *bad = i;
      return false;
    }
  }
  // Narrow to uint32 in stack batches; a chunk longer than one batch goes through the
  // general hasher in token_hash.cc via a heap-free loop of batches.
  uint32_t narrow[kEncodeBatchTokens];
  if (tokens.size() <= kEncodeBatchTokens) {
    for (size_t i = 0; i < tokens.size(); ++i) narrow[i] = static_cast<uint32_t>(tokens[i]);
    *result = HashTokenChunk(prev, std::span<const uint32_t>(narrow, tokens.size()));
    return true;
  }
  std::vector<uint32_t> all(tokens.begin(), tokens.end());
  *result = HashTokenChunk(prev, all);
  return true;
}

}  // namespace

Status TokenOutOfRange(size_t index, int64_t value) {
  return Status::InvalidArgument("token at index " + std::to_string(index) + " has value " +
                                 std::to_string(value) + ", which does not fit in uint32 [0, 2^32)");
}

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
