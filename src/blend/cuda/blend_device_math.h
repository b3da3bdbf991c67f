// blend_device_math: the index math and row arithmetic of CacheBlend's CUDA scatter +
// re-RoPE, shared verbatim by the kernel (blend_kernels.cu) and the host emulator
// (blend_device_plan.cc, unit-tested against blend::ExecuteScatter for every layout).
// Header-only, no CUDA headers, no std containers; KVD_BLEND_HD (rope_math.h) marks the
// functions __host__ __device__ under nvcc.
//
// Work decomposition (one plan per request, one launch):
//   job    one (match, kernel group, K/V plane, layer access): rows [0, rows) of the
//          object plane, contiguous at `src`, to request positions cur_st.. through the
//          group's block table and the layer's byte runs (scatter_math.h's SlotOf,
//          PlaneOffset, RunOffset, as the CPU scatter);
//   shape  how a job's rows move: copied (V rows, unrotated groups, old_st == cur_st) or
//          turned (K rows): per head, the bytes before and after the rotary window are
//          copied in words of copy_vec bytes, the window is turned in units of two words
//          of win_word bytes (NeoX: x word and the y word half a window later; GPT-J: two
//          adjacent words of whole pairs) by rope_math.h's RotateWindow, fp32, rounded once;
//   piece  a run of rows of one job (about 32 KiB): one CTA's work item.
// The deltas (rot_dim/2 cosines then sines per token) are computed on the host by
// RopeTable::Delta, the very function the CPU scatter calls, so both turn with the same
// bits. Every value here was validated by PlanScatter and BuildBlendDevicePlan.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "blend/rope_math.h"
#include "blend/scatter_math.h"

#if defined(__CUDACC__)
#define KVD_BLEND_UNROLL _Pragma("unroll")
#else
#define KVD_BLEND_UNROLL
#endif

