// SSE4.1 BLAKE3: a row-parallel single-block compression (one 128-bit vector per
// row of the 4x4 state) and a 4-way "hash many" that compresses four independent
// inputs at once, one input per 32-bit lane.
//
// Functions here are compiled with __attribute__((target("sse4.1"))) so no global
// -msse4.1 flag is needed; callers must check the CPU first (see blake3.cc).
// Stateless and thread-safe; no allocation.
#include "keys/blake3_internal.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#define KVD_SSE41 __attribute__((target("sse4.1"), always_inline)) inline
#define KVD_SSE41_FN __attribute__((target("sse4.1")))

namespace kvd::keys::internal {
namespace {

KVD_SSE41 __m128i Add(__m128i a, __m128i b) { return _mm_add_epi32(a, b); }
KVD_SSE41 __m128i Xor(__m128i a, __m128i b) { return _mm_xor_si128(a, b); }
KVD_SSE41 __m128i Rotr16(__m128i x) {
  return _mm_shuffle_epi8(x, _mm_set_epi8(13, 12, 15, 14, 9, 8, 11, 10, 5, 4, 7, 6, 1, 0, 3, 2));
}
KVD_SSE41 __m128i Rotr8(__m128i x) {
  return _mm_shuffle_epi8(x, _mm_set_epi8(12, 15, 14, 13, 8, 11, 10, 9, 4, 7, 6, 5, 0, 3, 2, 1));
}
KVD_SSE41 __m128i Rotr12(__m128i x) { return _mm_or_si128(_mm_srli_epi32(x, 12), _mm_slli_epi32(x, 20)); }
KVD_SSE41 __m128i Rotr7(__m128i x) { return _mm_or_si128(_mm_srli_epi32(x, 7), _mm_slli_epi32(x, 25)); }

// ---- Row-parallel single compression ----------------------------------------

// G on all four columns (or diagonals, after rotating rows) at once.
KVD_SSE41 void MixRows(__m128i& r0, __m128i& r1, __m128i& r2, __m128i& r3, __m128i mx, __m128i my) {
  r0 = Add(Add(r0, r1), mx);
  r3 = Rotr16(Xor(r3, r0));
  r2 = Add(r2, r3);
  r1 = Rotr12(Xor(r1, r2));
  r0 = Add(Add(r0, r1), my);
  r3 = Rotr8(Xor(r3, r0));
  r2 = Add(r2, r3);
  r1 = Rotr7(Xor(r1, r2));
}

template <int R>
KVD_SSE41 void RowRound(__m128i& r0, __m128i& r1, __m128i& r2, __m128i& r3, const uint32_t m[16]) {
  constexpr const uint8_t* s = kSchedule.idx[R];
  MixRows(r0, r1, r2, r3, _mm_setr_epi32(m[s[0]], m[s[2]], m[s[4]], m[s[6]]),
          _mm_setr_epi32(m[s[1]], m[s[3]], m[s[5]], m[s[7]]));
  // Rotate rows so that lane j of each row holds diagonal j.
  r1 = _mm_shuffle_epi32(r1, 0x39);  // lanes 1,2,3,0
  r2 = _mm_shuffle_epi32(r2, 0x4E);  // lanes 2,3,0,1
  r3 = _mm_shuffle_epi32(r3, 0x93);  // lanes 3,0,1,2
  MixRows(r0, r1, r2, r3, _mm_setr_epi32(m[s[8]], m[s[10]], m[s[12]], m[s[14]]),
          _mm_setr_epi32(m[s[9]], m[s[11]], m[s[13]], m[s[15]]));
  r1 = _mm_shuffle_epi32(r1, 0x93);
  r2 = _mm_shuffle_epi32(r2, 0x4E);
  r3 = _mm_shuffle_epi32(r3, 0x39);
}

KVD_SSE41 void CompressRows(const uint32_t cv[8], const uint8_t block[kBlockLen], uint8_t block_len,
                            uint64_t counter, uint8_t flags, __m128i& r0, __m128i& r1, __m128i& r2,
                            __m128i& r3) {
  uint32_t m[16];
  for (int i = 0; i < 16; ++i) m[i] = LoadLe32(block + 4 * i);
  r0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(cv));
  r1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(cv + 4));
  r2 = _mm_setr_epi32(static_cast<int>(kIv[0]), static_cast<int>(kIv[1]), static_cast<int>(kIv[2]),
                      static_cast<int>(kIv[3]));
  r3 = _mm_setr_epi32(static_cast<int>(static_cast<uint32_t>(counter)),
                      static_cast<int>(static_cast<uint32_t>(counter >> 32)), block_len, flags);
  RowRound<0>(r0, r1, r2, r3, m);
  RowRound<1>(r0, r1, r2, r3, m);
  RowRound<2>(r0, r1, r2, r3, m);
  RowRound<3>(r0, r1, r2, r3, m);
  RowRound<4>(r0, r1, r2, r3, m);
  RowRound<5>(r0, r1, r2, r3, m);
  RowRound<6>(r0, r1, r2, r3, m);
}

