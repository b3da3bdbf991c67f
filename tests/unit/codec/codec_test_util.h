// Test helpers for the codec: KV-like objects (Gaussian channels with per-channel
// scales and means, optional outlier channels, AR(1) token correlation) and a
// reference quantizer written from the format's description (plane.h), used to check
// that the entropy coder returns exactly the quantized symbols.
#pragma once

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "codec/codec.h"
#include "codec/float_bits.h"

namespace kvd::codec::test {

struct KvSpec {
  uint32_t kv_size = 2, layers = 2, tokens = 256, hidden = 128;
  Dtype dtype = Dtype::kBfloat16;
  float rho = 0.9f;             // token-to-token correlation
  int outliers = 2;             // channels with 100x the scale
  float outlier_scale = 100.0f;
  uint32_t seed = 1;
};

inline ObjectLayout LayoutOf(const KvSpec& s, uint64_t id = 42) {
  ObjectLayout l;
  l.layout_id = id;
  l.groups.push_back({s.kv_size, s.layers, s.tokens, s.hidden, s.dtype});
  return l;
}

inline void StoreAs(Dtype d, float v, uint8_t* p) {
  if (d == Dtype::kBfloat16) {
    const uint16_t h = FloatToBf16(v);
    memcpy(p, &h, 2);
  } else if (d == Dtype::kFloat16) {
    const uint16_t h = FloatToFp16(v);
    memcpy(p, &h, 2);
  } else {
    memcpy(p, &v, 4);
  }
}

inline float LoadAs(Dtype d, const uint8_t* p) {
  uint16_t h;
  if (d == Dtype::kBfloat16) {
    memcpy(&h, p, 2);
    return Bf16ToFloat(h);
  }
  if (d == Dtype::kFloat16) {
    memcpy(&h, p, 2);
    return Fp16ToFloat(h);
  }
  float f;
  memcpy(&f, p, 4);
  return f;
}

inline std::vector<uint8_t> MakeKv(const KvSpec& s) {
  std::mt19937 rng(s.seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const uint32_t isz = DtypeBytes(s.dtype);
  std::vector<uint8_t> obj(uint64_t{s.kv_size} * s.layers * s.tokens * s.hidden * isz);
  const uint32_t planes = s.kv_size * s.layers;
  for (uint32_t p = 0; p < planes; ++p) {
    std::vector<float> scale(s.hidden), mean(s.hidden), prev(s.hidden, 0.0f);
    for (uint32_t c = 0; c < s.hidden; ++c) {
      scale[c] = 0.2f + std::fabs(nd(rng));
      mean[c] = 0.3f * nd(rng);
      if (static_cast<int>(c) < s.outliers) scale[c] *= s.outlier_scale;
    }
    const float inn = std::sqrt(1.0f - s.rho * s.rho);
    for (uint32_t t = 0; t < s.tokens; ++t) {
      for (uint32_t c = 0; c < s.hidden; ++c) {
        prev[c] = s.rho * prev[c] + inn * nd(rng);
        const float v = mean[c] * scale[c] + scale[c] * prev[c];
        StoreAs(s.dtype, v, obj.data() + ((uint64_t{p} * s.tokens + t) * s.hidden + c) * isz);
      }
    }
  }
  return obj;
}

// The format's quantizer for one plane without anchors: what Decode must return, bit
// for bit, if the entropy coder is lossless.
inline std::vector<float> ReferencePlane(const uint8_t* data, Dtype d, uint32_t tokens, uint32_t hidden,
                                         uint32_t bins, std::vector<float>* steps = nullptr) {
  const uint32_t isz = DtypeBytes(d);
  const int m = static_cast<int>(bins / 2) - 1;
  std::vector<float> out(size_t{tokens} * hidden);
  for (uint32_t t = 0; t < tokens; ++t) {
    float amax = 0;
    for (uint32_t c = 0; c < hidden; ++c) {
      amax = std::max(amax, std::fabs(LoadAs(d, data + (size_t{t} * hidden + c) * isz)));
    }
    const float step = Bf16ToFloat(FloatToBf16Up(amax)) / static_cast<float>(m);
    if (steps) steps->push_back(step);
    for (uint32_t c = 0; c < hidden; ++c) {
      const float x = LoadAs(d, data + (size_t{t} * hidden + c) * isz);
      int q = step > 0 ? static_cast<int>(std::nearbyint(x / step)) : 0;
      q = std::clamp(q, -m, m);
      out[size_t{t} * hidden + c] = static_cast<float>(q) * step;
    }
  }
  return out;
}

}  // namespace kvd::codec::test
