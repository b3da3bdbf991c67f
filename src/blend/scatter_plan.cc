// PlanScatter: every check of a CacheBlend retrieve, before a byte moves (scatter.h).
#include <algorithm>
#include <limits>
#include <string>

#include "blend/scatter.h"

namespace kvd::blend {
namespace {

// Positions beyond this are refused before any arithmetic on them (no overflow below).
constexpr int64_t kMaxPosition = int64_t{1} << 40;

std::string MatchName(size_t i, const BlendMatch& m) {
  return "match " + std::to_string(i) + " (old_st " + std::to_string(m.old_st) + ", cur_st " +
         std::to_string(m.cur_st) + ", " + std::to_string(m.n_tokens) + " tokens)";
}

// The layout's accesses against the caller's mappings; runs against the row size.
Status CheckTensors(const layout::KvLayout& l, const ScatterRequest& req) {
  for (size_t gi = 0; gi < l.groups.size(); ++gi) {
    const auto& g = l.groups[gi];
    if (g.tokens_per_block <= 0 || l.chunk_tokens % g.tokens_per_block != 0) {
      return Status::InvalidArgument(
          "chunk size " + std::to_string(l.chunk_tokens) + " is not a multiple of kernel group " +
          std::to_string(gi) + "'s " + std::to_string(g.tokens_per_block) + " tokens per block");
    }
    if (g.kv_size != 1 && g.kv_size != 2) {
      return Status::InvalidArgument("kernel group " + std::to_string(gi) + " has kv_size " +
                                     std::to_string(g.kv_size));
    }
    if (g.engine_group >= req.block_ids.size()) {
      return Status::InvalidArgument("kernel group " + std::to_string(gi) + " uses block-id list " +
                                     std::to_string(g.engine_group) + ", the request has " +
                                     std::to_string(req.block_ids.size()));
    }
    for (const auto& acc : g.layers) {
      const size_t ti = acc.tensor_index;
      if (ti >= req.tensor_bases.size() || ti >= req.tensor_sizes.size() ||
          req.tensor_bases[ti] == nullptr) {
        return Status::InvalidArgument("registered tensor " + std::to_string(ti) +
                                       " has no mapping");
      }
      if (acc.span_bytes > req.tensor_sizes[ti]) {
        return Status::InvalidArgument("registered tensor " + std::to_string(ti) +
                                       "'s view needs " + std::to_string(acc.span_bytes) +
                                       " bytes, " + std::to_string(req.tensor_sizes[ti]) +
                                       " are mapped");
      }
      int64_t row = 0;
      for (const auto& run : acc.row_runs) {
        if (run.length <= 0 || run.offset < 0 || run.token_stride < 0) {
          return Status::Internal("layout run of tensor " + std::to_string(ti) + " is malformed");
        }
        row += run.length;
      }
      if (row != g.row_bytes) {
        return Status::Internal("layout runs of tensor " + std::to_string(ti) + " cover " +
                                std::to_string(row) + " bytes of a " + std::to_string(g.row_bytes) +
                                "-byte row");
      }
    }
  }
  return Status::Ok();
}

// The destination blocks of the (sorted) matches in kernel group `g`'s block table: in
// range, not the null block, no block twice; every byte the rows touch inside the mapping.
Status CheckDestinations(const layout::KernelGroup& g, size_t gi, const std::vector<int64_t>& ids,
                         const std::vector<BlendMatch>& matches, const ScatterRequest& req) {
  const int64_t tpb = g.tokens_per_block;
  std::vector<int64_t> used;  // block-table indices, ascending, each once
  for (const auto& m : matches) {
    for (int64_t b = m.cur_st / tpb; b <= (m.cur_st + m.n_tokens - 1) / tpb; ++b) {
      if (used.empty() || used.back() < b) used.push_back(b);
    }
  }
  std::vector<int64_t> blocks;
  blocks.reserve(used.size());
  for (int64_t b : used) {
    const int64_t id = ids[b];
    const std::string where = "block_ids[" + std::to_string(g.engine_group) + "][" +
                              std::to_string(b) + "] = " + std::to_string(id);
    if (id < 0 || id >= g.num_blocks) {
      return Status::InvalidArgument(where + " is outside kernel group " + std::to_string(gi) +
                                     "'s [0, " + std::to_string(g.num_blocks) + ")");
    }
    if (req.null_block_id >= 0 && id == req.null_block_id) {
      return Status::InvalidArgument(where + " is the null block; matched tokens cannot go there");
    }
    blocks.push_back(id);
  }
  std::sort(blocks.begin(), blocks.end());
  for (size_t i = 1; i < blocks.size(); ++i) {
    if (blocks[i] == blocks[i - 1]) {
      return Status::InvalidArgument("block " + std::to_string(blocks[i]) +
                                     " appears twice among "
                                     "the destination blocks of block_ids[" +
                                     std::to_string(g.engine_group) + "]");
    }
  }
  if (blocks.empty()) return Status::Ok();
  const int64_t bmin = blocks.front(), bmax = blocks.back();
  for (const auto& acc : g.layers) {
    int64_t lo = std::numeric_limits<int64_t>::max(), hi = 0;
    for (const auto& run : acc.row_runs) {
      lo = std::min(lo, run.offset);
      hi = std::max(hi, run.offset + (tpb - 1) * run.token_stride + run.length);
    }
    for (int64_t kv = 0; kv < g.kv_size; ++kv) {
      const int64_t first = PlaneOffset(acc.base_offset, kv, acc.kv_stride, bmin, acc.block_stride);
      const int64_t last = PlaneOffset(acc.base_offset, kv, acc.kv_stride, bmax, acc.block_stride);
      if (first + lo < 0 || static_cast<uint64_t>(last + hi) > req.tensor_sizes[acc.tensor_index]) {
        return Status::InvalidArgument("kernel group " + std::to_string(gi) + ": rows of blocks " +
                                       std::to_string(bmin) + ".." + std::to_string(bmax) +
                                       " fall outside registered tensor " +
                                       std::to_string(acc.tensor_index) + "'s mapping");
      }
    }
  }
  return Status::Ok();
}

}  // namespace

size_t ScatterPlan::num_rotated_matches() const {
  size_t n = 0;
  bool any = false;
  for (const auto& g : groups_) any = any || g.geo.rotate;
  if (!any) return 0;
  for (const auto& m : matches_) n += m.old_st != m.cur_st ? 1 : 0;
  return n;
}

Result<ScatterPlan> PlanScatter(const ScatterRequest& req) {
  if (req.layout == nullptr || req.layout->groups.empty() || req.layout->chunk_tokens <= 0) {
    return Status::InvalidArgument("blend scatter: no registered layout");
  }
  const layout::KvLayout& l = *req.layout;
  if (l.block_size_dependent > 0) {
    return Status::InvalidArgument(
        "blend scatter: the registered blocks are not token rows kvd "
        "can address (vLLM CPU kernels of unknown layout)");
  }
  if (req.block_ids.size() != l.num_engine_groups) {
    return Status::InvalidArgument("block_ids has " + std::to_string(req.block_ids.size()) +
                                   " list(s), the registered layout has " +
                                   std::to_string(l.num_engine_groups));
  }
  KVD_RETURN_IF_ERROR(CheckTensors(l, req));
  if (!req.rope.empty() && req.rope.size() != l.groups.size()) {
    return Status::InvalidArgument("rope given for " + std::to_string(req.rope.size()) +
                                   " kernel group(s), the layout has " +
                                   std::to_string(l.groups.size()));
  }

  ScatterPlan plan;
  plan.layout_ = &l;
  plan.rotate_ = HostRotateRows();
  plan.bases_.assign(req.tensor_bases.begin(), req.tensor_bases.end());
  std::vector<size_t> list_begin;
  for (const auto& ids : req.block_ids) {
    list_begin.push_back(plan.ids_.size());
    plan.ids_.insert(plan.ids_.end(), ids.begin(), ids.end());
  }
  plan.slot_bound_ = std::numeric_limits<int64_t>::max();
  int64_t max_rot = 0, max_row = 0;
  for (size_t gi = 0; gi < l.groups.size(); ++gi) {
    const auto& g = l.groups[gi];
    ScatterPlan::Group pg;
    const GroupRope rope = req.rope.empty() ? GroupRope{} : req.rope[gi];
    auto geo = ResolveGroupRope(l, gi, rope);
    if (!geo.ok()) return geo.status();
    pg.geo = std::move(*geo);
    pg.table = pg.geo.rotate ? rope.table : nullptr;
    pg.ids_begin = list_begin[g.engine_group];
    if (pg.geo.rotate) {
      max_rot = std::max(max_rot, pg.table->rot_dim());
      max_row = std::max(max_row, g.row_bytes);
    }
    const int64_t ids = static_cast<int64_t>(req.block_ids[g.engine_group].size());
    plan.slot_bound_ = std::min(plan.slot_bound_, CoveredTokens(ids, g.tokens_per_block));
    plan.groups_.push_back(std::move(pg));
  }

  // The matches on their own: sizes, objects, positions, no overlap.
  std::vector<BlendMatch> sorted(req.matches.begin(), req.matches.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    const auto& m = sorted[i];
    if (m.n_tokens <= 0 || m.n_tokens > l.chunk_tokens) {
      return Status::InvalidArgument(MatchName(i, m) + ": a match covers 1 to " +
                                     std::to_string(l.chunk_tokens) + " tokens");
    }
    if (m.old_st < 0 || m.cur_st < 0 || m.old_st > kMaxPosition || m.cur_st > kMaxPosition) {
      return Status::InvalidArgument(MatchName(i, m) + ": positions must be in [0, 2^40]");
    }
    if (m.object == nullptr || m.object_bytes != l.object_bytes) {
      return Status::InvalidArgument(MatchName(i, m) + ": object of " +
                                     std::to_string(m.object_bytes) + " bytes, the layout's are " +
                                     std::to_string(l.object_bytes));
    }
    if (m.old_st == m.cur_st) continue;
    for (const auto& pg : plan.groups_) {
      if (!pg.geo.rotate) continue;
      const int64_t limit = pg.table->max_positions();
      if (m.old_st + m.n_tokens > limit || m.cur_st + m.n_tokens > limit) {
        return Status::InvalidArgument(MatchName(i, m) + ": positions beyond the rope table's " +
                                       std::to_string(limit));
      }
    }
  }
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const BlendMatch& a, const BlendMatch& b) { return a.cur_st < b.cur_st; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i].cur_st < sorted[i - 1].cur_st + sorted[i - 1].n_tokens) {
      return Status::InvalidArgument(MatchName(i - 1, sorted[i - 1]) + " and " +
                                     MatchName(i, sorted[i]) + " overlap in request positions");
    }
  }

  // All or nothing against the allocation.
  std::vector<int64_t> st, ed;
  for (const auto& m : sorted) {
    st.push_back(m.cur_st);
    ed.push_back(m.cur_st + m.n_tokens);
  }
  plan.reason_ =
      ClassifyAgainstBound(st.data(), ed.data(), static_cast<int64_t>(st.size()), plan.slot_bound_);
  if (!plan.ready()) return plan;

  for (size_t gi = 0; gi < l.groups.size(); ++gi) {
    const auto& g = l.groups[gi];
    KVD_RETURN_IF_ERROR(CheckDestinations(g, gi, req.block_ids[g.engine_group], sorted, req));
  }
  int64_t max_tokens = 0;
  bool turns = false;
  for (const auto& m : sorted) {
    max_tokens = std::max(max_tokens, m.n_tokens);
    turns = turns || m.old_st != m.cur_st;
    for (const auto& g : l.groups) {
      plan.bytes_ += static_cast<uint64_t>(m.n_tokens) * g.kv_size * g.layers.size() * g.row_bytes;
    }
  }
  if (turns && max_rot > 0) {
    plan.delta_.resize(static_cast<size_t>(max_tokens * max_rot));
    plan.row_.resize(static_cast<size_t>(max_row));
  }
  plan.matches_ = std::move(sorted);
  return plan;
}

}  // namespace kvd::blend
