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

#include <cstring>

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
// The message word is added to r0 first: r0 is ready before r1, so only one add waits
// for r1 (a single compression is latency-bound; this is its critical path).
// The empty asm keeps the compiler from reassociating (r0 + m) + r1 into (r0 + r1) + m,
// which would put a second add on the critical path.
KVD_SSE41 __m128i AddEarly(__m128i a, __m128i m) {
  __m128i t = Add(a, m);
  __asm__("" : "+x"(t));
  return t;
}
KVD_SSE41 void MixRows(__m128i& r0, __m128i& r1, __m128i& r2, __m128i& r3, __m128i mx, __m128i my) {
  r0 = Add(AddEarly(r0, mx), r1);
  r3 = Rotr16(Xor(r3, r0));
  r2 = Add(r2, r3);
  r1 = Rotr12(Xor(r1, r2));
  r0 = Add(AddEarly(r0, my), r1);
  r3 = Rotr8(Xor(r3, r0));
  r2 = Add(r2, r3);
  r1 = Rotr7(Xor(r1, r2));
}

// Diagonal step: rows 0, 2 and 3 are rotated so that lane j of each row holds the
// diagonal through row 1's lane j (row 1 stays put). Row 1 is the last value a G step
// computes, rows 0, 2 and 3 are ready earlier, so the rotations stay off the critical path
// of the (latency-bound) compression. Lane 0 then holds diagonal 3 (v3, v4, v9, v14),
// lane 1 diagonal 0, lane 2 diagonal 1, lane 3 diagonal 2.
KVD_SSE41 void Diagonalize(__m128i& r0, __m128i& r2, __m128i& r3) {
  r0 = _mm_shuffle_epi32(r0, 0x93);  // lanes 3,0,1,2
  r2 = _mm_shuffle_epi32(r2, 0x39);  // lanes 1,2,3,0
  r3 = _mm_shuffle_epi32(r3, 0x4E);  // lanes 2,3,0,1
}
KVD_SSE41 void Undiagonalize(__m128i& r0, __m128i& r2, __m128i& r3) {
  r0 = _mm_shuffle_epi32(r0, 0x39);
  r2 = _mm_shuffle_epi32(r2, 0x93);
  r3 = _mm_shuffle_epi32(r3, 0x4E);
}

template <int R>
KVD_SSE41 void RowRound(__m128i& r0, __m128i& r1, __m128i& r2, __m128i& r3, const uint32_t m[16]) {
  constexpr const uint8_t* s = kSchedule.idx[R];
  MixRows(r0, r1, r2, r3, _mm_setr_epi32(m[s[0]], m[s[2]], m[s[4]], m[s[6]]),
          _mm_setr_epi32(m[s[1]], m[s[3]], m[s[5]], m[s[7]]));
  Diagonalize(r0, r2, r3);
  MixRows(r0, r1, r2, r3, _mm_setr_epi32(m[s[14]], m[s[8]], m[s[10]], m[s[12]]),
          _mm_setr_epi32(m[s[15]], m[s[9]], m[s[11]], m[s[13]]));
  Undiagonalize(r0, r2, r3);
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

// ---- One-shot token chunks (token_hash.h) ------------------------------------

// dst <- big-endian bytes of n native-order tokens, four at a time with one pshufb.
KVD_SSE41 void CopyTokensBigEndian(uint8_t* dst, const uint32_t* t, size_t n) {
  const __m128i swap = _mm_setr_epi8(3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12);
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(t + i));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 4 * i), _mm_shuffle_epi8(v, swap));
  }
  for (; i < n; ++i) StoreBe32(dst + 4 * i, t[i]);
}

KVD_SSE41 __m128i IvLo() {
  return _mm_setr_epi32(static_cast<int>(kIv[0]), static_cast<int>(kIv[1]), static_cast<int>(kIv[2]),
                        static_cast<int>(kIv[3]));
}
KVD_SSE41 __m128i IvHi() {
  return _mm_setr_epi32(static_cast<int>(kIv[4]), static_cast<int>(kIv[5]), static_cast<int>(kIv[6]),
                        static_cast<int>(kIv[7]));
}