namespace kvd::blend::cuda {

// One byte run of a destination token row (layout::ByteRun) and where it sits in the row.
struct BlendRun {
  int64_t offset;        // from the block-plane start to token 0's run
  int64_t token_stride;  // between consecutive tokens' runs
  uint32_t length;       // bytes
  uint32_t row_prefix;   // bytes of the row before this run
};

// One layer access of a kernel group.
struct BlendLayer {
  uint64_t base;         // address of the tensor mapping + the access's base_offset
  int64_t block_stride;  // bytes between blocks
  int64_t kv_stride;     // bytes between the K and V planes
  uint32_t run_begin;    // first run in the plan's run array
  uint32_t run_count;
  uint32_t uniform_run;  // > 0: every run has this many bytes
  uint32_t pad_;
};

struct BlendShape {
  uint32_t row_bytes;
  uint32_t tokens_per_block;
  uint32_t heads;       // turned: K heads of the row; copied: 1
  uint32_t head_bytes;  // copied: row_bytes
  uint32_t pre_bytes;   // copied bytes before the window in each head (copied: row_bytes)
  uint32_t win_bytes;   // window bytes in each head (copied: 0)
  uint32_t copy_vec;    // word of the copied bytes (16, 8, 4, 2 or 1)
  uint32_t copy_units;  // copy words per row
  uint32_t win_word;    // bytes of each of a window unit's two words (16, or the element)
  uint32_t win_units;   // window units per row
  uint32_t y_shift;     // bytes from a unit's x word to its y word
  uint32_t rot;         // floats per token in the delta table (rot_dim); 0: copied
  uint8_t elem;         // KvElem
  uint8_t style;        // RopeStyle
  uint8_t pad_[6];
};

struct BlendJob {
  uint64_t src;    // address of the object plane's row 0
  int64_t cur_st;  // request position of row 0
  uint64_t ids;    // index of the group's block table in the id array
  uint64_t delta;  // index of row 0's deltas in the delta array (turned shapes)
  uint32_t rows;
  uint32_t shape;
  uint32_t layer;  // index into the layer array
  uint32_t kv;     // K/V plane
};

struct BlendPiece {
  uint32_t job;
  uint32_t first_row;
  uint32_t rows;
  uint32_t pad_;
};

// The kernel's arguments: the plan's arrays at the addresses they were uploaded to (the
// host emulator: at the host blob).
struct BlendArgs {
  const BlendPiece* pieces = nullptr;
  const BlendJob* jobs = nullptr;
  const BlendShape* shapes = nullptr;
  const BlendLayer* layers = nullptr;
  const BlendRun* runs = nullptr;
  const int64_t* ids = nullptr;
  const float* delta = nullptr;
  uint32_t num_pieces = 0;
  uint32_t pad_ = 0;
};

// A word of kBytes in registers, moved with one naturally aligned access.
template <uint32_t kBytes>
struct BlendWord {
#if defined(__CUDA_ARCH__)
  using Raw = typename std::conditional<
      kBytes == 16, uint4,
      typename std::conditional<
          kBytes == 8, uint2,
          typename std::conditional<
              kBytes == 4, uint32_t,
              typename std::conditional<kBytes == 2, uint16_t, uint8_t>::type>::type>::type>::type;
  Raw v;
  KVD_BLEND_HD void Load(const uint8_t* p) { v = *reinterpret_cast<const Raw*>(p); }
  KVD_BLEND_HD void Store(uint8_t* p) const { *reinterpret_cast<Raw*>(p) = v; }
#else
  uint8_t v[kBytes];
  void Load(const uint8_t* p) { std::memcpy(v, p, kBytes); }
  void Store(uint8_t* p) const { std::memcpy(p, v, kBytes); }
#endif
};

// Where a row's destination plane starts, for request position `pos`.
struct RowTarget {
  uint64_t plane;  // block-plane start
  int64_t slot;    // token slot inside the block
};

KVD_BLEND_HD RowTarget TargetOf(const BlendArgs& a, const BlendJob& j, const BlendShape& s,
                                const BlendLayer& l, int64_t pos) {
  const TokenSlot ts = SlotOf(pos, s.tokens_per_block, a.ids + j.ids);
  return {
      l.base + static_cast<uint64_t>(PlaneOffset(0, j.kv, l.kv_stride, ts.block, l.block_stride)),
      ts.offset};
}

// Destination address of row byte `b` (a word that lies inside one run).
KVD_BLEND_HD uint8_t* DestOf(const BlendArgs& a, const BlendLayer& l, const RowTarget& t,
                             uint32_t b) {
  uint32_t k;
  if (l.uniform_run > 0) {
    k = b / l.uniform_run;
  } else {
    k = 0;
    while (k + 1 < l.run_count && b >= a.runs[l.run_begin + k + 1].row_prefix) ++k;
  }
  const BlendRun& r = a.runs[l.run_begin + k];
  return reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(
      t.plane + static_cast<uint64_t>(RunOffset(r.offset, r.token_stride, t.slot)) +
      (b - r.row_prefix)));
}

// Row byte of copy word `c` (0 <= c < copy_units).
KVD_BLEND_HD uint32_t CopyWordByte(const BlendShape& s, uint32_t c) {
  const uint32_t per_head = s.copy_units / s.heads;
  const uint32_t h = c / per_head, w = c - h * per_head;
  const uint32_t pre_words = s.pre_bytes / s.copy_vec;
  const uint32_t in_head =
      w < pre_words ? w * s.copy_vec : s.pre_bytes + s.win_bytes + (w - pre_words) * s.copy_vec;
  return h * s.head_bytes + in_head;
}

