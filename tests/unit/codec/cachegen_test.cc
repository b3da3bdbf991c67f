// CacheGen codec (codec.h): exact round trip of the entropy coder (decoded values equal
// the format's quantizer bit for bit), error bounded by the quantization step, edge
// cases, anchors, determinism across thread counts, the scalar and AVX2 decoders
// agreeing, and every way a wrong, corrupted or truncated object is refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <random>

#include "codec/codec.h"
#include "codec/crc32c.h"
#include "codec/device_decode.h"
#include "codec/format.h"
#include "codec/plane.h"
#include "codec_test_util.h"

namespace kvd::codec {
namespace {

using ::testing::HasSubstr;
using test::KvSpec;
using test::LayoutOf;
using test::MakeKv;

CachegenOptions Bins(uint32_t b) {
  CachegenOptions o;
  o.bins = BinSchedule::Uniform(b);
  return o;
}

std::vector<uint8_t> RoundTrip(const ObjectLayout& l, const std::vector<uint8_t>& obj, const CachegenOptions& o,
                               std::vector<uint8_t>* encoded = nullptr) {
  auto enc = Encode(l, obj, o);
  EXPECT_TRUE(enc.ok()) << enc.status().ToString();
  if (!enc.ok()) return {};
  std::vector<uint8_t> out(obj.size());
  const Status st = Decode(*enc, out, &l);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (encoded) *encoded = *enc;
  return out;
}

// Decoded planes equal the reference quantizer exactly: nothing the entropy coder
// dropped or altered, for several bin counts, dtypes and shapes.
void ExpectExact(const KvSpec& s, uint32_t bins) {
  const auto l = LayoutOf(s);
  const auto obj = MakeKv(s);
  std::vector<uint8_t> enc;
  const auto out = RoundTrip(l, obj, Bins(bins), &enc);
  ASSERT_EQ(out.size(), obj.size());
  auto info = Inspect(enc);
  ASSERT_TRUE(info.ok());
  const uint32_t isz = DtypeBytes(s.dtype);
  const size_t plane = size_t{s.tokens} * s.hidden * isz;
  for (uint32_t p = 0; p < s.kv_size * s.layers; ++p) {
    if (info->plane_bins[p] == 0) {  // stored raw (too small to shrink): exact copy
      ASSERT_EQ(0, memcmp(obj.data() + p * plane, out.data() + p * plane, plane)) << "raw plane " << p;
      continue;
    }
    ASSERT_EQ(info->plane_bins[p], bins);
    const auto ref = test::ReferencePlane(obj.data() + p * plane, s.dtype, s.tokens, s.hidden, bins);
    for (size_t i = 0; i < ref.size(); ++i) {
      std::vector<uint8_t> want(isz);
      test::StoreAs(s.dtype, ref[i], want.data());
      ASSERT_EQ(0, memcmp(want.data(), out.data() + p * plane + i * isz, isz))
          << "plane " << p << " element " << i << " bins " << bins;
    }
  }
}

TEST(CachegenTest, EntropyCoderIsExactAcrossBinsAndDtypes) {
  for (uint32_t bins : {4u, 8u, 12u, 16u, 32u, 64u}) ExpectExact(KvSpec{}, bins);
  KvSpec f16;
  f16.dtype = Dtype::kFloat16;
  f16.outliers = 0;
  ExpectExact(f16, 16);
  KvSpec f32;
  f32.dtype = Dtype::kFloat32;
  ExpectExact(f32, 32);
}

TEST(CachegenTest, EdgeShapesAreExact) {
  KvSpec one;  // a single token (stored raw: CacheGen's tables would outweigh it)
  one.tokens = 1;
  ExpectExact(one, 32);
  KvSpec few;  // few tokens, still worth coding
  few.tokens = 9;
  few.hidden = 512;
  ExpectExact(few, 16);
  KvSpec short_chunk;  // shorter than 256 tokens
  short_chunk.tokens = 100;
  ExpectExact(short_chunk, 16);
  KvSpec odd;  // channels not a power of two, a partial 32-lane block
  odd.hidden = 100;
  ExpectExact(odd, 32);
  KvSpec tiny;
  tiny.hidden = 3;
  tiny.outliers = 0;
  ExpectExact(tiny, 16);
  KvSpec wide;  // more than one stream per plane (256 channels each)
  wide.hidden = 600;
  wide.tokens = 64;
  ExpectExact(wide, 16);
  KvSpec mla;  // kv_size 1
  mla.kv_size = 1;
  mla.layers = 3;
  ExpectExact(mla, 32);
}

TEST(CachegenTest, ErrorIsBoundedByHalfAStep) {
  KvSpec s;
  s.outliers = 3;  // 100x channels set the per-token scale
  const auto l = LayoutOf(s);
  const auto obj = MakeKv(s);
  for (uint32_t bins : {8u, 16u, 32u}) {
    const auto out = RoundTrip(l, obj, Bins(bins));
    const size_t plane = size_t{s.tokens} * s.hidden * 2;
    for (uint32_t p = 0; p < 2 * s.layers; ++p) {
      std::vector<float> steps;
      test::ReferencePlane(obj.data() + p * plane, s.dtype, s.tokens, s.hidden, bins, &steps);
      for (uint32_t t = 0; t < s.tokens; ++t) {
        for (uint32_t c = 0; c < s.hidden; ++c) {
          const size_t at = p * plane + (size_t{t} * s.hidden + c) * 2;
          const float x = test::LoadAs(s.dtype, obj.data() + at);
          const float y = test::LoadAs(s.dtype, out.data() + at);
          // Half a step, plus the rounding of the decoded value to bf16.
          const float bound = steps[t] * 0.5f * (1 + 1e-6f) + std::fabs(y) * (1.0f / 256);
          ASSERT_LE(std::fabs(x - y), bound) << "bins " << bins << " plane " << p << " t " << t << " c " << c;
        }
      }
    }
  }
}

TEST(CachegenTest, AllZeroTokensDecodeToZero) {
  KvSpec s;
  s.tokens = 64;
  auto obj = MakeKv(s);
  // Tokens 0, 10 and 63 of every plane are all zeros.
  const size_t plane = size_t{s.tokens} * s.hidden * 2;
  for (uint32_t p = 0; p < 2 * s.layers; ++p) {
    for (uint32_t t : {0u, 10u, 63u}) memset(obj.data() + p * plane + size_t{t} * s.hidden * 2, 0, s.hidden * 2);
  }
  const auto l = LayoutOf(s);
  const auto out = RoundTrip(l, obj, Bins(16));
  for (uint32_t p = 0; p < 2 * s.layers; ++p) {
    for (uint32_t t : {0u, 10u, 63u}) {
      for (uint32_t c = 0; c < s.hidden; ++c) {
        EXPECT_EQ(test::LoadAs(s.dtype, out.data() + p * plane + (size_t{t} * s.hidden + c) * 2), 0.0f);
      }
    }
  }
  // A whole object of zeros: every value comes back 0 and the object is tiny.
  std::vector<uint8_t> zeros(obj.size(), 0);
  std::vector<uint8_t> enc;
  const auto zout = RoundTrip(l, zeros, Bins(32), &enc);
  EXPECT_EQ(zout, zeros);
  EXPECT_LT(enc.size(), zeros.size() / 20);
}

TEST(CachegenTest, OutlierChannelsAreReproduced) {
  KvSpec s;
  s.outliers = 4;
  s.outlier_scale = 100;
  const auto l = LayoutOf(s);
  const auto obj = MakeKv(s);
  const auto out = RoundTrip(l, obj, Bins(32));
  // The outlier channels set the scale, so they come back within 1/30 of their range.
  const size_t plane = size_t{s.tokens} * s.hidden * 2;
  for (uint32_t t = 0; t < s.tokens; ++t) {
    float amax = 0;
    for (uint32_t c = 0; c < s.hidden; ++c) amax = std::max(amax, std::fabs(test::LoadAs(s.dtype, obj.data() + (t * s.hidden + c) * 2)));
    for (uint32_t c = 0; c < 4; ++c) {
      const float x = test::LoadAs(s.dtype, obj.data() + (t * s.hidden + c) * 2);
      const float y = test::LoadAs(s.dtype, out.data() + (t * s.hidden + c) * 2);
      EXPECT_LE(std::fabs(x - y), amax / 30 + std::fabs(x) / 128) << t << " " << c;
    }
  }
  (void)plane;
}

TEST(CachegenTest, NonFinitePlanesAreStoredRawAndComeBackExact) {
  KvSpec s;
  auto obj = MakeKv(s);
  const uint16_t nan = 0x7fc0, inf = 0x7f80;
  memcpy(obj.data() + 10, &nan, 2);                               // plane 0
  memcpy(obj.data() + size_t{s.tokens} * s.hidden * 2 * 3 + 8, &inf, 2);  // plane 3
  const auto l = LayoutOf(s);
  std::vector<uint8_t> enc;
  const auto out = RoundTrip(l, obj, Bins(16), &enc);
  const size_t plane = size_t{s.tokens} * s.hidden * 2;
  EXPECT_EQ(0, memcmp(obj.data(), out.data(), plane));
  EXPECT_EQ(0, memcmp(obj.data() + 3 * plane, out.data() + 3 * plane, plane));
  auto info = Inspect(enc);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->plane_bins, (std::vector<uint8_t>{0, 16, 16, 0}));
}

// Regression (found by the cachegen fuzzer): fp16 data at +-65504 gets the bf16 scale
// 65536, and the top symbol decoded to 65536, which is infinity in fp16. Decoded values
// now saturate at the dtype's largest finite value.
TEST(CachegenTest, Fp16MaxValueDoesNotDecodeToInfinity) {
  ObjectLayout l;
  l.groups.push_back({2, 1, 16, 64, Dtype::kFloat16});
  std::vector<uint8_t> obj(l.Bytes());
  for (size_t i = 0; i < obj.size() / 2; ++i) {
    const float v = i % 3 == 0 ? 65504.0f : (i % 3 == 1 ? -65504.0f : 1000.0f * static_cast<float>(i % 17));
    test::StoreAs(Dtype::kFloat16, v, obj.data() + 2 * i);
  }
  for (uint32_t g : {0u, 4u}) {
    CachegenOptions o = Bins(16);
    o.anchor_group = g;
    const auto out = RoundTrip(l, obj, o);
    for (size_t i = 0; i < obj.size() / 2; ++i) {
      const float x = test::LoadAs(Dtype::kFloat16, obj.data() + 2 * i);
      const float y = test::LoadAs(Dtype::kFloat16, out.data() + 2 * i);
      ASSERT_TRUE(std::isfinite(y)) << i << " anchors " << g;
      if (g == 0 && i % 3 != 2) {
        EXPECT_EQ(y, x) << i;  // the top and bottom symbols, saturated
      }
      // Half a step of the (bf16-rounded) scale; deltas span up to twice the range.
      EXPECT_LE(std::fabs(x - y), (g ? 2 : 1) * 65536.0f / 7 / 2 * 1.01f + 32) << i << " anchors " << g;
    }
  }
}

TEST(CachegenTest, NonFloatGroupsAreStoredRaw) {
  ObjectLayout l;
  l.layout_id = 9;
  l.groups.push_back({2, 2, 256, 64, Dtype::kBfloat16});
  l.groups.push_back({1, 2, 256, 132, Dtype::kUint8});   // e.g. a DSA indexer page
  l.groups.push_back({1, 1, 256, 64, Dtype::kFloat8E4m3fn});
  KvSpec s;
  s.hidden = 64;
  auto obj = MakeKv(s);
  const size_t first = obj.size();
  std::mt19937 rng(3);
  obj.resize(l.Bytes());
  for (size_t i = first; i < obj.size(); ++i) obj[i] = static_cast<uint8_t>(rng());
  const auto out = RoundTrip(l, obj, Bins(16));
  EXPECT_EQ(0, memcmp(obj.data() + first, out.data() + first, obj.size() - first));
}

TEST(CachegenTest, AnchorsRoundTripWithinTheirSteps) {
  KvSpec s;
  s.rho = 0.99f;
  const auto l = LayoutOf(s);
  const auto obj = MakeKv(s);
  for (uint32_t g : {2u, 5u, 10u, 256u}) {
    CachegenOptions o = Bins(16);
    o.anchor_group = g;
    o.anchor_bins = 32;
    std::vector<uint8_t> enc;
    const auto out = RoundTrip(l, obj, o, &enc);
    auto info = Inspect(enc);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->anchor_group, g);
    // Anchor tokens are quantized on their own (32 bins): within half their step.
    const size_t plane = size_t{s.tokens} * s.hidden * 2;
    for (uint32_t p = 0; p < 2 * s.layers; ++p) {
      for (uint32_t t = 0; t < s.tokens; t += g) {
        float amax = 0;
        for (uint32_t c = 0; c < s.hidden; ++c) amax = std::max(amax, std::fabs(test::LoadAs(s.dtype, obj.data() + p * plane + (t * s.hidden + c) * 2)));
        for (uint32_t c = 0; c < s.hidden; ++c) {
          const size_t at = p * plane + (size_t{t} * s.hidden + c) * 2;
          const float x = test::LoadAs(s.dtype, obj.data() + at), y = test::LoadAs(s.dtype, out.data() + at);
          ASSERT_LE(std::fabs(x - y), amax / 15 * 0.5f * 1.01f + std::fabs(y) / 256) << g << " " << t;
        }
      }
    }
    // Every token: never further from the input than the delta's range allows.
    double err = 0, norm = 0;
    for (size_t i = 0; i < obj.size() / 2; ++i) {
      const float x = test::LoadAs(s.dtype, obj.data() + 2 * i), y = test::LoadAs(s.dtype, out.data() + 2 * i);
      err += double(x - y) * (x - y);
      norm += double(x) * x;
    }
    EXPECT_LT(std::sqrt(err / norm), 0.08) << "anchor group " << g;
  }
}