// A compression whose chaining value stays in two registers (lo = words 0-3, hi = 4-7).
KVD_SSE41 void CompressReg(__m128i& lo, __m128i& hi, const uint8_t* block, uint32_t block_len,
                           uint64_t counter, uint32_t flags) {
  uint32_t m[16];
  for (int i = 0; i < 16; ++i) m[i] = LoadLe32(block + 4 * i);
  __m128i r0 = lo, r1 = hi, r2 = IvLo();
  __m128i r3 = _mm_setr_epi32(static_cast<int>(static_cast<uint32_t>(counter)),
                              static_cast<int>(static_cast<uint32_t>(counter >> 32)),
                              static_cast<int>(block_len), static_cast<int>(flags));
  RowRound<0>(r0, r1, r2, r3, m);
  RowRound<1>(r0, r1, r2, r3, m);
  RowRound<2>(r0, r1, r2, r3, m);
  RowRound<3>(r0, r1, r2, r3, m);
  RowRound<4>(r0, r1, r2, r3, m);
  RowRound<5>(r0, r1, r2, r3, m);
  RowRound<6>(r0, r1, r2, r3, m);
  lo = Xor(r0, r2);
  hi = Xor(r1, r3);
}

// Two independent compressions, instruction by instruction side by side, so the second
// one fills the first one's latency gaps.
template <int R>
KVD_SSE41 void RowRound2(__m128i a[4], __m128i b[4], const uint32_t ma[16], const uint32_t mb[16]) {
  constexpr const uint8_t* s = kSchedule.idx[R];
  MixRows(a[0], a[1], a[2], a[3], _mm_setr_epi32(ma[s[0]], ma[s[2]], ma[s[4]], ma[s[6]]),
          _mm_setr_epi32(ma[s[1]], ma[s[3]], ma[s[5]], ma[s[7]]));
  MixRows(b[0], b[1], b[2], b[3], _mm_setr_epi32(mb[s[0]], mb[s[2]], mb[s[4]], mb[s[6]]),
          _mm_setr_epi32(mb[s[1]], mb[s[3]], mb[s[5]], mb[s[7]]));
  Diagonalize(a[0], a[2], a[3]);
  Diagonalize(b[0], b[2], b[3]);
  MixRows(a[0], a[1], a[2], a[3], _mm_setr_epi32(ma[s[14]], ma[s[8]], ma[s[10]], ma[s[12]]),
          _mm_setr_epi32(ma[s[15]], ma[s[9]], ma[s[11]], ma[s[13]]));
  MixRows(b[0], b[1], b[2], b[3], _mm_setr_epi32(mb[s[14]], mb[s[8]], mb[s[10]], mb[s[12]]),
          _mm_setr_epi32(mb[s[15]], mb[s[9]], mb[s[11]], mb[s[13]]));
  Undiagonalize(a[0], a[2], a[3]);
  Undiagonalize(b[0], b[2], b[3]);
}

// First block of chunk 0 (counter 0) and of chunk 1 (counter 1) of one message at once.
KVD_SSE41 void CompressFirstBlocks(__m128i& lo0, __m128i& hi0, const uint8_t* block0, uint32_t flags0,
                                   __m128i& lo1, __m128i& hi1, const uint8_t* block1,
                                   uint32_t len1, uint32_t flags1) {
  uint32_t ma[16], mb[16];
  for (int i = 0; i < 16; ++i) ma[i] = LoadLe32(block0 + 4 * i);
  for (int i = 0; i < 16; ++i) mb[i] = LoadLe32(block1 + 4 * i);
  __m128i a[4] = {IvLo(), IvHi(), IvLo(), _mm_setr_epi32(0, 0, static_cast<int>(kBlockLen),
                                                          static_cast<int>(flags0))};
  __m128i b[4] = {IvLo(), IvHi(), IvLo(), _mm_setr_epi32(1, 0, static_cast<int>(len1),
                                                          static_cast<int>(flags1))};
  RowRound2<0>(a, b, ma, mb);
  RowRound2<1>(a, b, ma, mb);
  RowRound2<2>(a, b, ma, mb);
  RowRound2<3>(a, b, ma, mb);
  RowRound2<4>(a, b, ma, mb);
  RowRound2<5>(a, b, ma, mb);
  RowRound2<6>(a, b, ma, mb);
  lo0 = Xor(a[0], a[2]);
  hi0 = Xor(a[1], a[3]);
  lo1 = Xor(b[0], b[2]);
  hi1 = Xor(b[1], b[3]);
}

