// ExecuteScatter: writes a validated ScatterPlan (scatter.h). Allocation-free; every
// address was checked by PlanScatter.
#include "blend/scatter.h"

#include <algorithm>
#include <cstring>

namespace kvd::blend {
namespace {

// One token row from `row` to token slot `slot` of a block plane, run by run.
inline void WriteRow(const std::vector<layout::ByteRun>& runs, uint8_t* plane, int64_t slot,
                     const uint8_t* row) {
  for (const auto& run : runs) {
    std::memcpy(plane + RunOffset(run.offset, run.token_stride, slot), row, run.length);
    row += run.length;
  }
}

// `count` rows (row_bytes apart) to slots first.. of a transposed plane: element r of
// every row goes to column r, E bytes per token. Column by column, so each column's
// writes are adjacent.
template <int64_t E>
void WriteTransposed(const std::vector<layout::ByteRun>& runs, uint8_t* plane, int64_t first,
                     int64_t count, const uint8_t* rows, int64_t row_bytes) {
  const int64_t cols = static_cast<int64_t>(runs.size());
  for (int64_t c = 0; c < cols; ++c) {
    uint8_t* col = plane + runs[c].offset + first * E;
    const uint8_t* src = rows + c * E;
    for (int64_t s = 0; s < count; ++s) std::memcpy(col + s * E, src + s * row_bytes, E);
  }
}

void WriteRows(const layout::TensorAccess& acc, int64_t row_bytes, uint8_t* plane, int64_t first,
               int64_t count, const uint8_t* rows) {
  if (acc.block_is_contiguous) {
    std::memcpy(plane + first * row_bytes, rows, count * row_bytes);
    return;
  }
  switch (acc.transposed_element) {
    case 1:
      return WriteTransposed<1>(acc.row_runs, plane, first, count, rows, row_bytes);
    case 2:
      return WriteTransposed<2>(acc.row_runs, plane, first, count, rows, row_bytes);
    case 4:
      return WriteTransposed<4>(acc.row_runs, plane, first, count, rows, row_bytes);
    case 8:
      return WriteTransposed<8>(acc.row_runs, plane, first, count, rows, row_bytes);
    default:
      break;
  }
  for (int64_t s = 0; s < count; ++s)
    WriteRow(acc.row_runs, plane, first + s, rows + s * row_bytes);
}

struct Target {
  const layout::KernelGroup* g;
  const layout::TensorAccess* acc;
  int64_t kv;
  uint8_t* tensor;     // the tensor mapping's first byte
  const int64_t* ids;  // the group's block table
};

inline uint8_t* PlaneOf(const Target& t, int64_t block) {
  return t.tensor +
         PlaneOffset(t.acc->base_offset, t.kv, t.acc->kv_stride, block, t.acc->block_stride);
}

// Rows [0, n) of an object plane to positions cur_st.., as stored: one write per block
// segment (the tokens of the match that share a destination block).
void CopyRows(const Target& t, const uint8_t* src, int64_t cur_st, int64_t n) {
  const int64_t tpb = t.g->tokens_per_block, row_bytes = t.g->row_bytes;
  for (int64_t i = 0; i < n;) {
    const TokenSlot slot = SlotOf(cur_st + i, tpb, t.ids);
    const int64_t seg = std::min(n - i, tpb - slot.offset);
    WriteRows(*t.acc, row_bytes, PlaneOf(t, slot.block), slot.offset, seg, src + i * row_bytes);
    i += seg;
  }
}

// Rows [0, n) of a K plane, each turned by its token's delta (rot_dim floats per token:
// rot_dim/2 cosines, then sines). Straight into the destination, one batch per block
// segment, when the destination row is one run; else row by row through `scratch`.
void TurnRows(const Target& t, RotateRowsFn rotate, const KRowGeometry& geo, const float* delta,
              int64_t rot, uint8_t* scratch, const uint8_t* src, int64_t cur_st, int64_t n) {
  const int64_t tpb = t.g->tokens_per_block, row_bytes = t.g->row_bytes;
  const auto& runs = t.acc->row_runs;
  const bool direct = runs.size() == 1 && runs[0].length == row_bytes;
  RowBatch b;
  b.src_stride = row_bytes;
  b.delta_stride = rot;
  for (int64_t i = 0; i < n;) {
    const TokenSlot slot = SlotOf(cur_st + i, tpb, t.ids);
    const int64_t seg = direct ? std::min(n - i, tpb - slot.offset) : 1;
    uint8_t* plane = PlaneOf(t, slot.block);
    b.src = src + i * row_bytes;
    b.delta = delta + i * rot;
    b.rows = seg;
    if (direct) {
      b.dst = plane + RunOffset(runs[0].offset, runs[0].token_stride, slot.offset);
      b.dst_stride = runs[0].token_stride;
      rotate(b, geo);
    } else {
      b.dst = scratch;
      rotate(b, geo);
      WriteRows(*t.acc, row_bytes, plane, slot.offset, 1, scratch);
    }
    i += seg;
  }
}

}  // namespace

void ExecuteScatter(ScatterPlan& plan) noexcept {
  if (!plan.ready()) return;
  const layout::KvLayout& l = *plan.layout_;
  float* delta = plan.delta_.data();
  for (const BlendMatch& m : plan.matches_) {
    const RopeTable* computed = nullptr;  // whose deltas `delta` holds for this match
    for (size_t gi = 0; gi < l.groups.size(); ++gi) {
      const layout::KernelGroup& g = l.groups[gi];
      const ScatterPlan::Group& pg = plan.groups_[gi];
      const bool turn = pg.geo.rotate && m.old_st != m.cur_st;
      const int64_t rot = turn ? pg.table->rot_dim() : 0;
      if (turn && pg.table != computed) {
        for (int64_t i = 0; i < m.n_tokens; ++i) {
          float* dc = delta + i * rot;
          pg.table->Delta(m.old_st + i, m.cur_st + i, dc, dc + rot / 2);
        }
        computed = pg.table;
      }
      const int64_t layers = static_cast<int64_t>(g.layers.size());
      for (int64_t kv = 0; kv < g.kv_size; ++kv) {
        for (int64_t li = 0; li < layers; ++li) {
          const layout::TensorAccess& acc = g.layers[li];
          const Target t{&g, &acc, kv, plan.bases_[acc.tensor_index],
                         plan.ids_.data() + pg.ids_begin};
          const uint8_t* src = m.object + ObjectRowOffset(g.object_offset, kv, layers, li,
                                                          l.chunk_tokens, 0, g.row_bytes);
          if (turn && IsKeyAccess(g.kv_size, pg.geo.split_kv_accesses, kv, li, layers)) {
            TurnRows(t, plan.rotate_, pg.geo.row, delta, rot, plan.row_.data(), src, m.cur_st,
                     m.n_tokens);
          } else {
            CopyRows(t, src, m.cur_st, m.n_tokens);
          }
        }
      }
    }
  }
}

}  // namespace kvd::blend
