#include "transfer/cuda/device_plan.h"

#include <algorithm>
#include <limits>
#include <sstream>

namespace kvd::transfer::cuda {
namespace {

constexpr uint64_t kMax32 = std::numeric_limits<int32_t>::max();

// Largest power of two <= 16 dividing every value.
uint32_t CommonVec(std::initializer_list<uint64_t> values, uint32_t vec) {
  for (uint64_t v : values) {
    while (vec > 1 && v % vec != 0) vec /= 2;
  }
  return vec;
}

}  // namespace

Result<DevicePlan> BuildDevicePlan(const layout::KvLayout& layout,
                                   std::span<const uint64_t> mapping_base,
                                   std::span<const uint64_t> mapping_bytes) {
  DevicePlan p;
  if (layout.groups.empty()) return Status::InvalidArgument("device plan: empty layout");
  if (layout.groups.size() > kMaxGroups) {
    return Status::InvalidArgument("the layout has " + std::to_string(layout.groups.size()) +
                                   " kernel groups; the CUDA engine supports " +
                                   std::to_string(kMaxGroups));
  }
  if (layout.chunk_tokens <= 0 || static_cast<uint64_t>(layout.chunk_tokens) > kMax32) {
    return Status::InvalidArgument("device plan: chunk size out of range");
  }
  p.chunk_tokens = static_cast<uint32_t>(layout.chunk_tokens);
  p.object_bytes = layout.object_bytes;
  p.list_offset.assign(layout.num_engine_groups, UINT32_MAX);
  p.list_blocks_per_chunk.assign(layout.num_engine_groups, 0);

  uint64_t ids = 0, tiles = 0;
  for (const auto& g : layout.groups) {
    if (g.engine_group >= layout.num_engine_groups) {
      return Status::InvalidArgument("device plan: group names block list " +
                                     std::to_string(g.engine_group));
    }
    const uint64_t bpc = static_cast<uint64_t>(layout.chunk_tokens / g.tokens_per_block);
    const uint64_t tile_bytes = static_cast<uint64_t>(g.tokens_per_block) * g.row_bytes;
    if (g.row_bytes <= 0 || tile_bytes == 0 || tile_bytes > kMax32 ||
        static_cast<uint64_t>(g.num_blocks) > kMax32 || g.kv_size < 1 || g.kv_size > 2 ||
        g.layers.empty()) {
      return Status::InvalidArgument("kernel group '" + g.form + "' (" +
                                     std::to_string(g.tokens_per_block) + " tokens x " +
                                     std::to_string(g.row_bytes) + " bytes per block, " +
                                     std::to_string(g.num_blocks) +
                                     " blocks) exceeds the CUDA engine's 2^31 limits");
    }
    if (p.list_offset[g.engine_group] == UINT32_MAX) {
      p.list_offset[g.engine_group] = static_cast<uint32_t>(ids);
      p.list_blocks_per_chunk[g.engine_group] = static_cast<uint32_t>(bpc);
      ids += bpc;
    }
    DevGroup d{};
    d.object_offset = g.object_offset;
    d.tokens_per_block = static_cast<uint32_t>(g.tokens_per_block);
    d.row_bytes = static_cast<uint32_t>(g.row_bytes);
    d.kv_size = static_cast<uint32_t>(g.kv_size);
    d.num_layers = static_cast<uint32_t>(g.layers.size());
    d.layer_begin = static_cast<uint32_t>(p.layers.size());
    d.blocks_per_chunk = static_cast<uint32_t>(bpc);
    d.ids_offset = p.list_offset[g.engine_group];
    d.tile_begin = static_cast<uint32_t>(tiles);
    tiles += TilesOfGroup(d);
    if (tiles > kMax32) return Status::InvalidArgument("device plan: too many tiles per chunk");
    p.max_tile_bytes = std::max(p.max_tile_bytes, static_cast<uint32_t>(tile_bytes));

    for (const auto& acc : g.layers) {
      if (acc.tensor_index >= mapping_base.size() || acc.tensor_index >= mapping_bytes.size()) {
        return Status::InvalidArgument("device plan: tensor " + std::to_string(acc.tensor_index) +
                                       " has no mapping");
      }
      if (acc.span_bytes > mapping_bytes[acc.tensor_index] || acc.base_offset < 0) {
        return Status::InvalidArgument(
            "kv_cache[" + std::to_string(acc.tensor_index) + "]: its view needs " +
            std::to_string(acc.span_bytes) + " bytes but its GPU mapping has " +
            std::to_string(mapping_bytes[acc.tensor_index]));
      }
      DevLayer l{};
      l.base = mapping_base[acc.tensor_index] + static_cast<uint64_t>(acc.base_offset);
      l.block_stride = acc.block_stride;
      l.kv_stride = acc.kv_stride;
      l.run_begin = static_cast<uint32_t>(p.runs.size());
      l.run_count = static_cast<uint32_t>(acc.row_runs.size());
      l.contiguous = acc.block_is_contiguous ? 1 : 0;
      uint32_t vec = CommonVec({l.base, static_cast<uint64_t>(l.block_stride),
                                static_cast<uint64_t>(l.kv_stride), static_cast<uint64_t>(g.row_bytes),
                                g.object_offset},
                               16);
      uint64_t prefix = 0;
      uint32_t uniform = acc.row_runs.empty() ? 0 : static_cast<uint32_t>(acc.row_runs[0].length);
      for (const auto& r : acc.row_runs) {
        if (r.length <= 0 || static_cast<uint64_t>(r.length) > kMax32 || r.offset < 0 ||
            r.token_stride < 0) {
          return Status::InvalidArgument("device plan: bad byte run in kv_cache[" +
                                         std::to_string(acc.tensor_index) + "]");
        }
        DevRun d_run{r.offset, r.token_stride, static_cast<uint32_t>(r.length),
                     static_cast<uint32_t>(prefix)};
        vec = CommonVec({static_cast<uint64_t>(r.offset), static_cast<uint64_t>(r.token_stride),
                         static_cast<uint64_t>(r.length), prefix},
                        vec);
        if (static_cast<uint32_t>(r.length) != uniform) uniform = 0;
        prefix += static_cast<uint64_t>(r.length);
        p.runs.push_back(d_run);
      }
      if (prefix != static_cast<uint64_t>(g.row_bytes)) {
        return Status::InvalidArgument("device plan: kv_cache[" + std::to_string(acc.tensor_index) +
                                       "] row runs cover " + std::to_string(prefix) + " of " +
                                       std::to_string(g.row_bytes) + " bytes");
      }
      l.uniform_run = uniform;
      l.vec = vec;
      p.min_vec = std::min(p.min_vec, vec);
      p.layers.push_back(l);
    }
    p.groups.push_back(d);
  }
  if (ids > kMaxIdsPerChunk) {
    return Status::InvalidArgument("one chunk needs " + std::to_string(ids) +
                                   " block ids; the CUDA engine supports up to " +
                                   std::to_string(kMaxIdsPerChunk) +
                                   " (use a smaller --chunk-size or larger blocks)");
  }
  p.ids_per_chunk = static_cast<uint32_t>(ids);
  p.tiles_per_chunk = static_cast<uint32_t>(tiles);
  return p;
}

void PackChunkIds(const DevicePlan& plan, const std::vector<std::vector<int64_t>>& block_ids,
                  int64_t chunk, int32_t* out) {
  for (size_t list = 0; list < plan.list_offset.size(); ++list) {
    if (plan.list_offset[list] == UINT32_MAX) continue;
    const uint32_t bpc = plan.list_blocks_per_chunk[list];
    const int64_t* src = block_ids[list].data() + chunk * bpc;
    for (uint32_t i = 0; i < bpc; ++i) out[plan.list_offset[list] + i] = static_cast<int32_t>(src[i]);
  }
}

void EmulateChunk(const DevicePlan& plan, const int32_t* ids, uint8_t* object, bool to_object,
                  int64_t skip_tokens) {
  const uint32_t ngroups = static_cast<uint32_t>(plan.groups.size());
  for (uint32_t tile = 0; tile < plan.tiles_per_chunk; ++tile) {
    const TileRef t = DecodeTile(plan.groups.data(), ngroups, tile);
    const DevGroup& g = plan.groups[t.group];
    const DevLayer& l = plan.layers[t.layer];
    const uint32_t first = to_object ? 0 : FirstRowAfterSkip(g, t.block, skip_tokens);
    if (first >= g.tokens_per_block) continue;
    auto* plane = reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(
        TileBlockAddress(l, t, ids[g.ids_offset + t.block])));
    uint8_t* obj = object + TileObjectOffset(g, t, plan.chunk_tokens);
    if (to_object) {
      CopyTileWords<true>(l, plan.runs.data(), g.row_bytes, plane, obj, 0, TileEndByte(g), 0, 1);
    } else {
      CopyTileWords<false>(l, plan.runs.data(), g.row_bytes, plane, obj,
                           TileFirstByte(g, first), TileEndByte(g), 0, 1);
    }
  }
}

std::string DescribePlan(const DevicePlan& p) {
  std::ostringstream os;
  os << p.groups.size() << " group(s), " << p.layers.size() << " layer(s), " << p.tiles_per_chunk
     << " tiles and " << p.ids_per_chunk << " block ids per chunk, largest tile "
     << p.max_tile_bytes << " B, narrowest word " << p.min_vec << " B";
  return os.str();
}

}  // namespace kvd::transfer::cuda
