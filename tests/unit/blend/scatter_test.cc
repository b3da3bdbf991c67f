// The CacheBlend CPU scatter over every layout kvd registers: stored objects put at
// request positions that are not block-aligned, keys turned from their old positions,
// values and unrotated rows byte-identical, and nothing else in the registered buffers
// touched (scatter_test_util.h). Then lmcache's all-or-nothing outcomes and the requests
// that must be refused before a byte moves.
#include "blend/scatter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "scatter_test_util.h"

namespace kvd::blend {
namespace {

using ::testing::HasSubstr;
using namespace kvd::blend::test_util;  // NOLINT

// Runs a scenario whose block tables cover every match and checks the result.
void ExpectScatter(Scenario& s, KvElem elem) {
  ASSERT_TRUE(s.Prepare());
  auto r = s.Run();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, RetrieveReason::kOk);
  RowError keys;
  s.CheckScattered(&keys);
  ExpectKeysExact(keys, elem);
}

Scenario OneListScenario(TestModel m, int64_t chunk, int64_t nb, int64_t tpb,
                         std::vector<GroupKeys> keys) {
  Scenario s;
  s.model = std::move(m);
  s.chunk = chunk;
  s.keys = std::move(keys);
  s.engine = &Engine500k();
  s.matches = ThreeMatches(chunk);
  s.ids = {ShuffledBlocks(nb, 3 * chunk / tpb, 42)};
  return s;
}

TEST(ScatterTest, FlashAttentionNhdAndHnd) {
  struct Case {
    Order order;
    const char* dtype;
    KvElem elem;
    RopeStyle style;
  };
  for (const Case& c : {Case{Order::kNhd, "bfloat16", KvElem::kBFloat16, RopeStyle::kNeox},
                        Case{Order::kHndPhysical, "float16", KvElem::kFloat16, RopeStyle::kGptj},
                        Case{Order::kHndView, "float32", KvElem::kFloat32, RopeStyle::kNeox}}) {
    SCOPED_TRACE(c.dtype);
    auto s = OneListScenario(FlashAttention(3, 40, 16, 2, 64, c.order, c.dtype), 64, 40, 16,
                             {{KeyRow(c.elem, c.style, 2, 64, 0, 64), Rope(64, c.style)}});
    ExpectScatter(s, c.elem);
  }
}

TEST(ScatterTest, FlashInferNhdAndHnd) {
  for (Order order : {Order::kNhd, Order::kHndPhysical, Order::kHndView}) {
    auto s = OneListScenario(
        FlashInfer(2, 40, 16, 4, 64, order), 64, 40, 16,
        {{KeyRow(KvElem::kBFloat16, RopeStyle::kNeox, 4, 64, 0, 64), Rope(64, RopeStyle::kNeox)}});
    ExpectScatter(s, KvElem::kBFloat16);
  }
}

// Packed [K|V] heads: only the K half of each head turns; the V half is copied.
TEST(ScatterTest, PackedKvTurnsOnlyTheKeyHalf) {
  for (bool hnd : {true, false}) {
    auto s = OneListScenario(
        PackedKv(2, 40, 16, 2, 64, hnd), 64, 40, 16,
        {{KeyRow(KvElem::kBFloat16, RopeStyle::kNeox, 2, 128, 0, 64), Rope(64, RopeStyle::kNeox)}});
    ExpectScatter(s, KvElem::kBFloat16);
  }
}

// MLA latent [NB, BS, 576]: the rope part closes the row (GPT-J pairs, as DeepSeek).
TEST(ScatterTest, MlaLatentTurnsOnlyItsRopeWindow) {
  auto s = OneListScenario(Mla(2, 40, 16), 64, 40, 16,
                           {{KeyRow(KvElem::kBFloat16, RopeStyle::kGptj, 1, 576, 512, 64),
                             Rope(0, RopeStyle::kGptj, 512)}});
  ExpectScatter(s, KvElem::kBFloat16);
}

// vLLM's CPU cache with VEC kernels: K is [HS][BS] per (block, head), V [BS][HS].
TEST(ScatterTest, VllmCpuCacheWithTransposedKeys) {
  for (int64_t bs : {16, 32}) {
    for (const char* dtype : {"bfloat16", "float32"}) {
      const KvElem e = std::string(dtype) == "float32" ? KvElem::kFloat32 : KvElem::kBFloat16;
      SCOPED_TRACE(std::string(dtype) + " block " + std::to_string(bs));
      auto s = OneListScenario(
          VllmCpu(2, 40, bs, 2, 64, dtype), 64, 40, bs,
          {{KeyRow(e, RopeStyle::kNeox, 2, 64, 0, 64), Rope(64, RopeStyle::kNeox)}});
      s.ids = {ShuffledBlocks(40, 3 * 64 / bs, 7)};
      ExpectScatter(s, e);
    }
  }
}

// fp8 caches: vLLM's uint8 pages with a declared flavour, and torch float8 dtypes.
TEST(ScatterTest, Fp8KeysAreDequantisedTurnedAndRequantised) {
  auto a = OneListScenario(FlashAttention(2, 40, 16, 2, 64, Order::kNhd, "uint8"), 64, 40, 16,
                           {{KeyRow(KvElem::kFp8E4m3, RopeStyle::kNeox, 2, 64, 0, 64),
                             Rope(64, RopeStyle::kNeox, 0, KvQuant::kFp8E4m3)}});
  ExpectScatter(a, KvElem::kFp8E4m3);
  auto b = OneListScenario(
      FlashAttention(2, 40, 16, 2, 64, Order::kNhd, "float8_e5m2"), 64, 40, 16,
      {{KeyRow(KvElem::kFp8E5m2, RopeStyle::kGptj, 2, 64, 0, 64), Rope(64, RopeStyle::kGptj)}});
  ExpectScatter(b, KvElem::kFp8E5m2);
}

// MiniMax-M3-like: one engine group holding the packed main cache (64 of 128 dims rotary,
// NeoX) and the key-only indexer cache (post-RoPE keys, the same rotation), both turned
// with the one table; blocks of 128, chunks of 256.
TEST(ScatterTest, MiniMaxM3MainAndIndexerShareOneRope) {
  for (bool split : {true, false}) {
    for (M3Main form : {M3Main::kPackedHnd, M3Main::kRank5}) {
      SCOPED_TRACE(std::string(split ? "split infos " : "one info ") +
                   (form == M3Main::kRank5 ? "rank 5" : "packed"));
      Scenario s;
      s.model = MiniMaxM3(16, form, "bfloat16", split, /*layers=*/3, /*first_sparse=*/1);
      s.chunk = 256;
      const int64_t main_stride = form == M3Main::kRank5 ? 128 : 256;
      s.keys = {{KeyRow(KvElem::kBFloat16, RopeStyle::kNeox, 1, main_stride, 0, 64),
                 Rope(128, RopeStyle::kNeox)},
                {KeyRow(KvElem::kBFloat16, RopeStyle::kNeox, 1, 128, 0, 64),
                 Rope(128, RopeStyle::kNeox)}};
      s.engine = &Engine500k();
      s.matches = {{256, 300, 256}, {1024, 600, 200}};
      const auto table = ShuffledBlocks(16, 7, 9);
      s.ids = split ? BlockIds{table, table} : BlockIds{table};
      ExpectScatter(s, KvElem::kBFloat16);
    }
  }
}

// A group without a rope (NoPE, rope-less group) is copied as stored even when shifted.
TEST(ScatterTest, UnrotatedGroupsAreCopiedAsStored) {
  auto s =
      OneListScenario(FlashAttention(2, 40, 16, 2, 64, Order::kNhd), 64, 40, 16,
                      {{KeyRow(KvElem::kBFloat16, RopeStyle::kNeox, 2, 64, 0, 0), GroupRope{}}});
  ASSERT_TRUE(s.Prepare());
  ASSERT_TRUE(s.Run().ok());
  RowError keys;
  s.CheckScattered(&keys);
  EXPECT_EQ(keys.elems, 0);  // every row compared byte for byte
}

TEST(ScatterTest, NoMatchesWriteNothing) {
  auto s = OneListScenario(
      FlashAttention(2, 40, 16, 2, 64, Order::kNhd), 64, 40, 16,
      {{KeyRow(KvElem::kBFloat16, RopeStyle::kNeox, 2, 64, 0, 64), Rope(64, RopeStyle::kNeox)}});
  s.matches.clear();
  ASSERT_TRUE(s.Prepare());
  auto r = s.Run();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, RetrieveReason::kOk);
  EXPECT_TRUE(s.Untouched());
}