// The copied bytes of rows [first, first + rows) of a job: words lane, lane + lanes, ...,
// four loaded before any is stored.
template <uint32_t kVec>
KVD_BLEND_HD void CopyUnits(const BlendArgs& a, const BlendJob& j, const BlendShape& s,
                            const BlendLayer& l, uint32_t first, uint32_t rows, uint32_t lane,
                            uint32_t lanes) {
  constexpr uint32_t kUnroll = 4;
  const uint32_t total = rows * s.copy_units;
  for (uint32_t u0 = lane; u0 < total; u0 += kUnroll * lanes) {
    BlendWord<kVec> w[kUnroll];
    uint8_t* dst[kUnroll];
    KVD_BLEND_UNROLL
    for (uint32_t k = 0; k < kUnroll; ++k) {
      const uint32_t u = u0 + k * lanes;
      dst[k] = nullptr;
      if (u < total) {
        const uint32_t r = first + u / s.copy_units;
        const uint32_t b = CopyWordByte(s, u % s.copy_units);
        const RowTarget t = TargetOf(a, j, s, l, j.cur_st + r);
        w[k].Load(reinterpret_cast<const uint8_t*>(
            static_cast<uintptr_t>(j.src + static_cast<uint64_t>(r) * s.row_bytes + b)));
        dst[k] = DestOf(a, l, t, b);
      }
    }
    KVD_BLEND_UNROLL
    for (uint32_t k = 0; k < kUnroll; ++k) {
      if (dst[k] != nullptr) w[k].Store(dst[k]);
    }
  }
}

// The rotary windows of rows [first, first + rows) of a turned job. Unit c of a row: head
// h, unit i of the head; its x word at h*head_bytes + pre + i*step (step: one word for
// NeoX, two for GPT-J), its y word y_shift bytes later. The two words side by side are a
// window of 2*V elements (V = elements per word) holding pairs i*V .. i*V + V-1 of the
// head's window: NeoX, x elements then their y partners; GPT-J, V adjacent pairs.
template <KvElem E, RopeStyle S, uint32_t kW>
KVD_BLEND_HD void WindowUnits(const BlendArgs& a, const BlendJob& j, const BlendShape& s,
                              const BlendLayer& l, uint32_t first, uint32_t rows, uint32_t lane,
                              uint32_t lanes) {
  constexpr uint32_t kEs = static_cast<uint32_t>(KvElemSize(E));
  constexpr uint32_t kV = kW / kEs;  // elements per word
  constexpr uint32_t kStep = S == RopeStyle::kNeox ? kW : 2 * kW;
  const uint32_t per_head = s.win_units / s.heads;
  const uint32_t total = rows * s.win_units;
  const uint32_t half = s.rot / 2;
  for (uint32_t u = lane; u < total; u += lanes) {
    const uint32_t r = first + u / s.win_units;
    const uint32_t c = u % s.win_units;
    const uint32_t h = c / per_head, i = c - h * per_head;
    const uint32_t bx = h * s.head_bytes + s.pre_bytes + i * kStep;
    const uint32_t by = bx + s.y_shift;
    const uint8_t* row = reinterpret_cast<const uint8_t*>(
        static_cast<uintptr_t>(j.src + static_cast<uint64_t>(r) * s.row_bytes));
    BlendWord<kW> wx, wy;
    wx.Load(row + bx);
    wy.Load(row + by);
    uint8_t buf[2 * kW];
    memcpy(buf, &wx, kW);
    memcpy(buf + kW, &wy, kW);
    const float* d = a.delta + j.delta + static_cast<uint64_t>(r) * s.rot + i * kV;
    // Pair p of the unit's window of 2*kV elements, turned as a window of its own (both
    // styles pair elements 0 and 1 of a 2-element window): RotateWindow's arithmetic,
    // unrolled so that the buffer stays in registers.
    KVD_BLEND_UNROLL
    for (uint32_t p = 0; p < kV; ++p) {
      uint8_t pair[2 * kEs];
      const int64_t ex = PairX(S, p, 2 * kV) * kEs, ey = PairY(S, p, 2 * kV) * kEs;
      memcpy(pair, buf + ex, kEs);
      memcpy(pair + kEs, buf + ey, kEs);
      RotateWindow<E, S>(pair, pair, 2, d + p, d + half + p);
      memcpy(buf + ex, pair, kEs);
      memcpy(buf + ey, pair + kEs, kEs);
    }
    memcpy(&wx, buf, kW);
    memcpy(&wy, buf + kW, kW);
    const RowTarget t = TargetOf(a, j, s, l, j.cur_st + r);
    wx.Store(DestOf(a, l, t, bx));
    wy.Store(DestOf(a, l, t, by));
  }
}

