// Re-RoPE exactness: keys stored at position p and turned to q must be the keys the
// engine writes at q from the same cos/sin cache (rope_test_util.h builds both), for
// NeoX and GPT-J pairs, full and partial rotary, an MLA window, and every storage type.
// Plus: p -> q -> p is the identity within the same bounds, p == q touches nothing, the
// mscale is stripped, and malformed tables and geometries are refused.
#include "blend/rope.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "rope_test_util.h"

namespace kvd::blend {
namespace {

using ::testing::HasSubstr;
using namespace kvd::blend::test_util;  // NOLINT

constexpr int64_t kPositions = 65536;

// Real tables, built once per (base, dtype, scale).
const EngineTable& Engine(double base, const std::string& dtype = "float32", double scale = 1.0,
                          int64_t rot = 64) {
  static auto* cache = new std::map<std::tuple<double, std::string, double, int64_t>,
                                    std::unique_ptr<EngineTable>>();
  auto& slot = (*cache)[{base, dtype, scale, rot}];
  if (!slot)
    slot = std::make_unique<EngineTable>(MakeEngineTable(kPositions, rot, base, dtype, scale));
  return *slot;
}
const RopeTable& Table(double base, const std::string& dtype = "float32", double scale = 1.0) {
  static auto* cache =
      new std::map<std::tuple<double, std::string, double>, std::unique_ptr<RopeTable>>();
  auto& slot = (*cache)[{base, dtype, scale}];
  if (!slot) slot = std::make_unique<RopeTable>(MustTable(Engine(base, dtype, scale)));
  return *slot;
}

struct Shape {
  const char* name;
  int64_t heads, head_stride, rot_offset;
};
// Llama: 8 heads of 64, all 64 dims rotary. M3-like: heads of 128, the first 64 rotary.
// MLA-like: one 576-element latent row whose last 64 elements are the rope part.
const Shape kShapes[] = {
    {"llama_64_of_64", 8, 64, 0}, {"m3_64_of_128", 2, 128, 0}, {"mla_512_plus_64", 1, 576, 512}};
const std::pair<int64_t, int64_t> kMoves[] = {{0, 1},       {5, 300},       {1000, 17},
                                              {300, 40000}, {12345, 65000}, {65535, 0}};

KRowGeometry Geo(const Shape& s, KvElem e, RopeStyle style) {
  KRowGeometry g;
  g.elem = e;
  g.style = style;
  g.num_heads = s.heads;
  g.head_stride = s.head_stride;
  g.rot_offset = s.rot_offset;
  g.rot_dim = 64;
  return g;
}

// Turns `rows` random rows p -> q for every move and compares with the engine's row at q.
RowError Measure(const Shape& s, KvElem e, RopeStyle style, double base,
                 const std::string& table_dtype = "float32", int rows = 40) {
  const EngineTable& engine = Engine(base, table_dtype);
  const RopeTable& table = Table(base, table_dtype);
  const KRowGeometry g = Geo(s, e, style);
  std::mt19937_64 rng(static_cast<uint64_t>(base) + static_cast<uint64_t>(e) * 131 +
                      static_cast<uint64_t>(style) * 7 + static_cast<uint64_t>(s.head_stride));
  RowError total;
  for (auto [p, q] : kMoves) {
    for (int r = 0; r < rows; ++r) {
      const auto raw = RawRow(g, rng);
      auto row = KeyAt(raw, g, engine, p);
      const auto want = KeyAt(raw, g, engine, q);
      Status st = RotateK(table, p, q, g, row);
      EXPECT_TRUE(st.ok()) << st.ToString();
      total.Merge(CompareRows(row.data(), want.data(), g));
    }
  }
  return total;
}

TEST(RopeTest, Fp32MatchesKeysBuiltAtTheNewPosition) {
  for (double base : {10000.0, 500000.0}) {
    for (const auto& s : kShapes) {
      for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptj}) {
        const RowError e = Measure(s, KvElem::kFloat32, style, base);
        SCOPED_TRACE(std::string(s.name) + " base " + std::to_string(base) +
                     (style == RopeStyle::kNeox ? " neox" : " gptj"));
        EXPECT_GT(e.elems, 0);
        EXPECT_LE(e.max_rel, 1e-5);
        EXPECT_TRUE(e.outside_same);
      }
    }
  }
}

