// GatherChunk / ScatterChunk: byte-exact store → retrieve round trips for every KV
// layout kvd supports, over host buffers standing in for the mapped tensors.
//
// Each round trip fills the source tensors with random bytes, gathers chunks from
// some block ids and checks each object against a reference object built from the
// test's own description of the layout; then scatters the objects into zeroed buffers
// at other block ids and checks every byte of every destination buffer: copied blocks
// equal their source blocks, the first skip_tokens tokens and every other block (and
// every padding byte) stay zero.
#include "transfer/cpu_copy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "../layout/layout_test_util.h"

namespace kvd::transfer {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace kvd::layout::test_util;  // NOLINT
using layout::KvLayout;

using BlockIds = std::vector<std::vector<int64_t>>;

layout::KvLayout MustBuild(const TestModel& m, int64_t chunk) {
  auto l = layout::BuildLayout(m.Descriptors(), m.hints, m.infos, chunk, m.options);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  if (!l.ok()) return {};
  // The plan's group order is the reference's.
  EXPECT_EQ(l->groups.size(), m.groups.size()) << l->Describe();
  for (size_t g = 0; g < std::min(l->groups.size(), m.groups.size()); ++g) {
    std::vector<size_t> got;
    for (const auto& a : l->groups[g].layers) got.push_back(a.tensor_index);
    EXPECT_EQ(got, m.ExpectedAccesses(g)) << "group " << g;
    EXPECT_EQ(l->groups[g].engine_group, m.groups[g].block_list) << "group " << g;
  }
  return std::move(l).value();
}

// Distinct block ids for `num_chunks` chunks. Block lists that name the same engine
// group get the same ids (lmcache 0.5.6 sends copies); different engine groups get
// disjoint ids (vLLM allocates all groups from one pool, which matters when they share
// a buffer).
BlockIds PickIds(const TestModel& m, const KvLayout& l, int64_t num_chunks, uint64_t seed) {
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
    int64_t eg = m.infos.empty() ? 0 : m.infos[list].engine_group_id;
    auto it = by_engine_group.find(eg);
    if (it != by_engine_group.end()) {
      ids[list] = it->second;
      continue;
    }
    const size_t need = static_cast<size_t>(num_chunks * l.chunk_tokens / tpb);
    EXPECT_LE(next + need, perm.size()) << "test model has too few blocks";
    ids[list].assign(perm.begin() + next, perm.begin() + next + need);
    next += need;
    by_engine_group[eg] = ids[list];
  }
  return ids;
}

void ExpectSameBuffers(const Buffers& got, const Buffers& want) {
  for (const auto& [name, w] : want.seg) {
    const auto& g = got.seg.at(name);
    ASSERT_EQ(g.size(), w.size()) << name;
    auto mm = std::mismatch(g.begin(), g.end(), w.begin());
    EXPECT_TRUE(mm.first == g.end())
        << "segment " << name << " differs first at byte " << (mm.first - g.begin()) << " of "
        << g.size() << ": got " << int(*mm.first) << ", want " << int(*mm.second);
  }
}

// Gathers `num_chunks` chunks, checks them against the reference, scatters them into
// zeroed buffers at other ids with skips[c] for chunk c, checks every byte.
void RoundTrip(const TestModel& m, int64_t chunk_tokens, int64_t num_chunks,
               std::vector<int64_t> skips = {}, uint64_t seed = 1) {
  skips.resize(num_chunks, 0);
  KvLayout l = MustBuild(m, chunk_tokens);
  ASSERT_FALSE(l.groups.empty());
  Buffers src = Buffers::Random(m, seed);
  BlockIds src_ids = PickIds(m, l, num_chunks, seed * 7 + 1);
  BlockIds dst_ids = PickIds(m, l, num_chunks, seed * 7 + 2);
  ASSERT_NE(src_ids, dst_ids);
  ASSERT_TRUE(ValidateBlockIds(l, src_ids, num_chunks).ok());
  ASSERT_TRUE(ValidateBlockIds(l, dst_ids, num_chunks).ok());
  auto src_bases = src.Bases(m);

  std::vector<std::vector<uint8_t>> objects;
  for (int64_t c = 0; c < num_chunks; ++c) {
    std::vector<uint8_t> obj(l.object_bytes, 0xEE);
    GatherChunk(l, src_bases, src_ids, c, obj.data());
    std::vector<uint8_t> want = ReferenceObject(m, src, src_ids, c, chunk_tokens);
    ASSERT_EQ(want.size(), l.object_bytes);
    auto mm = std::mismatch(obj.begin(), obj.end(), want.begin());
    ASSERT_TRUE(mm.first == obj.end())
        << "chunk " << c << " object differs from the reference at byte " << (mm.first - obj.begin())
        << " of " << obj.size() << " (" << l.Describe() << ")";
    objects.push_back(std::move(obj));
  }

  Buffers dst = Buffers::Zeroed(m);
  Buffers want = Buffers::Zeroed(m);
  auto dst_bases = dst.Bases(m);
  for (int64_t c = 0; c < num_chunks; ++c) {
    ScatterChunk(l, dst_bases, dst_ids, c, objects[c].data(), skips[c]);
    ApplyExpectedScatter(m, src, &want, src_ids, dst_ids, c, chunk_tokens, skips[c]);
  }
  ExpectSameBuffers(dst, want);

  // Without skips the destination now holds the same chunks: gathering it gives the
  // same objects.
  for (int64_t c = 0; c < num_chunks; ++c) {
    if (skips[c] > 0) continue;
    std::vector<uint8_t> again(l.object_bytes);
    GatherChunk(l, dst_bases, dst_ids, c, again.data());
    EXPECT_TRUE(again == objects[c]) << "chunk " << c << " re-gathered differently";
  }
}

