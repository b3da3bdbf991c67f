// The codec's serdes ("cachegen", "fp8") through MakeSerde and a real tier (fs in a
// temporary directory, resp against a real redis-server): stored bytes are the codec's,
// load back (variable-size stored forms) and decode to the object within the codec's
// error; damaged or mislabelled stored objects fail to decode; configs are checked.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "codec/codec.h"
#include "codec/float_bits.h"
#include "l2/serde.h"
#include "tier_backends.h"
#include "tier_test_util.h"

namespace kvd::l2 {
namespace {

using ::testing::HasSubstr;
using namespace kvd::l2::testing;  // NOLINT

ObjectLayout Layout(int64_t layers, int64_t tokens, int64_t hidden) {
  ObjectLayout l;
  l.groups.push_back({"bfloat16", 2, 2, layers, tokens, hidden});
  l.bytes = l.groups[0].bytes();
  return l;
}

std::vector<uint8_t> KvLike(const ObjectLayout& l, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  std::vector<uint8_t> v(l.bytes);
  for (size_t i = 0; i < v.size() / 2; ++i) {
    const float x = nd(rng);
    const uint16_t h = codec::FloatToBf16(x);
    memcpy(&v[2 * i], &h, 2);
  }
  return v;
}

double RelError(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  double e = 0, n = 0;
  for (size_t i = 0; i < a.size() / 2; ++i) {
    uint16_t ha, hb;
    memcpy(&ha, &a[2 * i], 2);
    memcpy(&hb, &b[2 * i], 2);
    const double x = codec::Bf16ToFloat(ha), y = codec::Bf16ToFloat(hb);
    e += (x - y) * (x - y);
    n += x * x;
  }
  return std::sqrt(e / n);
}

std::shared_ptr<const Serde> Make(const char* json) {
  const auto spec = nlohmann::json::parse(json);
  auto s = MakeSerde(&spec);
  EXPECT_TRUE(s.ok()) << json << ": " << s.status().ToString();
  return s.ok() ? *s : nullptr;
}

class CodecSerdeTierTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CodecSerdeTierTest, RoundTripThroughTheTier) {
  auto backend = MakeBackend(GetParam());
  auto tier = backend->Make();
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  const ObjectLayout l = Layout(4, 256, 128);
  const auto raw = KvLike(l, 5);
  struct Case {
    const char* json;
    double max_err;
  };
  int i = 0;
  for (const Case& c : {Case{R"({"type": "cachegen"})", 0.07}, Case{R"({"type": "cachegen", "bins": 16})", 0.15},
                        Case{R"({"type": "cachegen", "bins": 16, "anchor_group": 8, "anchor_bins": 32})", 0.3},
                        Case{R"({"type": "fp8"})", 0.04}, Case{R"({"type": "fp8", "fp8_dtype": "float8_e5m2"})", 0.08}}) {
    SCOPED_TRACE(c.json);
    auto serde = Make(c.json);
    ASSERT_NE(serde, nullptr);
    std::vector<uint8_t> stored(serde->MaxStoredBytes(l));
    auto n = serde->Encode(raw, l, stored);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    stored.resize(*n);
    EXPECT_LT(stored.size(), raw.size());
    const ObjectKey key = Key(100 + i++);
    ASSERT_TRUE(StoreOne(**tier, key, stored).status.ok());
    // A stored form's size is not known before the load: read up to the bound.
    std::vector<uint8_t> back(serde->MaxStoredBytes(l), 0);
    auto r = LoadSync(**tier, {{key, back.data(), back.size(), true}});
    ASSERT_EQ(r.size(), 1u);
    ASSERT_TRUE(r[0].status.ok()) << r[0].status.ToString();
    ASSERT_EQ(r[0].bytes, stored.size());
    back.resize(r[0].bytes);
    EXPECT_EQ(back, stored);
    std::vector<uint8_t> out(l.bytes);
    ASSERT_TRUE(serde->Decode(back, l, out).ok());
    EXPECT_LT(RelError(raw, out), c.max_err);
    // Damage is an error, never garbage (fp8 has no checksum: a byte is a value).
    if (std::string(c.json).find("cachegen") != std::string::npos) {
      back[back.size() / 2] ^= 0x40;
      EXPECT_FALSE(serde->Decode(back, l, out).ok());
      ObjectLayout other = Layout(4, 256, 64);
      std::vector<uint8_t> small(other.bytes);
      stored.resize(*n);
      EXPECT_THAT(serde->Decode(stored, other, small).message(), HasSubstr("expected"));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, CodecSerdeTierTest, ::testing::Values("fs", "resp"));

TEST(CodecSerdeTest, StoredBytesAreTheCodecsOwn) {
  const ObjectLayout l = Layout(2, 64, 64);
  const auto raw = KvLike(l, 9);
  codec::ObjectLayout cl;
  cl.groups.push_back({2, 2, 64, 64, codec::Dtype::kBfloat16});
  // fp8: lmcache's bytes (one cast per element).
  auto fp8 = Make(R"({"type": "fp8", "max_workers": 4})");
  std::vector<uint8_t> a(fp8->MaxStoredBytes(l)), b(codec::Fp8EncodedBytes(cl));
  ASSERT_EQ(*fp8->Encode(raw, l, a), a.size());
  ASSERT_TRUE(codec::Fp8Encode(cl, raw, codec::Fp8Kind::kE4m3fn, b).ok());
  EXPECT_EQ(a, b);
  // cachegen with the default ("lmcache") schedule: 32 bins for a 2-layer model.
  auto cg = Make(R"({"type": "cachegen", "bins": "lmcache"})");
  std::vector<uint8_t> s(cg->MaxStoredBytes(l));
  auto n = cg->Encode(raw, l, s);
  ASSERT_TRUE(n.ok());
  s.resize(*n);
  auto info = codec::Inspect(s);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->plane_bins, (std::vector<uint8_t>{32, 32, 32, 32}));
}

TEST(CodecSerdeTest, ConfigsAreChecked) {
  for (const char* bad : {R"({"type": "cachegen", "bin": 16})", R"({"type": "cachegen", "bins": 3})",
                          R"({"type": "cachegen", "bins": "k=0-:16"})", R"({"type": "cachegen", "anchor_group": -1})",
                          R"({"type": "cachegen", "anchor_bins": 2})", R"({"type": "fp8", "fp8_dtype": "e4m3"})",
                          R"({"type": "fp8", "scale": 2})"}) {
    const auto spec = nlohmann::json::parse(bad);
    EXPECT_FALSE(MakeSerde(&spec).ok()) << bad;
  }
  const auto unknown = nlohmann::json::parse(R"({"type": "zstd"})");
  EXPECT_THAT(MakeSerde(&unknown).status().message(), HasSubstr("known: none, cachegen, fp8"));
  // fp8 refuses what it cannot cast; cachegen stores it raw inside its format.
  ObjectLayout pages;
  pages.groups.push_back({"uint8", 1, 1, 1, 256, 132});
  pages.bytes = pages.groups[0].bytes();
  std::vector<uint8_t> raw(pages.bytes, 7), out(pages.bytes + 4096);
  EXPECT_FALSE(Make(R"({"type": "fp8"})")->Encode(raw, pages, out).ok());
  auto cg = Make(R"({"type": "cachegen"})");
  auto n = cg->Encode(raw, pages, out);
  ASSERT_TRUE(n.ok());
  std::vector<uint8_t> back(pages.bytes);
  ASSERT_TRUE(cg->Decode({out.data(), *n}, pages, back).ok());
  EXPECT_EQ(back, raw);
}

}  // namespace
}  // namespace kvd::l2
