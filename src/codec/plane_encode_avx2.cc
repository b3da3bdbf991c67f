// AVX2 quantizer rows for the plane encoder (plane.h): the same float32 arithmetic as the
// scalar path (one rounding per operation, round half to even), eight channels at a time
// with a scalar tail. Compiled with target attributes; callers check HaveAvx2().
#include <immintrin.h>

#include <cmath>
#include <cstddef>
#include <cstring>

#include "codec/float_bits.h"
#include "codec/model_core.h"
#include "codec/plane.h"
#include "codec/rans.h"

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

// ---- Histograms ----------------------------------------------------------------------

namespace {

// Adds n byte counters (32 channels each) to hist rows s0.. at channel c0 and clears them.
KVD_AVX2_TARGET void FlushCounts(__m256i* cnt, int n, uint32_t* hist, size_t row, int s0, uint32_t c0) {
  for (int i = 0; i < n; ++i) {
    uint32_t* h = hist + size_t(s0 + i) * row + c0;
    alignas(32) uint8_t b[32];
    _mm256_store_si256(reinterpret_cast<__m256i*>(b), cnt[i]);
    for (int q = 0; q < 4; ++q) {
      const __m256i wide = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 8 * q)));
      __m256i* dst = reinterpret_cast<__m256i*>(h + 8 * q);
      _mm256_storeu_si256(dst, _mm256_add_epi32(_mm256_loadu_si256(dst), wide));
    }
    cnt[i] = _mm256_setzero_si256();
  }
}

}  // namespace

// Counts of the symbols of the normal tokens (every token but t % anchor_group == 0 when
// anchor_group >= 2): 32 channels at a time, eight symbols per pass over the tokens, in
// byte counters (compare and subtract) emptied into hist every 255 tokens. Channels past
// the last 32 are counted one by one.
KVD_AVX2_TARGET void NormalHistogramAvx2(const uint8_t* symbols, uint32_t tokens, uint32_t channels,
                                         uint32_t anchor_group, int alphabet, uint32_t* hist) {
  const uint32_t g = anchor_group >= 2 ? anchor_group : 0;
  uint32_t c0 = 0;
  for (; c0 + 32 <= channels; c0 += 32) {
    for (int s0 = 0; s0 < alphabet; s0 += 8) {
      const int n = alphabet - s0 < 8 ? alphabet - s0 : 8;
      __m256i sym[8], cnt[8];
      for (int i = 0; i < 8; ++i) {
        sym[i] = _mm256_set1_epi8(static_cast<char>(s0 + i));
        cnt[i] = _mm256_setzero_si256();
      }
      uint32_t pending = 0;
      for (uint32_t t = 0; t < tokens; ++t) {
        if (g != 0 && t % g == 0) continue;
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(symbols + size_t{t} * channels + c0));
        for (int i = 0; i < 8; ++i) cnt[i] = _mm256_sub_epi8(cnt[i], _mm256_cmpeq_epi8(v, sym[i]));
        if (++pending == 255) {
          FlushCounts(cnt, n, hist, channels, s0, c0);
          pending = 0;
        }
      }
      FlushCounts(cnt, n, hist, channels, s0, c0);
    }
  }
  if (c0 == channels) return;
  for (uint32_t t = 0; t < tokens; ++t) {
    if (g != 0 && t % g == 0) continue;
    const uint8_t* row = symbols + size_t{t} * channels;
    for (uint32_t c = c0; c < channels; ++c) hist[size_t{row[c]} * channels + c]++;
  }
}

// ---- Distribution fit, four channels ------------------------------------------------

namespace {

// A u64 below 2^52 as a double (exact).
KVD_AVX2_TARGET inline __m256d SmallU64ToDouble(__m256i v) {
  const __m256d two52 = _mm256_set1_pd(4503599627370496.0);
  return _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(v, _mm256_castpd_si256(two52))), two52);
}

}  // namespace