// ---- Standard attention --------------------------------------------------------------

TEST(CpuCopyTest, FlashAttentionNhd) { RoundTrip(FlashAttention(3, 24, 16, 4, 32, Order::kNhd), 64, 2); }
TEST(CpuCopyTest, FlashAttentionHndPhysical) {
  RoundTrip(FlashAttention(3, 24, 16, 4, 32, Order::kHndPhysical), 64, 2);
}
TEST(CpuCopyTest, FlashAttentionHndView) {
  RoundTrip(FlashAttention(3, 24, 16, 4, 32, Order::kHndView), 64, 2);
}
TEST(CpuCopyTest, FlashInferNhd) { RoundTrip(FlashInfer(3, 24, 16, 4, 32, Order::kNhd), 64, 2); }
TEST(CpuCopyTest, FlashInferHndPhysical) {
  RoundTrip(FlashInfer(3, 24, 16, 4, 32, Order::kHndPhysical), 64, 2);
}
TEST(CpuCopyTest, FlashInferHndView) { RoundTrip(FlashInfer(3, 24, 16, 4, 32, Order::kHndView), 64, 2); }
TEST(CpuCopyTest, PackedKvHnd) { RoundTrip(PackedKv(3, 24, 16, 4, 32, true), 64, 2); }
TEST(CpuCopyTest, PackedKvNhd) { RoundTrip(PackedKv(3, 24, 16, 4, 32, false), 64, 2); }
TEST(CpuCopyTest, HeadsEqualToBlockSize) {
  RoundTrip(FlashInfer(2, 20, 16, 16, 8, Order::kHndView), 32, 2);
  RoundTrip(FlashAttention(2, 20, 16, 16, 8, Order::kNhd), 32, 2);
}
TEST(CpuCopyTest, Fp32AndFp8Caches) {
  RoundTrip(FlashAttention(2, 20, 16, 2, 16, Order::kNhd, "float32"), 32, 2);
  RoundTrip(FlashAttention(2, 20, 16, 2, 16, Order::kHndView, "float8_e4m3fn"), 32, 2);
}