// bf16 and fp16: within 1 ulp on >= 99.9% of the rotated elements, 2 ulp at most. fp8
// (3 or 2 mantissa bits): the same bounds; the stored key is already rounded to fp8, so
// the rounding of the result is what the bound measures.
TEST(RopeTest, NarrowTypesWithinOneUlpOfKeysBuiltAtTheNewPosition) {
  for (KvElem e : {KvElem::kBFloat16, KvElem::kFloat16, KvElem::kFp8E4m3, KvElem::kFp8E5m2}) {
    for (double base : {10000.0, 500000.0}) {
      for (const auto& s : kShapes) {
        for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptj}) {
          const RowError err = Measure(s, e, style, base);
          SCOPED_TRACE(std::string(KvElemName(e)) + " " + s.name + " base " + std::to_string(base) +
                       (style == RopeStyle::kNeox ? " neox" : " gptj"));
          EXPECT_GE(err.Fraction(), 0.999) << err.within_one << " of " << err.elems;
          EXPECT_LE(err.max_ulp, 2.0);
          EXPECT_TRUE(err.outside_same);
        }
      }
    }
  }
}

// An engine that keeps its cos/sin cache in bf16 rotates by entries that are not of unit
// length; undoing exactly what it did at p gives its keys at q.
TEST(RopeTest, Bf16TableMatchesTheEngineThatUsedIt) {
  for (KvElem e : {KvElem::kFloat32, KvElem::kBFloat16}) {
    for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptj}) {
      const RowError err = Measure(kShapes[0], e, style, 500000.0, "bfloat16");
      SCOPED_TRACE(KvElemName(e));
      if (e == KvElem::kFloat32) {
        EXPECT_LE(err.max_rel, 1e-5);
      } else {
        EXPECT_GE(err.Fraction(), 0.999);
        EXPECT_LE(err.max_ulp, 2.0);
      }
    }
  }
}

TEST(RopeTest, ThereAndBackIsTheIdentity) {
  const RopeTable& table = Table(500000.0);
  for (KvElem e : {KvElem::kFloat32, KvElem::kBFloat16, KvElem::kFloat16, KvElem::kFp8E4m3,
                   KvElem::kFp8E5m2}) {
    for (const auto& s : kShapes) {
      for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptj}) {
        const KRowGeometry g = Geo(s, e, style);
        std::mt19937_64 rng(99);
        RowError total;
        for (auto [p, q] : kMoves) {
          for (int r = 0; r < 30; ++r) {
            const auto raw = RawRow(g, rng);
            const auto start = KeyAt(raw, g, Engine(500000.0), p);
            auto row = start;
            ASSERT_TRUE(RotateK(table, p, q, g, row).ok());
            ASSERT_TRUE(RotateK(table, q, p, g, row).ok());
            total.Merge(CompareRows(row.data(), start.data(), g));
          }
        }
        SCOPED_TRACE(std::string(KvElemName(e)) + " " + s.name);
        if (e == KvElem::kFloat32) {
          EXPECT_LE(total.max_rel, 1e-5);
        } else {
          EXPECT_GE(total.Fraction(), 0.999);
          EXPECT_LE(total.max_ulp, 2.0);
        }
        EXPECT_TRUE(total.outside_same);
      }
    }
  }
}

