// AVX2 quantizer rows for the plane encoder (plane.h): the same float32 arithmetic as the
// scalar path (one rounding per operation, round half to even), eight channels at a time
// with a scalar tail. Compiled with target attributes; callers check HaveAvx2().
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "codec/float_bits.h"
#include "codec/plane.h"

namespace kvd::codec::plane {

#define KVD_AVX2_TARGET __attribute__((target("avx2,f16c")))

KVD_AVX2_TARGET float LoadRowAvx2(const uint8_t* src, Dtype dtype, uint32_t channels, const float* ref, float* v) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 inf = _mm256_set1_ps(INFINITY);
  __m256 amax = _mm256_setzero_ps();
  __m256 bad = _mm256_setzero_ps();
  uint32_t c = 0;
  for (; c + 8 <= channels; c += 8) {
    __m256 x;
    if (dtype == Dtype::kBfloat16) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * c));
      x = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else if (dtype == Dtype::kFloat16) {
      x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * c)));
    } else {
      x = _mm256_loadu_ps(reinterpret_cast<const float*>(src + 4 * c));
    }
    if (ref) x = _mm256_sub_ps(x, _mm256_loadu_ps(ref + c));
    _mm256_storeu_ps(v + c, x);
    const __m256 a = _mm256_andnot_ps(sign, x);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ));  // NaN or infinity
    amax = _mm256_max_ps(amax, a);
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, amax);
  float m = 0;
  for (float l : lanes) m = l > m ? l : m;
  if (_mm256_movemask_ps(bad) != 0) return -1;
  for (; c < channels; ++c) {
    float x;
    uint16_t h;
    if (dtype == Dtype::kBfloat16) {
      memcpy(&h, src + 2 * c, 2);
      x = Bf16ToFloat(h);
    } else if (dtype == Dtype::kFloat16) {
      memcpy(&h, src + 2 * c, 2);
      x = Fp16ToFloat(h);
    } else {
      memcpy(&x, src + 4 * c, 4);
    }
    if (ref) x = x - ref[c];
    v[c] = x;
    if (!std::isfinite(x)) return -1;
    const float a = std::fabs(x);
    m = a > m ? a : m;
  }
  return m;
}

KVD_AVX2_TARGET void QuantizeRowAvx2(const float* v, uint32_t channels, float step, int m, uint8_t* sym) {
  if (!(step > 0)) {
    memset(sym, m, channels);
    return;
  }
  const __m256 st = _mm256_set1_ps(step);
  const __m256 lo = _mm256_set1_ps(static_cast<float>(-m));
  const __m256 hi = _mm256_set1_ps(static_cast<float>(m));
  const __m256i off = _mm256_set1_epi32(m);
  uint32_t c = 0;
  for (; c + 8 <= channels; c += 8) {
    __m256 q = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(v + c), st), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm256_min_ps(_mm256_max_ps(q, lo), hi);
    const __m256i i = _mm256_add_epi32(_mm256_cvtps_epi32(q), off);
    // 8 x int32 in [0, 126] -> 8 bytes.
    const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(sym + c), _mm_packus_epi16(w, w));
  }
  for (; c < channels; ++c) {
    int q = static_cast<int>(std::nearbyint(v[c] / step));
    q = q < -m ? -m : (q > m ? m : q);
    sym[c] = static_cast<uint8_t>(q + m);
  }
}

}  // namespace kvd::codec::plane
