// Rope geometry: which rows of each registered layout are keys and where their windows
// lie (ResolveGroupRope), and how a cb_register_rope registration maps onto kernel groups
// (GroupRopesFor), with lmcache 0.5.6's rules for rope-less groups, declared windows,
// legacy registrations, and quantised groups.
#include "blend/rope_geometry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../layout/layout_test_util.h"
#include "rope_test_util.h"

namespace kvd::blend {
namespace {

using ::testing::HasSubstr;
using namespace kvd::layout::test_util;  // NOLINT
using namespace kvd::blend::test_util;   // NOLINT

const RopeTable& Table64() {
  static const RopeTable* t = new RopeTable(MustTable(MakeEngineTable(256, 64, 10000.0)));
  return *t;
}
const RopeTable& Table32() {
  static const RopeTable* t = new RopeTable(MustTable(MakeEngineTable(256, 32, 10000.0)));
  return *t;
}

layout::KvLayout MustBuild(const TestModel& m, int64_t chunk) {
  auto l = layout::BuildLayout(m.Descriptors(), m.hints, m.infos, chunk, m.options);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  return l.ok() ? std::move(l).value() : layout::KvLayout{};
}

GroupRope Rope(int64_t head_size, int64_t offset = 0, const RopeTable& t = Table64()) {
  GroupRope r;
  r.table = &t;
  r.rot_offset = offset;
  r.rot_width = t.rot_dim();
  r.head_size = head_size;
  return r;
}

TEST(RopeGeometryTest, KeyRowsOfEachLayout) {
  struct Case {
    const char* name;
    TestModel model;
    int64_t chunk;
    size_t group;
    GroupRope rope;
    int64_t heads, stride, offset;
    bool split;
    const char* form;
  };
  std::vector<Case> cases;
  cases.push_back({"flash attention", FlashAttention(2, 8, 16, 4, 64, Order::kHndView), 64, 0,
                   Rope(64), 4, 64, 0, false, "K plane"});
  cases.push_back({"flashinfer", FlashInfer(2, 8, 16, 4, 128, Order::kNhd), 64, 0, Rope(128), 4,
                   128, 0, false, "K plane"});
  cases.push_back({"packed", PackedKv(2, 8, 16, 2, 64, true), 64, 0, Rope(64), 2, 128, 0, false,
                   "packed [K|V] heads, K half"});
  cases.push_back({"mla", Mla(2, 8, 16), 64, 0, Rope(0, 512), 1, 576, 512, false,
                   "MLA latent, rope window closing the row"});
  cases.push_back(
      {"vllm cpu", VllmCpu(2, 8, 16, 2, 64), 64, 0, Rope(64), 2, 64, 0, true, "vLLM CPU K halves"});
  cases.push_back({"m3 main", MiniMaxM3(8, M3Main::kPackedHnd, "bfloat16", true, 2, 1), 256, 0,
                   Rope(128), 1, 256, 0, false, "packed [K|V] heads, K half"});
  cases.push_back({"m3 indexer", MiniMaxM3(8, M3Main::kPackedHnd, "bfloat16", true, 2, 1), 256, 1,
                   Rope(128), 1, 128, 0, false, "key-only rows"});
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const auto l = MustBuild(c.model, c.chunk);
    auto geo = ResolveGroupRope(l, c.group, c.rope);
    ASSERT_TRUE(geo.ok()) << geo.status().ToString();
    EXPECT_TRUE(geo->rotate);
    EXPECT_EQ(geo->split_kv_accesses, c.split);
    EXPECT_EQ(geo->row.num_heads, c.heads);
    EXPECT_EQ(geo->row.head_stride, c.stride);
    EXPECT_EQ(geo->row.rot_offset, c.offset);
    EXPECT_EQ(geo->row.rot_dim, 64);
    EXPECT_EQ(geo->form, c.form);
    auto off = ResolveGroupRope(l, c.group, GroupRope{});
    ASSERT_TRUE(off.ok());
    EXPECT_FALSE(off->rotate);
  }
}

TEST(RopeGeometryTest, GeometriesThatDoNotFitAreRefused) {
  const auto fa = MustBuild(FlashAttention(2, 8, 16, 4, 64, Order::kNhd), 64);
  const auto mla = MustBuild(Mla(2, 8, 16), 64);
  auto refuse = [](const layout::KvLayout& l, GroupRope r, const std::string& why) {
    auto geo = ResolveGroupRope(l, 0, r);
    ASSERT_FALSE(geo.ok()) << why;
    EXPECT_THAT(geo.status().message(), HasSubstr(why));
  };
  refuse(fa, Rope(48), "not a multiple of the per-head width 48");
  refuse(fa, Rope(32), "rot_dim 64 exceeds head_size 32");
  refuse(fa, Rope(0), "head_size 0");
  refuse(fa, Rope(64, 4), "needs a single-plane latent");
  GroupRope narrow = Rope(64);
  narrow.rot_width = 32;
  refuse(fa, narrow, "the table's width 64");
  refuse(mla, Rope(0, 500), "does not close the row of 576");
  GroupRope fp8 = Rope(64);
  fp8.kv_quant = KvQuant::kFp8E4m3;
  const auto u8 = MustBuild(FlashAttention(2, 8, 16, 4, 64, Order::kNhd, "uint8"), 64);
  EXPECT_TRUE(ResolveGroupRope(u8, 0, fp8).ok());
  refuse(u8, Rope(64), "kv_quant");
  const auto i8 = MustBuild(FlashAttention(2, 8, 16, 4, 64, Order::kNhd, "int8"), 64);
  refuse(i8, Rope(64), "cannot rotate a int8");
  EXPECT_FALSE(ResolveGroupRope(fa, 1, Rope(64)).ok());
}

RopeRegistration Legacy() {
  RopeRegistration r;
  r.tables = {&Table64()};
  r.head_size = 64;
  r.is_neox_style = false;
  return r;
}

TEST(RopeGeometryTest, LegacyRegistrationTurnsEveryGroupByTheTableWidth) {
  const auto l = MustBuild(FlashAttention(2, 8, 16, 4, 64, Order::kNhd), 64);
  auto ropes = GroupRopesFor(l, {}, Legacy());
  ASSERT_TRUE(ropes.ok()) << ropes.status().ToString();
  ASSERT_EQ(ropes->size(), 1u);
  EXPECT_EQ((*ropes)[0].table, &Table64());
  EXPECT_EQ((*ropes)[0].rot_offset, 0);
  EXPECT_EQ((*ropes)[0].rot_width, 64);
  EXPECT_EQ((*ropes)[0].head_size, 64);
  EXPECT_EQ((*ropes)[0].style, RopeStyle::kGptj);
  // NoPE: no tables, nothing turned.
  RopeRegistration nope = Legacy();
  nope.tables.clear();
  ropes = GroupRopesFor(l, {}, nope);
  ASSERT_TRUE(ropes.ok());
  EXPECT_EQ((*ropes)[0].table, nullptr);
}

// MiniMax-M3 as lmcache sends it: two infos naming engine group 0; one rope for both.
TEST(RopeGeometryTest, EngineGroupIdsSelectCachesWindowsAndHeadSizes) {
  const auto l = MustBuild(MiniMaxM3(8, M3Main::kPackedHnd, "bfloat16", true, 2, 1), 256);
  RopeRegistration r = Legacy();
  r.tables = {&Table32(), &Table64()};
  r.group_to_cache = {1};
  r.group_rot = {{0, 128}};  // a width other than rot_dim at offset 0: the table's
  r.group_head_size = {128};
  r.is_neox_style = true;
  auto ropes = GroupRopesFor(l, {0, 0}, r);
  ASSERT_TRUE(ropes.ok()) << ropes.status().ToString();
  ASSERT_EQ(ropes->size(), 2u);
  for (const auto& g : *ropes) {
    EXPECT_EQ(g.table, &Table64());
    EXPECT_EQ(g.rot_width, 64);
    EXPECT_EQ(g.head_size, 128);
    EXPECT_EQ(g.style, RopeStyle::kNeox);
  }
  // Rope-less (-1) and skipped ([]) engine groups.
  r.group_to_cache = {-1};
  ropes = GroupRopesFor(l, {0, 0}, r);
  ASSERT_TRUE(ropes.ok());
  EXPECT_EQ((*ropes)[0].table, nullptr);
  EXPECT_EQ((*ropes)[1].table, nullptr);
  r.group_to_cache = {1};
  r.group_rot = {{}};
  ropes = GroupRopesFor(l, {0, 0}, r);
  ASSERT_TRUE(ropes.ok());
  EXPECT_EQ((*ropes)[0].table, nullptr);
}

TEST(RopeGeometryTest, MalformedRegistrationsAreRefused) {
  const auto l = MustBuild(MiniMaxM3(8, M3Main::kPackedHnd, "bfloat16", true, 2, 1), 256);
  auto refuse = [&](RopeRegistration r, std::vector<int64_t> ids, const std::string& why) {
    auto ropes = GroupRopesFor(l, ids, r);
    ASSERT_FALSE(ropes.ok()) << why;
    EXPECT_EQ(ropes.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(ropes.status().message(), HasSubstr(why));
  };
  RopeRegistration r = Legacy();
  r.head_size = 128;
  ASSERT_TRUE(GroupRopesFor(l, {0, 1}, r).ok());
  r.group_to_cache = {0, 1};
  refuse(r, {0, 1}, "group_to_cache[1] = 1 is outside [-1, 1)");
  r.group_to_cache = {-2};
  refuse(r, {0, 0}, "is outside [-1, 1)");
  r.group_to_cache = {0};
  refuse(r, {0, 1}, "group_to_cache covers 1 engine group(s)");
  r.group_to_cache = {};
  r.group_rot = {{0}};
  refuse(r, {0, 0}, "group_rot[0]: expected [offset >= 0, width > 0] or []");
  r.group_rot = {{-1, 64}};
  refuse(r, {0, 0}, "group_rot[0]");
  r.group_rot = {{0, 0}};
  refuse(r, {0, 0}, "group_rot[0]");
  r.group_rot = {{0, 64}};
  refuse(r, {0, 1}, "engine group 1 has no window");
  r.group_rot = {};
  r.group_head_size = {0};
  refuse(r, {0, 0}, "group_head_size[0] is not positive");
  r.group_head_size = {};
  r.tables = {nullptr};
  refuse(r, {0, 0}, "table 0 is null");
  refuse(Legacy(), {0}, "1 engine group id(s) for 2 block-id list(s)");
  refuse(Legacy(), {0, -1}, "negative engine group id");
  RopeRegistration mla = Legacy();
  mla.group_rot = {{512, 32}};
  refuse(mla, {0, 0}, "the table's width 64");
}

// Quantised pages: a declared map leaves what kvd cannot read as stored (as lmcache does
// for every non-float group), turns fp8 with a flavour; a legacy registration refuses.
TEST(RopeGeometryTest, QuantisedGroupsUnderDeclaredAndLegacyMaps) {
  const auto u8 = MustBuild(FlashAttention(2, 8, 16, 4, 64, Order::kNhd, "uint8"), 64);
  RopeRegistration r = Legacy();
  r.group_rot = {{0, 64}};
  std::vector<std::string> skipped;
  auto ropes = GroupRopesFor(u8, {}, r, &skipped);
  ASSERT_TRUE(ropes.ok());
  EXPECT_EQ((*ropes)[0].table, nullptr);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_THAT(skipped[0], HasSubstr("no kv_quant"));
  r.kv_quant = KvQuant::kFp8E5m2;
  ropes = GroupRopesFor(u8, {}, r);
  ASSERT_TRUE(ropes.ok());
  EXPECT_EQ((*ropes)[0].table, &Table64());
  EXPECT_EQ((*ropes)[0].kv_quant, KvQuant::kFp8E5m2);
  // Legacy (no window map): a uint8 page without a flavour cannot be turned.
  EXPECT_THAT(GroupRopesFor(u8, {}, Legacy()).status().message(), HasSubstr("kv_quant"));
  // DeepSeek-V3.2: fp8_ds_mla and DSA indexer pages (uint8 rows with scales and a bf16
  // rope part) are left as stored even with a flavour declared.
  const auto ds = MustBuild(DeepSeekV32(2, 8), 64);
  RopeRegistration d = Legacy();
  d.group_rot = {{512, 64}};
  d.kv_quant = KvQuant::kFp8E4m3;
  skipped.clear();
  ropes = GroupRopesFor(ds, {}, d, &skipped);
  ASSERT_TRUE(ropes.ok()) << ropes.status().ToString();
  EXPECT_EQ((*ropes)[0].table, nullptr);
  EXPECT_EQ((*ropes)[1].table, nullptr);
  EXPECT_EQ(skipped.size(), 2u);
}

}  // namespace
}  // namespace kvd::blend