// Writes the same logical KV (per kv, block, token: one row of heads × head_size) into
// an NHD model and an HND model; their objects must be identical.
void ExpectSameObject(const TestModel& nhd, const TestModel& hnd, int64_t chunk_tokens) {
  KvLayout ln = MustBuild(nhd, chunk_tokens);
  KvLayout lh = MustBuild(hnd, chunk_tokens);
  ASSERT_EQ(ln.object_bytes, lh.object_bytes);
  Buffers a = Buffers::Random(nhd, 5);
  Buffers b = Buffers::Zeroed(hnd);
  ASSERT_EQ(nhd.tensors.size(), hnd.tensors.size());
  for (size_t i = 0; i < nhd.tensors.size(); ++i) {
    const auto& tn = nhd.tensors[i];
    const auto& th = hnd.tensors[i];
    const int64_t kv_size = tn.kv_dim >= 0 ? 2 : 1;
    for (int64_t kv = 0; kv < kv_size; ++kv) {
      for (int64_t blk = 0; blk < tn.desc.shape[tn.block_dim]; ++blk) {
        for (int64_t t = 0; t < TokensPerBlock(tn); ++t) {
          std::vector<uint8_t> row;
          const uint8_t* pa = a.seg.at(tn.desc.shm_name).data();
          for (auto [off, len] : TokenRow(tn, kv, blk, t)) row.insert(row.end(), pa + off, pa + off + len);
          uint8_t* pb = b.seg.at(th.desc.shm_name).data();
          size_t pos = 0;
          for (auto [off, len] : TokenRow(th, kv, blk, t)) {
            std::memcpy(pb + off, row.data() + pos, len);
            pos += len;
          }
          ASSERT_EQ(pos, row.size());
        }
      }
    }
  }
  BlockIds ids = PickIds(nhd, ln, 2, 9);
  for (int64_t c = 0; c < 2; ++c) {
    std::vector<uint8_t> on(ln.object_bytes), oh(lh.object_bytes);
    GatherChunk(ln, a.Bases(nhd), ids, c, on.data());
    GatherChunk(lh, b.Bases(hnd), ids, c, oh.data());
    EXPECT_TRUE(on == oh) << "chunk " << c << ": NHD and HND objects differ";
    EXPECT_TRUE(on == ReferenceObject(nhd, a, ids, c, chunk_tokens));
  }
}

TEST(CpuCopyTest, ObjectDoesNotDependOnNhdOrHnd) {
  ExpectSameObject(FlashAttention(2, 12, 16, 4, 8, Order::kNhd),
                   FlashAttention(2, 12, 16, 4, 8, Order::kHndPhysical), 32);
  ExpectSameObject(FlashAttention(2, 12, 16, 4, 8, Order::kNhd),
                   FlashAttention(2, 12, 16, 4, 8, Order::kHndView), 32);
  ExpectSameObject(FlashInfer(2, 12, 16, 4, 8, Order::kNhd),
                   FlashInfer(2, 12, 16, 4, 8, Order::kHndPhysical), 32);
  ExpectSameObject(FlashInfer(2, 12, 16, 16, 8, Order::kNhd),
                   FlashInfer(2, 12, 16, 16, 8, Order::kHndView), 32);
  ExpectSameObject(PackedKv(2, 12, 16, 4, 8, false), PackedKv(2, 12, 16, 4, 8, true), 32);
}

// ---- vLLM's CPU attention cache ------------------------------------------------------

TEST(CpuCopyTest, VllmCpuCache) {
  RoundTrip(VllmCpu(3, 24, 32, 4, 32), 256, 2);
  RoundTrip(VllmCpu(2, 8, 128, 2, 64), 256, 2);
  RoundTrip(VllmCpu(2, 8, 128, 1, 64), 256, 2, {0, 130});  // one head: whole-plane copies
  RoundTrip(VllmCpu(2, 24, 32, 4, 32), 256, 2, {40, 255});
}

// The K halves are copied in tiles (8 x 8 for 2-byte, 4 x 4 for 4-byte elements, 32 tokens
// per tile): block sizes, head counts × head sizes and skips that are not multiples of a
// tile take the edge paths, and 1-, 4- and 8-byte elements the other widths; every byte
// still equals the reference's.
TEST(CpuCopyTest, VllmCpuCacheTransposedKeysAtSizesThatAreNotMultiplesOfTheTile) {
  RoundTrip(VllmCpu(2, 40, 12, 3, 20), 48, 3, {0, 5, 47});           // bf16: 60 columns, 12 tokens
  RoundTrip(VllmCpu(2, 24, 40, 1, 13), 80, 2, {3, 41});              // 13 columns, 40 tokens
  RoundTrip(VllmCpu(2, 24, 36, 2, 7, "float32"), 72, 2, {0, 33});    // 14 columns, 36 tokens
  RoundTrip(VllmCpu(2, 24, 32, 2, 16, "float32"), 64, 2, {9, 0});    // whole squares
  RoundTrip(VllmCpu(1, 24, 20, 3, 5, "uint8"), 40, 2, {0, 11});
  RoundTrip(VllmCpu(1, 24, 20, 2, 3, "float64"), 40, 2, {0, 19});
  KvLayout l = MustBuild(VllmCpu(1, 24, 36, 2, 7, "float32"), 72);
  ASSERT_FALSE(l.groups.empty());
  EXPECT_EQ(l.groups[0].layers[0].transposed_element, 4);
}

