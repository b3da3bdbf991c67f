// Portable scalar BLAKE3 compression: the reference every SIMD path is tested
// against, and the fallback on CPUs without SSE4.1/AVX2.
//
// Stateless and thread-safe; no allocation.
#include "keys/blake3_internal.h"

namespace kvd::keys::internal {
namespace {

inline uint32_t Rotr32(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

// The quarter-round mixing function G.
inline void Mix(uint32_t& a, uint32_t& b, uint32_t& c, uint32_t& d, uint32_t x, uint32_t y) {
  a = a + b + x;
  d = Rotr32(d ^ a, 16);
  c = c + d;
  b = Rotr32(b ^ c, 12);
  a = a + b + y;
  d = Rotr32(d ^ a, 8);
  c = c + d;
  b = Rotr32(b ^ c, 7);
}

template <int R>
inline void Round(uint32_t v[16], const uint32_t m[16]) {
  constexpr const uint8_t* s = kSchedule.idx[R];
  // Columns.
  Mix(v[0], v[4], v[8], v[12], m[s[0]], m[s[1]]);
  Mix(v[1], v[5], v[9], v[13], m[s[2]], m[s[3]]);
  Mix(v[2], v[6], v[10], v[14], m[s[4]], m[s[5]]);
  Mix(v[3], v[7], v[11], v[15], m[s[6]], m[s[7]]);
  // Diagonals.
  Mix(v[0], v[5], v[10], v[15], m[s[8]], m[s[9]]);
  Mix(v[1], v[6], v[11], v[12], m[s[10]], m[s[11]]);
  Mix(v[2], v[7], v[8], v[13], m[s[12]], m[s[13]]);
  Mix(v[3], v[4], v[9], v[14], m[s[14]], m[s[15]]);
}

// Runs the 7 rounds; v receives the final 16-word state (before the output xors).
inline void CompressCore(const uint32_t cv[8], const uint8_t block[kBlockLen], uint8_t block_len,
                         uint64_t counter, uint8_t flags, uint32_t v[16]) {
  uint32_t m[16];
  for (int i = 0; i < 16; ++i) m[i] = LoadLe32(block + 4 * i);
  for (int i = 0; i < 8; ++i) v[i] = cv[i];
  v[8] = kIv[0];
  v[9] = kIv[1];
  v[10] = kIv[2];
  v[11] = kIv[3];
  v[12] = static_cast<uint32_t>(counter);
  v[13] = static_cast<uint32_t>(counter >> 32);
  v[14] = block_len;
  v[15] = flags;
  Round<0>(v, m);
  Round<1>(v, m);
  Round<2>(v, m);
  Round<3>(v, m);
  Round<4>(v, m);
  Round<5>(v, m);
  Round<6>(v, m);
}

}  // namespace

void CompressInPlacePortable(uint32_t cv[8], const uint8_t block[kBlockLen], uint8_t block_len,
                             uint64_t counter, uint8_t flags) {
  uint32_t v[16];
  CompressCore(cv, block, block_len, counter, flags, v);
  for (int i = 0; i < 8; ++i) cv[i] = v[i] ^ v[i + 8];
}

void CompressXofPortable(const uint32_t cv[8], const uint8_t block[kBlockLen], uint8_t block_len,
                         uint64_t counter, uint8_t flags, uint8_t out[64]) {
  uint32_t v[16];
  CompressCore(cv, block, block_len, counter, flags, v);
  for (int i = 0; i < 8; ++i) {
    StoreLe32(out + 4 * i, v[i] ^ v[i + 8]);
    StoreLe32(out + 32 + 4 * i, v[i + 8] ^ cv[i]);
  }
}

void HashManyPortable(const uint8_t* input, size_t stride, size_t num_inputs, size_t blocks,
                      const uint32_t key[8], uint64_t counter, bool increment_counter, uint8_t flags,
                      uint8_t flags_start, uint8_t flags_end, uint8_t* out) {
  for (size_t i = 0; i < num_inputs; ++i) {
    const uint8_t* in = input + i * stride;
    uint32_t cv[8];
    for (int w = 0; w < 8; ++w) cv[w] = key[w];
    uint8_t block_flags = flags | flags_start;
    for (size_t b = 0; b < blocks; ++b) {
      if (b + 1 == blocks) block_flags |= flags_end;
      CompressInPlacePortable(cv, in + b * kBlockLen, kBlockLen, counter, block_flags);
      block_flags = flags;
    }
    for (int w = 0; w < 8; ++w) StoreLe32(out + 32 * i + 4 * w, cv[w]);
    if (increment_counter) ++counter;
  }
}

void TokenChainPortable(const uint8_t prev[32], const uint32_t* tokens, size_t chunk_tokens,
                        size_t num_chunks, uint8_t* out) {
  alignas(16) uint8_t msg[2 * kChunkLen];
  const size_t len = 32 + 4 * chunk_tokens;
  const size_t padded = (len + kBlockLen - 1) / kBlockLen * kBlockLen;
  for (size_t i = 0; i < 32; ++i) msg[i] = prev[i];
  for (size_t i = len; i < padded; ++i) msg[i] = 0;
  for (size_t c = 0; c < num_chunks; ++c) {
    const uint32_t* t = tokens + c * chunk_tokens;
    for (size_t i = 0; i < chunk_tokens; ++i) StoreBe32(msg + 32 + 4 * i, t[i]);
    uint8_t* h = out + 32 * c;
    OneShotUpTo2Chunks(CompressInPlacePortable, msg, len, h);
    for (size_t i = 0; i < 32; ++i) msg[i] = h[i];
  }
}

}  // namespace kvd::keys::internal