// FitChannel (plane_encode.cc) for four channels in double lanes. The moment sums run
// over the symbols from the lowest to the highest that any of the four counts: a
// channel's terms outside its own range are +0 and leave its sums as FitChannel's.
KVD_AVX2_TARGET void FitChannels4Avx2(const uint32_t* hist, size_t stride, int alphabet, uint8_t* params) {
  __m256i count = _mm256_setzero_si256(), moment1 = _mm256_setzero_si256();
  int lo = alphabet, hi = -1;
  for (int s = 0; s < alphabet; ++s) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(hist + size_t(s) * stride));
    const __m256i h64 = _mm256_cvtepu32_epi64(h);
    count = _mm256_add_epi64(count, h64);
    moment1 = _mm256_add_epi64(moment1, _mm256_mul_epu32(h64, _mm256_set1_epi64x(s)));
    if (_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(h, _mm_setzero_si128()))) != 0xf) {
      lo = s < lo ? s : lo;
      hi = s;
    }
  }
  const __m256d n = SmallU64ToDouble(count);
  const __m256d mean = _mm256_div_pd(SmallU64ToDouble(moment1), n);  // NaN for an empty channel
  __m256d s2 = _mm256_setzero_pd(), s4 = _mm256_setzero_pd();
  for (int s = lo; s <= hi; ++s) {
    const __m256d h = _mm256_cvtepi32_pd(_mm_loadu_si128(reinterpret_cast<const __m128i*>(hist + size_t(s) * stride)));
    const __m256d d = _mm256_sub_pd(_mm256_set1_pd(s), mean);
    const __m256d d2 = _mm256_mul_pd(d, d);
    const __m256d t = _mm256_mul_pd(h, d2);
    s2 = _mm256_add_pd(s2, t);
    s4 = _mm256_add_pd(s4, _mm256_mul_pd(t, d2));
  }
  const __m256d var = _mm256_div_pd(s2, n);
  // center: RoundNonNegative(4 mean), clamped to the alphabet.
  const __m256d x = _mm256_mul_pd(_mm256_set1_pd(4.0), mean);
  const __m256d tx = _mm256_round_pd(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256d up = _mm256_cmp_pd(_mm256_sub_pd(x, tx), _mm256_set1_pd(0.5), _CMP_GE_OQ);
  const __m256d kurt = _mm256_blendv_pd(_mm256_set1_pd(3.0), _mm256_div_pd(_mm256_div_pd(s4, n), _mm256_mul_pd(var, var)),
                                        _mm256_cmp_pd(var, _mm256_setzero_pd(), _CMP_GT_OQ));
  const __m256d laplace = _mm256_cmp_pd(kurt, _mm256_set1_pd(4.5), _CMP_GT_OQ);
  alignas(32) double sigma[4], rounded[4];
  alignas(32) uint64_t counts[4];
  _mm256_store_pd(sigma, _mm256_sqrt_pd(var));
  _mm256_store_pd(rounded, _mm256_add_pd(tx, _mm256_and_pd(up, _mm256_set1_pd(1.0))));
  _mm256_store_si256(reinterpret_cast<__m256i*>(counts), count);
  const int kinds = _mm256_movemask_pd(laplace);
  for (int j = 0; j < 4; ++j) {
    if (counts[j] == 0) {
      params[2 * j] = static_cast<uint8_t>(4 * (alphabet / 2));
      params[2 * j + 1] = 0;
      continue;
    }
    long c4 = static_cast<long>(rounded[j]);
    if (c4 < 0) c4 = 0;
    if (c4 > 4 * (alphabet - 1)) c4 = 4 * (alphabet - 1);
    const uint8_t kind = (kinds >> j) & 1 ? kKindLaplace : kKindGauss;
    params[2 * j] = static_cast<uint8_t>(c4);
    params[2 * j + 1] = static_cast<uint8_t>((kind << 6) | SigmaIndex(sigma[j]));
  }
}

// ---- rANS encoder, 32 lanes ---------------------------------------------------------
namespace {

// For each 8-bit mask of emitting lanes: the pshufb that moves their 16-bit words, in
// lane order, to the END of a 16-byte vector (the encoder writes backwards).
struct CompactTable {
  alignas(16) uint8_t shuf[256][16];
  constexpr CompactTable() : shuf{} {
    for (int m = 0; m < 256; ++m) {
      int n = 0;
      for (int i = 0; i < 8; ++i) n += (m >> i) & 1;
      for (int b = 0; b < 16; ++b) shuf[m][b] = 0x80;
      int slot = 8 - n;
      for (int i = 0; i < 8; ++i) {
        if ((m >> i) & 1) {
          shuf[m][2 * slot] = static_cast<uint8_t>(2 * i);
          shuf[m][2 * slot + 1] = static_cast<uint8_t>(2 * i + 1);
          ++slot;
        }
      }
    }
  }
};
constexpr CompactTable kCompact;

}  // namespace

