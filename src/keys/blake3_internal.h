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

struct Blake3Backend {
  const char* name;
  CompressInPlaceFn compress_in_place;
  CompressXofFn compress_xof;
  HashManyFn hash_many;
};

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

// The backend new hashers use (see SetBlake3ImplForTesting).
const Blake3Backend* ActiveBackend();

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

}  // namespace kvd::keys::internal