// One rounding: the result is the stored key turned exactly (in double, by the exact
// delta) and rounded to bf16 once, up to the fp32 arithmetic before that rounding.
TEST(RopeTest, Bf16RoundsOnce) {
  const EngineTable& engine = Engine(10000.0);
  const RopeTable& table = Table(10000.0);
  const KRowGeometry g = Geo(kShapes[0], KvElem::kBFloat16, RopeStyle::kNeox);
  std::mt19937_64 rng(5);
  int64_t same = 0, total = 0;
  for (auto [p, q] : kMoves) {
    for (int r = 0; r < 40; ++r) {
      auto row = KeyAt(RawRow(g, rng), g, engine, p);
      std::vector<uint8_t> want = row;
      for (int64_t h = 0; h < g.num_heads; ++h) {
        for (int64_t i = 0; i < 32; ++i) {
          const double oc = engine.Cos(p, i), os = engine.Sin(p, i);
          const double nc = engine.Cos(q, i), ns = engine.Sin(q, i);
          const double n2 = oc * oc + os * os;
          const double dc = (nc * oc + ns * os) / n2, ds = (ns * oc - nc * os) / n2;
          const int64_t ix = h * 64 + i, iy = ix + 32;
          const double x = DecodeElem(g.elem, row.data(), ix),
                       y = DecodeElem(g.elem, row.data(), iy);
          EncodeElem(g.elem, want.data(), ix, x * dc - y * ds);
          EncodeElem(g.elem, want.data(), iy, y * dc + x * ds);
        }
      }
      ASSERT_TRUE(RotateK(table, p, q, g, row).ok());
      for (int64_t i = 0; i < g.row_elems(); ++i) {
        const uint16_t a = static_cast<uint16_t>(row[2 * i] | row[2 * i + 1] << 8);
        const uint16_t b = static_cast<uint16_t>(want[2 * i] | want[2 * i + 1] << 8);
        same += a == b;
        EXPECT_LE(std::abs(static_cast<int>(a) - static_cast<int>(b)), 1) << "element " << i;
        ++total;
      }
    }
  }
  EXPECT_GE(static_cast<double>(same) / total, 0.999);
}

// Every build this CPU runs (AVX-512, AVX2, portable) gives the same bytes, special
// values (NaN, infinities, subnormals from random bit patterns) included; batches of rows
// with their own strides and deltas give what row-by-row gives; in place too.
TEST(RopeTest, EveryBuildWritesTheSameBytes) {
  const auto builds = RotateRowsBuilds();
  ASSERT_FALSE(builds.empty());
  EXPECT_EQ(std::string(builds.back().name), "portable");
  EXPECT_EQ(builds.front().fn, HostRotateRows());
  const RopeTable& table = Table(500000.0);
  std::mt19937_64 rng(23);
  constexpr int kRows = 7;
  std::vector<float> delta(kRows * 64);
  for (KvElem e : {KvElem::kFloat32, KvElem::kBFloat16, KvElem::kFloat16, KvElem::kFp8E4m3,
                   KvElem::kFp8E5m2}) {
    for (const auto& s : kShapes) {
      for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptj}) {
        const KRowGeometry g = Geo(s, e, style);
        const int64_t rb = g.row_bytes();
        for (auto [p, q] : kMoves) {
          for (int r = 0; r < kRows; ++r) {
            table.Delta((p + r) % kPositions, q, delta.data() + r * 64, delta.data() + r * 64 + 32);
          }
          std::vector<uint8_t> src(kRows * rb);
          for (auto& b : src) b = static_cast<uint8_t>(rng());
          // Reference: the portable build, one row at a time, into rows 2 * rb apart.
          std::vector<uint8_t> want(2 * kRows * rb, 0);
          for (int r = 0; r < kRows; ++r) {
            RowBatch one{src.data() + r * rb,   rb, want.data() + 2 * r * rb, rb, 1,
                         delta.data() + r * 64, 64};
            builds.back().fn(one, g);
          }
          for (const auto& b : builds) {
            std::vector<uint8_t> got(2 * kRows * rb, 0);
            b.fn(RowBatch{src.data(), rb, got.data(), 2 * rb, kRows, delta.data(), 64}, g);
            ASSERT_EQ(got, want) << b.name << " " << KvElemName(e) << " " << s.name;
            std::vector<uint8_t> in_place = src;
            b.fn(RowBatch{in_place.data(), rb, in_place.data(), rb, kRows, delta.data(), 64}, g);
            for (int r = 0; r < kRows; ++r) {
              ASSERT_EQ(0, std::memcmp(in_place.data() + r * rb, want.data() + 2 * r * rb, rb))
                  << b.name << " in place, " << KvElemName(e) << " " << s.name;
            }
          }
        }
      }
    }
  }
  RecordProperty("builds", static_cast<int>(builds.size()));
}

