// The index math of the CUDA gather/scatter kernels, shared verbatim by the device code
// (copy_kernels.cu) and the host emulator (device_plan.cc, unit-tested against
// cpu_copy.cc for every layout). Header-only, no CUDA headers: KVD_HD marks functions
// __host__ __device__ under nvcc and plain inline elsewhere.
//
// Work decomposition. One chunk = a set of *tiles*; a tile is one (kernel group, K/V
// plane, layer, block of the chunk): `tokens_per_block` token rows of `row_bytes`. On the
// object side a tile is contiguous (the group's [kv][layer][token][hidden] plane, rows
// b*tpb .. b*tpb+tpb-1); on the tensor side its rows follow the layer's runs and strides
// from the block's plane start. A tile is copied in words of `vec` bytes (16, 8, 4, 2 or
// 1): `vec` divides every address, stride, run offset and run length of the layer, so no
// word straddles a run and every access is naturally aligned.
//
// All plan values are validated on the host (BuildDevicePlan) before a kernel sees them:
// tile byte counts fit in 32 bits, block ids are in range, every access stays inside the
// tensor's registered view.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__CUDACC__)
#define KVD_HD __host__ __device__ __forceinline__
#define KVD_UNROLL _Pragma("unroll")
#else
#define KVD_HD inline
#define KVD_UNROLL
#endif