// One-shot hash of msg[0, len), 32 <= len <= 2 * kChunkLen, zero-padded to whole blocks.
KVD_SSE41 void OneShotSse41(const uint8_t* msg, size_t len, uint8_t out[32]) {
  __m128i lo0, hi0;
  if (len <= kChunkLen) {
    lo0 = IvLo();
    hi0 = IvHi();
    const size_t blocks = (len + kBlockLen - 1) / kBlockLen;
    for (size_t b = 0; b < blocks; ++b) {
      const bool last = b + 1 == blocks;
      const uint32_t flags = (b == 0 ? kChunkStart : 0) | (last ? kChunkEnd | kRoot : 0);
      const size_t block_len = last ? len - b * kBlockLen : kBlockLen;
      CompressReg(lo0, hi0, msg + b * kBlockLen, static_cast<uint32_t>(block_len), 0, flags);
    }
  } else {
    const size_t len1 = len - kChunkLen;
    const size_t blocks1 = (len1 + kBlockLen - 1) / kBlockLen;
    __m128i lo1, hi1;
    CompressFirstBlocks(lo0, hi0, msg, kChunkStart, lo1, hi1, msg + kChunkLen,
                        static_cast<uint32_t>(blocks1 == 1 ? len1 : kBlockLen),
                        kChunkStart | (blocks1 == 1 ? kChunkEnd : 0));
    for (size_t b = 1; b < kBlocksPerChunk; ++b) {
      CompressReg(lo0, hi0, msg + b * kBlockLen, kBlockLen, 0, b + 1 == kBlocksPerChunk ? kChunkEnd : 0);
    }
    for (size_t b = 1; b < blocks1; ++b) {
      const bool last = b + 1 == blocks1;
      const size_t block_len = last ? len1 - b * kBlockLen : kBlockLen;
      CompressReg(lo1, hi1, msg + kChunkLen + b * kBlockLen, static_cast<uint32_t>(block_len), 1,
                  last ? kChunkEnd : 0);
    }
    alignas(16) uint8_t parent[kBlockLen];
    _mm_store_si128(reinterpret_cast<__m128i*>(parent), lo0);
    _mm_store_si128(reinterpret_cast<__m128i*>(parent + 16), hi0);
    _mm_store_si128(reinterpret_cast<__m128i*>(parent + 32), lo1);
    _mm_store_si128(reinterpret_cast<__m128i*>(parent + 48), hi1);
    lo0 = IvLo();
    hi0 = IvHi();
    CompressReg(lo0, hi0, parent, kBlockLen, 0, kParent | kRoot);
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), lo0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), hi0);
}

}  // namespace

KVD_SSE41_FN void TokenChainSse41(const uint8_t prev[32], const uint32_t* tokens, size_t chunk_tokens,
                                  size_t num_chunks, uint8_t* out) {
  alignas(16) uint8_t msg[2 * kChunkLen];
  const size_t len = 32 + 4 * chunk_tokens;
  const size_t padded = (len + kBlockLen - 1) / kBlockLen * kBlockLen;
  std::memcpy(msg, prev, 32);
  std::memset(msg + len, 0, padded - len);
  for (size_t c = 0; c < num_chunks; ++c) {
    CopyTokensBigEndian(msg + 32, tokens + c * chunk_tokens, chunk_tokens);
    uint8_t* h = out + 32 * c;
    OneShotSse41(msg, len, h);
    std::memcpy(msg, h, 32);
  }
}

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
void TokenChainSse41(const uint8_t prev[32], const uint32_t* tokens, size_t chunk_tokens,
                     size_t num_chunks, uint8_t* out) {
  TokenChainPortable(prev, tokens, chunk_tokens, num_chunks, out);
}
}  // namespace kvd::keys::internal

#endif