// ---- 4-way transposed hash-many ---------------------------------------------

// In-place 4x4 transpose of 32-bit words.
KVD_SSE41 void Transpose4(__m128i& a, __m128i& b, __m128i& c, __m128i& d) {
  __m128i ab_lo = _mm_unpacklo_epi32(a, b);
  __m128i ab_hi = _mm_unpackhi_epi32(a, b);
  __m128i cd_lo = _mm_unpacklo_epi32(c, d);
  __m128i cd_hi = _mm_unpackhi_epi32(c, d);
  a = _mm_unpacklo_epi64(ab_lo, cd_lo);
  b = _mm_unpackhi_epi64(ab_lo, cd_lo);
  c = _mm_unpacklo_epi64(ab_hi, cd_hi);
  d = _mm_unpackhi_epi64(ab_hi, cd_hi);
}

KVD_SSE41 void Mix4(__m128i v[16], int a, int b, int c, int d, __m128i x, __m128i y) {
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
KVD_SSE41 void Round4(__m128i v[16], const __m128i m[16]) {
  constexpr const uint8_t* s = kSchedule.idx[R];
  Mix4(v, 0, 4, 8, 12, m[s[0]], m[s[1]]);
  Mix4(v, 1, 5, 9, 13, m[s[2]], m[s[3]]);
  Mix4(v, 2, 6, 10, 14, m[s[4]], m[s[5]]);
  Mix4(v, 3, 7, 11, 15, m[s[6]], m[s[7]]);
  Mix4(v, 0, 5, 10, 15, m[s[8]], m[s[9]]);
  Mix4(v, 1, 6, 11, 12, m[s[10]], m[s[11]]);
  Mix4(v, 2, 7, 8, 13, m[s[12]], m[s[13]]);
  Mix4(v, 3, 4, 9, 14, m[s[14]], m[s[15]]);
}

KVD_SSE41 __m128i LoadU(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

KVD_SSE41_FN void HashFour(const uint8_t* input, size_t stride, size_t blocks, const uint32_t key[8],
                           uint64_t counter, bool increment_counter, uint8_t flags,
                           uint8_t flags_start, uint8_t flags_end, uint8_t* out) {
  __m128i h[8];
  for (int i = 0; i < 8; ++i) h[i] = _mm_set1_epi32(static_cast<int>(key[i]));
  alignas(16) uint32_t lo[4];
  alignas(16) uint32_t hi[4];
  for (int i = 0; i < 4; ++i) {
    uint64_t c = counter + (increment_counter ? static_cast<uint64_t>(i) : 0);
    lo[i] = static_cast<uint32_t>(c);
    hi[i] = static_cast<uint32_t>(c >> 32);
  }
  const __m128i counter_lo = _mm_load_si128(reinterpret_cast<const __m128i*>(lo));
  const __m128i counter_hi = _mm_load_si128(reinterpret_cast<const __m128i*>(hi));
  uint8_t block_flags = flags | flags_start;
  for (size_t b = 0; b < blocks; ++b) {
    if (b + 1 == blocks) block_flags |= flags_end;
    const size_t off = b * kBlockLen;
    __m128i m[16];
    for (int q = 0; q < 4; ++q) {  // quarter q of each block: words 4q..4q+3
      m[4 * q + 0] = LoadU(input + 0 * stride + off + 16 * q);
      m[4 * q + 1] = LoadU(input + 1 * stride + off + 16 * q);
      m[4 * q + 2] = LoadU(input + 2 * stride + off + 16 * q);
      m[4 * q + 3] = LoadU(input + 3 * stride + off + 16 * q);
      Transpose4(m[4 * q + 0], m[4 * q + 1], m[4 * q + 2], m[4 * q + 3]);
    }
    __m128i v[16];
    for (int i = 0; i < 8; ++i) v[i] = h[i];
    for (int i = 0; i < 4; ++i) v[8 + i] = _mm_set1_epi32(static_cast<int>(kIv[i]));
    v[12] = counter_lo;
    v[13] = counter_hi;
    v[14] = _mm_set1_epi32(static_cast<int>(kBlockLen));
    v[15] = _mm_set1_epi32(block_flags);
    Round4<0>(v, m);
    Round4<1>(v, m);
    Round4<2>(v, m);
    Round4<3>(v, m);
    Round4<4>(v, m);
    Round4<5>(v, m);
    Round4<6>(v, m);
    for (int i = 0; i < 8; ++i) h[i] = Xor(v[i], v[i + 8]);
    block_flags = flags;
  }
  Transpose4(h[0], h[1], h[2], h[3]);
  Transpose4(h[4], h[5], h[6], h[7]);
  for (int i = 0; i < 4; ++i) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 32 * i), h[i]);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 32 * i + 16), h[4 + i]);
  }
}

}  // namespace