TEST(RopeTest, SamePositionLeavesEveryByte) {
  const RopeTable& table = Table(10000.0);
  std::mt19937_64 rng(3);
  for (KvElem e : {KvElem::kFloat32, KvElem::kBFloat16, KvElem::kFp8E4m3}) {
    const KRowGeometry g = Geo(kShapes[1], e, RopeStyle::kNeox);
    std::vector<uint8_t> row(g.row_bytes());
    for (auto& b : row) b = static_cast<uint8_t>(rng());  // NaNs and all
    const auto before = row;
    ASSERT_TRUE(RotateK(table, 777, 777, g, row).ok());
    EXPECT_EQ(row, before);
  }
}

TEST(RopeTest, NeoxAndGptjPairDifferentElements) {
  const EngineTable& engine = Engine(10000.0);
  const RopeTable& table = Table(10000.0);
  const KRowGeometry neox = Geo(kShapes[0], KvElem::kFloat32, RopeStyle::kNeox);
  KRowGeometry gptj = neox;
  gptj.style = RopeStyle::kGptj;
  std::mt19937_64 rng(11);
  const auto raw = RawRow(neox, rng);
  // The same stored bytes turned both ways: different results, each its own reference.
  auto a = KeyAt(raw, neox, engine, 10), b = a;
  ASSERT_TRUE(RotateK(table, 10, 500, neox, a).ok());
  ASSERT_TRUE(RotateK(table, 10, 500, gptj, b).ok());
  EXPECT_NE(a, b);
  EXPECT_LE(CompareRows(a.data(), KeyAt(raw, neox, engine, 500).data(), neox).max_rel, 1e-5);
  auto c = KeyAt(raw, gptj, engine, 10);
  ASSERT_TRUE(RotateK(table, 10, 500, gptj, c).ok());
  EXPECT_LE(CompareRows(c.data(), KeyAt(raw, gptj, engine, 500).data(), gptj).max_rel, 1e-5);
  // Keys the engine rotated NeoX-style, turned GPT-J-style, are wrong.
  auto d = KeyAt(raw, neox, engine, 10);
  ASSERT_TRUE(RotateK(table, 10, 500, gptj, d).ok());
  EXPECT_GT(CompareRows(d.data(), KeyAt(raw, neox, engine, 500).data(), neox).max_rel, 0.1);
}

TEST(RopeTest, DeltaIsTheRotationByTheAngleDifference) {
  const RopeTable& table = Table(10000.0);
  std::vector<float> dc(32), ds(32);
  for (auto [p, q] : kMoves) {
    table.Delta(p, q, dc.data(), ds.data());
    for (int i = 0; i < 32; ++i) {
      const double a = (static_cast<double>(q) - p) * std::pow(10000.0, -2.0 * i / 64);
      // fp32 table entries carry ~|pos| * 2^-24 of phase error at large positions.
      EXPECT_NEAR(dc[i], std::cos(a), 2e-3) << p << " -> " << q << " pair " << i;
      EXPECT_NEAR(ds[i], std::sin(a), 2e-3) << p << " -> " << q << " pair " << i;
      EXPECT_NEAR(static_cast<double>(dc[i]) * dc[i] + static_cast<double>(ds[i]) * ds[i], 1.0,
                  1e-6);
    }
  }
}

