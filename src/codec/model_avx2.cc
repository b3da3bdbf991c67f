// BuildFrequencies (model_core.h) eight symbols at a time with AVX2: the same integer
// arithmetic, so the same frequencies for every parameter (checked exhaustively by
// ModelTest.Avx2FrequenciesAreExact). Encoder and decoder build one table per distinct
// distribution of an object (hundreds per object), where the scalar loop's 64-bit
// products and table lookups were a tenth of the coding time. Compiled with target
// attributes; callers check HaveAvx2() (plane::Frequencies).
#include <immintrin.h>

#include <array>
#include <cstring>

#include "codec/model_core.h"
#include "codec/plane.h"

namespace kvd::codec::plane {
namespace {

// exp(-y / 256) = kExpHi[y >> 8] * kExpLo[y & 255] >> 16 for y < 13 * 256; entry 13
// (y clamped to 13 * 256) is 0, as ExpNegQ8 returns there.
constexpr std::array<uint32_t, 16> kExpHi16 = [] {
  std::array<uint32_t, 16> t{};
  for (int i = 0; i < 13; ++i) t[i] = model_tables::kExpHi[i];
  return t;
}();

#define KVD_AVX2_TARGET __attribute__((target("avx2")))

// Low 32 bits of the 64-bit lanes of even (lanes 0, 2, ..) and odd products, interleaved
// back into eight 32-bit lanes.
KVD_AVX2_TARGET inline __m256i Interleave(__m256i even, __m256i odd) {
  return _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xaa);
}

}  // namespace

