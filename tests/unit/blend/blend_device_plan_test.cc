// The CUDA blend scatter's device plan, executed on the host by the kernel's own code
// (EmulateBlendScatter, blend_device_math.h), against blend::ExecuteScatter: for every
// layout of scatter_test.cc the two write exactly the same bytes into the registered
// buffers (the keys also checked against the engine's keys at the new positions by
// scatter_test_util.h's independent check), with narrow words where the addresses are
// not 16-byte aligned, and the same outcomes and refusals as the CPU plan.
#include "blend/cuda/blend_device_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include "scatter_test_util.h"

namespace kvd::blend::cuda {
namespace {

using ::testing::HasSubstr;
using namespace kvd::blend::test_util;  // NOLINT

using Make = std::function<Scenario()>;

Make OneList(std::function<TestModel()> model, int64_t chunk, int64_t nb, int64_t tpb,
             std::vector<GroupKeys> keys) {
  return [=] {
    Scenario s;
    s.model = model();
    s.chunk = chunk;
    s.keys = keys;
    s.engine = &Engine500k();
    s.matches = ThreeMatches(chunk);
    s.ids = {ShuffledBlocks(nb, 3 * chunk / tpb, 42)};
    return s;
  };
}

// Objects copied to `misalign` bytes past a 16-byte boundary (0: as prepared).
struct Shifted {
  std::vector<std::vector<uint8_t>> storage;
  void Apply(Scenario& s, int64_t misalign) {
    if (misalign == 0) return;
    storage.clear();
    for (size_t i = 0; i < s.objects.size(); ++i) {
      const auto& b = s.objects[i].bytes;
      storage.emplace_back(b.size() + 32);
      uint8_t* p = storage.back().data();
      p += (16 - reinterpret_cast<uintptr_t>(p) % 16) % 16 + misalign;
      std::memcpy(p, b.data(), b.size());
      s.wire_matches[i].object = p;
    }
  }
};

// The CPU scatter and the emulated device plan over two identical scenarios: the same
// bytes everywhere; the emulated one also passes the independent check.
void ExpectSameAsCpu(const Make& make, KvElem elem, int64_t misalign = 0,
                     uint32_t want_win_word = 0) {
  Scenario cpu = make(), dev = make();
  ASSERT_TRUE(cpu.Prepare(3));
  ASSERT_TRUE(dev.Prepare(3));
  Shifted sc, sd;
  sc.Apply(cpu, misalign);
  sd.Apply(dev, misalign);
  auto r = cpu.Run();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(*r, RetrieveReason::kOk);
  auto plan = BuildBlendDevicePlan(dev.Request());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->reason, RetrieveReason::kOk);
  EXPECT_GT(plan->num_pieces, 0u);
  auto cpu_plan = PlanScatter(dev.Request());
  ASSERT_TRUE(cpu_plan.ok());
  EXPECT_EQ(plan->bytes, cpu_plan->bytes());
  if (want_win_word > 0) {
    EXPECT_EQ(plan->min_win_word, want_win_word) << DescribeBlendPlan(*plan);
  }
  EmulateBlendScatter(*plan);
  ASSERT_FALSE(dev.Untouched());
  for (const auto& [name, seg] : cpu.bufs.seg) {
    const auto& got = dev.bufs.seg.at(name);
    ASSERT_EQ(got.size(), seg.size());
    size_t diff = 0, first = seg.size();
    for (size_t i = 0; i < seg.size(); ++i) {
      if (got[i] != seg[i]) {
        ++diff;
        first = std::min(first, i);
      }
    }
    EXPECT_EQ(diff, 0u) << name << ": " << diff << " byte(s) differ from the CPU scatter, first at "
                        << first << " (" << DescribeBlendPlan(*plan) << ")";
  }
  RowError keys;
  dev.CheckScattered(&keys);
  if (keys.elems > 0) ExpectKeysExact(keys, elem);
}

TEST(BlendDevicePlanTest, FlashAttentionNhdAndHnd) {
  struct Case {
    Order order;
    const char* dtype;
    KvElem elem;
    RopeStyle style;
  };
  for (const Case& c : {Case{Order::kNhd, "bfloat16", KvElem::kBFloat16, RopeStyle::kNeox},
                        Case{Order::kNhd, "bfloat16", KvElem::kBFloat16, RopeStyle::kGptj},
                        Case{Order::kHndPhysical, "float16", KvElem::kFloat16, RopeStyle::kGptj},
                        Case{Order::kHndView, "float32", KvElem::kFloat32, RopeStyle::kNeox},
                        Case{Order::kNhd, "float32", KvElem::kFloat32, RopeStyle::kGptj}}) {
    SCOPED_TRACE(std::string(c.dtype) + (c.style == RopeStyle::kNeox ? " neox" : " gptj"));
    ExpectSameAsCpu(OneList([c] { return FlashAttention(3, 40, 16, 2, 64, c.order, c.dtype); }, 64,
                            40, 16, {{KeyRow(c.elem, c.style, 2, 64, 0, 64), Rope(64, c.style)}}),
                    c.elem, 0, 16);
  }
}

TEST(BlendDevicePlanTest, FlashInferNhdAndHnd) {
  for (Order order : {Order::kNhd, Order::kHndPhysical, Order::kHndView}) {
    ExpectSameAsCpu(OneList([order] { return FlashInfer(2, 40, 16, 4, 64, order); }, 64, 40, 16,
                            {{KeyRow(KvElem::kBFloat16, RopeStyle::kNeox, 4, 64, 0, 64),
                              Rope(64, RopeStyle::kNeox)}}),
                    KvElem::kBFloat16, 0, 16);
  }
}

TEST(BlendDevicePlanTest, PackedKvTurnsOnlyTheKeyHalf) {
  for (bool hnd : {true, false}) {
    ExpectSameAsCpu(OneList([hnd] { return PackedKv(2, 40, 16, 2, 64, hnd); }, 64, 40, 16,
                            {{KeyRow(KvElem::kBFloat16, RopeStyle::kNeox, 2, 128, 0, 64),
                              Rope(64, RopeStyle::kNeox)}}),
                    KvElem::kBFloat16, 0, 16);
  }
}

TEST(BlendDevicePlanTest, MlaLatentTurnsOnlyItsRopeWindow) {
  ExpectSameAsCpu(OneList([] { return Mla(2, 40, 16); }, 64, 40, 16,
                          {{KeyRow(KvElem::kBFloat16, RopeStyle::kGptj, 1, 576, 512, 64),
                            Rope(0, RopeStyle::kGptj, 512)}}),
                  KvElem::kBFloat16, 0, 16);
}

// vLLM's CPU cache (not a GPU layout, but the plan is layout-generic): transposed keys,
// one element per run, so every word is one element.
TEST(BlendDevicePlanTest, VllmCpuCacheWithTransposedKeys) {
  for (const char* dtype : {"bfloat16", "float32"}) {
    const KvElem e = std::string(dtype) == "float32" ? KvElem::kFloat32 : KvElem::kBFloat16;
    SCOPED_TRACE(dtype);
    Make base = OneList([dtype] { return VllmCpu(2, 40, 16, 2, 64, dtype); }, 64, 40, 16,
                        {{KeyRow(e, RopeStyle::kNeox, 2, 64, 0, 64), Rope(64, RopeStyle::kNeox)}});
    ExpectSameAsCpu(
        [base] {
          Scenario s = base();
          s.ids = {ShuffledBlocks(40, 3 * 64 / 16, 7)};
          return s;
        },
        e, 0, static_cast<uint32_t>(KvElemSize(e)));
  }
}

TEST(BlendDevicePlanTest, Fp8KeysAreDequantisedTurnedAndRequantised) {
  ExpectSameAsCpu(
      OneList([] { return FlashAttention(2, 40, 16, 2, 64, Order::kNhd, "uint8"); }, 64, 40, 16,
              {{KeyRow(KvElem::kFp8E4m3, RopeStyle::kNeox, 2, 64, 0, 64),
                Rope(64, RopeStyle::kNeox, 0, KvQuant::kFp8E4m3)}}),
      KvElem::kFp8E4m3, 0, 16);
  ExpectSameAsCpu(
      OneList(
          [] { return FlashAttention(2, 40, 16, 2, 64, Order::kNhd, "float8_e5m2"); }, 64, 40, 16,
          {{KeyRow(KvElem::kFp8E5m2, RopeStyle::kGptj, 2, 64, 0, 64), Rope(64, RopeStyle::kGptj)}}),
      KvElem::kFp8E5m2, 0, 16);
}

// MiniMax-M3: the packed main cache (64 of 128 dims, NeoX) and the key-only indexer, one
// table, blocks of 128, chunks of 256, matches not block-aligned.
TEST(BlendDevicePlanTest, MiniMaxM3MainAndIndexerShareOneRope) {
  for (bool split : {true, false}) {
    for (M3Main form : {M3Main::kPackedHnd, M3Main::kPackedNhd, M3Main::kRank5}) {
      SCOPED_TRACE(std::string(split ? "split infos, form " : "one info, form ") +
                   std::to_string(static_cast<int>(form)));
      ExpectSameAsCpu(
          [split, form] {
            Scenario s;
            s.model = MiniMaxM3(16, form, "bfloat16", split, 3, 1);
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
            return s;
          },
          KvElem::kBFloat16, 0, 16);
    }
  }
}

TEST(BlendDevicePlanTest, UnrotatedGroupsAreCopiedAsStored) {
  ExpectSameAsCpu(
      OneList([] { return FlashAttention(2, 40, 16, 2, 64, Order::kNhd); }, 64, 40, 16,
              {{KeyRow(KvElem::kBFloat16, RopeStyle::kNeox, 2, 64, 0, 0), GroupRope{}}}),
      KvElem::kBFloat16);
}

// Objects that are not 16-byte aligned: copy and window words narrow to what the
// addresses allow (the element), and the bytes stay the CPU's.
TEST(BlendDevicePlanTest, MisalignedObjectsUseNarrowWords) {
  for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptj}) {
    ExpectSameAsCpu(
        OneList([] { return FlashAttention(2, 40, 16, 2, 64, Order::kNhd); }, 64, 40, 16,
                {{KeyRow(KvElem::kBFloat16, style, 2, 64, 0, 64), Rope(64, style)}}),
        KvElem::kBFloat16, 2, 2);
    ExpectSameAsCpu(
        OneList([] { return FlashAttention(2, 40, 16, 2, 64, Order::kHndPhysical, "float32"); }, 64,
                40, 16, {{KeyRow(KvElem::kFloat32, style, 2, 64, 0, 64), Rope(64, style)}}),
        KvElem::kFloat32, 4, 4);
    ExpectSameAsCpu(
        OneList([] { return Mla(2, 40, 16); }, 64, 40, 16,
                {{KeyRow(KvElem::kBFloat16, style, 1, 576, 512, 64), Rope(0, style, 512)}}),
        KvElem::kBFloat16, 6, 2);
  }
}

