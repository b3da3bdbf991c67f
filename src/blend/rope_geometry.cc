#include "blend/rope_geometry.h"

#include <algorithm>

namespace kvd::blend {
namespace {

std::string GroupName(const layout::KvLayout& layout, size_t group) {
  const auto& g = layout.groups[group];
  return "kernel group " + std::to_string(group) + " (" + g.dtype + ", " + g.form + ", hidden " +
         std::to_string(g.hidden_elems) + ")";
}

bool IsFloatDtype(const std::string& d) {
  return d == "float32" || d == "float" || d == "bfloat16" || d == "float16" || d == "half" ||
         d == "float8_e4m3fn" || d == "float8_e5m2";
}

}  // namespace

bool SplitKvAccesses(const layout::KernelGroup& g) {
  const size_t n = g.layers.size();
  if (g.kv_size != 1 || n < 2 || n % 2 != 0) return false;
  for (size_t i = 0; i < n / 2; ++i) {
    if (g.layers[i].tensor_index != g.layers[i + n / 2].tensor_index) return false;
  }
  return true;
}

Result<GroupRopeGeometry> ResolveGroupRope(const layout::KvLayout& layout, size_t group,
                                           const GroupRope& rope) {
  if (group >= layout.groups.size()) {
    return Status::InvalidArgument("re-RoPE: kernel group " + std::to_string(group) +
                                   " does not exist (layout has " +
                                   std::to_string(layout.groups.size()) + ")");
  }
  const auto& g = layout.groups[group];
  GroupRopeGeometry out;
  out.split_kv_accesses = SplitKvAccesses(g);
  if (rope.table == nullptr) {
    out.form = "not rotated";
    return out;
  }
  const std::string name = GroupName(layout, group);
  if (layout.block_size_dependent > 0) {
    return Status::InvalidArgument(name +
                                   ": its blocks are not token rows kvd can address "
                                   "(vLLM CPU kernels of unknown layout); no per-token re-RoPE");
  }
  auto elem = RopeElemFor(g.dtype, rope.kv_quant);
  if (!elem.ok()) return Status::InvalidArgument(name + ": " + elem.status().message());
  if (KvElemSize(*elem) != g.itemsize) {
    return Status::InvalidArgument(name + ": element of " + std::to_string(g.itemsize) +
                                   " bytes cannot hold " + KvElemName(*elem));
  }
  const int64_t rot = rope.table->rot_dim();
  if (rope.rot_offset < 0 || rope.rot_width != rot) {
    return Status::InvalidArgument(name + ": rope window (" + std::to_string(rope.rot_offset) +
                                   ", " + std::to_string(rope.rot_width) +
                                   ") must have offset >= 0 and the table's width " +
                                   std::to_string(rot));
  }
  const int64_t hidden = g.hidden_elems;
  KRowGeometry row;
  row.elem = *elem;
  row.style = rope.style;
  row.rot_dim = rot;
  if (rope.rot_offset > 0) {  // MLA latent: [content | rope], one "head" per row
    if (g.kv_size != 1 || out.split_kv_accesses) {
      return Status::InvalidArgument(name + ": an MLA rope window (offset " +
                                     std::to_string(rope.rot_offset) +
                                     ") needs a single-plane latent");
    }
    if (rope.rot_offset + rot != hidden) {
      return Status::InvalidArgument(name + ": MLA rope window (" +
                                     std::to_string(rope.rot_offset) + ", " + std::to_string(rot) +
                                     ") does not close the row of " + std::to_string(hidden) +
                                     " elements");
    }
    row.num_heads = 1;
    row.head_stride = hidden;
    row.rot_offset = rope.rot_offset;
    out.form = "MLA latent, rope window closing the row";
  } else {
    if (rope.head_size <= 0) {
      return Status::InvalidArgument(name + ": head_size " + std::to_string(rope.head_size) +
                                     " is not positive");
    }
    const bool packed = g.kv_size == 1 && !out.split_kv_accesses && g.shape.size() == 4 &&
                        g.shape.back() == 2 * rope.head_size;
    const int64_t per_head = packed ? 2 * rope.head_size : rope.head_size;
    if (hidden % per_head != 0) {
      return Status::InvalidArgument(name + ": hidden " + std::to_string(hidden) +
                                     " is not a multiple of the per-head width " +
                                     std::to_string(per_head) + (packed ? " (packed [K|V])" : ""));
    }
    if (rot > rope.head_size) {
      return Status::InvalidArgument(name + ": rot_dim " + std::to_string(rot) +
                                     " exceeds head_size " + std::to_string(rope.head_size));
    }
    row.num_heads = hidden / per_head;
    row.head_stride = per_head;
    row.rot_offset = 0;
    out.form = packed                  ? "packed [K|V] heads, K half"
               : g.kv_size == 2        ? "K plane"
               : out.split_kv_accesses ? "vLLM CPU K halves"
                                       : "key-only rows";
  }
  KVD_RETURN_IF_ERROR(ValidateGeometry(row, hidden));
  out.rotate = true;
  out.row = row;
  return out;
}

Status ValidateRopeRegistration(const RopeRegistration& reg, int64_t max_engine_group_id) {
  const int64_t ntables = static_cast<int64_t>(reg.tables.size());
  for (size_t i = 0; i < reg.tables.size(); ++i) {
    if (reg.tables[i] == nullptr) {
      return Status::InvalidArgument("rope registration: table " + std::to_string(i) + " is null");
    }
  }
  if (!reg.group_to_cache.empty()) {
    for (size_t i = 0; i < reg.group_to_cache.size(); ++i) {
      const int64_t c = reg.group_to_cache[i];
      if (c < -1 || c >= ntables) {
        return Status::InvalidArgument("group_to_cache[" + std::to_string(i) +
                                       "] = " + std::to_string(c) + " is outside [-1, " +
                                       std::to_string(ntables) + ")");
      }
    }
    if (static_cast<int64_t>(reg.group_to_cache.size()) <= max_engine_group_id) {
      return Status::InvalidArgument(
          "group_to_cache covers " + std::to_string(reg.group_to_cache.size()) +
          " engine group(s), the registered model has engine groups up to id " +
          std::to_string(max_engine_group_id));
    }
  }
  for (size_t i = 0; i < reg.group_rot.size(); ++i) {
    const auto& w = reg.group_rot[i];
    if (w.empty()) continue;
    if (w.size() != 2 || w[0] < 0 || w[1] <= 0) {
      return Status::InvalidArgument("group_rot[" + std::to_string(i) +
                                     "]: expected [offset >= 0, width > 0] or []");
    }
  }
  if (reg.head_size < 0) return Status::InvalidArgument("head_size is negative");
  for (size_t i = 0; i < reg.group_head_size.size(); ++i) {
    if (reg.group_head_size[i] <= 0) {
      return Status::InvalidArgument("group_head_size[" + std::to_string(i) + "] is not positive");
    }
  }
  return Status::Ok();
}

Result<std::vector<GroupRope>> GroupRopesFor(const layout::KvLayout& layout,
                                             const std::vector<int64_t>& engine_group_ids,
                                             const RopeRegistration& reg,
                                             std::vector<std::string>* skipped) {
  if (!engine_group_ids.empty() && engine_group_ids.size() != layout.num_engine_groups) {
    return Status::InvalidArgument("rope registration: " + std::to_string(engine_group_ids.size()) +
                                   " engine group id(s) for " +
                                   std::to_string(layout.num_engine_groups) + " block-id list(s)");
  }
  int64_t max_id = -1;
  for (size_t i = 0; i < layout.num_engine_groups; ++i) {
    const int64_t id = engine_group_ids.empty() ? static_cast<int64_t>(i) : engine_group_ids[i];
    if (id < 0) return Status::InvalidArgument("negative engine group id " + std::to_string(id));
    max_id = std::max(max_id, id);
  }
  KVD_RETURN_IF_ERROR(ValidateRopeRegistration(reg, max_id));
  std::vector<GroupRope> out(layout.groups.size());
  for (size_t gi = 0; gi < layout.groups.size(); ++gi) {
    const auto& g = layout.groups[gi];
    const int64_t eg = engine_group_ids.empty() ? static_cast<int64_t>(g.engine_group)
                                                : engine_group_ids[g.engine_group];
    GroupRope& r = out[gi];
    if (reg.tables.empty()) continue;  // NoPE
    int64_t cache = 0;
    if (!reg.group_to_cache.empty()) cache = reg.group_to_cache[eg];
    if (cache < 0) continue;  // rope-less engine group
    int64_t offset = 0;
    int64_t width = reg.tables[cache]->rot_dim();
    if (!reg.group_rot.empty()) {
      if (eg >= static_cast<int64_t>(reg.group_rot.size())) {
        return Status::InvalidArgument("group_rot covers " + std::to_string(reg.group_rot.size()) +
                                       " engine group(s); engine group " + std::to_string(eg) +
                                       " has no window");
      }
      const auto& w = reg.group_rot[eg];
      if (w.empty()) continue;  // declared: skip this group
      offset = w[0];
      if (offset > 0) width = w[1];  // MLA: the declared width must be the table's
      if (!IsFloatDtype(g.dtype) && reg.kv_quant == KvQuant::kNone) {
        if (skipped) {
          skipped->push_back("kernel group " + std::to_string(gi) + " (" + g.dtype +
                             "): not a float dtype and no kv_quant; its keys are copied as stored");
        }
        continue;
      }
    }
    r.table = reg.tables[cache];
    r.rot_offset = offset;
    r.rot_width = width;
    r.head_size =
        !reg.group_head_size.empty() && eg < static_cast<int64_t>(reg.group_head_size.size())
            ? reg.group_head_size[eg]
            : reg.head_size;
    r.style = reg.is_neox_style ? RopeStyle::kNeox : RopeStyle::kGptj;
    r.kv_quant = reg.kv_quant;
    auto geo = ResolveGroupRope(layout, gi, r);
    if (!geo.ok()) {
      // Under a declared window map lmcache never turns non-float groups; kvd turns the
      // fp8 ones it can read and leaves the others (e.g. DeepSeek's fp8_ds_mla page, whose
      // rope part is bf16 inside uint8 rows) as stored.
      if (reg.group_rot.empty() || IsFloatDtype(g.dtype)) return geo.status();
      if (skipped) skipped->push_back(geo.status().message() + "; its keys are copied as stored");
      r = GroupRope{};
    }
  }
  return out;
}

}  // namespace kvd::blend
