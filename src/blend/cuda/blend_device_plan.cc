// BuildBlendDevicePlan, BlendArgsAt, EmulateBlendScatter (blend_device_plan.h).
#include "blend/cuda/blend_device_plan.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <sstream>

namespace kvd::blend::cuda {
namespace {

constexpr uint64_t kMax31 = std::numeric_limits<int32_t>::max();

// Largest power of two <= 16 dividing every value seen.
struct Align {
  uint32_t vec = 16;
  void Add(uint64_t v) {
    while (vec > 1 && v % vec != 0) vec /= 2;
  }
};

template <typename T>
uint64_t Append(std::vector<uint8_t>* blob, const std::vector<T>& items) {
  const uint64_t at = (blob->size() + 15) / 16 * 16;
  blob->resize(at + items.size() * sizeof(T));
  if (!items.empty()) std::memcpy(blob->data() + at, items.data(), items.size() * sizeof(T));
  return at;
}

uint64_t Addr(const void* p) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)); }

}  // namespace

Result<BlendDevicePlan> BuildBlendDevicePlan(const ScatterRequest& req) {
  auto checked = PlanScatter(req);
  if (!checked.ok()) return checked.status();
  BlendDevicePlan plan;
  plan.reason = checked->reason();
  if (!checked->ready()) return plan;
  plan.bytes = checked->bytes();
  const layout::KvLayout& l = *req.layout;

  std::vector<BlendShape> shapes;
  std::vector<BlendLayer> layers;
  std::vector<BlendRun> runs;
  std::vector<int64_t> ids;
  std::vector<uint64_t> list_at;
  for (const auto& list : req.block_ids) {
    list_at.push_back(ids.size());
    ids.insert(ids.end(), list.begin(), list.end());
  }

  // Per kernel group: its layers, a copy shape and (when it turns) a turn shape.
  struct GroupInfo {
    uint32_t layer_begin = 0;
    uint32_t copy_shape = 0;
    int64_t turn_shape = -1;
    const RopeTable* table = nullptr;
    bool split = false;
  };
  std::vector<GroupInfo> info(l.groups.size());
  for (size_t gi = 0; gi < l.groups.size(); ++gi) {
    const layout::KernelGroup& g = l.groups[gi];
    const GroupRope rope = req.rope.empty() ? GroupRope{} : req.rope[gi];
    auto geo = ResolveGroupRope(l, gi, rope);
    if (!geo.ok()) return geo.status();  // PlanScatter accepted it: cannot happen
    if (static_cast<uint64_t>(g.row_bytes) > kMax31 / 2 || g.tokens_per_block <= 0 ||
        static_cast<uint64_t>(g.tokens_per_block) > kMax31) {
      return Status::InvalidArgument("blend device plan: kernel group " + std::to_string(gi) +
                                     "'s rows exceed the CUDA scatter's 2^30-byte limit");
    }
    GroupInfo& gi_info = info[gi];
    gi_info.split = geo->split_kv_accesses;
    gi_info.layer_begin = static_cast<uint32_t>(layers.size());

    // What every address and stride of the group's rows is a multiple of.
    Align a;
    a.Add(g.object_offset);
    a.Add(static_cast<uint64_t>(g.row_bytes));
    for (const auto& m : req.matches) a.Add(Addr(m.object));
    for (const auto& acc : g.layers) {
      BlendLayer bl{};
      bl.base = Addr(req.tensor_bases[acc.tensor_index]) + static_cast<uint64_t>(acc.base_offset);
      bl.block_stride = acc.block_stride;
      bl.kv_stride = acc.kv_stride;
      bl.run_begin = static_cast<uint32_t>(runs.size());
      bl.run_count = static_cast<uint32_t>(acc.row_runs.size());
      a.Add(bl.base);
      a.Add(static_cast<uint64_t>(acc.block_stride));
      a.Add(static_cast<uint64_t>(acc.kv_stride));
      uint64_t prefix = 0;
      uint32_t uniform = acc.row_runs.empty() ? 0 : static_cast<uint32_t>(acc.row_runs[0].length);
      for (const auto& r : acc.row_runs) {
        runs.push_back({r.offset, r.token_stride, static_cast<uint32_t>(r.length),
                        static_cast<uint32_t>(prefix)});
        a.Add(static_cast<uint64_t>(r.offset));
        a.Add(static_cast<uint64_t>(r.token_stride));
        a.Add(static_cast<uint64_t>(r.length));
        a.Add(prefix);
        if (static_cast<uint32_t>(r.length) != uniform) uniform = 0;  // runs tile the row
        prefix += static_cast<uint64_t>(r.length);
      }
      bl.uniform_run = uniform;
      layers.push_back(bl);
    }

    BlendShape copy{};
    copy.row_bytes = static_cast<uint32_t>(g.row_bytes);
    copy.tokens_per_block = static_cast<uint32_t>(g.tokens_per_block);
    copy.heads = 1;
    copy.head_bytes = copy.row_bytes;
    copy.pre_bytes = copy.row_bytes;
    copy.copy_vec = a.vec;
    copy.copy_units = copy.row_bytes / a.vec;
    copy.win_word = 0;
    gi_info.copy_shape = static_cast<uint32_t>(shapes.size());
    shapes.push_back(copy);
    plan.min_copy_vec = std::min(plan.min_copy_vec, copy.copy_vec);

    if (!geo->rotate) continue;
    const KRowGeometry& row = geo->row;
    const uint32_t es = static_cast<uint32_t>(KvElemSize(row.elem));
    BlendShape turn = copy;
    turn.heads = static_cast<uint32_t>(row.num_heads);
    turn.head_bytes = static_cast<uint32_t>(row.head_stride * es);
    turn.pre_bytes = static_cast<uint32_t>(row.rot_offset * es);
    turn.win_bytes = static_cast<uint32_t>(row.rot_dim * es);
    turn.rot = static_cast<uint32_t>(rope.table->rot_dim());
    turn.elem = static_cast<uint8_t>(row.elem);
    turn.style = static_cast<uint8_t>(row.style);
    if (static_cast<int64_t>(turn.heads) * turn.head_bytes != g.row_bytes ||
        turn.rot != static_cast<uint32_t>(row.rot_dim)) {
      return Status::Internal("blend device plan: kernel group " + std::to_string(gi) +
                              "'s rope geometry does not tile its row");
    }
    const uint32_t post = turn.head_bytes - turn.pre_bytes - turn.win_bytes;
    Align c = a;
    c.Add(turn.head_bytes);
    c.Add(turn.pre_bytes);
    c.Add(post);
    turn.copy_vec = c.vec;
    turn.copy_units = turn.heads * ((turn.pre_bytes + post) / c.vec);
    const bool neox = row.style == RopeStyle::kNeox;
    const uint32_t half_bytes = turn.win_bytes / 2;
    Align w = a;
    w.Add(turn.head_bytes);
    w.Add(turn.pre_bytes);
    w.Add(neox ? half_bytes : turn.win_bytes / 2);  // GPT-J: units of two words
    if (w.vec == 16) {
      turn.win_word = 16;
    } else if (w.vec >= es) {
      turn.win_word = es;
    } else {
      return Status::InvalidArgument("blend device plan: kernel group " + std::to_string(gi) +
                                     "'s keys are not aligned to their " + std::to_string(es) +
                                     "-byte elements");
    }
    turn.y_shift = neox ? half_bytes : turn.win_word;
    turn.win_units = turn.heads * (half_bytes / turn.win_word);  // NeoX: x words; GPT-J: word pairs
    gi_info.turn_shape = static_cast<int64_t>(shapes.size());
    gi_info.table = rope.table;
    shapes.push_back(turn);
    plan.min_win_word = std::min(plan.min_win_word, turn.win_word);
  }

  // Jobs, pieces and the deltas of every (match, table) that turns.
  std::vector<BlendJob> jobs;
  std::vector<BlendPiece> pieces;
  std::vector<float> delta;
  for (const BlendMatch& m : req.matches) {
    std::map<const RopeTable*, uint64_t> delta_at;
    for (size_t gi = 0; gi < l.groups.size(); ++gi) {
      const layout::KernelGroup& g = l.groups[gi];
      const GroupInfo& gi_info = info[gi];
      const bool turn = gi_info.turn_shape >= 0 && m.old_st != m.cur_st;
      uint64_t d_at = 0;
      if (turn) {
        auto it = delta_at.find(gi_info.table);
        if (it == delta_at.end()) {
          const int64_t rot = gi_info.table->rot_dim();
          d_at = delta.size();
          delta.resize(delta.size() + static_cast<size_t>(m.n_tokens * rot));
          for (int64_t i = 0; i < m.n_tokens; ++i) {
            float* dc = delta.data() + d_at + i * rot;
            gi_info.table->Delta(m.old_st + i, m.cur_st + i, dc, dc + rot / 2);
          }
          delta_at.emplace(gi_info.table, d_at);
        } else {
          d_at = it->second;
        }
      }
      const int64_t nl = static_cast<int64_t>(g.layers.size());
      const uint32_t rows_per_piece =
          std::max<uint32_t>(1, kBlendPieceBytes / static_cast<uint32_t>(g.row_bytes));
      for (int64_t kv = 0; kv < g.kv_size; ++kv) {
        for (int64_t li = 0; li < nl; ++li) {
          BlendJob j{};
          j.src = Addr(m.object) +
                  ObjectRowOffset(g.object_offset, kv, nl, li, l.chunk_tokens, 0, g.row_bytes);
          j.cur_st = m.cur_st;
          j.ids = list_at[g.engine_group];
          j.rows = static_cast<uint32_t>(m.n_tokens);
          j.layer = gi_info.layer_begin + static_cast<uint32_t>(li);
          j.kv = static_cast<uint32_t>(kv);
          const bool key = IsKeyAccess(g.kv_size, gi_info.split, kv, li, nl);
          if (turn && key) {
            j.shape = static_cast<uint32_t>(gi_info.turn_shape);
            j.delta = d_at;
            ++plan.rotated_jobs;
          } else {
            j.shape = gi_info.copy_shape;
          }
          if (jobs.size() >= std::numeric_limits<uint32_t>::max()) {
            return Status::InvalidArgument("blend device plan: too many jobs");
          }
          const uint32_t ji = static_cast<uint32_t>(jobs.size());
          jobs.push_back(j);
          for (uint32_t r = 0; r < j.rows; r += rows_per_piece) {
            if (pieces.size() >= std::numeric_limits<uint32_t>::max()) {
              return Status::InvalidArgument("blend device plan: too many pieces");
            }
            pieces.push_back({ji, r, std::min(rows_per_piece, j.rows - r), 0});
          }
        }
      }
    }
  }

  plan.num_jobs = static_cast<uint32_t>(jobs.size());
  plan.num_pieces = static_cast<uint32_t>(pieces.size());
  plan.at.pieces = Append(&plan.blob, pieces);
  plan.at.jobs = Append(&plan.blob, jobs);
  plan.at.shapes = Append(&plan.blob, shapes);
  plan.at.layers = Append(&plan.blob, layers);
  plan.at.runs = Append(&plan.blob, runs);
  plan.at.ids = Append(&plan.blob, ids);
  plan.at.delta = Append(&plan.blob, delta);
  plan.blob.resize((plan.blob.size() + 15) / 16 * 16);
  return plan;
}

