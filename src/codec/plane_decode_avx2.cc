// AVX2 plane decoder (plane.h): the 32 lanes of a block as four registers of 8 states.
// Each register step: one gather (slot -> freq, bias, symbol), the state update, and the renormalisation of the lanes that need a word, which take the next
// words in lane order (a permutation from a 256-entry table, indexed by the mask of
// needing lanes). Produces exactly the scalar decoder's output and word consumption.
// Compiled with target attributes (no global -mavx2); callers check HaveAvx2().
#include <cpuid.h>
#include <immintrin.h>

#include <array>

#include "codec/model_core.h"
#include "codec/plane.h"

namespace kvd::codec::plane {
namespace {

// kPerm[m] byte i: for a lane i whose bit is set in m, how many lanes below it also
// need a word (= which of the loaded words it takes).
constexpr std::array<uint64_t, 256> MakePerm() {
  std::array<uint64_t, 256> t{};
  for (int m = 0; m < 256; ++m) {
    uint64_t v = 0;
    int k = 0;
    for (int i = 0; i < 8; ++i) {
      if (m & (1 << i)) {
        v |= static_cast<uint64_t>(k) << (8 * i);
        ++k;
      }
    }
    t[m] = v;
  }
  return t;
}
constexpr std::array<uint64_t, 256> kPerm = MakePerm();

#define KVD_AVX2_TARGET __attribute__((target("avx2,f16c,popcnt")))

// Saturation at the dtype's largest finite value, as the scalar decoder does.
template <Dtype D>
constexpr float kLimit8 = D == Dtype::kFloat16 ? 65504.0f : (D == Dtype::kBfloat16 ? 0x1.fep127f : 0x1.fffffep127f);

template <Dtype D>
KVD_AVX2_TARGET inline void Store8(uint8_t* out, size_t index, __m256 v) {
  v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-kLimit8<D>)), _mm256_set1_ps(kLimit8<D>));
  if constexpr (D == Dtype::kBfloat16) {
    const __m256i b = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * index), _mm256_castsi256_si128(packed));
  } else if constexpr (D == Dtype::kFloat16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * index),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  } else {
    _mm256_storeu_ps(reinterpret_cast<float*>(out + 4 * index), v);
  }
}

