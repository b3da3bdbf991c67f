// rope_math: the arithmetic of re-RoPE on one K row, shared by the CPU scatter
// (scatter.cc) and, later, a CUDA kernel. Header-only, no allocation, no CUDA headers:
// KVD_BLEND_HD marks functions __host__ __device__ under nvcc and plain inline elsewhere.
//
// A K row is `num_heads` heads, `head_stride` elements apart. Inside each head the
// rotary window starts `rot_offset` elements in and is `rot_dim` elements wide; it holds
// rot_dim / 2 pairs (x, y): NeoX pairs element i with i + rot_dim/2, GPT-J pairs 2i with
// 2i + 1. Pair i turns by the angle of frequency i. Elements outside the windows (the
// rest of a partial-rotary head, an MLA latent's content, the V half of a packed head)
// are copied unchanged.
//
// The rotation from position p to position q is ONE complex multiply per pair, by
//   delta = t(q) * conj(t(p)) / |t(p)|^2,   t(pos) = cos(pos) + i sin(pos) from the table,
// i.e. dcos = (nc*oc + ns*os) / (oc^2 + os^2), dsin = (ns*oc - nc*os) / (oc^2 + os^2).
// With a unit table this is the rotation by theta(q) - theta(p); the division makes it the
// exact inverse of what the engine applied at p even when its table's entries are not of
// unit length (a bf16 table, an mscale), so the result is what the engine computes at q.
// Values are widened to fp32, turned, and rounded once (to nearest even) to the storage
// type; fp8 is dequantised and requantised without a scale (a per-tensor scale commutes
// with a rotation). A NaN in a turned pair is written as the positive quiet NaN.
#pragma once

#include <cstdint>
#include <cstring>

#include "codec/float_bits.h"

#if defined(__CUDACC__)
#define KVD_BLEND_HD __host__ __device__ __forceinline__
#else
#define KVD_BLEND_HD inline
#endif

namespace kvd::blend {

// The storage type of a K element.
enum class KvElem : uint8_t { kFloat32, kBFloat16, kFloat16, kFp8E4m3, kFp8E5m2 };

// How the pairs of a rotary window are formed.
enum class RopeStyle : uint8_t {
  kNeox,  // (i, i + rot_dim/2): contiguous halves
  kGptj,  // (2i, 2i + 1): interleaved
};

KVD_BLEND_HD constexpr int64_t KvElemSize(KvElem e) {
  return e == KvElem::kFloat32 ? 4 : (e == KvElem::kBFloat16 || e == KvElem::kFloat16) ? 2 : 1;
}

// Where the rotary windows of one K row are. All counts in elements.
struct KRowGeometry {
  KvElem elem = KvElem::kBFloat16;
  RopeStyle style = RopeStyle::kNeox;
  int64_t num_heads = 1;    // heads in the row
  int64_t head_stride = 0;  // elements from one head to the next
  int64_t rot_offset = 0;   // first rotated element inside each head
  int64_t rot_dim = 0;      // rotated elements per head (even)

  KVD_BLEND_HD constexpr int64_t row_elems() const { return num_heads * head_stride; }
  KVD_BLEND_HD constexpr int64_t row_bytes() const { return row_elems() * KvElemSize(elem); }
};

// delta for one pair, from the table's values at the old (oc, os) and new (nc, ns)
// position. Computed in double: the division and the products lose nothing measurable.
KVD_BLEND_HD void DeltaPair(float oc, float os, float nc, float ns, float* dcos, float* dsin) {
  const double inv = 1.0 / (static_cast<double>(oc) * oc + static_cast<double>(os) * os);
  *dcos = static_cast<float>((static_cast<double>(nc) * oc + static_cast<double>(ns) * os) * inv);
  *dsin = static_cast<float>((static_cast<double>(ns) * oc - static_cast<double>(nc) * os) * inv);
}

// Element access in fp32.
template <KvElem E>
KVD_BLEND_HD float LoadElem(const uint8_t* p, int64_t i) {
  if constexpr (E == KvElem::kFloat32) {
    float f;
    memcpy(&f, p + i * 4, 4);
    return f;
  } else if constexpr (E == KvElem::kBFloat16 || E == KvElem::kFloat16) {
    uint16_t h;
    memcpy(&h, p + i * 2, 2);
    return E == KvElem::kBFloat16 ? codec::Bf16ToFloat(h) : codec::Fp16ToFloat(h);
  } else {
    return codec::Fp8ToFloat(p[i], E == KvElem::kFp8E4m3);
  }
}

template <KvElem E>
KVD_BLEND_HD void StoreElem(uint8_t* p, int64_t i, float v) {
  // A NaN is stored as the positive quiet NaN: which operand's NaN an instruction passes
  // on (payload, sign) differs between builds and devices, so it is not kept.
  v = v == v ? v : codec::BitsFloat(0x7fc00000u);
  if constexpr (E == KvElem::kFloat32) {
    memcpy(p + i * 4, &v, 4);
  } else if constexpr (E == KvElem::kBFloat16 || E == KvElem::kFloat16) {
    const uint16_t h = E == KvElem::kBFloat16 ? codec::FloatToBf16(v) : codec::FloatToFp16(v);
    memcpy(p + i * 2, &h, 2);
  } else {
    p[i] = codec::FloatToFp8(v, E == KvElem::kFp8E4m3);
  }
}

// Element indices of pair i in a window of rot_dim elements.
KVD_BLEND_HD int64_t PairX(RopeStyle s, int64_t i, int64_t /*rot_dim*/) {
  return s == RopeStyle::kNeox ? i : 2 * i;
}
KVD_BLEND_HD int64_t PairY(RopeStyle s, int64_t i, int64_t rot_dim) {
  return s == RopeStyle::kNeox ? i + rot_dim / 2 : 2 * i + 1;
}

// Turns one window: reads pair i of `src`, writes it to `dst` (may be the same memory).
// `dcos`/`dsin` hold rot_dim/2 deltas.
template <KvElem E, RopeStyle S>
KVD_BLEND_HD void RotateWindow(const uint8_t* src, uint8_t* dst, int64_t rot_dim, const float* dcos,
                               const float* dsin) {
#if defined(__clang__) && !defined(__CUDACC__)
#pragma clang fp contract(off)  // a product, a product, a sum: the same in every CPU build
#endif
  const int64_t half = rot_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const int64_t ix = PairX(S, i, rot_dim), iy = PairY(S, i, rot_dim);
    const float x = LoadElem<E>(src, ix), y = LoadElem<E>(src, iy);
    const float c = dcos[i], s = dsin[i];
    StoreElem<E>(dst, ix, x * c - y * s);
    StoreElem<E>(dst, iy, y * c + x * s);
  }
}

