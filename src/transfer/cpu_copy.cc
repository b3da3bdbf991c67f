#include "transfer/cpu_copy.h"

#include "transfer/bus_error_guard.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace kvd::transfer {

Status ValidateBlockIds(const layout::KvLayout& layout,
                        const std::vector<std::vector<int64_t>>& block_ids, int64_t num_chunks) {
  if (block_ids.size() != layout.num_engine_groups) {
    return Status::InvalidArgument("block_ids has " + std::to_string(block_ids.size()) +
                                   " group list(s), the registered layout has " +
                                   std::to_string(layout.num_engine_groups));
  }
  if (num_chunks < 0) {
    return Status::InvalidArgument("negative chunk count " + std::to_string(num_chunks));
  }
  for (const auto& g : layout.groups) {
    const auto& ids = block_ids[g.engine_group];
    int64_t need = num_chunks * (layout.chunk_tokens / g.tokens_per_block);
    if (static_cast<int64_t>(ids.size()) < need) {
      return Status::InvalidArgument("block_ids[" + std::to_string(g.engine_group) + "] has " +
                                     std::to_string(ids.size()) + " ids, " +
                                     std::to_string(num_chunks) + " chunk(s) of " +
                                     std::to_string(layout.chunk_tokens) + " tokens at " +
                                     std::to_string(g.tokens_per_block) +
                                     " tokens per block need " + std::to_string(need));
    }
    for (int64_t i = 0; i < need; ++i) {
      if (ids[i] < 0 || ids[i] >= g.num_blocks) {
        return Status::InvalidArgument("block id " + std::to_string(ids[i]) + " at position " +
                                       std::to_string(i) + " of block_ids[" +
                                       std::to_string(g.engine_group) + "] is out of range [0, " +
                                       std::to_string(g.num_blocks) + ")");
      }
    }
  }
  return Status::Ok();
}