// A YaRN-style table (every entry times 1.3) turns keys exactly as the plain one does.
TEST(RopeTableTest, MscaleIsStripped) {
  const RopeTable& plain = Table(10000.0);
  const RopeTable& scaled = Table(10000.0, "float32", 1.3);
  EXPECT_FALSE(plain.mscale_stripped());
  EXPECT_NEAR(plain.mscale(), 1.0, 1e-6);
  EXPECT_TRUE(scaled.mscale_stripped());
  EXPECT_NEAR(scaled.mscale(), 1.3, 1e-6);
  for (int64_t p : {0, 1, 4097, 65535}) {
    for (int i = 0; i < 64; ++i) EXPECT_NEAR(scaled.Row(p)[i], plain.Row(p)[i], 1e-6);
  }
  for (KvElem e : {KvElem::kFloat32, KvElem::kBFloat16}) {
    const KRowGeometry g = Geo(kShapes[0], e, RopeStyle::kNeox);
    std::mt19937_64 rng(17);
    int64_t same = 0, total = 0;
    for (auto [p, q] : kMoves) {
      auto a = KeyAt(RawRow(g, rng), g, Engine(10000.0), p), b = a;
      ASSERT_TRUE(RotateK(plain, p, q, g, a).ok());
      ASSERT_TRUE(RotateK(scaled, p, q, g, b).ok());
      const RowError err = CompareRows(a.data(), b.data(), g);
      EXPECT_LE(err.max_rel, 1e-6);
      same += a == b;
      ++total;
    }
    if (e == KvElem::kBFloat16) {
      EXPECT_GE(same, total - 1);
    }
  }
  // Under the threshold: left as it is.
  const RopeTable& near_one = Table(10000.0, "float32", 1.0005);
  EXPECT_FALSE(near_one.mscale_stripped());
  EXPECT_NEAR(near_one.mscale(), 1.0005, 1e-6);
}

std::vector<uint8_t> Floats(std::initializer_list<float> v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), std::data(v), out.size());
  return out;
}

TEST(RopeTableTest, MalformedTablesAreRefused) {
  auto refuse = [](std::vector<uint8_t> bytes, std::string dtype, std::vector<int64_t> shape,
                   const std::string& why) {
    auto t = RopeTable::FromCosSinCache(bytes, dtype, shape);
    ASSERT_FALSE(t.ok()) << why;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(t.status().message(), HasSubstr(why));
  };
  const auto good = Floats({1, 0, 0, 1, 0.6f, 0.8f, 0.8f, 0.6f});  // [2 positions, rot 4]
  ASSERT_TRUE(RopeTable::FromCosSinCache(good, "float32", std::vector<int64_t>{2, 4}).ok());
  refuse(good, "float64", {2, 4}, "dtype 'float64'");
  refuse(good, "int8", {2, 4}, "dtype 'int8'");
  refuse(good, "float32", {8}, "expected shape [max_positions, rot_dim]");
  refuse(good, "float32", {1, 2, 4}, "expected shape [max_positions, rot_dim]");
  refuse(Floats({1, 0, 0}), "float32", {1, 3}, "rot_dim 3 must be even");
  refuse({}, "float32", {0, 4}, "max_positions 0");
  refuse({}, "float32", {4, 0}, "rot_dim 0");
  refuse({}, "float32", {4, -2}, "rot_dim -2");
  refuse(good, "float32", {2, 8192}, "rot_dim 8192");
  refuse(good, "float32", {3, 4}, "32 bytes for shape [3, 4]");
  refuse(good, "bfloat16", {2, 4}, "expected 16");
  refuse({}, "float32", {int64_t{1} << 40, 4096}, "exceed the limit");
  refuse(Floats({1, 0, NAN, 1}), "float32", {1, 4}, "not finite");
  refuse(Floats({1, 0, INFINITY, 1}), "float32", {1, 4}, "not finite");
  refuse(Floats({0, 0, 0, 0}), "float32", {1, 4}, "every value is zero");
  // Pairs of unequal length: not a rotary table.
  refuse(Floats({1, 0.5f, 0, 0.5f}), "float32", {1, 4}, "not a rotary table");
  refuse(Floats({1, 0, 0, 1, 0, 2, 0, 0}), "float32", {2, 4}, "not a rotary table");
}

