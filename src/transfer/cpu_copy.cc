#include "transfer/cpu_copy.h"

#include <cstring>

namespace kvd::transfer {

Status ValidateBlockIds(const layout::KvLayout& layout,
                        const std::vector<std::vector<int64_t>>& block_ids, int64_t num_chunks) {
  if (block_ids.size() != layout.num_engine_groups) {
    return Status::InvalidArgument("block_ids has " + std::to_string(block_ids.size()) +
                                   " group list(s), the registered layout has " +
                                   std::to_string(layout.num_engine_groups));
  }
  for (const auto& g : layout.groups) {
    const auto& ids = block_ids[g.engine_group];
    int64_t need = num_chunks * (layout.chunk_tokens / g.tokens_per_block);
    if (static_cast<int64_t>(ids.size()) < need) {
      return Status::InvalidArgument("block_ids[" + std::to_string(g.engine_group) + "] has " +
                                     std::to_string(ids.size()) + " ids, " +
                                     std::to_string(num_chunks) + " chunk(s) need " +
                                     std::to_string(need));
    }
    for (int64_t i = 0; i < need; ++i) {
      if (ids[i] < 0 || ids[i] >= g.num_blocks) {
        return Status::InvalidArgument("block id " + std::to_string(ids[i]) + " at position " +
                                       std::to_string(i) + " of group " +
                                       std::to_string(g.engine_group) + " is out of range [0, " +
                                       std::to_string(g.num_blocks) + ")");
      }
    }
  }
  return Status::Ok();
}

namespace {

template <bool kToObject>
void CopyGroup(const layout::KernelGroup& g, int64_t chunk_tokens,
               std::span<uint8_t* const> bases, const std::vector<int64_t>& ids, int64_t chunk,
               uint8_t* object_group, int64_t skip_tokens) {
  const int64_t bpc = chunk_tokens / g.tokens_per_block;
  const int64_t layers = static_cast<int64_t>(g.layers.size());
  for (int64_t kv = 0; kv < g.kv_size; ++kv) {
    for (int64_t l = 0; l < layers; ++l) {
      const auto& acc = g.layers[l];
      uint8_t* tensor = bases[acc.tensor_index] + acc.base_offset + kv * g.kv_stride;
      uint8_t* plane = object_group + ((kv * layers + l) * chunk_tokens) * g.row_bytes;
      for (int64_t b = 0; b < bpc; ++b) {
        uint8_t* block = tensor + ids[chunk * bpc + b] * g.block_stride;
        uint8_t* obj = plane + b * g.tokens_per_block * g.row_bytes;
        int64_t first = 0;
        if constexpr (!kToObject) {
          first = skip_tokens - b * g.tokens_per_block;
          if (first >= g.tokens_per_block) continue;
          if (first < 0) first = 0;
        }
        if (g.block_is_contiguous) {
          int64_t n = (g.tokens_per_block - first) * g.row_bytes;
          if constexpr (kToObject) {
            std::memcpy(obj, block, n);
          } else {
            std::memcpy(block + first * g.row_bytes, obj + first * g.row_bytes, n);
          }
          continue;
        }
        for (int64_t t = first; t < g.tokens_per_block; ++t) {
          uint8_t* row = block + t * g.token_stride;
          uint8_t* orow = obj + t * g.row_bytes;
          for (const auto& run : g.row_runs) {
            if constexpr (kToObject) {
              std::memcpy(orow, row + run.offset, run.length);
            } else {
              std::memcpy(row + run.offset, orow, run.length);
            }
            orow += run.length;
          }
        }
      }
    }
  }
}

}  // namespace

void GatherChunk(const layout::KvLayout& layout, std::span<uint8_t* const> tensor_bases,
                 const std::vector<std::vector<int64_t>>& block_ids, int64_t chunk,
                 uint8_t* object) {
  uint8_t* out = object;
  for (const auto& g : layout.groups) {
    CopyGroup<true>(g, layout.chunk_tokens, tensor_bases, block_ids[g.engine_group], chunk, out, 0);
    out += g.BytesPerChunk(layout.chunk_tokens);
  }
}

void ScatterChunk(const layout::KvLayout& layout, std::span<uint8_t* const> tensor_bases,
                  const std::vector<std::vector<int64_t>>& block_ids, int64_t chunk,
                  const uint8_t* object, int64_t skip_tokens) {
  const uint8_t* in = object;
  for (const auto& g : layout.groups) {
    CopyGroup<false>(g, layout.chunk_tokens, tensor_bases, block_ids[g.engine_group], chunk,
                     const_cast<uint8_t*>(in), skip_tokens);
    in += g.BytesPerChunk(layout.chunk_tokens);
  }
}

}  // namespace kvd::transfer
