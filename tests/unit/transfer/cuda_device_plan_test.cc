// The CUDA kernels' plan and index math, on the host. For every layout the CPU engine
// supports, EmulateChunk (copy_math.h: the exact functions the kernels run, lane 0 of 1)
// must produce the same objects as GatherChunk and the same tensors as ScatterChunk,
// including skip_first_n_tokens in the middle of a block. Plans bound to fake device
// addresses are checked for the addresses, word sizes and packed block ids the kernels get.
#include "transfer/cuda/device_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "../layout/layout_test_util.h"
#include "transfer/cpu_copy.h"

namespace kvd::transfer::cuda {
namespace {

using ::testing::HasSubstr;
using namespace kvd::layout::test_util;  // NOLINT
using BlockIds = std::vector<std::vector<int64_t>>;

layout::KvLayout MustBuild(const TestModel& m, int64_t chunk) {
  auto l = layout::BuildLayout(m.Descriptors(), m.hints, m.infos, chunk);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  return l.ok() ? std::move(l).value() : layout::KvLayout{};
}

// Distinct shuffled ids per engine group; block lists naming one engine group share ids.
BlockIds PickIds(const TestModel& m, const layout::KvLayout& l, int64_t chunks, uint64_t seed) {
  BlockIds ids(l.num_engine_groups);
  int64_t min_blocks = INT64_MAX;
  for (const auto& g : l.groups) min_blocks = std::min(min_blocks, g.num_blocks);
  std::vector<int64_t> perm(min_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::map<int64_t, std::vector<int64_t>> by_engine_group;
  size_t next = 0;
  for (size_t list = 0; list < l.num_engine_groups; ++list) {
    int64_t tpb = 0;
    for (const auto& g : l.groups) {
      if (g.engine_group == list) tpb = g.tokens_per_block;
    }
    if (tpb == 0) continue;
    const int64_t eg = m.infos.empty() ? 0 : m.infos[list].engine_group_id;
    if (auto it = by_engine_group.find(eg); it != by_engine_group.end()) {
      ids[list] = it->second;
      continue;
    }
    const size_t need = static_cast<size_t>(chunks * l.chunk_tokens / tpb);
    EXPECT_LE(next + need, perm.size());
    ids[list].assign(perm.begin() + next, perm.begin() + next + need);
    next += need;
    by_engine_group[eg] = ids[list];
  }
  return ids;
}

// Host addresses of each tensor's mapping, as the device plan sees them.
DevicePlan HostPlan(const TestModel& m, const layout::KvLayout& l, Buffers& b) {
  std::vector<uint64_t> base, bytes;
  for (const auto& t : m.tensors) {
    base.push_back(reinterpret_cast<uint64_t>(b.seg.at(t.desc.shm_name).data()));
    bytes.push_back(b.seg.at(t.desc.shm_name).size());
  }
  auto p = BuildDevicePlan(l, base, bytes);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? std::move(p).value() : DevicePlan{};
}

void ExpectSame(const Buffers& got, const Buffers& want, const std::string& what) {
  for (const auto& [name, w] : want.seg) {
    const auto& g = got.seg.at(name);
    auto mm = std::mismatch(g.begin(), g.end(), w.begin());
    EXPECT_TRUE(mm.first == g.end()) << what << ": segment " << name << " differs at byte "
                                     << (mm.first - g.begin());
  }
}

// Gathers and scatters `chunks` chunks with both executors; every byte must agree.
void SameAsCpu(const TestModel& m, int64_t chunk_tokens, int64_t chunks,
               std::vector<int64_t> skips = {}, uint64_t seed = 1) {
  SCOPED_TRACE(testing::Message() << "model with " << m.tensors.size() << " tensors, chunk "
                                  << chunk_tokens);
  skips.resize(chunks, 0);
  layout::KvLayout l = MustBuild(m, chunk_tokens);
  ASSERT_FALSE(l.groups.empty());
  Buffers src = Buffers::Random(m, seed);
  DevicePlan plan = HostPlan(m, l, src);
  ASSERT_EQ(plan.object_bytes, l.object_bytes);
  BlockIds src_ids = PickIds(m, l, chunks, seed * 11 + 1);
  BlockIds dst_ids = PickIds(m, l, chunks, seed * 11 + 2);
  ASSERT_TRUE(ValidateBlockIds(l, src_ids, chunks).ok());
  auto src_bases = src.Bases(m);
  std::vector<int32_t> packed(plan.ids_per_chunk);

  std::vector<std::vector<uint8_t>> objects;
  for (int64_t c = 0; c < chunks; ++c) {
    std::vector<uint8_t> want(l.object_bytes, 0xEE), got(l.object_bytes, 0x11);
    GatherChunk(l, src_bases, src_ids, c, want.data());
    PackChunkIds(plan, src_ids, c, packed.data());
    EmulateChunk(plan, packed.data(), got.data(), /*to_object=*/true, 0);
    auto mm = std::mismatch(got.begin(), got.end(), want.begin());
    ASSERT_TRUE(mm.first == got.end()) << "chunk " << c << " object differs at byte "
                                       << (mm.first - got.begin()) << " (" << l.Describe() << ")";
    objects.push_back(std::move(want));
  }

  Buffers cpu = Buffers::Zeroed(m), gpu = Buffers::Zeroed(m);
  DevicePlan gpu_plan = HostPlan(m, l, gpu);
  auto cpu_bases = cpu.Bases(m);
  for (int64_t c = 0; c < chunks; ++c) {
    ScatterChunk(l, cpu_bases, dst_ids, c, objects[c].data(), skips[c]);
    PackChunkIds(gpu_plan, dst_ids, c, packed.data());
    EmulateChunk(gpu_plan, packed.data(), objects[c].data(), /*to_object=*/false, skips[c]);
  }
  ExpectSame(gpu, cpu, "scatter");
}

// The word size the kernels use must divide every address and length they touch.
void ExpectAlignedWords(const DevicePlan& p) {
  for (const auto& g : p.groups) {
    for (uint32_t li = g.layer_begin; li < g.layer_begin + g.num_layers; ++li) {
      const DevLayer& l = p.layers[li];
      ASSERT_TRUE(l.vec == 1 || l.vec == 2 || l.vec == 4 || l.vec == 8 || l.vec == 16);
      EXPECT_EQ(l.base % l.vec, 0u);
      EXPECT_EQ(static_cast<uint64_t>(l.block_stride) % l.vec, 0u);
      EXPECT_EQ(static_cast<uint64_t>(l.kv_stride) % l.vec, 0u);
      EXPECT_EQ(g.row_bytes % l.vec, 0u);
      EXPECT_EQ(g.object_offset % l.vec, 0u);
      for (uint32_t r = l.run_begin; r < l.run_begin + l.run_count; ++r) {
        EXPECT_EQ(p.runs[r].length % l.vec, 0u);
        EXPECT_EQ(static_cast<uint64_t>(p.runs[r].offset) % l.vec, 0u);
        EXPECT_EQ(static_cast<uint64_t>(p.runs[r].token_stride) % l.vec, 0u);
      }
    }
  }
}

// ---- every layout of tests/unit/layout, as in cpu_copy_test.cc --------------------------

TEST(CudaDevicePlanTest, StandardAttention) {
  for (Order o : {Order::kNhd, Order::kHndPhysical, Order::kHndView}) {
    SameAsCpu(FlashAttention(3, 24, 16, 4, 32, o), 64, 2, {0, 5});
    SameAsCpu(FlashInfer(3, 24, 16, 4, 32, o), 64, 2, {17, 0});
  }
  SameAsCpu(PackedKv(3, 24, 16, 4, 32, true), 64, 2, {3, 0});
  SameAsCpu(PackedKv(3, 24, 16, 4, 32, false), 64, 2);
  SameAsCpu(FlashInfer(2, 20, 16, 16, 8, Order::kHndView), 32, 2);  // heads == block size
  SameAsCpu(FlashAttention(2, 20, 16, 16, 8, Order::kNhd), 32, 2);
}

TEST(CudaDevicePlanTest, Fp32AndFp8Caches) {
  SameAsCpu(FlashAttention(2, 20, 16, 2, 16, Order::kNhd, "float32"), 32, 2, {1, 0});
  SameAsCpu(FlashAttention(2, 20, 16, 2, 16, Order::kHndView, "float8_e4m3fn"), 32, 2, {0, 9});
  // fp8 with a head size of 6: 6-byte runs, the kernels fall back to 2-byte words.
  SameAsCpu(FlashAttention(2, 20, 16, 3, 6, Order::kHndView, "float8_e4m3fn"), 32, 2, {0, 3});
}

TEST(CudaDevicePlanTest, MlaAndIndexers) {
  SameAsCpu(Mla(3, 12, 64), 256, 2, {0, 70});
  SameAsCpu(DeepSeekV32(3, 12), 256, 2);
  SameAsCpu(DeepSeekV32(3, 12, /*with_info=*/false), 256, 2, {}, 3);
  SameAsCpu(DeepSeekV32(2, 12), 256, 2, {10, 200});  // partial-block skip: values and scales
}

TEST(CudaDevicePlanTest, MiniMaxM3AllForms) {
  SameAsCpu(MiniMaxM3(6, M3Main::kPackedHnd, "bfloat16", false), 256, 2);
  SameAsCpu(MiniMaxM3(6, M3Main::kPackedHnd, "bfloat16", true), 256, 2, {0, 130});
  SameAsCpu(MiniMaxM3(6, M3Main::kPackedNhd, "bfloat16", false), 256, 2);
  SameAsCpu(MiniMaxM3(6, M3Main::kRank5, "bfloat16", false), 256, 2, {100, 0});
  SameAsCpu(MiniMaxM3(6, M3Main::kPackedHnd, "float8_e4m3fn", true), 256, 2, {0, 130});
}

// vLLM #51718 per-group pool: layers are strided views at their own offsets, blocks padded.
TestModel SharedPool(int64_t pad, int64_t layer_offset_elems = 0) {
  const int64_t nb = 16, layers = 3, nh = 2, bs = 16, c = 24;
  const int64_t page = nh * bs * c, bstride = layers * page + pad;
  TestModel m;
  m.hints = Hint("BLHNC");
  ExpectedGroup g;
  std::vector<int64_t> all;
  for (int64_t l = 0; l < layers; ++l) {
    TestTensor t;
    t.desc = Desc("/pool", "bfloat16", {nb, nh, bs, c}, {bstride, bs * c, c, 1},
                  layer_offset_elems + l * page,
                  static_cast<uint64_t>((layer_offset_elems + nb * bstride) * 2));
    t.token_dim = 2;
    g.tensors.push_back(m.tensors.size());
    all.push_back(l);
    m.Add(t);
  }
  m.groups = {g};
  m.infos = {Info(0, all, bs)};
  return m;
}

TEST(CudaDevicePlanTest, SharedPoolsPaddingAndOddOffsets) {
  SameAsCpu(SharedPool(0), 64, 2);
  SameAsCpu(SharedPool(40), 64, 2, {0, 5});
  SameAsCpu(SharedPool(1, 1), 64, 2, {7, 0});  // 2-byte aligned only: 2-byte words
}

TEST(CudaDevicePlanTest, HybridGroupsWithTwoBlockSizes) {
  TestModel m;
  m.hints = Hint("NHD");
  const int64_t bs_of[5] = {16, 32, 16, 32, 16};
  for (int i = 0; i < 5; ++i) {
    TestTensor t;
    t.desc = Desc("/hy" + std::to_string(i), "bfloat16", {2, 48, bs_of[i], 2, 8});
    t.kv_dim = 0;
    t.block_dim = 1;
    t.token_dim = 2;
    m.Add(t);
  }
  m.infos = {Info(0, {0, 2, 4}, 16), Info(1, {1, 3}, 32)};
  m.groups = {{{0, 2, 4}, 0}, {{1, 3}, 1}};
  SameAsCpu(m, 256, 1, {0}, 2);
  SameAsCpu(m, 256, 1, {48}, 4);
}

TEST(CudaDevicePlanTest, RecurrentStatePageViews) {
  const int64_t nb = 12, bs = 32, w = 8, s = bs * w * 2 + 16;
  for (bool hnd : {false, true}) {
    TestModel m;
    m.hints = Hint(hnd ? "HND" : "NHD");
    ExpectedGroup g;
    for (int64_t l = 0; l < 2; ++l) {
      TestTensor t;
      if (hnd) {
        t.desc = Desc("/mamba", "bfloat16", {nb, 1, bs, w}, {s, bs * w, w, 1}, l * bs * w,
                      static_cast<uint64_t>(nb * s * 2));
        t.token_dim = 2;
      } else {
        t.desc = Desc("/mamba", "bfloat16", {nb, bs, 1, w}, {s, w, w, 1}, l * bs * w,
                      static_cast<uint64_t>(nb * s * 2));
        t.token_dim = 1;
      }
      g.tensors.push_back(m.tensors.size());
      m.Add(t);
    }
    m.groups = {g};
    m.infos = {Info(0, {0, 1}, bs)};
    SameAsCpu(m, 64, 2);
  }
}

// ---- plans bound to device addresses ------------------------------------------------------

TEST(CudaDevicePlanTest, FakeDeviceAddressesWordSizesAndPackedIds) {
  // Llama-style TP shard, HND view, one tensor per layer in one allocation each.
  TestModel m = FlashAttention(4, 40, 16, 8, 128, Order::kHndView);
  layout::KvLayout l = MustBuild(m, 256);
  std::vector<uint64_t> base, bytes;
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    base.push_back(0x7f0000000000ull + (i << 32) + 0x200000);  // allocation + storage offset
    bytes.push_back(m.tensors[i].desc.nbytes);
  }
  auto p = BuildDevicePlan(l, base, bytes);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->groups.size(), 1u);
  const DevGroup& g = p->groups[0];
  EXPECT_EQ(g.kv_size, 2u);
  EXPECT_EQ(g.num_layers, 4u);
  EXPECT_EQ(g.tokens_per_block, 16u);
  EXPECT_EQ(g.row_bytes, 8u * 128 * 2);
  EXPECT_EQ(g.blocks_per_chunk, 16u);
  EXPECT_EQ(p->tiles_per_chunk, 2u * 4 * 16);
  EXPECT_EQ(p->ids_per_chunk, 16u);
  for (size_t i = 0; i < 4; ++i) {
    const DevLayer& dl = p->layers[i];
    EXPECT_EQ(dl.base, base[i]);
    EXPECT_EQ(dl.vec, 16u);
    EXPECT_EQ(dl.contiguous, 0u);            // HND: one run per head
    EXPECT_EQ(dl.run_count, 8u);
    EXPECT_EQ(dl.uniform_run, 256u);
    EXPECT_EQ(dl.block_stride, 8 * 16 * 128 * 2);
    EXPECT_EQ(dl.kv_stride, 40 * 8 * 16 * 128 * 2);
  }
  ExpectAlignedWords(*p);