KVD_SSE41_FN void CompressInPlaceSse41(uint32_t cv[8], const uint8_t block[kBlockLen], uint8_t block_len,
                                       uint64_t counter, uint8_t flags) {
  __m128i r0, r1, r2, r3;
  CompressRows(cv, block, block_len, counter, flags, r0, r1, r2, r3);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(cv), Xor(r0, r2));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(cv + 4), Xor(r1, r3));
}

KVD_SSE41_FN void CompressXofSse41(const uint32_t cv[8], const uint8_t block[kBlockLen], uint8_t block_len,
                                   uint64_t counter, uint8_t flags, uint8_t out[64]) {
  __m128i r0, r1, r2, r3;
  CompressRows(cv, block, block_len, counter, flags, r0, r1, r2, r3);
  const __m128i c0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(cv));
  const __m128i c1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(cv + 4));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), Xor(r0, r2));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), Xor(r1, r3));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 32), Xor(r2, c0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 48), Xor(r3, c1));
}

KVD_SSE41_FN void HashManySse41(const uint8_t* input, size_t stride, size_t num_inputs, size_t blocks,
                                const uint32_t key[8], uint64_t counter, bool increment_counter,
                                uint8_t flags, uint8_t flags_start, uint8_t flags_end, uint8_t* out) {
  while (num_inputs >= 4) {
    HashFour(input, stride, blocks, key, counter, increment_counter, flags, flags_start, flags_end, out);
    input += 4 * stride;
    out += 4 * 32;
    num_inputs -= 4;
    if (increment_counter) counter += 4;
  }
  for (; num_inputs > 0; --num_inputs) {
    alignas(16) uint32_t cv[8];
    for (int w = 0; w < 8; ++w) cv[w] = key[w];
    uint8_t block_flags = flags | flags_start;
    for (size_t b = 0; b < blocks; ++b) {
      if (b + 1 == blocks) block_flags |= flags_end;
      CompressInPlaceSse41(cv, input + b * kBlockLen, kBlockLen, counter, block_flags);
      block_flags = flags;
    }
    for (int w = 0; w < 8; ++w) StoreLe32(out + 4 * w, cv[w]);
    input += stride;
    out += 32;
    if (increment_counter) ++counter;
  }
}

}  // namespace kvd::keys::internal

#else  // not x86: never selected at runtime; keep the symbols for the linker.

namespace kvd::keys::internal {
void CompressInPlaceSse41(uint32_t cv[8], const uint8_t block[kBlockLen], uint8_t block_len,
                          uint64_t counter, uint8_t flags) {
  CompressInPlacePortable(cv, block, block_len, counter, flags);
}
void CompressXofSse41(const uint32_t cv[8], const uint8_t block[kBlockLen], uint8_t block_len,
                      uint64_t counter, uint8_t flags, uint8_t out[64]) {
  CompressXofPortable(cv, block, block_len, counter, flags, out);
}
void HashManySse41(const uint8_t* input, size_t stride, size_t num_inputs, size_t blocks,
                   const uint32_t key[8], uint64_t counter, bool increment_counter, uint8_t flags,
                   uint8_t flags_start, uint8_t flags_end, uint8_t* out) {
  HashManyPortable(input, stride, num_inputs, blocks, key, counter, increment_counter, flags,
                   flags_start, flags_end, out);
}
}  // namespace kvd::keys::internal

#endif