// Writes the K/V of token positions [0, chunks * chunk_tokens) into `m` at `ids`: the row
// of (layer l, plane kv, position p) is bytes f(l, kv, p, i) = a hash of the four.
Buffers FillByPosition(const TestModel& m, const BlockIds& ids, int64_t chunk_tokens,
                       int64_t chunks) {
  Buffers b = Buffers::Zeroed(m);
  for (size_t l = 0; l < m.tensors.size(); ++l) {
    const auto& tt = m.tensors[l];
    const int64_t tpb = TokensPerBlock(tt);
    uint8_t* base = b.seg.at(tt.desc.shm_name).data();
    for (int64_t kv = 0; kv < 2; ++kv) {
      for (int64_t p = 0; p < chunks * chunk_tokens; ++p) {
        uint64_t i = 0;
        for (auto [off, len] : TokenRow(tt, kv, ids[0][p / tpb], p % tpb)) {
          for (int64_t k = 0; k < len; ++k, ++i) {
            uint64_t x = (l * 1000003 + kv * 7919 + p * 104729 + i) * 0x9E3779B97F4A7C15ull;
            base[off + k] = static_cast<uint8_t>(x >> 56);
          }
        }
      }
    }
  }
  return b;
}

// Regression: vLLM's CPU cache [NB, NH, BS, 2*HS] holds, per (block, head), a key half
// and a value half (VEC kernels: K as [HS][BS], V as [BS][HS]); kvd read it as BS rows of
// [K|V], so a chunk's object depended on the block size and a vLLM with --block-size 32 loaded wrong KV from chunks stored by
// one with --block-size 128 (and objects differed from every other layout's). Now the
// same K/V gives byte-identical objects at block sizes 32 and 128, equal to the object a
// FlashAttention layout with the same K/V gives.
TEST(CpuCopyTest, VllmCpuObjectsDependOnBlockSize) {
  constexpr int64_t kChunk = 256, kChunks = 2;
  TestModel bs32 = VllmCpu(3, 40, 32, 4, 32, "bfloat16", "cpu32_");
  TestModel bs128 = VllmCpu(3, 10, 128, 4, 32, "bfloat16", "cpu128_");
  TestModel fa = FlashAttention(3, 40, 16, 4, 32, Order::kNhd);
  KvLayout l32 = MustBuild(bs32, kChunk), l128 = MustBuild(bs128, kChunk), lfa = MustBuild(fa, kChunk);
  ASSERT_EQ(l32.object_bytes, 2u * 3 * kChunk * 4 * 32 * 2);
  ASSERT_EQ(l128.object_bytes, l32.object_bytes);
  ASSERT_EQ(lfa.object_bytes, l32.object_bytes);
  BlockIds ids32 = PickIds(bs32, l32, kChunks, 3), ids128 = PickIds(bs128, l128, kChunks, 4),
           idsfa = PickIds(fa, lfa, kChunks, 5);
  Buffers b32 = FillByPosition(bs32, ids32, kChunk, kChunks);
  Buffers b128 = FillByPosition(bs128, ids128, kChunk, kChunks);
  Buffers bfa = FillByPosition(fa, idsfa, kChunk, kChunks);
  for (int64_t c = 0; c < kChunks; ++c) {
    std::vector<uint8_t> o32(l32.object_bytes), o128(l128.object_bytes), ofa(lfa.object_bytes);
    GatherChunk(l32, b32.Bases(bs32), ids32, c, o32.data());
    GatherChunk(l128, b128.Bases(bs128), ids128, c, o128.data());
    GatherChunk(lfa, bfa.Bases(fa), idsfa, c, ofa.data());
    EXPECT_TRUE(o32 == o128) << "chunk " << c << ": block sizes 32 and 128 give different objects";
    EXPECT_TRUE(o32 == ofa) << "chunk " << c << ": vLLM-CPU and FlashAttention objects differ";
    // Stored at block size 128, loaded at block size 32: every K/V row lands where the
    // block-size-32 kernels read it.
    Buffers dst = Buffers::Zeroed(bs32);
    ScatterChunk(l32, dst.Bases(bs32), ids32, c, o128.data(), 0);
    std::vector<uint8_t> again(l32.object_bytes);
    GatherChunk(l32, dst.Bases(bs32), ids32, c, again.data());
    EXPECT_TRUE(again == o32) << "chunk " << c;
  }
  // Byte-exact spot check against the VEC kernels' addressing (csrc/cpu/cpu_attn_vec.hpp,
  // reshape_and_cache): layer 0, block ids32[0][0], head 1, token 5. Key dimension d is
  // element (block*NH + head)*2*BS*HS + d*BS + 5; the value row is at
  // (block*NH + head)*2*BS*HS + BS*HS + 5*HS.
  const auto& t0 = bs32.tensors[0];
  const uint8_t* seg = b32.seg.at(t0.desc.shm_name).data();
  const int64_t blk = ids32[0][0], hs = 32, bs = 32, item = 2;
  std::vector<uint8_t> obj(l32.object_bytes);
  GatherChunk(l32, b32.Bases(bs32), ids32, 0, obj.data());
  const int64_t row = 4 * hs * item;       // object row: NH * HS elements
  const int64_t plane = 3 * kChunk * row;  // [layers][tokens][hidden] per K or V
  const int64_t head_block = (blk * 4 + 1) * 2 * bs * hs;
  for (int64_t d = 0; d < hs; ++d) {
    EXPECT_EQ(0, std::memcmp(obj.data() + 5 * row + (hs + d) * item,
                             seg + (head_block + d * bs + 5) * item, item)) << "K dimension " << d;
  }
  EXPECT_EQ(0, std::memcmp(obj.data() + plane + 5 * row + hs * item,
                           seg + (head_block + bs * hs + 5 * hs) * item, hs * item));
}