  // A storage offset of 3 elements (6 bytes) leaves 2-byte alignment.
  base[1] += 6;
  auto q = BuildDevicePlan(l, base, bytes);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->layers[1].vec, 2u);
  EXPECT_EQ(q->min_vec, 2u);
  ExpectAlignedWords(*q);

  // Tile 0 is K of layer 0, block 0; the last tile is V of layer 3, block 15.
  TileRef first = DecodeTile(p->groups.data(), 1, 0);
  EXPECT_EQ(first.kv, 0u);
  EXPECT_EQ(first.layer, 0u);
  EXPECT_EQ(first.block, 0u);
  TileRef last = DecodeTile(p->groups.data(), 1, p->tiles_per_chunk - 1);
  EXPECT_EQ(last.kv, 1u);
  EXPECT_EQ(last.layer, 3u);
  EXPECT_EQ(last.block, 15u);
  EXPECT_EQ(TileObjectOffset(g, last, 256), l.object_bytes - 16 * g.row_bytes);
  EXPECT_EQ(TileBlockAddress(p->layers[3], last, 7),
            base[3] + 7 * 8 * 16 * 128 * 2 + 40ull * 8 * 16 * 128 * 2);

  BlockIds ids = {std::vector<int64_t>(32)};
  std::iota(ids[0].begin(), ids[0].end(), 100);
  std::vector<int32_t> packed(p->ids_per_chunk);
  PackChunkIds(*p, ids, 1, packed.data());
  EXPECT_EQ(packed.front(), 116);
  EXPECT_EQ(packed.back(), 131);
}