// ---- lmcache's all-or-nothing outcome against the allocation ---------------------------

Scenario Allocation(std::vector<MatchSpec> matches, int64_t blocks) {
  auto s = OneListScenario(
      FlashAttention(2, 40, 16, 2, 64, Order::kNhd), 64, 40, 16,
      {{KeyRow(KvElem::kBFloat16, RopeStyle::kNeox, 2, 64, 0, 64), Rope(64, RopeStyle::kNeox)}});
  s.matches = std::move(matches);
  s.ids = {ShuffledBlocks(40, blocks, 3)};
  return s;
}

TEST(ScatterTest, MatchesBeyondTheAllocationAreDeferred) {
  auto s = Allocation({{0, 64, 64}, {64, 130, 64}}, 4);  // 4 blocks: 64 tokens
  ASSERT_TRUE(s.Prepare());
  auto plan = PlanScatter(s.Request());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->reason(), RetrieveReason::kMatchesBeyondAlloc);
  EXPECT_TRUE(ScatterRan(plan->reason()));
  EXPECT_EQ(plan->slot_bound(), 64);
  EXPECT_EQ(plan->num_matches(), 0u);
  ExecuteScatter(*plan);
  EXPECT_TRUE(s.Untouched());
}

TEST(ScatterTest, MatchesStraddlingTheAllocationFailAndWriteNothing) {
  // 5 blocks: 80 tokens. One match across the bound; then one wholly inside and one
  // wholly beyond (the client would forward tokens of both: refused as well).
  for (auto matches :
       {std::vector<MatchSpec>{{0, 40, 64}}, std::vector<MatchSpec>{{0, 0, 64}, {64, 96, 64}}}) {
    auto s = Allocation(matches, 5);
    ASSERT_TRUE(s.Prepare());
    auto r = s.Run();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, RetrieveReason::kMatchesStraddleAlloc);
    EXPECT_FALSE(ScatterRan(*r));
    EXPECT_TRUE(s.Untouched());
  }
}