namespace {

// ---- Transposed planes (TensorAccess::transposed_element) ------------------------------
// In the block, element r of token t is at col[r] + t*E (a column per row element); in
// the object it is at row t, element r. Tiles of kTileTokens tokens are moved column
// group by column group (kLanes columns at once): each column's tokens of a tile are one
// cache line or less, and the tile's object rows stay in cache while they fill.

constexpr int64_t kTileTokens = 32;

template <int64_t E>
inline void CopyElement(uint8_t* dst, const uint8_t* src) {
  std::memcpy(dst, src, E);
}

#if defined(__SSE2__)
// In-place transposes of a square held in registers: on entry r[i] holds element 0.. of
// line i, on exit r[j] holds element j of every line. 8 × 8 16-bit elements:
inline void Transpose8x16(__m128i r[8]) {
  const __m128i a0 = _mm_unpacklo_epi16(r[0], r[1]), a1 = _mm_unpackhi_epi16(r[0], r[1]);
  const __m128i a2 = _mm_unpacklo_epi16(r[2], r[3]), a3 = _mm_unpackhi_epi16(r[2], r[3]);
  const __m128i a4 = _mm_unpacklo_epi16(r[4], r[5]), a5 = _mm_unpackhi_epi16(r[4], r[5]);
  const __m128i a6 = _mm_unpacklo_epi16(r[6], r[7]), a7 = _mm_unpackhi_epi16(r[6], r[7]);
  const __m128i b0 = _mm_unpacklo_epi32(a0, a2), b1 = _mm_unpackhi_epi32(a0, a2);
  const __m128i b2 = _mm_unpacklo_epi32(a1, a3), b3 = _mm_unpackhi_epi32(a1, a3);
  const __m128i b4 = _mm_unpacklo_epi32(a4, a6), b5 = _mm_unpackhi_epi32(a4, a6);
  const __m128i b6 = _mm_unpacklo_epi32(a5, a7), b7 = _mm_unpackhi_epi32(a5, a7);
  r[0] = _mm_unpacklo_epi64(b0, b4);
  r[1] = _mm_unpackhi_epi64(b0, b4);
  r[2] = _mm_unpacklo_epi64(b1, b5);
  r[3] = _mm_unpackhi_epi64(b1, b5);
  r[4] = _mm_unpacklo_epi64(b2, b6);
  r[5] = _mm_unpackhi_epi64(b2, b6);
  r[6] = _mm_unpacklo_epi64(b3, b7);
  r[7] = _mm_unpackhi_epi64(b3, b7);
}

// 4 × 4 32-bit elements:
inline void Transpose4x32(__m128i r[4]) {
  const __m128i a0 = _mm_unpacklo_epi32(r[0], r[1]), a1 = _mm_unpackhi_epi32(r[0], r[1]);
  const __m128i a2 = _mm_unpacklo_epi32(r[2], r[3]), a3 = _mm_unpackhi_epi32(r[2], r[3]);
  r[0] = _mm_unpacklo_epi64(a0, a2);
  r[1] = _mm_unpackhi_epi64(a0, a2);
  r[2] = _mm_unpacklo_epi64(a1, a3);
  r[3] = _mm_unpackhi_epi64(a1, a3);
}

// One square of kLanes columns × kLanes tokens starting at token t. Gather: load each
// column's tokens, store each token's row piece; scatter: the reverse.
template <bool kToObject, int64_t E>
inline void CopySquare(uint8_t* const* col, int64_t t, uint8_t* orow, int64_t row_bytes) {
  constexpr int kLanes = 16 / E;
  __m128i r[kLanes];
  for (int i = 0; i < kLanes; ++i) {
    const uint8_t* p = kToObject ? col[i] + t * E : orow + i * row_bytes;
    r[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  }
  if constexpr (E == 2) {
    Transpose8x16(r);
  } else {
    Transpose4x32(r);
  }
  for (int j = 0; j < kLanes; ++j) {
    uint8_t* p = kToObject ? orow + j * row_bytes : col[j] + t * E;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), r[j]);
  }
}
constexpr bool kHasSquares = true;
#else
template <bool kToObject, int64_t E>
inline void CopySquare(uint8_t* const*, int64_t, uint8_t*, int64_t) {}
constexpr bool kHasSquares = false;
#endif

// Tokens [first, tpb) of one block's transposed plane ↔ the object's rows of that block.
template <bool kToObject, int64_t E>
void CopyTransposedBlock(const std::vector<layout::ByteRun>& runs, uint8_t* block, uint8_t* obj,
                         int64_t row_bytes, int64_t first, int64_t tpb) {
  constexpr int64_t kLanes = (E == 2 || E == 4) && kHasSquares ? 16 / E : 1;
  const int64_t ncols = static_cast<int64_t>(runs.size());
  for (int64_t t0 = first; t0 < tpb; t0 += kTileTokens) {
    const int64_t t1 = std::min(tpb, t0 + kTileTokens);
    for (int64_t c0 = 0; c0 < ncols; c0 += kLanes) {
      const int64_t lanes = std::min(kLanes, ncols - c0);
      uint8_t* col[kLanes];
      for (int64_t i = 0; i < lanes; ++i) col[i] = block + runs[c0 + i].offset;
      int64_t t = t0;
      if constexpr (kLanes > 1) {
        if (lanes == kLanes) {
          for (; t + kLanes <= t1; t += kLanes) {
            CopySquare<kToObject, E>(col, t, obj + t * row_bytes + c0 * E, row_bytes);
          }
        }
      }
      for (; t < t1; ++t) {
        uint8_t* orow = obj + t * row_bytes + c0 * E;
        for (int64_t i = 0; i < lanes; ++i) {
          if constexpr (kToObject) {
            CopyElement<E>(orow + i * E, col[i] + t * E);
          } else {
            CopyElement<E>(col[i] + t * E, orow + i * E);
          }
        }
      }
    }
  }
}