TEST(CudaDevicePlanTest, MiniMaxM3TensorParallelRankPlan) {
  // Per-rank shapes at TP=8 (docs/layouts.md): 60 x [NB, 1, 128, 256] + 57 x [NB, 128, 128],
  // both lists of one engine group (lmcache's split infos): 4 block ids per 256-token chunk.
  TestModel m = MiniMaxM3(8, M3Main::kPackedHnd, "bfloat16", true);
  layout::KvLayout l = MustBuild(m, 256);
  std::vector<uint64_t> base, bytes;
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    base.push_back(0x7e0000000000ull + i * 0x10000000ull);
    bytes.push_back(m.tensors[i].desc.nbytes);
  }
  auto p = BuildDevicePlan(l, base, bytes);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->object_bytes, 11599872u);
  ASSERT_EQ(p->groups.size(), 2u);
  EXPECT_EQ(p->ids_per_chunk, 4u);
  EXPECT_EQ(p->groups[0].ids_offset, 0u);
  EXPECT_EQ(p->groups[1].ids_offset, 2u);
  EXPECT_EQ(p->tiles_per_chunk, 60u * 2 + 57u * 2);
  EXPECT_EQ(p->groups[1].tile_begin, 120u);
  EXPECT_EQ(p->groups[1].object_offset, 7864320u);
  for (const auto& dl : p->layers) EXPECT_EQ(dl.contiguous, 1u);
  ExpectAlignedWords(*p);
}