template <Dtype D>
KVD_AVX2_TARGET void Block(const BlockJob& job, uint32_t* tp, uint32_t* st, const uint8_t** words,
                           const uint8_t* end) {
  const PlaneSpec& sp = *job.spec;
  __m256i x[4];
  for (int g = 0; g < 4; ++g) x[g] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(st + 8 * g));
  const uint8_t* w = *words;
  uint32_t t = *tp;
  __m256i slot_off[2][4], first[2][4];  // first: entry 0 of each lane's search table
  for (int g = 0; g < 4; ++g) {
    for (int k = 0; k < 2; ++k) {
      slot_off[k][g] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(job.cls[k].lane_at + 8 * g));
      first[k][g] = job.cls[k].search_steps != 0
                        ? _mm256_i32gather_epi32(reinterpret_cast<const int*>(job.cls[k].slots), slot_off[k][g], 4)
                        : _mm256_setzero_si256();
    }
  }
  const __m256i low = _mm256_set1_epi32(static_cast<int>(kRansLow));
  const __m256i m7f = _mm256_set1_epi32(0x7f);
  const __m256i mfff = _mm256_set1_epi32(0xfff);
  // At most 32 words (64 bytes) per token; each load reads 16 bytes.
  for (; t < sp.tokens && end - w >= 64; ++t) {
    const int k = sp.IsAnchor(t) ? 1 : 0;
    const ClassTables& ct = job.cls[k];
    const __m128i pb = _mm_cvtsi32_si128(ct.prob_bits);
    const __m256i mask = _mm256_set1_epi32(static_cast<int>((1u << ct.prob_bits) - 1u));
    const __m256i lev = _mm256_set1_epi32(ct.levels);
    const __m256 step = _mm256_set1_ps(job.steps[t]);
    const int* slots = reinterpret_cast<const int*>(ct.slots);
    const size_t row = size_t{t} * sp.channels + job.channel0;
    // Decode all four registers first (their gathers overlap), then renormalise them in
    // lane order: the word pointer is the only thing that chains the registers.
    __m256i sym[4], xn[4], need[4];
    int m[4];
    if (ct.search_steps == 0) {
      for (int g = 0; g < 4; ++g) {
        const __m256i e =
            _mm256_i32gather_epi32(slots, _mm256_add_epi32(_mm256_and_si256(x[g], mask), slot_off[k][g]), 4);
        sym[g] = _mm256_and_si256(e, m7f);
        const __m256i f = _mm256_srli_epi32(e, 19);
        const __m256i bias = _mm256_and_si256(_mm256_srli_epi32(e, 7), mfff);
        xn[g] = _mm256_add_epi32(_mm256_mullo_epi32(f, _mm256_srl_epi32(x[g], pb)), bias);
      }
    } else {
      // Search tables: the last entry whose cum is <= slot, in halving steps (the four
      // registers' gathers interleaved), keeping the entry taken last (at first the
      // lane's entry 0, loaded once per block): its cum and freq.
      __m256i slot[4], s[4], e[4];
      for (int g = 0; g < 4; ++g) {
        slot[g] = _mm256_add_epi32(_mm256_and_si256(x[g], mask), _mm256_set1_epi32(1));  // compare slot + 1 > cum
        s[g] = slot_off[k][g];
        e[g] = first[k][g];
      }
      for (int b = (1 << ct.search_steps) >> 1; b != 0; b >>= 1) {
        const __m256i vb = _mm256_set1_epi32(b);
        for (int g = 0; g < 4; ++g) {
          const __m256i probe = _mm256_i32gather_epi32(slots, _mm256_add_epi32(s[g], vb), 4);
          const __m256i below = _mm256_cmpgt_epi32(slot[g], _mm256_and_si256(probe, _mm256_set1_epi32(0xffff)));
          s[g] = _mm256_add_epi32(s[g], _mm256_and_si256(below, vb));
          e[g] = _mm256_blendv_epi8(e[g], probe, below);
        }
      }
      for (int g = 0; g < 4; ++g) {
        sym[g] = _mm256_sub_epi32(s[g], slot_off[k][g]);
        const __m256i cum = _mm256_and_si256(e[g], _mm256_set1_epi32(0xffff));
        xn[g] = _mm256_add_epi32(_mm256_mullo_epi32(_mm256_srli_epi32(e[g], 16), _mm256_srl_epi32(x[g], pb)),
                                 _mm256_sub_epi32(_mm256_sub_epi32(slot[g], _mm256_set1_epi32(1)), cum));
      }
    }
    for (int g = 0; g < 4; ++g) {
      need[g] = _mm256_cmpgt_epi32(low, xn[g]);
      m[g] = _mm256_movemask_ps(_mm256_castsi256_ps(need[g]));
    }
    for (int g = 0; g < 4; ++g) {
      const __m256i wv = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
      const __m256i perm = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(&kPerm[m[g]])));
      const __m256i refill = _mm256_or_si256(_mm256_slli_epi32(xn[g], 16), _mm256_permutevar8x32_epi32(wv, perm));
      x[g] = _mm256_blendv_epi8(xn[g], refill, need[g]);
      w += 2 * __builtin_popcount(static_cast<unsigned>(m[g]));
    }
    for (int g = 0; g < 4; ++g) {
      __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(sym[g], lev)), step);
      if (sp.anchors()) {
        float* r = job.recon + job.channel0 + 8 * g;
        if (k == 1) {
          _mm256_storeu_ps(r, v);
        } else {
          v = _mm256_add_ps(_mm256_loadu_ps(r), v);
        }
      }
      Store8<D>(job.out, row + 8 * g, v);
    }
  }
  for (int g = 0; g < 4; ++g) _mm256_storeu_si256(reinterpret_cast<__m256i*>(st + 8 * g), x[g]);
  *words = w;
  *tp = t;
}

}  // namespace

KVD_AVX2_TARGET void FillSlotTableAvx2(const uint16_t* freq, int alphabet, uint32_t* table) {
  const __m256i ramp = _mm256_setr_epi32(0, 1 << 7, 2 << 7, 3 << 7, 4 << 7, 5 << 7, 6 << 7, 7 << 7);
  const __m256i step = _mm256_set1_epi32(8 << 7);
  uint32_t cum = 0;
  for (int s = 0; s < alphabet; ++s) {
    // Runs are written in order, eight entries at a time: what a store writes past its
    // run is overwritten by the next run (or lies in the 7 entries of padding).
    __m256i v = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(PackSlot(freq[s], 0, static_cast<uint32_t>(s)))), ramp);
    for (uint32_t i = 0; i < freq[s]; i += 8) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(table + cum + i), v);
      v = _mm256_add_epi32(v, step);
    }
    cum += freq[s];
  }
}

bool HaveAvx2() {
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
    return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
  }();
  return has;
}

void DecodeBlockAvx2(const BlockJob& job, uint32_t* t, uint32_t* states, const uint8_t** words,
                     const uint8_t* end) {
  switch (job.spec->dtype) {
    case Dtype::kBfloat16: return Block<Dtype::kBfloat16>(job, t, states, words, end);
    case Dtype::kFloat16: return Block<Dtype::kFloat16>(job, t, states, words, end);
    default: return Block<Dtype::kFloat32>(job, t, states, words, end);
  }
}

}  // namespace kvd::codec::plane