TEST(CachegenTest, OutputDoesNotDependOnThreadCount) {
  KvSpec s;
  s.layers = 5;
  s.hidden = 96;
  const auto l = LayoutOf(s);
  const auto obj = MakeKv(s);
  for (uint32_t g : {0u, 8u}) {
    CachegenOptions o = Bins(16);
    o.anchor_group = g;
    o.threads = 1;
    auto one = Encode(l, obj, o);
    ASSERT_TRUE(one.ok());
    std::vector<uint8_t> d1(obj.size());
    ASSERT_TRUE(Decode(*one, d1, &l, 1).ok());
    for (int threads : {2, 3, 8}) {
      o.threads = threads;
      auto many = Encode(l, obj, o);
      ASSERT_TRUE(many.ok());
      EXPECT_EQ(*one, *many) << threads << " threads";
      std::vector<uint8_t> dn(obj.size());
      ASSERT_TRUE(Decode(*one, dn, &l, threads).ok());
      EXPECT_EQ(d1, dn) << threads << " threads";
    }
  }
}

TEST(CachegenTest, ScalarAndAvx2DecodersAgree) {
  if (!plane::HaveAvx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  for (Dtype d : {Dtype::kBfloat16, Dtype::kFloat16, Dtype::kFloat32}) {
    for (uint32_t g : {0u, 7u}) {
      KvSpec s;
      s.dtype = d;
      s.layers = 1;
      s.hidden = 200;  // six full blocks and a partial one
      s.tokens = 77;
      const auto obj = MakeKv(s);
      plane::PlaneSpec ps;
      ps.tokens = s.tokens;
      ps.channels = s.hidden;
      ps.dtype = d;
      ps.bins = 32;
      ps.anchor_group = g;
      ps.anchor_bins = g ? 64 : 0;
      plane::Scratch sc;
      std::vector<uint8_t> payload;
      ASSERT_TRUE(plane::Encode(obj.data(), ps, &sc, &payload));
      const size_t bytes = size_t{s.tokens} * s.hidden * DtypeBytes(d);
      std::vector<uint8_t> a(bytes), b(bytes);
      ASSERT_TRUE(plane::Decode(payload, ps, &sc, a.data(), /*simd=*/false).ok());
      ASSERT_TRUE(plane::Decode(payload, ps, &sc, b.data(), /*simd=*/true).ok());
      EXPECT_EQ(a, b) << DtypeName(d) << " anchors " << g;
    }
  }
}

// The AVX2 encoder (quantizer rows and the 32-lane rANS step) writes exactly the scalar
// encoder's bytes: full and partial blocks, several streams, anchors, every bin count
// class, outlier channels, one token and long planes, a plane that renormalises on
// nearly every symbol (4 bins) and one that rarely does (64 bins).
TEST(CachegenTest, ScalarAndAvx2EncodersWriteTheSameBytes) {
  if (!plane::HaveAvx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  int cases = 0;
  for (Dtype d : {Dtype::kBfloat16, Dtype::kFloat32}) {
    for (uint32_t hidden : {32u, 96u, 200u, 512u + 40u}) {
      for (uint32_t tokens : {1u, 33u, 256u}) {
        for (uint32_t bins : {4u, 16u, 64u}) {
          for (uint32_t g : {0u, 10u}) {
            KvSpec s;
            s.dtype = d;
            s.layers = 1;
            s.kv_size = 1;
            s.hidden = hidden;
            s.tokens = tokens;
            s.outliers = 3;
            s.seed = 7 + hidden + tokens + bins + g;
            const auto obj = MakeKv(s);
            plane::PlaneSpec ps;
            ps.tokens = tokens;
            ps.channels = hidden;
            ps.dtype = d;
            ps.bins = bins;
            ps.anchor_group = g;
            ps.anchor_bins = g ? 32 : 0;
            plane::Scratch sa, sb;
            std::vector<uint8_t> pa, pb;
            const bool oka = plane::Encode(obj.data(), ps, &sa, &pa, /*simd=*/false);
            const bool okb = plane::Encode(obj.data(), ps, &sb, &pb, /*simd=*/true);
            ASSERT_EQ(oka, okb) << hidden << " " << tokens << " " << bins << " " << g;
            ASSERT_EQ(pa, pb) << DtypeName(d) << " hidden " << hidden << " tokens " << tokens << " bins " << bins
                              << " anchors " << g;
            if (!oka) continue;
            ++cases;
            std::vector<uint8_t> out(size_t{tokens} * hidden * DtypeBytes(d));
            ASSERT_TRUE(plane::Decode(pb, ps, &sb, out.data()).ok());
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 100);  // most planes get smaller than raw (one-token planes may not)
}

// The AVX2 fit of four channels at once picks what FitChannel picks for each, on random
// histograms of every alphabet (sparse, dense, peaked, empty channels beside full ones,
// counts up to 2^31 - 1) and on the cases at its boundaries (4 x mean at k + 1/2,
// kurtosis 4.5).
TEST(CachegenTest, Avx2FitOfFourChannelsIsFitChannels) {
  if (!plane::HaveAvx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(3);
  auto check = [&](const std::vector<uint32_t>& hist, int alphabet, const char* what) {
    uint8_t got[8];
    plane::FitChannels4Avx2(hist.data(), 4, alphabet, got);
    for (int j = 0; j < 4; ++j) {
      uint32_t h[kMaxAlphabet];
      for (int s = 0; s < alphabet; ++s) h[s] = hist[4 * size_t(s) + j];
      uint8_t center, shape;
      plane::FitChannel(h, alphabet, ProbBitsFor(alphabet), &center, &shape);
      ASSERT_EQ(got[2 * j], center) << what << " alphabet " << alphabet << " channel " << j;
      ASSERT_EQ(got[2 * j + 1], shape) << what << " alphabet " << alphabet << " channel " << j;
    }
  };
  for (int round = 0; round < 3000; ++round) {
    const int alphabet = 3 + 2 * static_cast<int>(rng() % 31);
    std::vector<uint32_t> hist(4 * size_t(alphabet), 0);
    for (int j = 0; j < 4; ++j) {
      const int kind = static_cast<int>(rng() % 5);
      if (kind == 0) continue;  // empty channel
      const int center = static_cast<int>(rng() % alphabet);
      const int width = 1 + static_cast<int>(rng() % alphabet);
      const uint32_t top = kind == 4 ? 0x7fffffffu / alphabet : (kind == 3 ? 3u : 300u);
      for (int s = std::max(0, center - width); s < std::min(alphabet, center + width); ++s) {
        if (kind == 2 && rng() % 2) continue;  // sparse
        hist[4 * size_t(s) + j] = rng() % (top + 1);
      }
    }
    check(hist, alphabet, "random");
  }
  // 4 x mean exactly half-way: counts 7 and 1 of two neighbours (mean +1/8), 3 and 1, ...
  for (int alphabet : {3, 15, 63}) {
    for (uint32_t a : {1u, 3u, 7u, 15u}) {
      std::vector<uint32_t> hist(4 * size_t(alphabet), 0);
      for (int j = 0; j < 4; ++j) {
        const int s0 = (j * 5) % (alphabet - 1);
        hist[4 * size_t(s0) + j] = a;
        hist[4 * size_t(s0 + 1) + j] = 1;
      }
      check(hist, alphabet, "half-way");
    }
  }
  // Kurtosis at the Gauss/Laplace threshold: counts k, 7k, k of three neighbours have
  // kurtosis 4.5 (variance 2/9, fourth moment 2/9).
  for (int alphabet : {3, 31}) {
    for (uint32_t k : {1u, 2u, 5u, 1000u}) {
      std::vector<uint32_t> hist(4 * size_t(alphabet), 0);
      for (int j = 0; j < 4; ++j) {
        const int s0 = (j * 7) % (alphabet - 2);
        hist[4 * size_t(s0) + j] = k * (j + 1);
        hist[4 * size_t(s0 + 1) + j] = 7 * k * (j + 1);
        hist[4 * size_t(s0 + 2) + j] = k * (j + 1);
      }
      check(hist, alphabet, "kurtosis 4.5");
    }
  }
}

// The AVX2 histogram of the normal tokens (byte counters emptied every 255 tokens, a
// scalar tail past the last 32 channels) counts what one increment per value counts.
TEST(CachegenTest, Avx2HistogramCountsEverySymbol) {
  if (!plane::HaveAvx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(5);
  for (uint32_t channels : {32u, 40u, 7u, 128u}) {
    for (uint32_t tokens : {1u, 255u, 256u, 700u}) {
      for (uint32_t g : {0u, 2u, 10u}) {
        for (int alphabet : {3, 15, 31}) {
          std::vector<uint8_t> sym(size_t{tokens} * channels);
          for (size_t i = 0; i < sym.size(); ++i) {
            // Even channels always the same symbol (their counters fill up), odd ones spread.
            const size_t c = i % channels;
            sym[i] = static_cast<uint8_t>(c % 2 == 0 ? c % alphabet : rng() % alphabet);
          }
          std::vector<uint32_t> want(size_t(alphabet) * channels, 1), got = want;  // adds to what is there
          for (uint32_t t = 0; t < tokens; ++t) {
            if (g >= 2 && t % g == 0) continue;
            for (uint32_t c = 0; c < channels; ++c) want[size_t{sym[size_t{t} * channels + c]} * channels + c]++;
          }
          plane::NormalHistogramAvx2(sym.data(), tokens, channels, g, alphabet, got.data());
          ASSERT_EQ(got, want) << channels << " channels, " << tokens << " tokens, G " << g << ", alphabet "
                               << alphabet;
        }
      }
    }
  }
}

TEST(CachegenTest, BinScheduleIsPerLayerAndRecorded) {
  KvSpec s;
  s.layers = 12;
  s.hidden = 32;
  s.tokens = 32;
  const auto l = LayoutOf(s);
  const auto obj = MakeKv(s);
  CachegenOptions o;
  o.bins = BinSchedule::Lmcache(12);
  std::vector<uint8_t> enc;
  RoundTrip(l, obj, o, &enc);
  auto info = Inspect(enc);
  ASSERT_TRUE(info.ok());
  std::vector<uint8_t> want;
  for (int l2 = 0; l2 < 12; ++l2) want.push_back(l2 < 10 ? 32 : 16);
  for (int l2 = 0; l2 < 12; ++l2) want.push_back(l2 < 2 ? 32 : 16);
  EXPECT_EQ(info->plane_bins, want);
  // Fewer bins, fewer bytes.
  auto e32 = Encode(l, obj, Bins(32)), e8 = Encode(l, obj, Bins(8));
  ASSERT_TRUE(e32.ok() && e8.ok());
  EXPECT_LT(e8->size(), e32->size());
}

TEST(CachegenTest, BinScheduleParsesAndRefusesBadSpans) {
  auto s = BinSchedule::Parse("k=0-10:32,10-:16 v=0-2:32,2-:16");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(*s, BinSchedule::Lmcache(32));
  EXPECT_EQ(s->ToString(), "k=0-10:32,10-:16 v=0-2:32,2-:16");
  EXPECT_EQ(s->BinsFor(0, 9), 32u);
  EXPECT_EQ(s->BinsFor(0, 10), 16u);
  EXPECT_EQ(s->BinsFor(1, 1), 32u);
  EXPECT_EQ(s->BinsFor(1, 200), 16u);
  EXPECT_EQ(BinSchedule::Parse("24")->BinsFor(1, 3), 24u);
  EXPECT_EQ(BinSchedule::Lmcache(6), BinSchedule::Uniform(32));
  for (const char* bad : {"", "3", "65", "k=0-:16", "k=1-:16 v=0-:16", "k=0-4:16,5-:16 v=0-:16",
                          "k=0-:2 v=0-:16", "k=0-x:16 v=0-:16", "q=0-:16"}) {
    EXPECT_FALSE(BinSchedule::Parse(bad).ok()) << bad;
  }
}

// ---- Refusals ---------------------------------------------------------------------

class CorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    s_.tokens = 64;
    s_.hidden = 64;
    layout_ = LayoutOf(s_);
    obj_ = MakeKv(s_);
    auto e = Encode(layout_, obj_, Bins(16));
    ASSERT_TRUE(e.ok());
    enc_ = *e;
  }
  Status DecodeBytes(const std::vector<uint8_t>& b) {
    std::vector<uint8_t> out(obj_.size());
    return Decode(b, out, &layout_);
  }
  KvSpec s_;
  ObjectLayout layout_;
  std::vector<uint8_t> obj_, enc_;
};

TEST_F(CorruptionTest, EveryFlippedByteIsDetected) {
  for (size_t i = 0; i < enc_.size(); ++i) {
    auto b = enc_;
    b[i] ^= static_cast<uint8_t>(1u << (i % 8));
    const Status st = DecodeBytes(b);
    ASSERT_FALSE(st.ok()) << "flipped byte " << i << " of " << enc_.size();
  }
}

TEST_F(CorruptionTest, TruncatedAndPaddedObjectsAreRefused) {
  for (size_t n : {size_t{0}, size_t{3}, size_t{47}, size_t{48}, enc_.size() / 2, enc_.size() - 1}) {
    std::vector<uint8_t> b(enc_.begin(), enc_.begin() + static_cast<long>(n));
    const Status st = DecodeBytes(b);
    ASSERT_FALSE(st.ok()) << n;
  }
  auto padded = enc_;
  padded.push_back(0);
  EXPECT_THAT(DecodeBytes(padded).message(), HasSubstr("truncated or padded"));
}

// Payload damage behind a recomputed checksum is still caught by the stream checks.
TEST_F(CorruptionTest, StreamDamageBehindAValidChecksumIsRefused) {
  auto h = format::ReadHeader(enc_);
  ASSERT_TRUE(h.ok());
  const size_t start = h->TablesEnd();
  int refused = 0, tried = 0;
  for (size_t i = start; i + format::kTrailerBytes < enc_.size(); i += 7) {
    auto b = enc_;
    b[i] ^= 0x5a;
    format::Put32(b.data() + b.size() - 4, Crc32c(b.data(), b.size() - 4));
    ++tried;
    if (!DecodeBytes(b).ok()) ++refused;
  }
  // Scale and parameter bytes can decode to other valid values; stream words and
  // states cannot go unnoticed. Most damage is refused outright.
  EXPECT_GT(refused, tried * 3 / 4) << refused << " of " << tried;
}

TEST_F(CorruptionTest, WrongLayoutOrBufferIsRefused) {
  ObjectLayout other = layout_;
  other.layout_id = 43;
  std::vector<uint8_t> out(obj_.size());
  EXPECT_THAT(Decode(enc_, out, &other).message(), HasSubstr("expected"));
  other = layout_;
  other.groups[0].dtype = Dtype::kFloat16;
  EXPECT_FALSE(Decode(enc_, out, &other).ok());
  std::vector<uint8_t> small(obj_.size() - 2);
  EXPECT_THAT(Decode(enc_, small, &layout_).message(), HasSubstr("output buffer"));
  // Not a CacheGen object at all.
  EXPECT_THAT(DecodeBytes(obj_).message(), HasSubstr("magic"));
}

TEST_F(CorruptionTest, HeaderFieldsAreCheckedEvenWithAValidHeaderChecksum) {
  auto tamper = [&](size_t off, uint8_t v) {
    auto b = enc_;
    b[off] = v;
    auto h = format::ReadHeader(enc_);
    // Recompute the header CRC over the tampered tables.
    format::Put32(b.data() + 44, 0);
    format::Put32(b.data() + 44, Crc32c(b.data(), h->TablesEnd()));
    return format::ReadHeader(b).status();
  };
  EXPECT_THAT(tamper(4, 1).message(), HasSubstr("format version 1 not supported"));
  EXPECT_THAT(tamper(4, 3).message(), HasSubstr("version"));
  EXPECT_FALSE(tamper(32, 0).ok());                        // no groups
  EXPECT_FALSE(tamper(36, 9).ok());                        // plane count
  EXPECT_FALSE(tamper(format::kHeaderBytes + 16, 99).ok());  // dtype code
  EXPECT_FALSE(tamper(format::kHeaderBytes + 0, 3).ok());    // kv_size 3
  const size_t plane0 = format::kHeaderBytes + format::kGroupEntryBytes;
  EXPECT_FALSE(tamper(plane0, 7).ok());                      // plane mode
  EXPECT_FALSE(tamper(plane0 + 1, 80).ok());                 // bins
  EXPECT_FALSE(tamper(plane0 + 4, 1).ok());                  // payload size
  EXPECT_FALSE(tamper(plane0 + 3, 0x05).ok());               // precision 13 bits
}

// The probability precision is recorded per plane (v2) and the decoder uses the
// object's, so the encoder's policy can change without breaking stored objects; a
// stream decoded with another precision is refused, never decoded.
TEST_F(CorruptionTest, PrecisionIsTheObjectsOwn) {
  auto h = format::ReadHeader(enc_);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->planes[0].prob_bits[0], 9);  // 16 bins: ceil(log2 15) + 5
  plane::PlaneSpec ps;
  ps.tokens = s_.tokens;
  ps.channels = s_.hidden;
  ps.bins = 16;
  ps.prob_bits[0] = ps.prob_bits[1] = 12;
  plane::Scratch sc;
  std::vector<uint8_t> payload;
  ASSERT_TRUE(plane::Encode(obj_.data(), ps, &sc, &payload));
  std::vector<uint8_t> a(size_t{s_.tokens} * s_.hidden * 2), b(a.size());
  ASSERT_TRUE(plane::Decode(payload, ps, &sc, a.data()).ok());
  const auto ref = test::ReferencePlane(obj_.data(), s_.dtype, s_.tokens, s_.hidden, 16);
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_EQ(test::LoadAs(s_.dtype, a.data() + 2 * i), Bf16ToFloat(FloatToBf16(ref[i])));
  ps.prob_bits[0] = ps.prob_bits[1] = 9;
  EXPECT_FALSE(plane::Decode(payload, ps, &sc, b.data()).ok());
}

// An object written by a build of format version 1 (tests/data/codec/format_v1/: made
// with `kvd-codec encode --layout 2,2,16,64,bfloat16 --bins 16` at commit 5bed4d2, where
// the precision was implied by the bins) is refused by name by every decoder, and the
// output buffer is left as it was.
TEST(CachegenTest, FormatVersion1ObjectsAreRefusedByName) {
  std::ifstream f(std::string(KVD_SOURCE_DIR) + "/tests/data/codec/format_v1/object_2x2x16x64_bf16_16bins.kvcg",
                  std::ios::binary);
  ASSERT_TRUE(f) << "test data missing";
  const std::vector<uint8_t> v1((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  ASSERT_EQ(v1.size(), 1736u);
  ASSERT_EQ(format::Get16(v1.data() + 4), 1);
  ObjectLayout l;
  l.groups.push_back({2, 2, 16, 64, Dtype::kBfloat16});
  EXPECT_THAT(Inspect(v1).status().message(), HasSubstr("format version 1 not supported (this build reads 2)"));
  std::vector<uint8_t> out(l.Bytes(), 0xab);
  EXPECT_THAT(Decode(v1, out, &l).message(), HasSubstr("format version 1 not supported"));
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](uint8_t b) { return b == 0xab; }));
  EXPECT_THAT(EmulateDeviceDecode(v1, out).message(), HasSubstr("format version 1 not supported"));
  EXPECT_FALSE(Decode(v1).ok());
}

TEST(CachegenTest, EncodeRefusesBadInput) {
  KvSpec s;
  const auto l = LayoutOf(s);
  auto obj = MakeKv(s);
  obj.pop_back();
  EXPECT_FALSE(Encode(l, obj, Bins(16)).ok());
  obj.push_back(0);
  EXPECT_FALSE(Encode(l, obj, Bins(3)).ok());
  CachegenOptions o = Bins(16);
  o.anchor_group = 4;
  o.anchor_bins = 100;
  EXPECT_FALSE(Encode(l, obj, o).ok());
  ObjectLayout bad = l;
  bad.groups[0].kv_size = 3;
  EXPECT_FALSE(Encode(bad, obj, Bins(16)).ok());
  EXPECT_FALSE(Encode(ObjectLayout{}, {}, Bins(16)).ok());
}

TEST(CachegenTest, EncodedSizeIsBounded) {
  KvSpec s;
  s.rho = 0;
  s.outliers = 0;
  const auto l = LayoutOf(s);
  std::mt19937 rng(5);
  std::vector<uint8_t> noise(l.Bytes());
  for (size_t i = 0; i < noise.size(); i += 2) {
    // Random finite bf16 values of every magnitude: incompressible planes.
    uint16_t h = static_cast<uint16_t>(rng());
    if ((h & 0x7f80) == 0x7f80) h &= 0xbfff;
    memcpy(&noise[i], &h, 2);
  }
  auto e = Encode(l, noise, Bins(64));
  ASSERT_TRUE(e.ok());
  EXPECT_LE(e->size(), MaxEncodedBytes(l));
}

// The decoder's slot tables are shared by channels with the same distribution, kept
// from plane to plane in a Scratch and dropped when the pool is full: none of it may
// change a decoded byte or verdict. One Scratch decodes a sequence of planes of
// different bins, precisions, anchor classes and partial blocks, a damaged plane, and a
// plane whose distribution bytes are those of a plane of another alphabet at the same
// precision (its tables must not be taken for that plane's), at pool limits from
// "every block builds its own" (0) to "never full"; every plane must decode exactly (the
// same bytes, even those written before a failure, and the same verdict) as with a
// fresh Scratch that builds every block's slot tables. The same with the token classes
// decoded by search tables where they have few tokens (the default: the anchors of
// G = 10 at 32 bins), never, and always (every class, full and partial blocks).
TEST(CachegenTest, SharedDecodingTablesDoNotChangeTheOutput) {
  struct P {
    plane::PlaneSpec spec;
    std::vector<uint8_t> payload;
    std::vector<uint8_t> expect[2];  // scalar, AVX2
    bool expect_ok[2] = {false, false};
  };
  std::vector<P> planes;
  auto add = [&](const KvSpec& s, uint32_t bins, uint32_t g) {
    P p;
    p.spec.tokens = s.tokens;
    p.spec.channels = s.hidden;
    p.spec.bins = bins;
    p.spec.anchor_group = g;
    p.spec.anchor_bins = g ? 32 : 0;
    plane::Scratch sc;
    EXPECT_TRUE(plane::Encode(MakeKv(s).data(), p.spec, &sc, &p.payload));
    planes.push_back(std::move(p));
  };
  const uint32_t bins[] = {16, 32, 20, 64, 8, 24};  // 20, 24 and 32: the same precision
  for (int i = 0; i < 6; ++i) {
    for (uint32_t g : {0u, 10u}) {
      KvSpec s;
      s.layers = 1;
      s.kv_size = 1;
      s.hidden = i % 2 ? 200 : 128;  // six full blocks and a partial one; four full
      s.tokens = i == 4 ? 33 : 256;
      s.outliers = 2;
      s.seed = 100 + 10 * i + g;
      add(s, bins[i], g);
    }
  }
  // planes[4]: 20 bins, 128 channels, no anchors. A 32-bin plane of 128 channels with
  // planes[4]'s distribution bytes, decoded after it.
  {
    KvSpec s;
    s.layers = 1;
    s.kv_size = 1;
    s.seed = 7;
    add(s, 32, 0);
    P& x = planes.back();
    memcpy(x.payload.data() + 2 * x.spec.tokens, planes[4].payload.data() + 2 * planes[4].spec.tokens,
           2 * size_t{x.spec.channels});
  }
  // A plane whose last stream word is damaged: it fails after building its tables.
  P bad = planes[3];
  bad.payload[bad.payload.size() - 1] ^= 0x5a;
  planes.insert(planes.begin() + 5, bad);
  for (P& p : planes) {
    for (int simd = 0; simd < 2; ++simd) {
      plane::Scratch fresh;
      fresh.slot_table_limit = 0;
      fresh.search_weight = 0;
      p.expect[simd].assign(size_t{p.spec.tokens} * p.spec.channels * 2, 0xee);
      p.expect_ok[simd] = plane::Decode(p.payload, p.spec, &fresh, p.expect[simd].data(), simd).ok();
    }
  }
  EXPECT_FALSE(planes[5].expect_ok[0]);
  int ok = 0, failed = 0;
  const uint32_t weights[] = {0, plane::Scratch{}.search_weight, 1u << 20};
  for (size_t limit : {size_t{0}, size_t{32} << 10, size_t{100} << 10, size_t{1} << 19, size_t{1} << 26}) {
    for (int run = 0; run < 2 * 3; ++run) {
      const int simd = run % 2;
      const uint32_t weight = weights[run / 2];
      plane::Scratch sc;
      sc.slot_table_limit = limit;
      sc.search_weight = weight;
      for (int pass = 0; pass < 2; ++pass) {  // the second pass finds its tables in the pool
        for (size_t i = 0; i < planes.size(); ++i) {
          const P& p = planes[i];
          std::vector<uint8_t> out(p.expect[simd].size(), 0xee);
          const bool st = plane::Decode(p.payload, p.spec, &sc, out.data(), simd).ok();
          const std::string where = "plane " + std::to_string(i) + " limit " + std::to_string(limit) + " simd " +
                                    std::to_string(simd) + " weight " + std::to_string(weight) + " pass " +
                                    std::to_string(pass);
          ASSERT_EQ(st, p.expect_ok[simd]) << where;
          ASSERT_EQ(out, p.expect[simd]) << where;
          (st ? ok : failed)++;
        }
      }
    }
  }
  EXPECT_GE(ok, 5 * 2 * 3 * 2 * 12);
  EXPECT_GE(failed, 5 * 2 * 3 * 2);
}

}  // namespace
}  // namespace kvd::codec