// ---- MLA and sparse-attention indexers -------------------------------------------

TEST(CpuCopyTest, MlaLatent) { RoundTrip(Mla(3, 12, 64), 256, 2); }

TEST(CpuCopyTest, DeepSeekV32WithBlockedIndexer) {
  RoundTrip(DeepSeekV32(3, 12), 256, 2);
  RoundTrip(DeepSeekV32(3, 12, /*with_info=*/false), 256, 2, {}, 3);
}

TEST(CpuCopyTest, DeepSeekV32PartialBlockSkipMovesTheRightScales) {
  // Tokens 10.. of the first block: value bytes [10*128, 64*128) and scale bytes
  // [64*128 + 40, 64*132) of that block; nothing else of it.
  RoundTrip(DeepSeekV32(2, 12), 256, 2, {10, 200});
}

TEST(CpuCopyTest, MiniMaxM3PackedMainAndIndexerOneInfo) {
  RoundTrip(MiniMaxM3(6, M3Main::kPackedHnd, "bfloat16", false), 256, 2);
}
TEST(CpuCopyTest, MiniMaxM3AsLmcacheSplitsTheInfos) {
  RoundTrip(MiniMaxM3(6, M3Main::kPackedHnd, "bfloat16", true), 256, 2);
}
TEST(CpuCopyTest, MiniMaxM3TokensBeforeHeads) {
  RoundTrip(MiniMaxM3(6, M3Main::kPackedNhd, "bfloat16", false), 256, 2);
}
TEST(CpuCopyTest, MiniMaxM3OldRankFiveMain) {
  RoundTrip(MiniMaxM3(6, M3Main::kRank5, "bfloat16", false), 256, 2);
}
TEST(CpuCopyTest, MiniMaxM3Fp8Main) {
  RoundTrip(MiniMaxM3(6, M3Main::kPackedHnd, "float8_e4m3fn", true), 256, 2, {0, 130});
}

// ---- Shared buffers, hybrids, aliases ------------------------------------------------

// vLLM #51718 BLHNC: one pool [NB, L, NH, BS, C] with padding after each block; each
// layer is a view at its own storage offset.
TestModel SharedPoolBlocksFirst(int64_t pad) {
  const int64_t nb = 16, layers = 3, nh = 2, bs = 16, c = 24;
  const int64_t page = nh * bs * c, bstride = layers * page + pad;
  TestModel m;
  m.hints = Hint("BLHNC");
  ExpectedGroup g;
  std::vector<int64_t> all;
  for (int64_t l = 0; l < layers; ++l) {
    TestTensor t;
    t.desc = OnGpu(Desc("/pool", "bfloat16", {nb, nh, bs, c}, {bstride, bs * c, c, 1}, l * page,
                        static_cast<uint64_t>(nb * bstride * 2)));
    t.token_dim = 2;
    g.tensors.push_back(m.tensors.size());
    all.push_back(l);
    m.Add(t);
  }
  m.groups = {g};
  m.infos = {Info(0, all, bs)};
  return m;
}

