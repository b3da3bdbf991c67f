// plane encoder (plane.h): quantize, fit one distribution per (channel, token class),
// rANS-encode the streams.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>

#include "codec/float_bits.h"
#include "codec/format.h"
#include "codec/model_core.h"
#include "codec/plane.h"

namespace kvd::codec::plane {
namespace {

inline float LoadValue(const uint8_t* p, Dtype dtype) {
  uint16_t h;
  switch (dtype) {
    case Dtype::kBfloat16:
      memcpy(&h, p, 2);
      return Bf16ToFloat(h);
    case Dtype::kFloat16:
      memcpy(&h, p, 2);
      return Fp16ToFloat(h);
    default: {
      float f;
      memcpy(&f, p, 4);
      return f;
    }
  }
}

// std::lround for 0 <= x < 2^53 (nearest, halves away from zero), without the library
// call: x - trunc(x) is exact in that range.
inline long RoundNonNegative(double x) {
  const long t = static_cast<long>(x);
  return t + (x - static_cast<double>(t) >= 0.5 ? 1 : 0);
}

}  // namespace

int SigmaIndex(double sigma) {
  if (sigma <= 0.08) return 0;
  const int i = static_cast<int>(RoundNonNegative(std::log(sigma / 0.08) / std::log(1.1)));
  return i < 0 ? 0 : (i > kNumSigmas - 1 ? kNumSigmas - 1 : i);
}

// Picks the distribution for this channel's histogram from its moments. n and s1 are
// sums of integers (exact in double as well); the squared and fourth moments skip the
// empty symbols at either end, whose terms are +0 and leave the sums as they are.
void FitChannel(const uint32_t* h, int alphabet, int prob_bits, uint8_t* center_out, uint8_t* shape_out) {
  uint64_t count = 0, moment1 = 0;
  for (int s = 0; s < alphabet; ++s) {
    count += h[s];
    moment1 += uint64_t{h[s]} * static_cast<uint64_t>(s);
  }
  if (count == 0) {
    *center_out = static_cast<uint8_t>(4 * (alphabet / 2));
    *shape_out = 0;
    return;
  }
  const double n = static_cast<double>(count), s1 = static_cast<double>(moment1);
  int lo = 0, hi = alphabet - 1;
  while (h[lo] == 0) ++lo;
  while (h[hi] == 0) --hi;
  const double mean = s1 / n;
  double s2 = 0, s4 = 0;
  for (int s = lo; s <= hi; ++s) {
    const double d = s - mean, d2 = d * d;
    s2 += h[s] * d2;
    s4 += h[s] * d2 * d2;
  }
  const double var = s2 / n;
  long c4 = RoundNonNegative(4 * mean);
  if (c4 < 0) c4 = 0;
  if (c4 > 4 * (alphabet - 1)) c4 = 4 * (alphabet - 1);
  const uint8_t center = static_cast<uint8_t>(c4);
  const int sig = SigmaIndex(std::sqrt(var));
  // The kind by the tails (kurtosis above the midpoint of Gauss's 3 and Laplace's 6),
  // sigma by the variance. Searching neighbouring sigmas and the other kind as well saves
  // 0.1-0.2% of the bits on the KV model's KV at three to four times the fitting time
  // (docs/compression.md), so the encoder keeps the moment fit.
  const double kurt = var > 0 ? (s4 / n) / (var * var) : 3.0;
  const uint8_t kind = kurt > 4.5 ? kKindLaplace : kKindGauss;
  const uint8_t best_shape = static_cast<uint8_t>((kind << 6) | sig);
  *center_out = center;
  *shape_out = best_shape;
}

int ProbBits(const PlaneSpec& spec, int k) {
  if (spec.prob_bits[k] != 0) return spec.prob_bits[k];
  return ProbBitsFor(Alphabet(k == 1 && spec.anchors() ? spec.anchor_bins : spec.bins));
}

uint64_t FixedBytes(const PlaneSpec& spec) {
  return uint64_t{spec.tokens} * 2 + uint64_t{spec.channels} * 2 * (spec.anchors() ? 2 : 1) +
         uint64_t{spec.Streams()} * 4;
}

bool Encode(const uint8_t* data, const PlaneSpec& spec, Scratch* sc, std::vector<uint8_t>* out, bool simd) {
  const uint32_t T = spec.tokens, C = spec.channels;
  const uint32_t isz = DtypeBytes(spec.dtype);
  const int levels[2] = {Levels(spec.bins), Levels(spec.anchors() ? spec.anchor_bins : spec.bins)};
  const int alpha[2] = {2 * levels[0] + 1, 2 * levels[1] + 1};
  const int pbits[2] = {ProbBits(spec, 0), ProbBits(spec, 1)};
  const int classes = spec.anchors() ? 2 : 1;
  sc->symbols.resize(size_t{T} * C);
  sc->scales.resize(T);
  sc->row.resize(C);
  sc->recon.assign(C, 0.0f);
  // Histograms, per class: alpha[k] rows (symbols) of C counts (channels).
  const size_t hist_at[2] = {0, size_t{C} * alpha[0]};
  sc->hist.assign(size_t{C} * alpha[0] + (classes == 2 ? size_t{C} * alpha[1] : 0), 0);

  // 1. Quantize, token by token. The normal tokens' symbols are counted after the loop
  // with AVX2 (one compare per symbol value and 32 channels: cheaper than one increment
  // per value up to 31 symbols), else token by token like the anchors'.
  const bool avx2 = simd && HaveAvx2();
  const bool count_after = avx2 && alpha[0] <= 31;
  for (uint32_t t = 0; t < T; ++t) {
    const int cls = spec.IsAnchor(t) ? 1 : 0;
    const uint8_t* src = data + size_t{t} * C * isz;
    float* v = sc->row.data();
    const float* ref = spec.anchors() && cls == 0 ? sc->recon.data() : nullptr;
    float amax = 0;
    if (avx2) {
      amax = LoadRowAvx2(src, spec.dtype, C, ref, v);
    } else {
      for (uint32_t c = 0; c < C; ++c) {
        float x = LoadValue(src + size_t{c} * isz, spec.dtype);
        if (ref) x = x - ref[c];
        v[c] = x;
        if (!std::isfinite(x)) {
          amax = -1;
          break;
        }
        const float a = std::fabs(x);
        amax = a > amax ? a : amax;
      }
    }
    if (amax < 0) return false;  // NaN or infinity: stored raw
    const uint16_t sb = FloatToBf16Up(amax);
    if ((sb & 0x7f80u) == 0x7f80u) return false;  // scale overflows bf16
    sc->scales[t] = sb;
    const int m = levels[cls];
    const float step = Bf16ToFloat(sb) / static_cast<float>(m);
    uint8_t* sym = sc->symbols.data() + size_t{t} * C;
    if (avx2) {
      QuantizeRowAvx2(v, C, step, m, sym);
    } else {
      for (uint32_t c = 0; c < C; ++c) {
        int q = 0;
        if (step > 0) {
          q = static_cast<int>(std::nearbyint(v[c] / step));
          q = q < -m ? -m : (q > m ? m : q);
        }
        sym[c] = static_cast<uint8_t>(q + m);
      }
    }
    if (cls == 1 || !count_after) {
      uint32_t* hist = sc->hist.data() + hist_at[cls];
      for (uint32_t c = 0; c < C; ++c) hist[size_t{sym[c]} * C + c]++;
    }
    if (cls == 1) {
      for (uint32_t c = 0; c < C; ++c) sc->recon[c] = static_cast<float>(static_cast<int>(sym[c]) - m) * step;
    }
  }

  if (count_after) NormalHistogramAvx2(sc->symbols.data(), T, C, spec.anchors() ? spec.anchor_group : 0, alpha[0], sc->hist.data());

  // 2. One distribution per (class, channel), and its symbol table: channels with the
  // same distribution share one, built once per Scratch (the pool is emptied when a
  // plane could take it past kEncPoolLimit entries).
  constexpr size_t kEncPoolLimit = size_t{1} << 16;
  const size_t most = size_t{C} * alpha[0] + (classes == 2 ? size_t{C} * alpha[1] : 0);  // this plane adds
  if (sc->enc_pool.size() + most > kEncPoolLimit) {
    sc->enc_pool.clear();
    sc->enc_index.Clear();
  }
  if (sc->enc_pool.capacity() < sc->enc_pool.size() + most) {
    sc->enc_pool.reserve(std::max(sc->enc_pool.size() + most, std::min(2 * sc->enc_pool.capacity(), kEncPoolLimit)));
  }
  const Reciprocal* reciprocals = ReciprocalTable();
  sc->params.assign(size_t{2} * C * 2, 0);
  sc->enc_at.resize(size_t{2} * C);
  for (int k = 0; k < classes; ++k) {
    const uint32_t* hist = sc->hist.data() + hist_at[k];
    uint8_t* params = sc->params.data() + static_cast<size_t>(k) * C * 2;
    uint32_t c = 0;
    if (avx2) {
      for (; c + 4 <= C; c += 4) FitChannels4Avx2(hist + c, C, alpha[k], params + 2 * size_t{c});
    }
    for (; c < C; ++c) {
      uint32_t h[kMaxAlphabet];
      for (int s = 0; s < alpha[k]; ++s) h[s] = hist[size_t(s) * C + c];
      FitChannel(h, alpha[k], pbits[k], &params[2 * size_t{c}], &params[2 * size_t{c} + 1]);
    }
  }
  for (int k = 0; k < classes; ++k) {
    for (uint32_t c = 0; c < C; ++c) {
      const uint8_t* prm = sc->params.data() + (static_cast<size_t>(k) * C + c) * 2;
      const uint32_t key = TableKey(pbits[k], alpha[k], prm[0], prm[1]);
      uint32_t at = sc->enc_index.Find(key);
      if (at == TableIndex::kNone) {
        uint16_t f[kMaxAlphabet];
        Frequencies(prm[0], prm[1], alpha[k], pbits[k], avx2, f);  // FitChannel's choices are valid
        at = static_cast<uint32_t>(sc->enc_pool.size());
        sc->enc_pool.resize(sc->enc_pool.size() + static_cast<size_t>(alpha[k]));
        EncSymbol* e = sc->enc_pool.data() + at;
        uint32_t cum = 0;
        for (int s = 0; s < alpha[k]; ++s) {
          e[s] = MakeEncSymbol(cum, f[s], pbits[k], reciprocals);
          cum += f[s];
        }
        sc->enc_index.Insert(key, at);
      }
      sc->enc_at[static_cast<size_t>(k) * C + c] = at;
    }
  }
  // Without anchors class 1 is never coded; it names class 0's tables.
  if (classes == 1) std::copy_n(sc->enc_at.begin(), C, sc->enc_at.begin() + C);

  // 3. Streams, each encoded in reverse decoding order.
  const size_t base = out->size();
  out->reserve(base + size_t{T} * C * isz + 4096);  // no reallocation below
  const uint32_t S = spec.Streams();
  out->resize(base + FixedBytes(spec));
  uint8_t* p = out->data() + base;
  for (uint32_t t = 0; t < T; ++t) format::Put16(p + 2 * t, sc->scales[t]);
  p += 2 * size_t{T};
  for (int k = 0; k < classes; ++k) {
    memcpy(p, sc->params.data() + static_cast<size_t>(k) * C * 2, size_t{C} * 2);
    p += size_t{C} * 2;
  }
  const size_t lengths_at = base + 2 * size_t{T} + size_t{C} * 2 * classes;
  const uint64_t raw_bytes = uint64_t{T} * C * isz;
  for (uint32_t si = 0; si < S; ++si) {
    const uint32_t c0 = si * spec.stream_channels;
    const uint32_t c1 = c0 + spec.stream_channels < C ? c0 + spec.stream_channels : C;
    const size_t cap = size_t{T} * (c1 - c0) + 8;  // + the AVX2 step's room below (plane.h)
    sc->words.resize(cap);
    uint16_t* w = sc->words.data() + cap;
    uint32_t x[kLanes];
    for (int j = 0; j < kLanes; ++j) x[j] = kRansLow;
    const uint32_t blocks = (c1 - c0 + kLanes - 1) / kLanes;
    for (uint32_t b = blocks; b-- > 0;) {
      const uint32_t cb = c0 + b * kLanes;
      const int lanes = static_cast<int>(c1 - cb < kLanes ? c1 - cb : kLanes);
      const EncSymbol* tables[2 * kLanes];  // lane j's table of class k: tables[32 k + j]
      for (int k = 0; k < 2; ++k) {
        for (int j = 0; j < lanes; ++j) tables[kLanes * k + j] = sc->enc_pool.data() + sc->enc_at[static_cast<size_t>(k) * C + cb + j];
      }
      if (avx2 && lanes == kLanes) {
        w = EncodeBlockAvx2(x, sc->symbols.data() + cb, C, tables, spec.anchors() ? spec.anchor_group : 0, T, w);
        continue;
      }
      for (uint32_t t = T; t-- > 0;) {
        const int k = spec.IsAnchor(t) ? 1 : 0;
        const uint8_t* sym = sc->symbols.data() + size_t{t} * C + cb;
        const EncSymbol* const* e = tables + kLanes * k;
        for (int j = lanes; j-- > 0;) w = EncodeStep(&x[j], e[j][sym[j]], w);
      }
    }
    const size_t nwords = static_cast<size_t>(sc->words.data() + cap - w);
    const size_t len = 4 * kLanes + 2 * nwords;
    if (out->size() - base + len >= raw_bytes) {
      out->resize(base);
      return false;  // would not get smaller than the raw plane
    }
    const size_t at = out->size();
    out->resize(at + len);
    uint8_t* q = out->data() + at;
    for (int j = 0; j < kLanes; ++j) format::Put32(q + 4 * j, x[j]);
    q += 4 * kLanes;
    if constexpr (std::endian::native == std::endian::little) {
      memcpy(q, w, 2 * nwords);
    } else {
      for (size_t i = 0; i < nwords; ++i) format::Put16(q + 2 * i, w[i]);
    }
    format::Put32(out->data() + lengths_at + 4 * size_t{si}, static_cast<uint32_t>(len));
  }
  return true;
}

}  // namespace kvd::codec::plane