TEST(ScatterTest, AMatchEndingAtTheBoundIsScattered) {
  auto s = Allocation({{128, 16, 64}}, 5);  // tokens 16..79 of 80
  ExpectScatter(s, KvElem::kBFloat16);
}

// Two block-id lists: the bound is the shorter one's.
TEST(ScatterTest, TheBoundIsTheShortestBlockTable) {
  Scenario s;
  s.model = MiniMaxM3(16, M3Main::kPackedHnd, "bfloat16", /*split=*/true, 2, 1);
  s.chunk = 256;
  s.keys = {
      {KeyRow(KvElem::kBFloat16, RopeStyle::kNeox, 1, 256, 0, 64), Rope(128, RopeStyle::kNeox)},
      {KeyRow(KvElem::kBFloat16, RopeStyle::kNeox, 1, 128, 0, 64), Rope(128, RopeStyle::kNeox)}};
  s.engine = &Engine500k();
  s.matches = {{0, 256, 256}};
  const auto table = ShuffledBlocks(16, 4, 1);
  s.ids = {table, std::vector<int64_t>(table.begin(), table.begin() + 2)};  // 512 vs 256
  ASSERT_TRUE(s.Prepare());
  auto plan = PlanScatter(s.Request());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->slot_bound(), 256);
  EXPECT_EQ(plan->reason(), RetrieveReason::kMatchesBeyondAlloc);
}

// ---- Refused before a byte moves ---------------------------------------------------------

void ExpectRefused(Scenario& s, const std::string& why) {
  auto plan = PlanScatter(s.Request());
  ASSERT_FALSE(plan.ok()) << why;
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr(why));
  EXPECT_TRUE(s.Untouched());
}

Scenario Small() {
  auto s = Allocation({{20, 20, 64}, {64, 100, 64}}, 12);
  EXPECT_TRUE(s.Prepare());
  return s;
}