namespace kvd::transfer::cuda {

// Limits baked into the kernel parameters (kept under the classic 4 KiB parameter space).
inline constexpr uint32_t kMaxIdsPerChunk = 896;  // block ids one chunk may need, all lists
inline constexpr uint32_t kMaxGroups = 16;        // kernel groups per layout

// One byte run of a token row (see layout::ByteRun), plus where it sits in the row.
struct DevRun {
  int64_t offset;        // from the block-plane start to token 0's run
  int64_t token_stride;  // between consecutive tokens' runs
  uint32_t length;       // bytes
  uint32_t row_prefix;   // bytes of the row before this run
};

// One layer (tensor) of a kernel group.
struct DevLayer {
  uint64_t base;         // device address of the tensor's element 0
  int64_t block_stride;  // bytes between blocks
  int64_t kv_stride;     // bytes between the K and V planes
  uint32_t run_begin;    // index of its first run in the plan's run array
  uint32_t run_count;
  uint32_t contiguous;   // 1: the tile is one run of tpb*row_bytes bytes at the plane start
  uint32_t vec;          // word size for this layer's tiles (power of two <= 16)
  uint32_t uniform_run;  // > 0: every run has this many bytes (run k = row byte / uniform_run)
  uint32_t pad_;
};

struct DevGroup {
  uint64_t object_offset;     // bytes from the object start to this group
  uint32_t tokens_per_block;
  uint32_t row_bytes;
  uint32_t kv_size;
  uint32_t num_layers;
  uint32_t layer_begin;       // index of its first layer in the plan's layer array
  uint32_t blocks_per_chunk;
  uint32_t ids_offset;        // where its block-id list starts in a chunk's packed ids
  uint32_t tile_begin;        // first tile index of this group within a chunk
};

// The decoded coordinates of one tile of a chunk.
struct TileRef {
  uint32_t group;
  uint32_t layer;   // index into the plan's layer array
  uint32_t kv;
  uint32_t block;   // block of the chunk, 0 .. blocks_per_chunk-1
};

KVD_HD uint32_t TilesOfGroup(const DevGroup& g) {
  return g.kv_size * g.num_layers * g.blocks_per_chunk;
}

// Tile `tile` of a chunk (0 <= tile < total tiles) → its coordinates.
KVD_HD TileRef DecodeTile(const DevGroup* groups, uint32_t num_groups, uint32_t tile) {
  uint32_t gi = 0;
  while (gi + 1 < num_groups && tile >= groups[gi + 1].tile_begin) ++gi;
  const DevGroup& g = groups[gi];
  uint32_t local = tile - g.tile_begin;
  TileRef r;
  r.group = gi;
  r.block = local % g.blocks_per_chunk;
  local /= g.blocks_per_chunk;
  r.layer = g.layer_begin + local % g.num_layers;
  r.kv = local / g.num_layers;
  return r;
}

// Byte offset of the tile's first row inside the chunk object.
KVD_HD uint64_t TileObjectOffset(const DevGroup& g, const TileRef& t, uint32_t chunk_tokens) {
  const uint64_t plane = static_cast<uint64_t>(t.kv) * g.num_layers + (t.layer - g.layer_begin);
  return g.object_offset +
         (plane * chunk_tokens + static_cast<uint64_t>(t.block) * g.tokens_per_block) * g.row_bytes;
}

// Device address of the block plane the tile reads or writes.
KVD_HD uint64_t TileBlockAddress(const DevLayer& l, const TileRef& t, int64_t block_id) {
  return l.base + static_cast<uint64_t>(block_id * l.block_stride) +
         static_cast<uint64_t>(static_cast<int64_t>(t.kv) * l.kv_stride);
}

// For the tile byte `o` (0 <= o < tpb * row_bytes, a multiple of the layer's vec): its
// offset from the block-plane start on the tensor side.
KVD_HD int64_t TensorOffset(const DevLayer& l, const DevRun* runs, uint32_t row_bytes,
                            uint32_t o) {
  if (l.contiguous) return o;
  const uint32_t t = o / row_bytes;
  const uint32_t in_row = o - t * row_bytes;
  uint32_t k;
  if (l.uniform_run > 0) {
    k = in_row / l.uniform_run;
  } else {
    k = 0;
    while (k + 1 < l.run_count && in_row >= runs[l.run_begin + k + 1].row_prefix) ++k;
  }
  const DevRun& r = runs[l.run_begin + k];
  return r.offset + static_cast<int64_t>(t) * r.token_stride + (in_row - r.row_prefix);
}

// The bytes of one tile that a gather (to_object) or scatter moves: rows [first_row, tpb).
KVD_HD uint32_t TileFirstByte(const DevGroup& g, uint32_t first_row) { return first_row * g.row_bytes; }
KVD_HD uint32_t TileEndByte(const DevGroup& g) { return g.tokens_per_block * g.row_bytes; }

// First row of block `block` a scatter writes, given the chunk-relative skip (<= 0: all).
// Returns tokens_per_block when the whole block is skipped.
KVD_HD uint32_t FirstRowAfterSkip(const DevGroup& g, uint32_t block, int64_t skip_tokens) {
  int64_t first = skip_tokens - static_cast<int64_t>(block) * g.tokens_per_block;
  if (first <= 0) return 0;
  if (first >= g.tokens_per_block) return g.tokens_per_block;
  return static_cast<uint32_t>(first);
}

// A word of kVec bytes in registers, loaded and stored with one naturally aligned access.
template <uint32_t kVec>
struct Word {
#if defined(__CUDA_ARCH__)
  using Raw = typename std::conditional<
      kVec == 16, uint4,
      typename std::conditional<
          kVec == 8, uint2,
          typename std::conditional<kVec == 4, uint32_t,
                                    typename std::conditional<kVec == 2, uint16_t,
                                                              uint8_t>::type>::type>::type>::type;
  Raw v;
  KVD_HD void Load(const uint8_t* p) { v = *reinterpret_cast<const Raw*>(p); }
  KVD_HD void Store(uint8_t* p) const { *reinterpret_cast<Raw*>(p) = v; }
#else
  uint8_t v[kVec];
  void Load(const uint8_t* p) { std::memcpy(v, p, kVec); }
  void Store(uint8_t* p) const { std::memcpy(p, v, kVec); }
#endif
};

// Moves the tile bytes [begin, end) in kVec-byte words lane, lane + lanes, ...: the loop
// body of both the kernel (lane = thread, lanes = threads per block) and the host emulator
// (lane 0 of 1). Four words are loaded before any is stored, to keep loads in flight.
// `block_plane` is the tensor side, `object_tile` the object side.
template <uint32_t kVec, bool kToObject>
KVD_HD void CopyTileWordsVec(const DevLayer& l, const DevRun* runs, uint32_t row_bytes,
                             uint8_t* block_plane, uint8_t* object_tile, uint32_t begin,
                             uint32_t end, uint32_t lane, uint32_t lanes) {
  constexpr int kUnroll = 4;
  const uint32_t step = lanes * kVec;
  for (uint32_t o0 = begin + lane * kVec; o0 < end; o0 += kUnroll * step) {
    Word<kVec> w[kUnroll];
    uint8_t* dst[kUnroll];
KVD_UNROLL
    for (int j = 0; j < kUnroll; ++j) {
      const uint32_t o = o0 + j * step;
      dst[j] = nullptr;
      if (o < end) {
        uint8_t* t = block_plane + TensorOffset(l, runs, row_bytes, o);
        uint8_t* b = object_tile + o;
        w[j].Load(kToObject ? t : b);
        dst[j] = kToObject ? b : t;
      }
    }
KVD_UNROLL
    for (int j = 0; j < kUnroll; ++j) {
      if (dst[j] != nullptr) w[j].Store(dst[j]);
    }
  }
}

template <bool kToObject>
KVD_HD void CopyTileWords(const DevLayer& l, const DevRun* runs, uint32_t row_bytes,
                          uint8_t* block_plane, uint8_t* object_tile, uint32_t begin,
                          uint32_t end, uint32_t lane, uint32_t lanes) {
  switch (l.vec) {
    case 16:
      CopyTileWordsVec<16, kToObject>(l, runs, row_bytes, block_plane, object_tile, begin, end, lane, lanes);
      break;
    case 8:
      CopyTileWordsVec<8, kToObject>(l, runs, row_bytes, block_plane, object_tile, begin, end, lane, lanes);
      break;
    case 4:
      CopyTileWordsVec<4, kToObject>(l, runs, row_bytes, block_plane, object_tile, begin, end, lane, lanes);
      break;
    case 2:
      CopyTileWordsVec<2, kToObject>(l, runs, row_bytes, block_plane, object_tile, begin, end, lane, lanes);
      break;
    default:
      CopyTileWordsVec<1, kToObject>(l, runs, row_bytes, block_plane, object_tile, begin, end, lane, lanes);
      break;
  }
}

}  // namespace kvd::transfer::cuda
