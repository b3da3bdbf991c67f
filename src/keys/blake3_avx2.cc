// AVX2 BLAKE3 "hash many": compresses eight independent inputs at once, one input
// per 32-bit lane of each 256-bit vector. Leftover inputs (fewer than eight) go to
// the SSE4.1 code, which every AVX2 CPU also has.
//
// Functions here are compiled with __attribute__((target("avx2"))) so no global
// -mavx2 flag is needed; callers must check the CPU first (see blake3.cc).
// Stateless and thread-safe; no allocation.
#include "keys/blake3_internal.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include <cstring>

#define KVD_AVX2 __attribute__((target("avx2"), always_inline)) inline
#define KVD_AVX2_FN __attribute__((target("avx2")))

namespace kvd::keys::internal {
namespace {

KVD_AVX2 __m256i Add(__m256i a, __m256i b) { return _mm256_add_epi32(a, b); }
KVD_AVX2 __m256i Xor(__m256i a, __m256i b) { return _mm256_xor_si256(a, b); }
KVD_AVX2 __m256i Rotr16(__m256i x) {
  return _mm256_shuffle_epi8(x, _mm256_set_epi8(13, 12, 15, 14, 9, 8, 11, 10, 5, 4, 7, 6, 1, 0, 3, 2,  //
                                                13, 12, 15, 14, 9, 8, 11, 10, 5, 4, 7, 6, 1, 0, 3, 2));
}
KVD_AVX2 __m256i Rotr8(__m256i x) {
  return _mm256_shuffle_epi8(x, _mm256_set_epi8(12, 15, 14, 13, 8, 11, 10, 9, 4, 7, 6, 5, 0, 3, 2, 1,  //
                                                12, 15, 14, 13, 8, 11, 10, 9, 4, 7, 6, 5, 0, 3, 2, 1));
}
KVD_AVX2 __m256i Rotr12(__m256i x) { return _mm256_or_si256(_mm256_srli_epi32(x, 12), _mm256_slli_epi32(x, 20)); }
KVD_AVX2 __m256i Rotr7(__m256i x) { return _mm256_or_si256(_mm256_srli_epi32(x, 7), _mm256_slli_epi32(x, 25)); }

KVD_AVX2 void Mix8(__m256i v[16], int a, int b, int c, int d, __m256i x, __m256i y) {
  v[a] = Add(Add(v[a], v[b]), x);
  v[d] = Rotr16(Xor(v[d], v[a]));
  v[c] = Add(v[c], v[d]);
  v[b] = Rotr12(Xor(v[b], v[c]));
  v[a] = Add(Add(v[a], v[b]), y);
  v[d] = Rotr8(Xor(v[d], v[a]));
  v[c] = Add(v[c], v[d]);
  v[b] = Rotr7(Xor(v[b], v[c]));
}

template <int R>
KVD_AVX2 void Round8(__m256i v[16], const __m256i m[16]) {
  constexpr const uint8_t* s = kSchedule.idx[R];
  Mix8(v, 0, 4, 8, 12, m[s[0]], m[s[1]]);
  Mix8(v, 1, 5, 9, 13, m[s[2]], m[s[3]]);
  Mix8(v, 2, 6, 10, 14, m[s[4]], m[s[5]]);
  Mix8(v, 3, 7, 11, 15, m[s[6]], m[s[7]]);
  Mix8(v, 0, 5, 10, 15, m[s[8]], m[s[9]]);
  Mix8(v, 1, 6, 11, 12, m[s[10]], m[s[11]]);
  Mix8(v, 2, 7, 8, 13, m[s[12]], m[s[13]]);
  Mix8(v, 3, 4, 9, 14, m[s[14]], m[s[15]]);
}

// In-place 8x8 transpose of 32-bit words: on entry r[i] is row i, on exit r[j]
// holds column j (word j of every row).
KVD_AVX2 void Transpose8(__m256i r[8]) {
  // Pairs of rows interleaved by word, then by pairs of words (within 128-bit halves).
  __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]);
  __m256i t1 = _mm256_unpackhi_epi32(r[0], r[1]);
  __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]);
  __m256i t3 = _mm256_unpackhi_epi32(r[2], r[3]);
  __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]);
  __m256i t5 = _mm256_unpackhi_epi32(r[4], r[5]);
  __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]);
  __m256i t7 = _mm256_unpackhi_epi32(r[6], r[7]);
  // u0: word 0 of rows 0-3 | word 4 of rows 0-3; u1: words 1|5; u2: 2|6; u3: 3|7.
  __m256i u0 = _mm256_unpacklo_epi64(t0, t2);
  __m256i u1 = _mm256_unpackhi_epi64(t0, t2);
  __m256i u2 = _mm256_unpacklo_epi64(t1, t3);
  __m256i u3 = _mm256_unpackhi_epi64(t1, t3);
  // Same for rows 4-7.
  __m256i u4 = _mm256_unpacklo_epi64(t4, t6);
  __m256i u5 = _mm256_unpackhi_epi64(t4, t6);
  __m256i u6 = _mm256_unpacklo_epi64(t5, t7);
  __m256i u7 = _mm256_unpackhi_epi64(t5, t7);
  // Join the halves: low halves give words 0-3, high halves words 4-7.
  r[0] = _mm256_permute2x128_si256(u0, u4, 0x20);
  r[1] = _mm256_permute2x128_si256(u1, u5, 0x20);
  r[2] = _mm256_permute2x128_si256(u2, u6, 0x20);
  r[3] = _mm256_permute2x128_si256(u3, u7, 0x20);
  r[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
  r[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
  r[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
  r[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
}

KVD_AVX2 __m256i LoadU(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

KVD_AVX2_FN void HashEight(const uint8_t* input, size_t stride, size_t blocks, const uint32_t key[8],
                           uint64_t counter, bool increment_counter, uint8_t flags,
                           uint8_t flags_start, uint8_t flags_end, uint8_t* out) {
  __m256i h[8];
  for (int i = 0; i < 8; ++i) h[i] = _mm256_set1_epi32(static_cast<int>(key[i]));
  alignas(32) uint32_t lo[8];
  alignas(32) uint32_t hi[8];
  for (int i = 0; i < 8; ++i) {
    uint64_t c = counter + (increment_counter ? static_cast<uint64_t>(i) : 0);
    lo[i] = static_cast<uint32_t>(c);
    hi[i] = static_cast<uint32_t>(c >> 32);
  }
  const __m256i counter_lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo));
  const __m256i counter_hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi));
  uint8_t block_flags = flags | flags_start;
  for (size_t b = 0; b < blocks; ++b) {
    if (b + 1 == blocks) block_flags |= flags_end;
    const size_t off = b * kBlockLen;
    __m256i m[16];
    for (int i = 0; i < 8; ++i) {
      m[i] = LoadU(input + i * stride + off);
      m[8 + i] = LoadU(input + i * stride + off + 32);
    }
    Transpose8(m);
    Transpose8(m + 8);
    __m256i v[16];
    for (int i = 0; i < 8; ++i) v[i] = h[i];
    for (int i = 0; i < 4; ++i) v[8 + i] = _mm256_set1_epi32(static_cast<int>(kIv[i]));
    v[12] = counter_lo;
    v[13] = counter_hi;
    v[14] = _mm256_set1_epi32(static_cast<int>(kBlockLen));
    v[15] = _mm256_set1_epi32(block_flags);
    Round8<0>(v, m);
    Round8<1>(v, m);
    Round8<2>(v, m);
    Round8<3>(v, m);
    Round8<4>(v, m);
    Round8<5>(v, m);
    Round8<6>(v, m);
    for (int i = 0; i < 8; ++i) h[i] = Xor(v[i], v[i + 8]);
    block_flags = flags;
  }
  Transpose8(h);
  for (int i = 0; i < 8; ++i) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * i), h[i]);
}