// Layers-first FlashInfer views into one buffer, each block padded.
TestModel SharedPoolLayersFirst(int64_t pad) {
  const int64_t nb = 16, layers = 3, bs = 16, nh = 2, hs = 8;
  const int64_t bstride = 2 * bs * nh * hs + pad, layer_bytes = nb * bstride;
  TestModel m;
  m.hints = Hint("NHD");
  ExpectedGroup g;
  for (int64_t l = 0; l < layers; ++l) {
    TestTensor t;
    t.desc = Desc("/pool", "float16", {nb, 2, bs, nh, hs}, {bstride, bs * nh * hs, nh * hs, hs, 1},
                  l * layer_bytes, static_cast<uint64_t>(layers * layer_bytes * 2));
    t.kv_dim = 1;
    t.token_dim = 2;
    g.tensors.push_back(m.tensors.size());
    m.Add(t);
  }
  m.groups = {g};
  return m;
}

// K-first FlashAttention views in one buffer: [2, NB, BS, NH, HS] with padded blocks,
// the K planes of all layers first, then the V planes.
TestModel SharedPoolKvFirst(int64_t pad) {
  const int64_t nb = 16, layers = 2, bs = 16, nh = 2, hs = 8;
  const int64_t bstride = bs * nh * hs + pad;
  const int64_t plane = nb * bstride;
  TestModel m;
  m.hints = Hint("NHD");
  ExpectedGroup g;
  for (int64_t l = 0; l < layers; ++l) {
    TestTensor t;
    t.desc = Desc("/pool", "bfloat16", {2, nb, bs, nh, hs}, {layers * plane, bstride, nh * hs, hs, 1},
                  l * plane, static_cast<uint64_t>(2 * layers * plane * 2));
    t.kv_dim = 0;
    t.block_dim = 1;
    t.token_dim = 2;
    g.tensors.push_back(m.tensors.size());
    m.Add(t);
  }
  m.groups = {g};
  return m;
}

TEST(CpuCopyTest, StridedViewsIntoOneSharedBuffer) {
  RoundTrip(SharedPoolBlocksFirst(0), 64, 2);
  RoundTrip(SharedPoolLayersFirst(0), 64, 2);
  RoundTrip(SharedPoolKvFirst(0), 64, 2);
}

// The vLLM CPU cache as views into one buffer per group (BLHNC-style), with padding
// after each block: the key/value split follows each view's strides and offset.
TestModel VllmCpuSharedPool(int64_t pad) {
  const int64_t nb = 16, layers = 3, nh = 2, bs = 32, c = 16;
  const int64_t page = nh * bs * c, bstride = layers * page + pad;
  TestModel m = VllmCpu(layers, nb, bs, nh, c / 2);
  m.segment_bytes.clear();
  for (int64_t l = 0; l < layers; ++l) {
    m.tensors[l].desc = Desc("/cpupool", "bfloat16", {nb, nh, bs, c}, {bstride, bs * c, c, 1},
                             l * page, static_cast<uint64_t>(nb * bstride * 2));
    m.segment_bytes["/cpupool"] = m.tensors[l].desc.nbytes;
  }
  return m;
}

TEST(CpuCopyTest, PaddedBlockStride) {
  RoundTrip(VllmCpuSharedPool(0), 64, 2);
  RoundTrip(VllmCpuSharedPool(40), 64, 2, {0, 37});
  RoundTrip(SharedPoolBlocksFirst(40), 64, 2, {0, 5});
  RoundTrip(SharedPoolLayersFirst(24), 64, 2, {17, 0});
  RoundTrip(SharedPoolKvFirst(8), 64, 2);
  // MLA rows padded to a larger pool row (DeepSeek-V4-style page padding).
  TestModel m = Mla(2, 12, 64);
  for (auto& t : m.tensors) t.desc = Desc(t.desc.shm_name, "bfloat16", {12, 64, 576}, {64 * 576 + 512, 576, 1});
  m.segment_bytes.clear();
  for (const auto& t : m.tensors) m.segment_bytes[t.desc.shm_name] = t.desc.nbytes;
  RoundTrip(m, 128, 2);
}

// Recurrent-state pages as lmcache 0.5.6 re-views them (_MambaPageViewEdit): a state row
// per block seen as [NB, BS, 1, W] with strides (S, W, W, 1) (NHD) or [NB, 1, BS, W] with
// strides (S, BS*W, W, 1) (HND), S > BS*W (page padding and sibling layers).
TEST(CpuCopyTest, RecurrentStatePageViews) {
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
    auto info = Info(0, {0, 1}, bs);
    info.recurrent_state = true;
    m.infos = {info};
    RoundTrip(m, 64, 2);
  }
}

