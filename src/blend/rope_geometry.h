// rope_geometry: which rows of a kernel group's stored object are keys, and where the
// rotary windows lie inside them. Turns an engine's rope registration (lmcache 0.5.6's
// cb_register_rope fields: caches, head_size, NeoX/GPT-J, group_to_cache, group_rot,
// group_head_size, kv_quant) into one GroupRope per kernel group of a registered layout,
// and a GroupRope into the KRowGeometry that rope_math.h turns.
//
// Only keys are turned, never values:
//   - two-plane groups (FlashAttention, FlashInfer, kv-first/blocks-first, NHD/HND):
//     plane 0, rows of heads × head_size;
//   - vLLM's CPU cache (VEC kernels: each tensor read twice, K halves then V halves):
//     the first half of the group's layer accesses, rows of heads × head_size;
//   - one-plane groups: packed [K|V] heads (rank 4, last dimension 2 × head_size): the
//     K half of each head; key-only caches (MiniMax-M3's indexer): rows of heads ×
//     head_size; MLA latents: a window with offset > 0 that must close the row.
// Groups of an unknown token layout (vLLM CPU kernels kvd cannot read per token) are
// refused: a per-token write into them would be wrong.
//
// Pure functions; GroupRope holds a non-owning RopeTable pointer that must outlive every
// plan built from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "blend/rope.h"
#include "common/status.h"
#include "layout/layout.h"

namespace kvd::blend {

// Re-RoPE of one kernel group.
struct GroupRope {
  const RopeTable* table = nullptr;  // null: the group's rows are copied, never turned
  int64_t rot_offset = 0;            // window start inside each head (> 0: MLA latent)
  int64_t rot_width = 0;             // window width; must be the table's rot_dim
  int64_t head_size = 0;             // K head size (ignored for an MLA window)
  RopeStyle style = RopeStyle::kNeox;
  KvQuant kv_quant = KvQuant::kNone;  // fp8 flavour of a uint8 K plane
};

// What re-RoPE does to a kernel group, resolved against its layout.
struct GroupRopeGeometry {
  bool rotate = false;             // false: every row copied as stored
  bool split_kv_accesses = false;  // K and V are separate halves of the layer accesses
  KRowGeometry row;                // the K row's windows (when rotate)
  std::string form;                // for logs: "K plane", "packed [K|V] heads", ...
};

// True when the group reads each tensor twice, K halves of every layer then V halves
// (vLLM's CPU cache with VEC kernels; layout.cc builds it so).
bool SplitKvAccesses(const layout::KernelGroup& g);

// Applies the rules above to kernel group `group` of `layout`. Errors name the group.
Result<GroupRopeGeometry> ResolveGroupRope(const layout::KvLayout& layout, size_t group,
                                           const GroupRope& rope);

// The fields of a rope registration (cb_register_rope), as the wire carries them.
struct RopeRegistration {
  std::vector<const RopeTable*> tables;  // one per distinct rope; empty: NoPE
  int64_t head_size = 0;
  bool is_neox_style = true;
  // Per engine group id: index into `tables`, -1 for a rope-less group; empty: every
  // group uses table 0.
  std::vector<int64_t> group_to_cache;
  // Per engine group id: {offset, width}, or {} to skip the group; empty: every group
  // rotates the table's rot_dim at offset 0 (the legacy form).
  std::vector<std::vector<int64_t>> group_rot;
  std::vector<int64_t> group_head_size;  // per engine group id; empty: head_size
  KvQuant kv_quant = KvQuant::kNone;
};

// Checks a registration on its own (indices, windows), as cb_register_rope must before
// it replies. `max_engine_group_id` is the largest engine group id of the registered
// layout (-1: none known).
Status ValidateRopeRegistration(const RopeRegistration& reg, int64_t max_engine_group_id);

// One GroupRope per kernel group of `layout`. `engine_group_ids[i]` is the engine group id
// of the layout's block-id list i (engine_group_infos[i].engine_group_id; empty: i).
// A kernel group is left unrotated (table null) when its engine group maps to -1, has an
// empty window, or there are no tables, and - as lmcache does under a declared window map -
// when its dtype is not a float and no kv_quant names it (`skipped` gets a line for it).
// A window other than the table's rot_dim at offset 0 is taken as the table's rot_dim
// (lmcache rotates rot_dim there whatever the width says); an MLA window must match.
// Every resulting GroupRope is checked with ResolveGroupRope.
Result<std::vector<GroupRope>> GroupRopesFor(const layout::KvLayout& layout,
                                             const std::vector<int64_t>& engine_group_ids,
                                             const RopeRegistration& reg,
                                             std::vector<std::string>* skipped = nullptr);

}  // namespace kvd::blend