TEST(RopeTest, MalformedGeometriesAndPositionsAreRefused) {
  const RopeTable& table = Table(10000.0);
  KRowGeometry g = Geo(kShapes[1], KvElem::kBFloat16, RopeStyle::kNeox);
  std::vector<uint8_t> row(g.row_bytes());
  ASSERT_TRUE(RotateK(table, 1, 2, g, row).ok());
  auto refuse = [&](KRowGeometry bad, std::span<uint8_t> r, int64_t p, int64_t q,
                    const std::string& why) {
    Status st = RotateK(table, p, q, bad, r);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << why;
    EXPECT_THAT(st.message(), HasSubstr(why));
  };
  KRowGeometry b = g;
  b.rot_offset = 65;  // 65 + 64 > 128
  refuse(b, row, 1, 2, "does not fit a head");
  b = g;
  b.rot_offset = -1;
  refuse(b, row, 1, 2, "does not fit a head");
  b = g;
  b.rot_dim = 63;
  refuse(b, row, 1, 2, "must be even");
  b = g;
  b.rot_dim = 32;
  refuse(b, row, 1, 2, "the table's rot_dim is 64");
  b = g;
  b.num_heads = 0;
  refuse(b, row, 1, 2, "0 head(s)");
  b = g;
  b.num_heads = 3;
  refuse(b, row, 1, 2, "exceed a row");
  refuse(g, std::span<uint8_t>(row).first(row.size() - 2), 1, 2, "exceed a row");
  refuse(g, row, -1, 2, "position -1");
  refuse(g, row, 1, kPositions, "position 65536");
}

TEST(RopeTest, KvQuantAndElementTypes) {
  EXPECT_EQ(*ParseKvQuant(""), KvQuant::kNone);
  EXPECT_EQ(*ParseKvQuant("fp8_e4m3"), KvQuant::kFp8E4m3);
  EXPECT_EQ(*ParseKvQuant("fp8_e5m2"), KvQuant::kFp8E5m2);
  EXPECT_FALSE(ParseKvQuant("fp8").ok());
  EXPECT_FALSE(ParseKvQuant("int4").ok());
  EXPECT_EQ(*RopeElemFor("bfloat16", KvQuant::kNone), KvElem::kBFloat16);
  EXPECT_EQ(*RopeElemFor("bfloat16", KvQuant::kFp8E4m3), KvElem::kBFloat16);  // not its plane
  EXPECT_EQ(*RopeElemFor("float16", KvQuant::kNone), KvElem::kFloat16);
  EXPECT_EQ(*RopeElemFor("float32", KvQuant::kNone), KvElem::kFloat32);
  EXPECT_EQ(*RopeElemFor("float8_e4m3fn", KvQuant::kNone), KvElem::kFp8E4m3);
  EXPECT_EQ(*RopeElemFor("float8_e5m2", KvQuant::kFp8E5m2), KvElem::kFp8E5m2);
  EXPECT_EQ(*RopeElemFor("uint8", KvQuant::kFp8E4m3), KvElem::kFp8E4m3);
  EXPECT_EQ(*RopeElemFor("uint8", KvQuant::kFp8E5m2), KvElem::kFp8E5m2);
  EXPECT_THAT(RopeElemFor("uint8", KvQuant::kNone).status().message(), HasSubstr("kv_quant"));
  EXPECT_THAT(RopeElemFor("float8_e4m3fn", KvQuant::kFp8E5m2).status().message(),
              HasSubstr("contradicts"));
  EXPECT_FALSE(RopeElemFor("int8", KvQuant::kNone).ok());
  EXPECT_FALSE(RopeElemFor("float8_e4m3fnuz", KvQuant::kNone).ok());
}

}  // namespace
}  // namespace kvd::blend