TEST(CudaDevicePlanTest, RefusesWhatTheKernelsCannotDo) {
  TestModel m = FlashAttention(2, 40, 16, 2, 8, Order::kNhd);
  layout::KvLayout l = MustBuild(m, 256);
  std::vector<uint64_t> base = {0x1000, 0x2000000};
  std::vector<uint64_t> bytes = {m.tensors[0].desc.nbytes, m.tensors[1].desc.nbytes - 1};
  auto small = BuildDevicePlan(l, base, bytes);  // mapping smaller than the view
  ASSERT_FALSE(small.ok());
  EXPECT_THAT(small.status().message(), HasSubstr("kv_cache[1]"));
  EXPECT_FALSE(BuildDevicePlan(l, std::vector<uint64_t>{0x1000}, std::vector<uint64_t>{1 << 30}).ok());

  // A chunk that needs more block ids than the kernel parameters hold.
  TestModel tiny = Mla(1, 4000, 1);
  layout::KvLayout lt = MustBuild(tiny, 1024);
  auto many = BuildDevicePlan(lt, std::vector<uint64_t>{0x1000},
                              std::vector<uint64_t>{tiny.tensors[0].desc.nbytes});
  ASSERT_FALSE(many.ok());
  EXPECT_THAT(many.status().message(), HasSubstr("block ids"));
}

}  // namespace
}  // namespace kvd::transfer::cuda
