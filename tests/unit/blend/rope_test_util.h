// Helpers for the re-RoPE and scatter tests: engine-style rotary tables built from real
// RoPE frequencies, keys rotated at a position the way an engine writes them (from the
// same table, in double, rounded once), and the error measures the tests bound.
//
// Error measure. A rotation mixes the two elements of a pair, so an element that cancels
// to near zero inherits the absolute rounding error of its larger partner; errors are
// therefore measured against the pair: fp32 as |got - ref| / |ref pair|, the narrow types
// in units of the type's ulp at the pair's length (the spacing of representable values
// at that magnitude).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "blend/rope.h"

namespace kvd::blend::test_util {

// A cos/sin cache as an engine registers it: [positions, rot] in `dtype`, row p =
// rot/2 cosines then rot/2 sines of p * base^(-2i/rot), times `scale` (a YaRN mscale).
struct EngineTable {
  int64_t positions = 0;
  int64_t rot = 0;
  std::string dtype;
  std::vector<uint8_t> bytes;
  std::vector<double> values;  // what the engine computes with: the stored values

  double Cos(int64_t p, int64_t i) const { return values[p * rot + i]; }
  double Sin(int64_t p, int64_t i) const { return values[p * rot + rot / 2 + i]; }
};

inline void AppendValue(std::vector<uint8_t>* out, const std::string& dtype, double v,
                        double* stored) {
  const float f = static_cast<float>(v);
  if (dtype == "float32") {
    uint8_t b[4];
    std::memcpy(b, &f, 4);
    out->insert(out->end(), b, b + 4);
    *stored = f;
    return;
  }
  const uint16_t h = dtype == "bfloat16" ? codec::FloatToBf16(f) : codec::FloatToFp16(f);
  out->push_back(static_cast<uint8_t>(h & 0xff));
  out->push_back(static_cast<uint8_t>(h >> 8));
  *stored = dtype == "bfloat16" ? codec::Bf16ToFloat(h) : codec::Fp16ToFloat(h);
}

inline EngineTable MakeEngineTable(int64_t positions, int64_t rot, double base,
                                   const std::string& dtype = "float32", double scale = 1.0) {
  EngineTable t;
  t.positions = positions;
  t.rot = rot;
  t.dtype = dtype;
  t.values.resize(positions * rot);
  const int64_t half = rot / 2;
  for (int64_t p = 0; p < positions; ++p) {
    for (int64_t j = 0; j < rot; ++j) {
      const int64_t i = j % half;
      const double inv_freq = std::pow(base, -2.0 * static_cast<double>(i) / rot);
      const double a = static_cast<double>(p) * inv_freq;
      const double v = (j < half ? std::cos(a) : std::sin(a)) * scale;
      AppendValue(&t.bytes, dtype, v, &t.values[p * rot + j]);
    }
  }
  return t;
}

inline RopeTable MustTable(const EngineTable& e) {
  const int64_t shape[2] = {e.positions, e.rot};
  auto t = RopeTable::FromCosSinCache(e.bytes, e.dtype, shape);
  if (!t.ok()) std::abort();
  return std::move(t).value();
}

inline double DecodeElem(KvElem e, const uint8_t* row, int64_t i) {
  switch (e) {
    case KvElem::kFloat32:
      return LoadElem<KvElem::kFloat32>(row, i);
    case KvElem::kBFloat16:
      return LoadElem<KvElem::kBFloat16>(row, i);
    case KvElem::kFloat16:
      return LoadElem<KvElem::kFloat16>(row, i);
    case KvElem::kFp8E4m3:
      return LoadElem<KvElem::kFp8E4m3>(row, i);
    case KvElem::kFp8E5m2:
      return LoadElem<KvElem::kFp8E5m2>(row, i);
  }
  return 0;
}

inline void EncodeElem(KvElem e, uint8_t* row, int64_t i, double v) {
  const float f = static_cast<float>(v);
  switch (e) {
    case KvElem::kFloat32:
      return StoreElem<KvElem::kFloat32>(row, i, f);
    case KvElem::kBFloat16:
      return StoreElem<KvElem::kBFloat16>(row, i, f);
    case KvElem::kFloat16:
      return StoreElem<KvElem::kFloat16>(row, i, f);
    case KvElem::kFp8E4m3:
      return StoreElem<KvElem::kFp8E4m3>(row, i, f);
    case KvElem::kFp8E5m2:
      return StoreElem<KvElem::kFp8E5m2>(row, i, f);
  }
}

// Spacing of representable values of `e` at magnitude |v|.
inline double UlpAt(KvElem e, double v) {
  int mant = 23, emin = -126;
  switch (e) {
    case KvElem::kFloat32:
      break;
    case KvElem::kBFloat16:
      mant = 7;
      break;
    case KvElem::kFloat16:
      mant = 10, emin = -14;
      break;
    case KvElem::kFp8E4m3:
      mant = 3, emin = -6;
      break;
    case KvElem::kFp8E5m2:
      mant = 2, emin = -14;
      break;
  }
  int ex = v > 0 ? static_cast<int>(std::floor(std::log2(std::fabs(v)))) : emin;
  if (ex < emin) ex = emin;
  return std::ldexp(1.0, ex - mant);
}

// Raw (pre-RoPE) keys of one row: N(0, sigma) per element.
inline std::vector<double> RawRow(const KRowGeometry& g, std::mt19937_64& rng, double sigma = 1.0) {
  std::normal_distribution<double> nd(0.0, sigma);
  std::vector<double> raw(g.row_elems());
  for (double& v : raw) v = nd(rng);
  return raw;
}

// The row as the engine writes it at position `pos`: every window turned by the engine
// table's values at pos (in double), every element rounded once to g.elem.
inline std::vector<uint8_t> KeyAt(const std::vector<double>& raw, const KRowGeometry& g,
                                  const EngineTable& t, int64_t pos) {
  std::vector<double> v = raw;
  for (int64_t h = 0; h < g.num_heads; ++h) {
    const int64_t base = h * g.head_stride + g.rot_offset;
    for (int64_t i = 0; i < g.rot_dim / 2; ++i) {
      const int64_t ix = base + PairX(g.style, i, g.rot_dim);
      const int64_t iy = base + PairY(g.style, i, g.rot_dim);
      const double c = t.Cos(pos, i), s = t.Sin(pos, i);
      v[ix] = raw[ix] * c - raw[iy] * s;
      v[iy] = raw[iy] * c + raw[ix] * s;
    }
  }
  std::vector<uint8_t> out(g.row_bytes());
  for (int64_t i = 0; i < g.row_elems(); ++i) EncodeElem(g.elem, out.data(), i, v[i]);
  return out;
}

struct RowError {
  double max_rel = 0;        // fp32: max |got - ref| / |ref pair|
  double max_ulp = 0;        // narrow types: max error in ulps at the pair's length
  int64_t within_one = 0;    // elements within 1 such ulp
  int64_t elems = 0;         // rotated elements compared
  bool outside_same = true;  // every element outside the windows byte-identical
  double Fraction() const { return elems ? static_cast<double>(within_one) / elems : 1.0; }
  void Merge(const RowError& o) {
    max_rel = std::max(max_rel, o.max_rel);
    max_ulp = std::max(max_ulp, o.max_ulp);
    within_one += o.within_one;
    elems += o.elems;
    outside_same = outside_same && o.outside_same;
  }
};

inline RowError CompareRows(const uint8_t* got, const uint8_t* ref, const KRowGeometry& g) {
  RowError e;
  const int64_t size = KvElemSize(g.elem);
  std::vector<bool> in_window(g.row_elems(), false);
  for (int64_t h = 0; h < g.num_heads; ++h) {
    const int64_t base = h * g.head_stride + g.rot_offset;
    for (int64_t i = 0; i < g.rot_dim / 2; ++i) {
      const int64_t ix = base + PairX(g.style, i, g.rot_dim);
      const int64_t iy = base + PairY(g.style, i, g.rot_dim);
      in_window[ix] = in_window[iy] = true;
      const double rx = DecodeElem(g.elem, ref, ix), ry = DecodeElem(g.elem, ref, iy);
      const double len = std::hypot(rx, ry);
      for (int64_t k : {ix, iy}) {
        const double err = std::fabs(DecodeElem(g.elem, got, k) - DecodeElem(g.elem, ref, k));
        if (len > 0) e.max_rel = std::max(e.max_rel, err / len);
        const double ulps = err / UlpAt(g.elem, len);
        e.max_ulp = std::max(e.max_ulp, ulps);
        e.within_one += ulps <= 1.0 ? 1 : 0;
        ++e.elems;
      }
    }
  }
  for (int64_t i = 0; i < g.row_elems(); ++i) {
    if (!in_window[i] && std::memcmp(got + i * size, ref + i * size, size) != 0) {
      e.outside_same = false;
    }
  }
  return e;
}

}  // namespace kvd::blend::test_util