TEST(ScatterTest, BadBlockIdsAreRefused) {
  for (int64_t bad : {int64_t{-1}, int64_t{40}, int64_t{1} << 40}) {
    auto s = Small();
    s.ids[0][3] = bad;
    ExpectRefused(s, "block_ids[0][3] = " + std::to_string(bad) + " is outside");
  }
  auto s = Small();
  s.null_block_id = s.ids[0][2];
  ExpectRefused(s, "is the null block");
  s = Small();
  s.ids[0][4] = s.ids[0][1];
  ExpectRefused(s, "appears twice");
  s = Small();
  s.ids.push_back(s.ids[0]);
  ExpectRefused(s, "block_ids has 2 list(s), the registered layout has 1");
  // A block id the matches do not use is not looked at.
  s = Small();
  s.ids[0][11] = -5;
  EXPECT_TRUE(PlanScatter(s.Request()).ok());
}

TEST(ScatterTest, OverlappingMatchesAreRefused) {
  auto s = Small();
  s.wire_matches[1].cur_st = 20 + 63;
  ExpectRefused(s, "overlap in request positions");
  s.wire_matches[1].cur_st = 20 + 64;  // adjacent is fine
  EXPECT_TRUE(PlanScatter(s.Request()).ok());
}

TEST(ScatterTest, MalformedMatchesAreRefused) {
  auto s = Small();
  s.wire_matches[0].object_bytes -= 1;
  ExpectRefused(s, "bytes, the layout's are");
  s = Small();
  s.wire_matches[0].object = nullptr;
  ExpectRefused(s, "bytes, the layout's are");
  s = Small();
  s.wire_matches[0].n_tokens = 0;
  ExpectRefused(s, "a match covers 1 to 64 tokens");
  s = Small();
  s.wire_matches[0].n_tokens = 65;
  ExpectRefused(s, "a match covers 1 to 64 tokens");
  s = Small();
  s.wire_matches[0].cur_st = -16;
  ExpectRefused(s, "positions must be in");
  s = Small();
  s.wire_matches[0].old_st = int64_t{1} << 62;
  ExpectRefused(s, "positions must be in");
  s = Small();
  s.wire_matches[0].old_st = 4096 - 10;  // beyond the rope table
  ExpectRefused(s, "beyond the rope table's 4096");
}

TEST(ScatterTest, MalformedMappingsAndRopeAreRefused) {
  auto s = Small();
  s.sizes[1] -= 1;
  ExpectRefused(s, "are mapped");
  s = Small();
  s.bases[0] = nullptr;
  ExpectRefused(s, "registered tensor 0 has no mapping");
  s = Small();
  s.sizes.pop_back();
  ExpectRefused(s, "registered tensor 1 has no mapping");
  s = Small();
  s.ropes.push_back(GroupRope{});
  ExpectRefused(s, "rope given for 2 kernel group(s)");
  s = Small();
  s.ropes[0].rot_width = 32;
  ExpectRefused(s, "the table's width 64");
  s = Small();
  s.ropes[0].head_size = 48;
  ExpectRefused(s, "not a multiple of the per-head width 48");
  s = Small();
  s.ropes[0].rot_offset = 8;
  ExpectRefused(s, "needs a single-plane latent");
}

TEST(ScatterTest, CpuCachesOfUnknownKernelsAreRefused) {
  Scenario s =
      OneListScenario(VllmCpu(2, 40, 16, 2, 64), 64, 40, 16,
                      {{KeyRow(KvElem::kBFloat16, RopeStyle::kNeox, 2, 64, 0, 64), GroupRope{}}});
  s.model.options.vllm_cpu = layout::VllmCpuKernels::kUnknown;
  auto l =
      layout::BuildLayout(s.model.Descriptors(), s.model.hints, s.model.infos, 64, s.model.options);
  ASSERT_TRUE(l.ok());
  s.layout = *l;
  s.bufs = Buffers::Random(s.model, 1);
  s.bases = s.bufs.Bases(s.model);
  for (const auto& t : s.model.tensors) s.sizes.push_back(s.bufs.seg.at(t.desc.shm_name).size());
  EXPECT_THAT(PlanScatter(s.Request()).status().message(), HasSubstr("not token rows"));
}

TEST(ScatterTest, PlanCountsWhatItWillWrite) {
  auto s = Small();
  auto plan = PlanScatter(s.Request());
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->num_matches(), 2u);
  EXPECT_EQ(plan->num_rotated_matches(), 1u);  // the second one moves, the first does not
  // 2 matches x 64 tokens x (K + V) x 2 layers x 2 heads x 64 x 2 bytes.
  EXPECT_EQ(plan->bytes(), 2u * 64 * 2 * 2 * 128 * 2);
}

}  // namespace
}  // namespace kvd::blend
