// Internals shared by the BLAKE3 implementation files (not for use outside keys/).
//
// Defines the BLAKE3 constants and the per-CPU-feature "backend": a compression
// function for single blocks and a hash-many function that compresses several
// independent inputs of whole 64-byte blocks (whole chunks, or parent nodes) at
// once. All backends must give bit-identical results. Everything here is stateless
// and thread-safe; backends are immutable singletons with static storage.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvd::keys::internal {

inline constexpr size_t kBlockLen = 64;
inline constexpr size_t kChunkLen = 1024;
inline constexpr size_t kBlocksPerChunk = kChunkLen / kBlockLen;

inline constexpr uint32_t kIv[8] = {0x6A09E667u, 0xBB67AE85u, 0x3C6EF372u, 0xA54FF53Au,
                                    0x510E527Fu, 0x9B05688Cu, 0x1F83D9ABu, 0x5BE0CD19u};

// Domain-separation flags (the last word of the compression state).
enum : uint8_t {
  kChunkStart = 1 << 0,
  kChunkEnd = 1 << 1,
  kParent = 1 << 2,
  kRoot = 1 << 3,
  kKeyedHash = 1 << 4,
  kDeriveKeyContext = 1 << 5,
  kDeriveKeyMaterial = 1 << 6,
};

// Message word order per round: round r uses word kSchedule.idx[r][i] at position i.
// Round 0 is the identity; each later round applies the spec's fixed permutation
// to the previous round's order.
struct MessageSchedule {
  uint8_t idx[7][16];
};
constexpr MessageSchedule MakeMessageSchedule() {
  constexpr uint8_t kPermutation[16] = {2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8};
  MessageSchedule s{};
  for (int i = 0; i < 16; ++i) s.idx[0][i] = static_cast<uint8_t>(i);
  for (int r = 1; r < 7; ++r) {
    for (int i = 0; i < 16; ++i) s.idx[r][i] = s.idx[r - 1][kPermutation[i]];
  }
  return s;
}
inline constexpr MessageSchedule kSchedule = MakeMessageSchedule();

// cv = first 8 words of compress(cv, block, counter, block_len, flags).
using CompressInPlaceFn = void (*)(uint32_t cv[8], const uint8_t block[kBlockLen], uint8_t block_len,
                                   uint64_t counter, uint8_t flags);
// out = all 16 output words (little-endian bytes), as used for root output blocks.
using CompressXofFn = void (*)(const uint32_t cv[8], const uint8_t block[kBlockLen], uint8_t block_len,
                               uint64_t counter, uint8_t flags, uint8_t out[64]);
// For each of num_inputs inputs (input i starts at input + i * stride and has
// `blocks` full 64-byte blocks): start from `key`, compress every block with
// flags | (first block ? flags_start : 0) | (last block ? flags_end : 0) and counter
// (counter + i if increment_counter, else counter); write the 32-byte chaining value
// to out + 32 * i. `out` may not overlap the inputs.
using HashManyFn = void (*)(const uint8_t* input, size_t stride, size_t num_inputs, size_t blocks,
                            const uint32_t key[8], uint64_t counter, bool increment_counter,
                            uint8_t flags, uint8_t flags_start, uint8_t flags_end, uint8_t* out);

// Token-chunk kernels (token_hash.h). A message is prev (32 bytes) || big-endian uint32
// tokens; the kernels take native-order tokens and handle 1..kMaxOneShotTokens tokens per
// chunk (messages of at most two BLAKE3 chunks, hashed one-shot).
inline constexpr size_t kMaxOneShotTokens = (2 * kChunkLen - 32) / 4;  // 504
// One chain: out + 32 * c receives chunk c's key, c < num_chunks, chained from prev.
using TokenChainFn = void (*)(const uint8_t prev[32], const uint32_t* tokens, size_t chunk_tokens,
                              size_t num_chunks, uint8_t* out);
// Eight independent chains side by side, each of num_chunks chunks (lane l: prev[l],
// tokens[l], out[l]).
using TokenChains8Fn = void (*)(const uint8_t* const prev[8], const uint32_t* const tokens[8],
                                size_t chunk_tokens, size_t num_chunks, uint8_t* const out[8]);

struct Blake3Backend {
  const char* name;
  CompressInPlaceFn compress_in_place;
  CompressXofFn compress_xof;
  HashManyFn hash_many;
  TokenChainFn token_chain;
  TokenChains8Fn token_chains8;  // null: no lanes, chains run one after the other
};

// The backend hashers and token chains use now: the forced one (SetBlake3ImplForTesting),
// or the best the CPU has with the one-chain kernel of AutoOneChainChoice.
const Blake3Backend* ActiveBackend();

// Which kernel the auto backend hashes one chain with: its SIMD kernel or the portable one,
// whichever ran faster when first asked (timed once per process, ~6 ms; later calls
// return the same). Thread-safe.
struct OneChainChoice {
  TokenChainFn kernel = nullptr;
  const char* name = "";                 // the kernel: "portable" or "sse4.1"
  double chosen_ns_per_chunk = 0;        // best of the timing runs (256-token chunks);
  double other_ns_per_chunk = 0;         // 0 when there was no other kernel to time
};
const OneChainChoice& AutoOneChainChoice();

// Portable scalar reference; always available.
void CompressInPlacePortable(uint32_t cv[8], const uint8_t block[kBlockLen], uint8_t block_len,
                             uint64_t counter, uint8_t flags);