// Hybrid: group 0 full attention (16 tokens/block) with an MTP draft layer registered
// after the target layers; group 1 sliding window (32 tokens/block). Chunk 256.
TestModel Hybrid() {
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
  return m;
}

TEST(CpuCopyTest, HybridTwoBlockSizesTwoBlockLists) { RoundTrip(Hybrid(), 256, 1, {0}, 2); }
TEST(CpuCopyTest, HybridSkip) { RoundTrip(Hybrid(), 256, 1, {48}, 4); }

TEST(CpuCopyTest, OneBufferSharedByTwoEngineGroups) {
  // vLLM hybrid allocation: layer 0 of group 0 and layer 0 of group 1 share one raw
  // tensor; each group uses its own block ids. Both must be stored and restored.
  TestModel m;
  m.hints = Hint("NHD");
  for (int i = 0; i < 2; ++i) {
    TestTensor t;
    t.desc = Desc("/shared", "bfloat16", {2, 40, 16, 2, 8});
    t.kv_dim = 0;
    t.block_dim = 1;
    t.token_dim = 2;
    m.Add(t);
  }
  m.infos = {Info(0, {0}, 16), Info(1, {1}, 16)};
  m.groups = {{{0}, 0}, {{1}, 1}};
  RoundTrip(m, 64, 2);
}

TEST(CpuCopyTest, AliasedTensorsAreStoredOnceAndExcludedOnesUntouched) {
  TestModel m;
  m.hints = Hint("NHD");
  auto kv = [](const std::string& shm) {
    TestTensor t;
    t.desc = Desc(shm, "bfloat16", {2, 20, 16, 2, 8});
    t.kv_dim = 0;
    t.block_dim = 1;
    t.token_dim = 2;
    return t;
  };
  m.Add(kv("/a"));       // 0
  m.Add(kv("/a"));       // 1: the same memory and view as 0
  m.Add(kv("/b"));       // 2
  m.Add(kv("/a"));       // 3: KV sharing, in no group
  m.Add(kv("/scratch"));  // 4: a scratch ring, in no group: must stay zero
  m.infos = {Info(0, {0, 1, 2}, 16)};
  m.groups = {{{0, 2}, 0}};
  KvLayout l = MustBuild(m, 32);
  EXPECT_EQ(l.object_bytes, 2u * 2 * 32 * 16 * 2);
  RoundTrip(m, 32, 2);
}

// ---- skip_tokens -------------------------------------------------------------------

TEST(CpuCopyTest, SkipTokensLeavesTheFirstTokensUntouched) {
  const std::vector<int64_t> skips = {1, 15, 16, 17, 63, 64, 100, -3};
  for (int64_t s : skips) {
    SCOPED_TRACE("skip " + std::to_string(s));
    RoundTrip(FlashAttention(2, 24, 16, 2, 8, Order::kNhd), 64, 2, {s, s});
    RoundTrip(FlashAttention(2, 24, 16, 2, 8, Order::kHndView), 64, 2, {s, 0});
    RoundTrip(PackedKv(2, 24, 16, 2, 8, true), 64, 2, {0, s});
    RoundTrip(Mla(2, 24, 16, 40), 64, 2, {s, s});
  }
}

TEST(CpuCopyTest, SkipTokensMiniMaxM3) {
  RoundTrip(MiniMaxM3(6, M3Main::kPackedHnd, "bfloat16", false, 8, 3), 256, 2, {128, 255});
  RoundTrip(MiniMaxM3(6, M3Main::kRank5, "bfloat16", true, 8, 3), 256, 2, {1, 129});
}

// ---- Threads ---------------------------------------------------------------------

void ExpectThreadsMatch(const TestModel& m, int64_t chunk_tokens, int64_t num_chunks, int threads) {
  KvLayout l = MustBuild(m, chunk_tokens);
  Buffers src = Buffers::Random(m, 11);
  BlockIds src_ids = PickIds(m, l, num_chunks, 21);
  BlockIds dst_ids = PickIds(m, l, num_chunks, 22);
  std::vector<std::vector<uint8_t>> one(num_chunks), many(num_chunks);
  std::vector<ChunkTask> tasks;
  for (int64_t c = 0; c < num_chunks; ++c) {
    one[c].resize(l.object_bytes);
    many[c].assign(l.object_bytes, 0xAB);
    GatherChunk(l, src.Bases(m), src_ids, c, one[c].data());
    tasks.push_back({c, many[c].data(), c == 0 ? 0 : 37});
  }
  GatherChunks(l, src.Bases(m), src_ids, tasks, threads);
  for (int64_t c = 0; c < num_chunks; ++c) EXPECT_TRUE(one[c] == many[c]) << "chunk " << c;

  Buffers a = Buffers::Zeroed(m), b = Buffers::Zeroed(m);
  for (int64_t c = 0; c < num_chunks; ++c) {
    ScatterChunk(l, a.Bases(m), dst_ids, c, one[c].data(), tasks[c].skip_tokens);
  }
  ScatterChunks(l, b.Bases(m), dst_ids, tasks, threads);
  ExpectSameBuffers(b, a);
}