// ---- Eight token chains side by side (token_hash.h) ---------------------------

// dst <- big-endian bytes of n native-order tokens, eight at a time with one vpshufb.
KVD_AVX2 void CopyTokensBigEndian8(uint8_t* dst, const uint32_t* t, size_t n) {
  const __m256i swap = _mm256_setr_epi8(3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12,  //
                                        3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 4 * i), _mm256_shuffle_epi8(v, swap));
  }
  for (; i < n; ++i) StoreBe32(dst + 4 * i, t[i]);
}

// One compression of eight lanes: h (word i of every lane in h[i]) <- compress(h, m).
KVD_AVX2 void Compress8(__m256i h[8], __m256i m[16], uint32_t counter, uint32_t block_len,
                        uint32_t flags) {
  __m256i v[16];
  for (int i = 0; i < 8; ++i) v[i] = h[i];
  for (int i = 0; i < 4; ++i) v[8 + i] = _mm256_set1_epi32(static_cast<int>(kIv[i]));
  v[12] = _mm256_set1_epi32(static_cast<int>(counter));
  v[13] = _mm256_setzero_si256();
  v[14] = _mm256_set1_epi32(static_cast<int>(block_len));
  v[15] = _mm256_set1_epi32(static_cast<int>(flags));
  Round8<0>(v, m);
  Round8<1>(v, m);
  Round8<2>(v, m);
  Round8<3>(v, m);
  Round8<4>(v, m);
  Round8<5>(v, m);
  Round8<6>(v, m);
  for (int i = 0; i < 8; ++i) h[i] = Xor(v[i], v[i + 8]);
}

// Block `off` of every lane's message (rows of `stride` bytes), transposed into m.
KVD_AVX2 void LoadBlock8(const uint8_t* rows, size_t stride, size_t off, __m256i m[16]) {
  for (int i = 0; i < 8; ++i) {
    m[i] = LoadU(rows + i * stride + off);
    m[8 + i] = LoadU(rows + i * stride + off + 32);
  }
  Transpose8(m);
  Transpose8(m + 8);
}

