// warp_decode: the CacheGen stream decoder written as one warp of 32 lanes (lane j =
// state j = channel c0 + 32b + j of block b), shared by the CUDA kernel
// (cuda/cachegen_decode.cu) and its host emulator (device_decode.cc), so the code the GPU
// runs is the code CI tests on the CPU. A lane finds its symbol by binary search over its
// channel's cumulative frequencies (no slot tables); the lanes that need a word take the
// next words in lane order (ballot + prefix count on the GPU, a loop on the host).
// Arithmetic is the format's: float32, one rounding per operation (the CUDA build uses
// __fmul_rn / __fadd_rn / __fdiv_rn, the host build -ffp-contract=off).
// Header-only; no state.
#pragma once

#include <cstdint>

#include "codec/float_bits.h"
#include "codec/model_core.h"

namespace kvd::codec::warp {

inline constexpr uint32_t kLow = 1u << 15;

// One rANS stream of one plane, as the host prepares it (all offsets in bytes, into the
// encoded object for inputs and into the raw object for out_offset). POD: copied to the GPU.
struct StreamJob {
  uint64_t stream_offset;    // the 32 states, then the words
  uint64_t stream_bytes;
  uint64_t scales_offset;    // the plane's tokens x u16 scales
  uint64_t params_offset[2]; // the plane's channels x 2 parameter bytes, per token class
  uint64_t out_offset;       // the plane's first byte in the raw object
  uint32_t tokens;
  uint32_t channels;         // of the plane (row length)
  uint32_t c0, c1;           // channels of this stream
  uint32_t anchor_group;     // 0: no anchors
  uint8_t dtype;             // codec::Dtype code (bf16, fp16, fp32)
  uint8_t levels[2];         // M per class
  uint8_t prob_bits[2];
  uint8_t alphabet[2];
  uint8_t pad[5];
};

KVD_HD inline float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
KVD_HD inline float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
KVD_HD inline float Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// Fills cum[0..alphabet] for one channel's distribution; false for invalid parameters.
KVD_HD inline bool BuildCum(uint8_t center, uint8_t shape, int alphabet, int prob_bits, uint16_t* cum) {
  uint16_t f[kMaxAlphabet];
  if (!BuildFrequencies(center, shape, alphabet, prob_bits, f)) return false;
  uint32_t c = 0;
  for (int s = 0; s < alphabet; ++s) {
    cum[s] = static_cast<uint16_t>(c);
    c += f[s];
  }
  cum[alphabet] = static_cast<uint16_t>(c);  // 2^prob_bits (4096 fits)
  return true;
}

// Decodes one symbol of one lane; returns true when the lane now needs a word.
KVD_HD inline bool LaneDecode(uint32_t* x, const uint16_t* cum, int alphabet, int prob_bits, int* sym) {
  const uint32_t slot = *x & ((1u << prob_bits) - 1u);
  int lo = 0, hi = alphabet;  // cum[lo] <= slot < cum[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (cum[mid] <= slot) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const uint32_t f = static_cast<uint32_t>(cum[lo + 1]) - cum[lo];
  *x = f * (*x >> prob_bits) + slot - cum[lo];
  *sym = lo;
  return *x < kLow;
}

// The decoded value of a symbol (anchor tokens set the lane's reference).
KVD_HD inline float LaneValue(int sym, int levels, float step, bool anchors, bool is_anchor, float* recon) {
  float v = Mul(static_cast<float>(sym - levels), step);
  if (anchors) {
    if (is_anchor) {
      *recon = v;
    } else {
      v = Add(*recon, v);
    }
  }
  return v;
}

// Saturates at the dtype's largest finite value and stores element `index`.
KVD_HD inline void StoreValue(uint8_t* out, uint64_t index, float v, uint8_t dtype) {
  if (dtype == 2) {  // float16
    v = v > 65504.0f ? 65504.0f : (v < -65504.0f ? -65504.0f : v);
    const uint16_t h = FloatToFp16(v);
    out[2 * index] = static_cast<uint8_t>(h);
    out[2 * index + 1] = static_cast<uint8_t>(h >> 8);
  } else if (dtype == 1) {  // bfloat16
    v = v > 0x1.fep127f ? 0x1.fep127f : (v < -0x1.fep127f ? -0x1.fep127f : v);
    const uint16_t h = FloatToBf16(v);
    out[2 * index] = static_cast<uint8_t>(h);
    out[2 * index + 1] = static_cast<uint8_t>(h >> 8);
  } else {  // float32
    v = v > 0x1.fffffep127f ? 0x1.fffffep127f : (v < -0x1.fffffep127f ? -0x1.fffffep127f : v);
    const uint32_t u = FloatBits(v);
    for (int i = 0; i < 4; ++i) out[4 * index + i] = static_cast<uint8_t>(u >> (8 * i));
  }
}

KVD_HD inline uint32_t Load32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}
KVD_HD inline uint32_t Load16(const uint8_t* p) { return uint32_t(p[0]) | (uint32_t(p[1]) << 8); }

// The step of token t: scale / M (the scales were checked on the host).
KVD_HD inline float TokenStep(const uint8_t* enc, const StreamJob& j, uint32_t t, int cls) {
  const uint16_t sb = static_cast<uint16_t>(Load16(enc + j.scales_offset + 2 * uint64_t{t}));
  return Div(Bf16ToFloat(sb), static_cast<float>(j.levels[cls]));
}

}  // namespace kvd::codec::warp