// One K row: every head's window turned from src into dst, every other element copied.
// src and dst are row_bytes() long and either identical or disjoint.
template <KvElem E, RopeStyle S>
KVD_BLEND_HD void RotateRowTyped(const uint8_t* src, uint8_t* dst, const KRowGeometry& g,
                                 const float* dcos, const float* dsin) {
  constexpr int64_t kSize = KvElemSize(E);
  const int64_t head_bytes = g.head_stride * kSize;
  const int64_t pre = g.rot_offset * kSize;
  const int64_t win = g.rot_dim * kSize;
  const int64_t post = head_bytes - pre - win;
  for (int64_t h = 0; h < g.num_heads; ++h) {
    const uint8_t* s = src + h * head_bytes;
    uint8_t* d = dst + h * head_bytes;
    if (s != d) {
      if (pre > 0) memcpy(d, s, pre);
      if (post > 0) memcpy(d + pre + win, s + pre + win, post);
    }
    RotateWindow<E, S>(s + pre, d + pre, g.rot_dim, dcos, dsin);
  }
}

// Rows turned together: row r is read at src + r * src_stride and written at
// dst + r * dst_stride (the same memory or disjoint), with the deltas at
// delta + r * delta_stride: rot_dim/2 cosines, then rot_dim/2 sines.
struct RowBatch {
  const uint8_t* src = nullptr;
  int64_t src_stride = 0;
  uint8_t* dst = nullptr;
  int64_t dst_stride = 0;
  int64_t rows = 0;
  const float* delta = nullptr;
  int64_t delta_stride = 0;
};

template <KvElem E, RopeStyle S>
KVD_BLEND_HD void RotateRowsTyped(const RowBatch& b, const KRowGeometry& g) {
  const int64_t half = g.rot_dim / 2;
  for (int64_t r = 0; r < b.rows; ++r) {
    const float* dc = b.delta + r * b.delta_stride;
    RotateRowTyped<E, S>(b.src + r * b.src_stride, b.dst + r * b.dst_stride, g, dc, dc + half);
  }
}

template <KvElem E>
KVD_BLEND_HD void RotateRowsStyle(const RowBatch& b, const KRowGeometry& g) {
  if (g.style == RopeStyle::kNeox) {
    RotateRowsTyped<E, RopeStyle::kNeox>(b, g);
  } else {
    RotateRowsTyped<E, RopeStyle::kGptj>(b, g);
  }
}

// Dispatch on the element type, once per batch. The geometry must have been validated
// (ValidateGeometry in rope.h).
KVD_BLEND_HD void RotateRows(const RowBatch& b, const KRowGeometry& g) {
  switch (g.elem) {
    case KvElem::kFloat32:
      return RotateRowsStyle<KvElem::kFloat32>(b, g);
    case KvElem::kBFloat16:
      return RotateRowsStyle<KvElem::kBFloat16>(b, g);
    case KvElem::kFloat16:
      return RotateRowsStyle<KvElem::kFloat16>(b, g);
    case KvElem::kFp8E4m3:
      return RotateRowsStyle<KvElem::kFp8E4m3>(b, g);
    case KvElem::kFp8E5m2:
      return RotateRowsStyle<KvElem::kFp8E5m2>(b, g);
  }
}

}  // namespace kvd::blend
