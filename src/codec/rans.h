// rans: the codec's entropy coder, 32 interleaved rANS states per stream with static
// per-(channel, token class) models (format v2, docs/compression.md "CacheGen, as kvd codes it").
//
// State x is kept in [2^15, 2^31); probabilities have P <= 12 bits; renormalisation
// moves 16-bit words. A stream holds the 32 final encoder states (u32, lane order)
// followed by the words in the order the decoder reads them. Decoding symbol s with
// frequency f and cumulative frequency c: x' = f * (x >> P) + (x mod 2^P) - c, then, if
// x' < 2^15, x' = (x' << 16) | next word. Lanes read their words in lane order at every
// step, so one shared word pointer serves all 32 (a warp on the GPU, four AVX2
// registers on the CPU). An intact stream ends with every state back at 2^15 and the
// word pointer exactly at the stream's end, which the decoders check.
//
// Header-only primitives; stateless.
#pragma once

#include <cstdint>

namespace kvd::codec {

inline constexpr int kLanes = 32;
inline constexpr uint32_t kRansLow = 1u << 15;
inline constexpr uint32_t kRansHigh = 1u << 31;   // states are < this

// What the encoder needs for one symbol of one model. Division by the frequency is a
// multiplication by a reciprocal, exact for every state < 2^31.
struct EncSymbol {
  uint32_t x_max;    // renormalise (emit a word) while x >= x_max
  uint32_t rcp;      // ceil(2^(31 + k) / freq), k = ceil(log2 freq)
  uint32_t cum;      // cumulative frequency
  uint16_t cmpl;     // 2^P - freq
  uint8_t rcp_shift; // 31 + k
  uint8_t pad = 0;
};

// The reciprocal of every frequency 1..4096 (computed once; immutable).
struct Reciprocal {
  uint32_t rcp;
  uint8_t shift;
};
const Reciprocal* ReciprocalTable();  // [4097]

inline Reciprocal ComputeReciprocal(uint32_t freq) {
  uint32_t k = 0;
  while ((1u << k) < freq) ++k;
  return {static_cast<uint32_t>(((uint64_t{1} << (31 + k)) + freq - 1) / freq), static_cast<uint8_t>(31 + k)};
}

// `reciprocals`: ReciprocalTable(), fetched once by callers that build many symbols.
inline EncSymbol MakeEncSymbol(uint32_t cum, uint32_t freq, int prob_bits, const Reciprocal* reciprocals) {
  EncSymbol e;
  e.x_max = ((kRansLow >> prob_bits) << 16) * freq;
  const Reciprocal r = freq <= 4096 ? reciprocals[freq] : ComputeReciprocal(freq);
  e.rcp = r.rcp;
  e.rcp_shift = r.shift;
  e.cum = cum;
  e.cmpl = static_cast<uint16_t>((1u << prob_bits) - freq);
  return e;
}

inline EncSymbol MakeEncSymbol(uint32_t cum, uint32_t freq, int prob_bits) {
  return MakeEncSymbol(cum, freq, prob_bits, ReciprocalTable());
}

// One encoding step (in reverse decoding order). Words grow downward: a renormalised
// word is stored at w[-1] and the returned pointer is one lower. Branch-free: the word
// is always stored, the pointer only moves when it is real (so w[-1] must be writable).
inline uint16_t* EncodeStep(uint32_t* x, const EncSymbol& e, uint16_t* w) {
  // Arithmetic, not a conditional: compilers turn `emit ? s >> 16 : s` into a branch,
  // which mispredicts on a quarter of the symbols and halves the speed.
  const EncSymbol es = e;
  const uint32_t s0 = *x;
  const uint32_t emit = s0 >= es.x_max ? 1u : 0u;
  const uint32_t s = s0 >> (emit << 4);
  const uint32_t q = static_cast<uint32_t>((uint64_t{s} * es.rcp) >> es.rcp_shift);
  *x = s + es.cum + q * es.cmpl;
  w[-1] = static_cast<uint16_t>(s0);
  return w - emit;
}

}  // namespace kvd::codec