// A piece is at most kBlendPieceBytes of rows, so a long chunk spans several pieces.
TEST(BlendDevicePlanTest, LongRowsSplitIntoPieces) {
  const Make make = OneList(
      [] { return FlashAttention(1, 40, 16, 8, 128, Order::kNhd); }, 64, 40, 16,
      {{KeyRow(KvElem::kBFloat16, RopeStyle::kNeox, 8, 128, 0, 64), Rope(128, RopeStyle::kNeox)}});
  Scenario s = make();
  ASSERT_TRUE(s.Prepare());
  auto plan = BuildBlendDevicePlan(s.Request());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  // 3 matches x 2 planes x 1 layer of 2 KiB rows, 16 rows per piece: 64, 55 and 24 rows.
  EXPECT_EQ(plan->num_jobs, 6u);
  EXPECT_EQ(plan->num_pieces, 2u * (4 + 4 + 2));
  EXPECT_EQ(plan->rotated_jobs, 2u);  // K of the two shifted matches; match 3 stays put
  ExpectSameAsCpu(make, KvElem::kBFloat16, 0, 16);
}

Scenario Small(std::vector<MatchSpec> matches, int64_t blocks) {
  Scenario s = OneList(
      [] { return FlashAttention(2, 40, 16, 2, 64, Order::kNhd); }, 64, 40, 16,
      {{KeyRow(KvElem::kBFloat16, RopeStyle::kNeox, 2, 64, 0, 64), Rope(64, RopeStyle::kNeox)}})();
  s.matches = std::move(matches);
  s.ids = {ShuffledBlocks(40, blocks, 5)};
  return s;
}