KVD_BLEND_HD void CopyPiece(const BlendArgs& a, const BlendJob& j, const BlendShape& s,
                            const BlendLayer& l, uint32_t first, uint32_t rows, uint32_t lane,
                            uint32_t lanes) {
  switch (s.copy_vec) {
    case 16:
      return CopyUnits<16>(a, j, s, l, first, rows, lane, lanes);
    case 8:
      return CopyUnits<8>(a, j, s, l, first, rows, lane, lanes);
    case 4:
      return CopyUnits<4>(a, j, s, l, first, rows, lane, lanes);
    case 2:
      return CopyUnits<2>(a, j, s, l, first, rows, lane, lanes);
    default:
      return CopyUnits<1>(a, j, s, l, first, rows, lane, lanes);
  }
}

template <KvElem E, RopeStyle S>
KVD_BLEND_HD void WindowPieceStyle(const BlendArgs& a, const BlendJob& j, const BlendShape& s,
                                   const BlendLayer& l, uint32_t first, uint32_t rows,
                                   uint32_t lane, uint32_t lanes) {
  constexpr uint32_t kNarrow = static_cast<uint32_t>(KvElemSize(E));
  if (s.win_word == 16) {
    WindowUnits<E, S, 16>(a, j, s, l, first, rows, lane, lanes);
  } else {
    WindowUnits<E, S, kNarrow>(a, j, s, l, first, rows, lane, lanes);
  }
}

template <KvElem E>
KVD_BLEND_HD void WindowPieceElem(const BlendArgs& a, const BlendJob& j, const BlendShape& s,
                                  const BlendLayer& l, uint32_t first, uint32_t rows, uint32_t lane,
                                  uint32_t lanes) {
  if (static_cast<RopeStyle>(s.style) == RopeStyle::kNeox) {
    WindowPieceStyle<E, RopeStyle::kNeox>(a, j, s, l, first, rows, lane, lanes);
  } else {
    WindowPieceStyle<E, RopeStyle::kGptj>(a, j, s, l, first, rows, lane, lanes);
  }
}

KVD_BLEND_HD void WindowPiece(const BlendArgs& a, const BlendJob& j, const BlendShape& s,
                              const BlendLayer& l, uint32_t first, uint32_t rows, uint32_t lane,
                              uint32_t lanes) {
  switch (static_cast<KvElem>(s.elem)) {
    case KvElem::kFloat32:
      return WindowPieceElem<KvElem::kFloat32>(a, j, s, l, first, rows, lane, lanes);
    case KvElem::kBFloat16:
      return WindowPieceElem<KvElem::kBFloat16>(a, j, s, l, first, rows, lane, lanes);
    case KvElem::kFloat16:
      return WindowPieceElem<KvElem::kFloat16>(a, j, s, l, first, rows, lane, lanes);
    case KvElem::kFp8E4m3:
      return WindowPieceElem<KvElem::kFp8E4m3>(a, j, s, l, first, rows, lane, lanes);
    case KvElem::kFp8E5m2:
      return WindowPieceElem<KvElem::kFp8E5m2>(a, j, s, l, first, rows, lane, lanes);
  }
}

// One piece: the body of one CTA's iteration (lane = thread, lanes = threads) and of the
// host emulator (lane 0 of 1).
KVD_BLEND_HD void RunPiece(const BlendArgs& a, uint32_t piece, uint32_t lane, uint32_t lanes) {
  const BlendPiece p = a.pieces[piece];
  const BlendJob j = a.jobs[p.job];
  const BlendShape s = a.shapes[j.shape];
  const BlendLayer l = a.layers[j.layer];
  if (s.copy_units > 0) CopyPiece(a, j, s, l, p.first_row, p.rows, lane, lanes);
  if (s.win_units > 0) WindowPiece(a, j, s, l, p.first_row, p.rows, lane, lanes);
}

}  // namespace kvd::blend::cuda
