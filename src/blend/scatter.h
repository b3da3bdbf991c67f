// CacheBlend's CPU retrieve: puts stored chunk objects at arbitrary token positions of a
// request's paged KV cache, one token row at a time, turning keys from the position they
// were computed at (old_st) to the one they are reused at (cur_st).
//
// Two steps, so that nothing is written unless everything was checked:
//   PlanScatter   validates the request against the registered layout and the mapped
//                 tensors (block tables, every destination byte, objects, positions,
//                 overlaps, rope geometry) and decides lmcache's outcome against the
//                 allocation (all or nothing; see RetrieveReason in scatter_math.h).
//                 Allocates everything the execution needs.
//   ExecuteScatter writes the plan's rows. No allocation, no lock, no object with a
//                 destructor, so it may run inside transfer::RunCatchingBusErrors (a
//                 client may truncate its shared memory under the copy; the caller then
//                 treats the whole scatter as failed).
//
// Per match, kernel group, K/V plane and layer tensor, each token row of the object goes
// to block_ids[pos / tokens_per_block] at slot pos % tokens_per_block through the
// layout's byte runs (scatter_math.h); K rows are turned when old_st != cur_st and the
// group has a rope (rope_geometry.h), V rows and unrotated groups are copied as stored.
//
// Ownership and threads: the plan keeps pointers to the layout, the tensor mappings, the
// objects and the rope tables named in the request; they must stay valid and mapped until
// ExecuteScatter returns. A plan holds its own scratch, so one plan is executed by one
// thread at a time; distinct plans over disjoint destinations may run concurrently.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "blend/rope_geometry.h"
#include "blend/scatter_math.h"
#include "common/status.h"
#include "layout/layout.h"

namespace kvd::blend {

// One stored chunk to put at request positions [cur_st, cur_st + n_tokens): object row r
// was computed at position old_st + r and lands at cur_st + r.
struct BlendMatch {
  int64_t old_st = 0;
  int64_t cur_st = 0;
  int64_t n_tokens = 0;             // 1 .. chunk_tokens (normally the chunk size)
  const uint8_t* object = nullptr;  // the canonical object of the chunk
  uint64_t object_bytes = 0;        // must be layout.object_bytes
};

struct ScatterRequest {
  const layout::KvLayout* layout = nullptr;
  std::span<uint8_t* const> tensor_bases;           // first mapped byte of each registered tensor
  std::span<const uint64_t> tensor_sizes;           // mapped bytes of each registered tensor
  std::span<const std::vector<int64_t>> block_ids;  // one block table per block-id list
  std::span<const BlendMatch> matches;              // any order; must not overlap in cur positions
  std::span<const GroupRope> rope;                  // one per kernel group; empty: none rotated
  int64_t null_block_id = -1;                       // >= 0: a destination in this block is refused
};

class ScatterPlan {
 public:
  RetrieveReason reason() const { return reason_; }
  bool ready() const { return reason_ == RetrieveReason::kOk; }
  // The fewest request positions any kernel group's block table covers.
  int64_t slot_bound() const { return slot_bound_; }
  // What ExecuteScatter will do: matches, of which turned, and destination bytes.
  size_t num_matches() const { return matches_.size(); }
  size_t num_rotated_matches() const;
  uint64_t bytes() const { return bytes_; }

 private:
  friend Result<ScatterPlan> PlanScatter(const ScatterRequest& req);
  friend void ExecuteScatter(ScatterPlan& plan) noexcept;

  struct Group {
    GroupRopeGeometry geo;
    const RopeTable* table = nullptr;
    size_t ids_begin = 0;  // this group's block table inside ids_
  };
  RetrieveReason reason_ = RetrieveReason::kOk;
  int64_t slot_bound_ = 0;
  uint64_t bytes_ = 0;
  const layout::KvLayout* layout_ = nullptr;
  std::vector<uint8_t*> bases_;
  std::vector<Group> groups_;
  std::vector<int64_t> ids_;         // block tables, back to back
  std::vector<BlendMatch> matches_;  // sorted by cur_st; empty unless ready()
  std::vector<float> delta_;         // scratch: per token, rot_dim/2 cos then sin
  std::vector<uint8_t> row_;         // scratch: one turned row
  RotateRowsFn rotate_ = nullptr;    // the row rotation built for this CPU
};

// Validates and plans. InvalidArgument for a malformed request (layout, tensors, block
// tables, matches, objects, positions, rope) whatever the outcome; the block ids and
// destination bytes the scatter would write are checked when the plan is ready (kOk). A
// plan whose reason() is not kOk writes nothing.
Result<ScatterPlan> PlanScatter(const ScatterRequest& req);

// Writes a ready plan (does nothing otherwise). See the contract above.
void ExecuteScatter(ScatterPlan& plan) noexcept;

}  // namespace kvd::blend