template <bool kToObject>
void CopyTransposed(const layout::TensorAccess& acc, uint8_t* block, uint8_t* obj,
                    int64_t row_bytes, int64_t first, int64_t tpb) {
  switch (acc.transposed_element) {
    case 1:
      return CopyTransposedBlock<kToObject, 1>(acc.row_runs, block, obj, row_bytes, first, tpb);
    case 2:
      return CopyTransposedBlock<kToObject, 2>(acc.row_runs, block, obj, row_bytes, first, tpb);
    case 4:
      return CopyTransposedBlock<kToObject, 4>(acc.row_runs, block, obj, row_bytes, first, tpb);
    default:
      return CopyTransposedBlock<kToObject, 8>(acc.row_runs, block, obj, row_bytes, first, tpb);
  }
}

// Copies one (K or V) plane of one layer for one chunk: the chunk's blocks of that
// tensor ↔ the object's [chunk_tokens][hidden] plane.
template <bool kToObject>
void CopyPlane(const layout::KernelGroup& g, const layout::TensorAccess& acc, int64_t kv,
               int64_t chunk_tokens, uint8_t* base, const int64_t* ids, uint8_t* plane,
               int64_t skip_tokens) {
  const int64_t bpc = chunk_tokens / g.tokens_per_block;
  const int64_t tpb = g.tokens_per_block;
  uint8_t* tensor = base + acc.base_offset + kv * acc.kv_stride;
  for (int64_t b = 0; b < bpc; ++b) {
    uint8_t* block = tensor + ids[b] * acc.block_stride;
    uint8_t* obj = plane + b * tpb * g.row_bytes;
    int64_t first = 0;
    if constexpr (!kToObject) {
      first = skip_tokens - b * tpb;
      if (first >= tpb) continue;
      if (first < 0) first = 0;
    }
    if (acc.block_is_contiguous) {
      const int64_t n = (tpb - first) * g.row_bytes;
      if constexpr (kToObject) {
        std::memcpy(obj, block, n);
      } else {
        std::memcpy(block + first * g.row_bytes, obj + first * g.row_bytes, n);
      }
      continue;
    }
    if (acc.transposed_element > 0) {
      CopyTransposed<kToObject>(acc, block, obj, g.row_bytes, first, tpb);
      continue;
    }
    for (int64_t t = first; t < tpb; ++t) {
      uint8_t* orow = obj + t * g.row_bytes;
      for (const auto& run : acc.row_runs) {
        uint8_t* p = block + run.offset + t * run.token_stride;
        if constexpr (kToObject) {
          std::memcpy(orow, p, run.length);
        } else {
          std::memcpy(p, orow, run.length);
        }
        orow += run.length;
      }
    }
  }
}

// One unit of work: one plane of one layer of one group of one task.
struct WorkItem {
  size_t task;
  size_t group;
  int64_t kv;
  size_t layer;
};

template <bool kToObject>
void RunItem(const layout::KvLayout& layout, std::span<uint8_t* const> bases,
             const std::vector<std::vector<int64_t>>& block_ids, const ChunkTask& task,
             size_t gi, int64_t kv, size_t li) {
  const auto& g = layout.groups[gi];
  const auto& acc = g.layers[li];
  const int64_t layers = static_cast<int64_t>(g.layers.size());
  const int64_t bpc = layout.chunk_tokens / g.tokens_per_block;
  uint8_t* plane = task.object + g.object_offset +
                   static_cast<uint64_t>((kv * layers + static_cast<int64_t>(li)) *
                                         layout.chunk_tokens * g.row_bytes);
  const int64_t* ids = block_ids[g.engine_group].data() + task.chunk * bpc;
  CopyPlane<kToObject>(g, acc, kv, layout.chunk_tokens, bases[acc.tensor_index], ids, plane,
                       task.skip_tokens);
}