KVD_AVX2_TARGET bool BuildFrequenciesAvx2(uint8_t center_q4, uint8_t shape, int alphabet, int prob_bits,
                                          uint16_t* freq) {
  if (alphabet < 1 || alphabet > kMaxAlphabet || prob_bits < kMinProbBits || prob_bits > kMaxProbBits ||
      !ShapeIsValid(shape)) {
    return false;
  }
  const uint32_t total = 1u << prob_bits;
  const uint8_t kind = shape >> 6;
  const int sigma = shape & 63;
  const int vectors = (alphabet + 7) / 8;
  alignas(32) uint32_t w[64];
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i size = _mm256_set1_epi32(alphabet);
  const __m256i k = _mm256_set1_epi64x(static_cast<int64_t>(kind == kKindGauss ? model_tables::kGaussK[sigma]
                                                                                : model_tables::kLaplaceK[sigma]));
  const __m256i center = _mm256_set1_epi32(center_q4);
  const __m256i y_end = _mm256_set1_epi64x(13 * 256);
  const __m256i hi0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kExpHi16.data()));
  const __m256i hi1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kExpHi16.data() + 8));
  __m256i wsum = _mm256_setzero_si256();  // four u64
  for (int i = 0; i < vectors; ++i) {
    const __m256i s = _mm256_add_epi32(lane, _mm256_set1_epi32(8 * i));
    __m256i v;
    if (kind == kKindUniform) {
      v = _mm256_set1_epi32(65536);
    } else {
      // ad = |4 s - center| (< 2^8); a = ad^2 (Gauss) or ad (Laplace); y = a * K >> 16,
      // in 64-bit lanes, then clamped to 13 * 256 and narrowed to 32 bits.
      const __m256i ad = _mm256_abs_epi32(_mm256_sub_epi32(_mm256_slli_epi32(s, 2), center));
      const __m256i a = kind == kKindGauss ? _mm256_mullo_epi32(ad, ad) : ad;
      __m256i ye = _mm256_srli_epi64(_mm256_mul_epu32(a, k), 16);
      __m256i yo = _mm256_srli_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), k), 16);
      ye = _mm256_blendv_epi8(y_end, ye, _mm256_cmpgt_epi64(y_end, ye));
      yo = _mm256_blendv_epi8(y_end, yo, _mm256_cmpgt_epi64(y_end, yo));
      const __m256i y = Interleave(ye, yo);
      const __m256i yh = _mm256_srli_epi32(y, 8);  // 0..13
      const __m256i hi = _mm256_blendv_epi8(_mm256_permutevar8x32_epi32(hi0, yh), _mm256_permutevar8x32_epi32(hi1, yh),
                                            _mm256_cmpgt_epi32(yh, _mm256_set1_epi32(7)));
      const __m256i lo = _mm256_i32gather_epi32(reinterpret_cast<const int*>(model_tables::kExpLo),
                                                _mm256_and_si256(y, _mm256_set1_epi32(255)), 4);
      // hi * lo can be 2^32: 64-bit products.
      v = Interleave(_mm256_srli_epi64(_mm256_mul_epu32(hi, lo), 16),
                     _mm256_srli_epi64(_mm256_mul_epu32(_mm256_srli_epi64(hi, 32), _mm256_srli_epi64(lo, 32)), 16));
    }
    v = _mm256_and_si256(v, _mm256_cmpgt_epi32(size, s));  // no weight past the alphabet
    _mm256_store_si256(reinterpret_cast<__m256i*>(w + 8 * i), v);
    wsum = _mm256_add_epi64(wsum, _mm256_add_epi64(_mm256_and_si256(v, _mm256_set1_epi64x(0xffffffff)),
                                                   _mm256_srli_epi64(v, 32)));
  }
  alignas(32) uint64_t sums[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(sums), wsum);
  const uint64_t sum = sums[0] + sums[1] + sums[2] + sums[3];
  const uint64_t budget = total - static_cast<uint32_t>(alphabet);
  const uint64_t scale = sum == 0 ? 0 : (budget << 32) / sum;
  // f = 1 + (w * scale) >> 32 = 1 + w * scale_hi + (w * scale_lo) >> 32 (w < 2^17).
  const __m256i scale_lo = _mm256_set1_epi64x(static_cast<int64_t>(scale & 0xffffffffu));
  const __m256i scale_hi = _mm256_set1_epi64x(static_cast<int64_t>(scale >> 32));
  __m256i used = _mm256_setzero_si256();
  __m256i top = _mm256_setzero_si256();
  alignas(32) uint16_t f16[64];
  for (int i = 0; i < vectors; ++i) {
    const __m256i s = _mm256_add_epi32(lane, _mm256_set1_epi32(8 * i));
    const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(w + 8 * i));
    const __m256i vo = _mm256_srli_epi64(v, 32);
    const __m256i qe = _mm256_add_epi64(_mm256_mul_epu32(v, scale_hi), _mm256_srli_epi64(_mm256_mul_epu32(v, scale_lo), 32));
    const __m256i qo =
        _mm256_add_epi64(_mm256_mul_epu32(vo, scale_hi), _mm256_srli_epi64(_mm256_mul_epu32(vo, scale_lo), 32));
    const __m256i f = _mm256_and_si256(_mm256_add_epi32(Interleave(qe, qo), _mm256_set1_epi32(1)), _mm256_cmpgt_epi32(size, s));
    _mm_store_si128(reinterpret_cast<__m128i*>(f16 + 8 * i),
                    _mm_packus_epi32(_mm256_castsi256_si128(f), _mm256_extracti128_si256(f, 1)));
    used = _mm256_add_epi32(used, f);
    top = _mm256_max_epu32(top, v);
  }
  __m128i u = _mm_add_epi32(_mm256_castsi256_si128(used), _mm256_extracti128_si256(used, 1));
  u = _mm_add_epi32(u, _mm_shuffle_epi32(u, 0x4e));
  u = _mm_add_epi32(u, _mm_shuffle_epi32(u, 0xb1));
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(top), _mm256_extracti128_si256(top, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4e));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xb1));
  // The remainder goes to the first symbol of largest weight (0 when every weight is 0).
  const __m256i best = _mm256_broadcastd_epi32(m);
  int first = 0;
  for (int i = 0; i < vectors; ++i) {
    const int hit = _mm256_movemask_ps(
        _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(w + 8 * i)), best)));
    if (hit != 0) {
      first = 8 * i + __builtin_ctz(static_cast<unsigned>(hit));
      break;
    }
  }
  f16[first] = static_cast<uint16_t>(f16[first] + (total - static_cast<uint32_t>(_mm_cvtsi128_si32(u))));
  memcpy(freq, f16, sizeof(uint16_t) * static_cast<size_t>(alphabet));
  return true;
}

}  // namespace kvd::codec::plane