void CompressXofPortable(const uint32_t cv[8], const uint8_t block[kBlockLen], uint8_t block_len,
                         uint64_t counter, uint8_t flags, uint8_t out[64]);
void HashManyPortable(const uint8_t* input, size_t stride, size_t num_inputs, size_t blocks,
                      const uint32_t key[8], uint64_t counter, bool increment_counter, uint8_t flags,
                      uint8_t flags_start, uint8_t flags_end, uint8_t* out);

// x86 SIMD versions: only callable when the CPU has the feature. On other
// architectures these fall back to the portable code (and are never selected).
void CompressInPlaceSse41(uint32_t cv[8], const uint8_t block[kBlockLen], uint8_t block_len,
                          uint64_t counter, uint8_t flags);
void CompressXofSse41(const uint32_t cv[8], const uint8_t block[kBlockLen], uint8_t block_len,
                      uint64_t counter, uint8_t flags, uint8_t out[64]);
void HashManySse41(const uint8_t* input, size_t stride, size_t num_inputs, size_t blocks,
                   const uint32_t key[8], uint64_t counter, bool increment_counter, uint8_t flags,
                   uint8_t flags_start, uint8_t flags_end, uint8_t* out);
void HashManyAvx2(const uint8_t* input, size_t stride, size_t num_inputs, size_t blocks,
                  const uint32_t key[8], uint64_t counter, bool increment_counter, uint8_t flags,
                  uint8_t flags_start, uint8_t flags_end, uint8_t* out);

void TokenChainPortable(const uint8_t prev[32], const uint32_t* tokens, size_t chunk_tokens,
                        size_t num_chunks, uint8_t* out);
void TokenChainSse41(const uint8_t prev[32], const uint32_t* tokens, size_t chunk_tokens,
                     size_t num_chunks, uint8_t* out);
void TokenChains8Avx2(const uint8_t* const prev[8], const uint32_t* const tokens[8],
                      size_t chunk_tokens, size_t num_chunks, uint8_t* const out[8]);

// Little-endian word access, independent of host byte order.
inline uint32_t LoadLe32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
inline void StoreLe32(uint8_t* p, uint32_t w) {
  p[0] = static_cast<uint8_t>(w);
  p[1] = static_cast<uint8_t>(w >> 8);
  p[2] = static_cast<uint8_t>(w >> 16);
  p[3] = static_cast<uint8_t>(w >> 24);
}

inline void StoreBe32(uint8_t* p, uint32_t w) {
  p[0] = static_cast<uint8_t>(w >> 24);
  p[1] = static_cast<uint8_t>(w >> 16);
  p[2] = static_cast<uint8_t>(w >> 8);
  p[3] = static_cast<uint8_t>(w);
}

// One-shot BLAKE3 (default mode, 32-byte output) of a message of 1..2 * kChunkLen bytes
// held in `msg`, which is zero-padded up to the next multiple of kBlockLen: chunk 0, then
// chunk 1 if there is one, then their parent as the root. `compress` has the signature of
// CompressInPlaceFn. Used by the portable token-chain kernel and by tests; the SIMD kernels
// follow the same steps with their own inlined compressions.
template <typename Compress>
inline void OneShotUpTo2Chunks(Compress compress, const uint8_t* msg, size_t len, uint8_t out[32]) {
  uint32_t cv0[8];
  for (int i = 0; i < 8; ++i) cv0[i] = kIv[i];
  const size_t len0 = len < kChunkLen ? len : kChunkLen;
  const bool one_chunk = len <= kChunkLen;
  const size_t blocks0 = (len0 + kBlockLen - 1) / kBlockLen;
  for (size_t b = 0; b < blocks0; ++b) {
    const bool last = b + 1 == blocks0;
    uint8_t flags = (b == 0 ? kChunkStart : 0) | (last ? kChunkEnd : 0);
    if (last && one_chunk) flags |= kRoot;
    const size_t block_len = last ? len0 - b * kBlockLen : kBlockLen;
    compress(cv0, msg + b * kBlockLen, static_cast<uint8_t>(block_len), 0, flags);
  }
  if (!one_chunk) {
    uint32_t cv1[8];
    for (int i = 0; i < 8; ++i) cv1[i] = kIv[i];
    const size_t len1 = len - kChunkLen;
    const size_t blocks1 = (len1 + kBlockLen - 1) / kBlockLen;
    for (size_t b = 0; b < blocks1; ++b) {
      const bool last = b + 1 == blocks1;
      const uint8_t flags = (b == 0 ? kChunkStart : 0) | (last ? kChunkEnd : 0);
      const size_t block_len = last ? len1 - b * kBlockLen : kBlockLen;
      compress(cv1, msg + kChunkLen + b * kBlockLen, static_cast<uint8_t>(block_len), 1, flags);
    }
    uint8_t parent[kBlockLen];
    for (int i = 0; i < 8; ++i) {
      StoreLe32(parent + 4 * i, cv0[i]);
      StoreLe32(parent + 32 + 4 * i, cv1[i]);
    }
    for (int i = 0; i < 8; ++i) cv0[i] = kIv[i];
    compress(cv0, parent, static_cast<uint8_t>(kBlockLen), 0, kParent | kRoot);
  }
  for (int i = 0; i < 8; ++i) StoreLe32(out + 4 * i, cv0[i]);
}

}  // namespace kvd::keys::internal