// Every copy runs under the bus-error guard: a mapping whose file shrank under it (a client
// truncating its segment) or a tmpfs page that cannot be allocated ends the copy with
// `false` instead of a SIGBUS. Between a guard and the memcpy calls there is no object with
// a destructor (see bus_error_guard.h).
template <bool kToObject>
bool RunTasks(const layout::KvLayout& layout, std::span<uint8_t* const> bases,
              const std::vector<std::vector<int64_t>>& block_ids,
              std::span<const ChunkTask> tasks, int threads) {
  if (threads <= 1 || tasks.empty()) {
    auto all = [&] {
      for (const auto& task : tasks) {
        if (!kToObject && task.skip_tokens >= layout.chunk_tokens) continue;
        for (size_t gi = 0; gi < layout.groups.size(); ++gi) {
          const auto& g = layout.groups[gi];
          for (int64_t kv = 0; kv < g.kv_size; ++kv) {
            for (size_t li = 0; li < g.layers.size(); ++li) {
              RunItem<kToObject>(layout, bases, block_ids, task, gi, kv, li);
            }
          }
        }
      }
    };
    return RunCatchingBusErrors(all);
  }
  std::vector<WorkItem> items;
  for (size_t ti = 0; ti < tasks.size(); ++ti) {
    if (!kToObject && tasks[ti].skip_tokens >= layout.chunk_tokens) continue;
    for (size_t gi = 0; gi < layout.groups.size(); ++gi) {
      const auto& g = layout.groups[gi];
      for (int64_t kv = 0; kv < g.kv_size; ++kv) {
        for (size_t li = 0; li < g.layers.size(); ++li) items.push_back({ti, gi, kv, li});
      }
    }
  }
  std::atomic<size_t> next{0};
  std::atomic<bool> faulted{false};
  auto items_loop = [&] {
    for (size_t i = next.fetch_add(1, std::memory_order_relaxed);
         i < items.size() && !faulted.load(std::memory_order_relaxed);
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      const auto& w = items[i];
      RunItem<kToObject>(layout, bases, block_ids, tasks[w.task], w.group, w.kv, w.layer);
    }
  };
  auto worker = [&] {
    if (!RunCatchingBusErrors(items_loop)) faulted.store(true, std::memory_order_relaxed);
  };
  const size_t n = std::min<size_t>(static_cast<size_t>(threads), items.size());
  std::vector<std::thread> pool;
  pool.reserve(n > 0 ? n - 1 : 0);
  for (size_t t = 1; t < n; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  return !faulted.load();
}

}  // namespace

bool GatherChunk(const layout::KvLayout& layout, std::span<uint8_t* const> tensor_bases,
                 const std::vector<std::vector<int64_t>>& block_ids, int64_t chunk,
                 uint8_t* object) {
  const ChunkTask task{chunk, object, 0};
  return RunTasks<true>(layout, tensor_bases, block_ids, std::span<const ChunkTask>(&task, 1), 1);
}

bool ScatterChunk(const layout::KvLayout& layout, std::span<uint8_t* const> tensor_bases,
                  const std::vector<std::vector<int64_t>>& block_ids, int64_t chunk,
                  const uint8_t* object, int64_t skip_tokens) {
  // The object is only read on this path.
  const ChunkTask task{chunk, const_cast<uint8_t*>(object), skip_tokens};
  return RunTasks<false>(layout, tensor_bases, block_ids, std::span<const ChunkTask>(&task, 1), 1);
}

bool GatherChunks(const layout::KvLayout& layout, std::span<uint8_t* const> tensor_bases,
                  const std::vector<std::vector<int64_t>>& block_ids,
                  std::span<const ChunkTask> tasks, int threads) {
  return RunTasks<true>(layout, tensor_bases, block_ids, tasks, threads);
}

bool ScatterChunks(const layout::KvLayout& layout, std::span<uint8_t* const> tensor_bases,
                   const std::vector<std::vector<int64_t>>& block_ids,
                   std::span<const ChunkTask> tasks, int threads) {
  return RunTasks<false>(layout, tensor_bases, block_ids, tasks, threads);
}

}  // namespace kvd::transfer