TEST(CpuCopyTest, ThreadedGatherAndScatterMatchTheSingleThreadedOnes) {
  ExpectThreadsMatch(MiniMaxM3(8, M3Main::kPackedHnd, "bfloat16", true), 256, 3, 4);
  ExpectThreadsMatch(Hybrid(), 256, 1, 3);
  ExpectThreadsMatch(FlashAttention(3, 24, 16, 4, 32, Order::kHndView), 64, 3, 16);
  ExpectThreadsMatch(DeepSeekV32(3, 12), 256, 2, 2);
}

TEST(CpuCopyTest, ChunkTasksWithZeroOrOneThread) {
  ExpectThreadsMatch(Mla(2, 12, 64), 128, 2, 0);
  ExpectThreadsMatch(Mla(2, 12, 64), 128, 2, 1);
}

// ---- ValidateBlockIds ----------------------------------------------------------------

TEST(ValidateBlockIdsTest, AcceptsExactlyEnoughIdsInRange) {
  KvLayout l = MustBuild(Hybrid(), 256);
  BlockIds ids = {std::vector<int64_t>(32, 47), std::vector<int64_t>(16, 0)};
  EXPECT_TRUE(ValidateBlockIds(l, ids, 2).ok());
  EXPECT_TRUE(ValidateBlockIds(l, ids, 0).ok());
  ids[0].push_back(1000);  // beyond what the chunks use: not looked at
  EXPECT_TRUE(ValidateBlockIds(l, ids, 2).ok());
}

TEST(ValidateBlockIdsTest, WrongNumberOfLists) {
  KvLayout l = MustBuild(Hybrid(), 256);
  auto st = ValidateBlockIds(l, {std::vector<int64_t>(16, 0)}, 1);
  EXPECT_THAT(st.message(), AllOf(HasSubstr("1 group list(s)"), HasSubstr("has 2")));
  // lmcache 0.5.6 sends one list per engine_group_info: MiniMax-M3 split infos need two.
  KvLayout m3 = MustBuild(MiniMaxM3(4, M3Main::kPackedHnd, "bfloat16", true), 256);
  EXPECT_FALSE(ValidateBlockIds(m3, {{0, 1}}, 1).ok());
  EXPECT_TRUE(ValidateBlockIds(m3, {{0, 1}, {0, 1}}, 1).ok());
}

TEST(ValidateBlockIdsTest, TooFewIds) {
  KvLayout l = MustBuild(Hybrid(), 256);
  BlockIds ids = {std::vector<int64_t>(16, 0), std::vector<int64_t>(7, 0)};
  auto st = ValidateBlockIds(l, ids, 1);
  EXPECT_THAT(st.message(), AllOf(HasSubstr("block_ids[1] has 7 ids"), HasSubstr("need 8"),
                                  HasSubstr("32 tokens per block")));
  ids[1].resize(8);
  EXPECT_TRUE(ValidateBlockIds(l, ids, 1).ok());
  EXPECT_FALSE(ValidateBlockIds(l, ids, 2).ok());
}

TEST(ValidateBlockIdsTest, IdsOutOfRange) {
  KvLayout l = MustBuild(Hybrid(), 256);
  BlockIds ids = {std::vector<int64_t>(16, 0), std::vector<int64_t>(8, 0)};
  ids[0][5] = 48;
  EXPECT_THAT(ValidateBlockIds(l, ids, 1).message(),
              AllOf(HasSubstr("block id 48 at position 5 of block_ids[0]"), HasSubstr("[0, 48)")));
  ids[0][5] = -1;
  EXPECT_THAT(ValidateBlockIds(l, ids, 1).message(), HasSubstr("block id -1"));
  ids[0][5] = 47;
  EXPECT_TRUE(ValidateBlockIds(l, ids, 1).ok());
  EXPECT_FALSE(ValidateBlockIds(l, ids, -1).ok());
}

}  // namespace
}  // namespace kvd::transfer