KVD_AVX2 void SetIv8(__m256i h[8]) {
  for (int i = 0; i < 8; ++i) h[i] = _mm256_set1_epi32(static_cast<int>(kIv[i]));
}

}  // namespace

KVD_AVX2_FN void TokenChains8Avx2(const uint8_t* const prev[8], const uint32_t* const tokens[8],
                                  size_t chunk_tokens, size_t num_chunks, uint8_t* const out[8]) {
  constexpr size_t kStride = 2 * kChunkLen;
  alignas(32) uint8_t msg[8 * kStride];  // lane l's message at msg + l * kStride
  const size_t len = 32 + 4 * chunk_tokens;
  const size_t padded = (len + kBlockLen - 1) / kBlockLen * kBlockLen;
  for (int l = 0; l < 8; ++l) {
    std::memcpy(msg + l * kStride, prev[l], 32);
    std::memset(msg + l * kStride + len, 0, padded - len);
  }
  const size_t len0 = len < kChunkLen ? len : kChunkLen;
  const size_t blocks0 = (len0 + kBlockLen - 1) / kBlockLen;
  const bool one_chunk = len <= kChunkLen;
  for (size_t c = 0; c < num_chunks; ++c) {
    for (int l = 0; l < 8; ++l) {
      CopyTokensBigEndian8(msg + l * kStride + 32, tokens[l] + c * chunk_tokens, chunk_tokens);
    }
    __m256i h0[8], m[16];
    SetIv8(h0);
    for (size_t b = 0; b < blocks0; ++b) {
      const bool last = b + 1 == blocks0;
      uint32_t flags = (b == 0 ? kChunkStart : 0) | (last ? kChunkEnd : 0);
      if (last && one_chunk) flags |= kRoot;
      LoadBlock8(msg, kStride, b * kBlockLen, m);
      Compress8(h0, m, 0, static_cast<uint32_t>(last ? len0 - b * kBlockLen : kBlockLen), flags);
    }
    if (!one_chunk) {
      const size_t len1 = len - kChunkLen;
      const size_t blocks1 = (len1 + kBlockLen - 1) / kBlockLen;
      __m256i h1[8];
      SetIv8(h1);
      for (size_t b = 0; b < blocks1; ++b) {
        const bool last = b + 1 == blocks1;
        LoadBlock8(msg, kStride, kChunkLen + b * kBlockLen, m);
        Compress8(h1, m, 1, static_cast<uint32_t>(last ? len1 - b * kBlockLen : kBlockLen),
                  (b == 0 ? kChunkStart : 0) | (last ? kChunkEnd : 0));
      }
      // The parent's message is the two chaining values, already one word per vector.
      for (int i = 0; i < 8; ++i) {
        m[i] = h0[i];
        m[8 + i] = h1[i];
      }
      SetIv8(h0);
      Compress8(h0, m, 0, kBlockLen, kParent | kRoot);
    }
    Transpose8(h0);  // h0[l] = lane l's key
    for (int l = 0; l < 8; ++l) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[l] + 32 * c), h0[l]);
      _mm256_store_si256(reinterpret_cast<__m256i*>(msg + l * kStride), h0[l]);
    }
  }
}

KVD_AVX2_FN void HashManyAvx2(const uint8_t* input, size_t stride, size_t num_inputs, size_t blocks,
                              const uint32_t key[8], uint64_t counter, bool increment_counter,
                              uint8_t flags, uint8_t flags_start, uint8_t flags_end, uint8_t* out) {
  while (num_inputs >= 8) {
    HashEight(input, stride, blocks, key, counter, increment_counter, flags, flags_start, flags_end, out);
    input += 8 * stride;
    out += 8 * 32;
    num_inputs -= 8;
    if (increment_counter) counter += 8;
  }
  if (num_inputs > 0) {
    HashManySse41(input, stride, num_inputs, blocks, key, counter, increment_counter, flags, flags_start,
                  flags_end, out);
  }
}

}  // namespace kvd::keys::internal

#else  // not x86: never selected at runtime; keep the symbol for the linker.

namespace kvd::keys::internal {
void HashManyAvx2(const uint8_t* input, size_t stride, size_t num_inputs, size_t blocks,
                  const uint32_t key[8], uint64_t counter, bool increment_counter, uint8_t flags,
                  uint8_t flags_start, uint8_t flags_end, uint8_t* out) {
  HashManyPortable(input, stride, num_inputs, blocks, key, counter, increment_counter, flags,
                   flags_start, flags_end, out);
}
void TokenChains8Avx2(const uint8_t* const prev[8], const uint32_t* const tokens[8],
                      size_t chunk_tokens, size_t num_chunks, uint8_t* const out[8]) {
  for (int l = 0; l < 8; ++l) TokenChainPortable(prev[l], tokens[l], chunk_tokens, num_chunks, out[l]);
}
}  // namespace kvd::keys::internal

#endif