BlendArgs BlendArgsAt(const BlendDevicePlan& plan, uint64_t base) {
  auto at = [base](uint64_t off) { return static_cast<uintptr_t>(base + off); };
  BlendArgs a;
  a.pieces = reinterpret_cast<const BlendPiece*>(at(plan.at.pieces));
  a.jobs = reinterpret_cast<const BlendJob*>(at(plan.at.jobs));
  a.shapes = reinterpret_cast<const BlendShape*>(at(plan.at.shapes));
  a.layers = reinterpret_cast<const BlendLayer*>(at(plan.at.layers));
  a.runs = reinterpret_cast<const BlendRun*>(at(plan.at.runs));
  a.ids = reinterpret_cast<const int64_t*>(at(plan.at.ids));
  a.delta = reinterpret_cast<const float*>(at(plan.at.delta));
  a.num_pieces = plan.num_pieces;
  return a;
}

void EmulateBlendScatter(const BlendDevicePlan& plan) {
  if (plan.reason != RetrieveReason::kOk || plan.num_pieces == 0) return;
  const BlendArgs a = BlendArgsAt(plan, Addr(plan.blob.data()));
  for (uint32_t p = 0; p < a.num_pieces; ++p) RunPiece(a, p, 0, 1);
}

std::string DescribeBlendPlan(const BlendDevicePlan& plan) {
  std::ostringstream os;
  os << plan.num_jobs << " job(s) (" << plan.rotated_jobs << " turned), " << plan.num_pieces
     << " piece(s), " << plan.bytes << " B, narrowest copy word " << plan.min_copy_vec
     << " B, narrowest window word " << plan.min_win_word << " B, plan blob " << plan.blob.size()
     << " B";
  return os.str();
}

}  // namespace kvd::blend::cuda