// lmcache's outcomes: deferred and straddling requests have nothing to launch.
TEST(BlendDevicePlanTest, OutcomesAgainstTheAllocation) {
  {
    Scenario s = Small({{64, 128, 64}}, 4);  // covers 64 positions: the match is beyond
    ASSERT_TRUE(s.Prepare());
    auto plan = BuildBlendDevicePlan(s.Request());
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(plan->reason, RetrieveReason::kMatchesBeyondAlloc);
    EXPECT_EQ(plan->num_pieces, 0u);
    EmulateBlendScatter(*plan);
    EXPECT_TRUE(s.Untouched());
  }
  {
    Scenario s = Small({{64, 40, 64}}, 4);  // 40..104 straddles 64
    ASSERT_TRUE(s.Prepare());
    auto plan = BuildBlendDevicePlan(s.Request());
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(plan->reason, RetrieveReason::kMatchesStraddleAlloc);
    EXPECT_EQ(plan->num_pieces, 0u);
    EmulateBlendScatter(*plan);
    EXPECT_TRUE(s.Untouched());
  }
}

// Refusals are PlanScatter's.
TEST(BlendDevicePlanTest, MalformedRequestsAreRefusedAsOnCpu) {
  Scenario s = Small({{0, 10, 64}, {64, 50, 64}}, 10);  // overlapping matches
  ASSERT_TRUE(s.Prepare());
  auto plan = BuildBlendDevicePlan(s.Request());
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().ToString(), HasSubstr("overlap"));
  EXPECT_EQ(plan.status().ToString(), PlanScatter(s.Request()).status().ToString());
}

TEST(BlendDevicePlanTest, ArgsPointIntoTheBlob) {
  Scenario s = Small({{0, 10, 64}}, 10);
  ASSERT_TRUE(s.Prepare());
  auto plan = BuildBlendDevicePlan(s.Request());
  ASSERT_TRUE(plan.ok());
  const BlendArgs a = BlendArgsAt(*plan, 0x100000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.pieces), 0x100000u + plan->at.pieces);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.delta), 0x100000u + plan->at.delta);
  for (uint64_t off : {plan->at.pieces, plan->at.jobs, plan->at.shapes, plan->at.layers,
                       plan->at.runs, plan->at.ids, plan->at.delta}) {
    EXPECT_EQ(off % 16, 0u);
    EXPECT_LE(off, plan->blob.size());
  }
  EXPECT_EQ(plan->blob.size() % 16, 0u);
}

}  // namespace
}  // namespace kvd::blend::cuda
