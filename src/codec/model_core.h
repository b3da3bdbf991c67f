// model_core: the codec's per-(plane, channel) symbol distributions, built with integer
// arithmetic only so that every encoder and decoder (CPU, SIMD or GPU) builds the same
// frequency table from the same two parameter bytes. Header-only and free of the
// standard library's containers so the CUDA decoder compiles it too. Stateless.
//
// A distribution is named by two bytes (format v2, docs/compression.md "CacheGen, as kvd codes it"):
//   center  the mean in quarter symbols (0..255: 0.00..63.75)
//   shape   bits 0-5: sigma index i (sigma = 0.08 * 1.1^i symbols),
//           bits 6-7: kind 0 = discretised Gaussian, 1 = discretised Laplace (same
//           variance), 2 = uniform (sigma ignored); 3 is invalid.
// Over an alphabet of A symbols (0..A-1) and a precision of P bits, symbol s gets weight
// w(s) (Q16, from exp(-y) tables), frequency 1 + floor(w(s) * floor((2^P - A) * 2^32 /
// sum w) / 2^32), and the remainder up to 2^P goes to the first symbol of largest
// weight: every symbol can be coded and the frequencies sum to exactly 2^P.
#pragma once

#include <cstdint>

#include "codec/model_tables.inc"

#if defined(__CUDACC__)
#define KVD_HD __host__ __device__
#else
#define KVD_HD
#endif

namespace kvd::codec {

#if defined(__CUDA_ARCH__)
namespace tables = model_tables_device;
#else
namespace tables = model_tables;
#endif

inline constexpr int kMaxAlphabet = 63;     // bins <= 64: symbols 0..2M with M = bins/2 - 1
inline constexpr int kMinProbBits = 8;
inline constexpr int kMaxProbBits = 12;
inline constexpr int kNumSigmas = 64;
inline constexpr uint8_t kKindGauss = 0;
inline constexpr uint8_t kKindLaplace = 1;
inline constexpr uint8_t kKindUniform = 2;

// exp(-y / 256) in Q16 (65536 = 1.0); 0 once y >= 13 * 256.
KVD_HD inline uint32_t ExpNegQ8(uint64_t y) {
  if (y >= 13u * 256u) return 0;
  return static_cast<uint32_t>((static_cast<uint64_t>(tables::kExpHi[y >> 8]) *
                                tables::kExpLo[y & 255u]) >> 16);
}

// The probability precision the codec uses for an alphabet of `alphabet` symbols: the
// minimum frequency of 1 per symbol takes at most 1/32 of the mass. On the KV model's KV
// one bit more (1/64) saved 0.1% of the bytes and cost 20-35% of the decoding speed
// (docs/compression.md): the decoder's tables have 2^P slots per channel.
KVD_HD inline int ProbBitsFor(int alphabet) {
  int bits = 0;
  while ((1 << bits) < alphabet) ++bits;
  bits += 5;
  return bits < kMinProbBits ? kMinProbBits : (bits > kMaxProbBits ? kMaxProbBits : bits);
}

KVD_HD inline bool ShapeIsValid(uint8_t shape) { return (shape >> 6) <= kKindUniform; }

// Fills freq[0..alphabet) for the distribution (center, shape). Returns false when the
// parameters are invalid (kind 3, alphabet out of range, precision out of range).
KVD_HD inline bool BuildFrequencies(uint8_t center_q4, uint8_t shape, int alphabet,
                                    int prob_bits, uint16_t* freq) {
  if (alphabet < 1 || alphabet > kMaxAlphabet || prob_bits < kMinProbBits ||
      prob_bits > kMaxProbBits || !ShapeIsValid(shape)) {
    return false;
  }
  const uint32_t total = 1u << prob_bits;
  const uint8_t kind = shape >> 6;
  const int sigma = shape & 63;
  uint32_t w[kMaxAlphabet];
  uint64_t wsum = 0;
  for (int s = 0; s < alphabet; ++s) {
    const int64_t d4 = 4 * s - static_cast<int64_t>(center_q4);
    const uint64_t ad = static_cast<uint64_t>(d4 < 0 ? -d4 : d4);
    uint32_t v;
    if (kind == kKindGauss) {
      v = ExpNegQ8((ad * ad * tables::kGaussK[sigma]) >> 16);
    } else if (kind == kKindLaplace) {
      v = ExpNegQ8((ad * tables::kLaplaceK[sigma]) >> 16);
    } else {
      v = 65536;
    }
    w[s] = v;
    wsum += v;
  }
  // f = 1 + floor(w * budget / wsum), with the division done once: scale is
  // floor(budget * 2^32 / wsum) and f = 1 + (w * scale) >> 32.
  const uint64_t budget = total - static_cast<uint32_t>(alphabet);
  const uint64_t scale = wsum == 0 ? 0 : (budget << 32) / wsum;
  uint32_t used = 0;
  int top = 0;
  for (int s = 0; s < alphabet; ++s) {
    const uint32_t f = 1u + static_cast<uint32_t>((w[s] * scale) >> 32);
    freq[s] = static_cast<uint16_t>(f);
    used += f;
    if (w[s] > w[top]) top = s;
  }
  freq[top] = static_cast<uint16_t>(freq[top] + (total - used));
  return true;
}

// One slot of a decoding table: the symbol whose frequency range holds the slot, its
// frequency and the slot's offset inside that range. x' = freq * (x >> P) + bias.
KVD_HD inline uint32_t PackSlot(uint32_t freq, uint32_t bias, uint32_t sym) {
  return (freq << 19) | (bias << 7) | sym;
}
KVD_HD inline uint32_t SlotFreq(uint32_t e) { return e >> 19; }
KVD_HD inline uint32_t SlotBias(uint32_t e) { return (e >> 7) & 0xFFFu; }
KVD_HD inline uint32_t SlotSym(uint32_t e) { return e & 0x7Fu; }

}  // namespace kvd::codec