KVD_AVX2_TARGET uint16_t* EncodeBlockAvx2(uint32_t* x, const uint8_t* symbols, size_t row_stride,
                                          const EncSymbol* const* lanes, uint32_t anchor_group, uint32_t tokens,
                                          uint16_t* w) {
  static_assert(sizeof(EncSymbol) == 16 && offsetof(EncSymbol, rcp) == 4 && offsetof(EncSymbol, cum) == 8 &&
                offsetof(EncSymbol, cmpl) == 12 && offsetof(EncSymbol, rcp_shift) == 14);
  const __m256i bias = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  const __m256i lo32 = _mm256_set1_epi64x(0xffffffffLL);
  const __m256i lo16 = _mm256_set1_epi32(0xffff);
  __m256i xs[4];
  for (int g = 0; g < 4; ++g) xs[g] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 8 * g));
  for (uint32_t t = tokens; t-- > 0;) {
    const int k = anchor_group && t % anchor_group == 0 ? 1 : 0;
    const uint8_t* sym = symbols + size_t{t} * row_stride;
    for (int g = 4; g-- > 0;) {
      // The eight lanes' EncSymbols (16 bytes each), loaded and transposed into
      // x_max, rcp, cum and (cmpl | shift << 16) vectors: faster than four gathers.
      const EncSymbol* const* e = lanes + kLanes * k + 8 * g;
      const uint8_t* sg = sym + 8 * g;
      auto ld = [&](int i) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(e[i] + sg[i])); };
      const __m256i r0 = _mm256_inserti128_si256(_mm256_castsi128_si256(ld(0)), ld(4), 1);
      const __m256i r1 = _mm256_inserti128_si256(_mm256_castsi128_si256(ld(1)), ld(5), 1);
      const __m256i r2 = _mm256_inserti128_si256(_mm256_castsi128_si256(ld(2)), ld(6), 1);
      const __m256i r3 = _mm256_inserti128_si256(_mm256_castsi128_si256(ld(3)), ld(7), 1);
      const __m256i t0 = _mm256_unpacklo_epi32(r0, r1), t1 = _mm256_unpacklo_epi32(r2, r3);
      const __m256i t2 = _mm256_unpackhi_epi32(r0, r1), t3 = _mm256_unpackhi_epi32(r2, r3);
      const __m256i x_max = _mm256_unpacklo_epi64(t0, t1);
      const __m256i rcp = _mm256_unpackhi_epi64(t0, t1);
      const __m256i cum = _mm256_unpacklo_epi64(t2, t3);
      const __m256i w3 = _mm256_unpackhi_epi64(t2, t3);
      const __m256i s0 = xs[g];
      // emit = s0 >= x_max (unsigned): not (x_max > s0).
      const __m256i below = _mm256_cmpgt_epi32(_mm256_xor_si256(x_max, bias), _mm256_xor_si256(s0, bias));
      const __m256i emit = _mm256_andnot_si256(below, _mm256_set1_epi32(-1));
      const __m256i s = _mm256_srlv_epi32(s0, _mm256_and_si256(emit, _mm256_set1_epi32(16)));
      // q = (s * rcp) >> shift, 64-bit products of even and odd lanes.
      const __m256i shift = _mm256_and_si256(_mm256_srli_epi32(w3, 16), _mm256_set1_epi32(0xff));
      const __m256i pe = _mm256_srlv_epi64(_mm256_mul_epu32(s, rcp), _mm256_and_si256(shift, lo32));
      const __m256i po = _mm256_srlv_epi64(_mm256_mul_epu32(_mm256_srli_epi64(s, 32), _mm256_srli_epi64(rcp, 32)),
                                           _mm256_srli_epi64(shift, 32));
      const __m256i q = _mm256_blend_epi32(pe, _mm256_slli_epi64(po, 32), 0xaa);
      const __m256i cmpl = _mm256_and_si256(w3, lo16);
      xs[g] = _mm256_add_epi32(_mm256_add_epi32(s, cum), _mm256_mullo_epi32(q, cmpl));
      // Words of the emitting lanes, in lane order, ending at w.
      const int m = _mm256_movemask_ps(_mm256_castsi256_ps(emit));
      if (m != 0) {
        const __m256i low = _mm256_and_si256(s0, lo16);
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(low, low), 0x08);
        const __m128i words = _mm_shuffle_epi8(_mm256_castsi256_si128(packed),
                                               _mm_load_si128(reinterpret_cast<const __m128i*>(kCompact.shuf[m])));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(w - 8), words);
        w -= __builtin_popcount(static_cast<unsigned>(m));
      }
    }
  }
  for (int g = 0; g < 4; ++g) _mm256_storeu_si256(reinterpret_cast<__m256i*>(x + 8 * g), xs[g]);
  return w;
}

}  // namespace kvd::codec::plane
