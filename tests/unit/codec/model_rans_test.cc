// The codec's building blocks: parametric distributions (model_core.h) and the rANS
// primitives (rans.h). Frequencies are valid for every parameter, deterministic (pinned
// by a checksum over all of them: a change here changes the byte format), and the
// encoder's reciprocal division is exact for every frequency and state.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "codec/crc32c.h"
#include "codec/model_core.h"
#include "codec/plane.h"
#include "codec/rans.h"

namespace kvd::codec {
namespace {

TEST(ModelTest, EveryDistributionIsValid) {
  uint16_t f[kMaxAlphabet];
  for (int a : {1, 3, 7, 15, 31, 47, 63}) {
    const int pb = ProbBitsFor(a);
    EXPECT_GE((1 << pb), 32 * a / 2) << a;
    for (int kind = 0; kind < 3; ++kind) {
      for (int sigma = 0; sigma < 64; ++sigma) {
        for (int center = 0; center < 256; center += 3) {
          ASSERT_TRUE(BuildFrequencies(static_cast<uint8_t>(center), static_cast<uint8_t>(kind << 6 | sigma), a, pb, f));
          uint32_t sum = 0;
          for (int s = 0; s < a; ++s) {
            ASSERT_GE(f[s], 1) << a << " " << kind << " " << sigma << " " << center;
            sum += f[s];
          }
          ASSERT_EQ(sum, 1u << pb);
        }
      }
    }
  }
  EXPECT_FALSE(BuildFrequencies(0, 3 << 6, 15, 10, f));  // kind 3
  EXPECT_FALSE(BuildFrequencies(0, 0, 64, 12, f));       // alphabet too large
  EXPECT_FALSE(BuildFrequencies(0, 0, 15, 13, f));       // precision too high
}

TEST(ModelTest, NarrowDistributionsPeakAtTheirCenter) {
  uint16_t f[kMaxAlphabet];
  ASSERT_TRUE(BuildFrequencies(4 * 7, kKindGauss << 6 | 0, 15, 10, f));
  EXPECT_EQ(f[7], 1024 - 14);                       // all mass but the minimum elsewhere
  EXPECT_EQ(ProbBitsFor(15), 9);                    // 16 bins
  EXPECT_EQ(ProbBitsFor(31), 10);                   // 32 bins
  ASSERT_TRUE(BuildFrequencies(4 * 7 + 2, kKindGauss << 6 | 10, 15, 10, f));
  EXPECT_NEAR(f[7], f[8], 15);                      // halfway (7 also takes the rounding remainder)
  ASSERT_TRUE(BuildFrequencies(0, kKindUniform << 6, 16 - 1, 10, f));
  EXPECT_LE(f[1] - f[14], 1);                       // flat
}

// Pins every frequency table the format can name (all kinds, sigmas, centers, for the
// alphabets of 4..64 bins). Changing model_tables.inc or BuildFrequencies changes this
// value, and must change the format version with it.
TEST(ModelTest, TablesArePinned) {
  uint32_t crc = 0;
  uint16_t f[kMaxAlphabet];
  for (int bins = 4; bins <= 64; bins += 2) {
    const int a = 2 * (bins / 2 - 1) + 1;
    for (int shape = 0; shape < 192; ++shape) {
      for (int center = 0; center < 256; ++center) {
        BuildFrequencies(static_cast<uint8_t>(center), static_cast<uint8_t>(shape), a, ProbBitsFor(a), f);
        crc = Crc32c(f, sizeof(uint16_t) * a, crc);
      }
    }
  }
  EXPECT_EQ(crc, 0xda837eb0u) << "tables checksum 0x" << std::hex << crc;
}

// The AVX2 construction (plane::BuildFrequenciesAvx2, used by the encoder and the
// decoder when the CPU has AVX2) gives the same verdict and frequencies as
// BuildFrequencies for every center and shape byte (valid or not) of every alphabet at its
// precision, and at every precision for the 4-, 16-, 32- and 64-bin alphabets.
TEST(ModelTest, Avx2FrequenciesAreExact) {
  if (!plane::HaveAvx2()) GTEST_SKIP() << "no AVX2";
  uint16_t f[kMaxAlphabet], g[kMaxAlphabet];
  auto check = [&](int a, int pb) {
    for (int shape = 0; shape < 256; ++shape) {
      for (int center = 0; center < 256; ++center) {
        const auto c = static_cast<uint8_t>(center), sh = static_cast<uint8_t>(shape);
        const bool ok = BuildFrequencies(c, sh, a, pb, f);
        ASSERT_EQ(plane::BuildFrequenciesAvx2(c, sh, a, pb, g), ok) << a << " " << pb << " " << shape << " " << center;
        if (ok) {
          ASSERT_EQ(memcmp(f, g, sizeof(uint16_t) * a), 0) << a << " " << pb << " " << shape << " " << center;
        }
      }
    }
  };
  for (int bins = 4; bins <= 64; bins += 2) check(2 * (bins / 2 - 1) + 1, ProbBitsFor(2 * (bins / 2 - 1) + 1));
  for (int a : {3, 15, 31, 63}) {
    for (int pb = kMinProbBits; pb <= kMaxProbBits; ++pb) check(a, pb);
  }
  EXPECT_FALSE(plane::BuildFrequenciesAvx2(0, 0, 64, 12, g));  // alphabet too large
  EXPECT_FALSE(plane::BuildFrequenciesAvx2(0, 0, 15, 13, g));  // precision too high
  EXPECT_FALSE(plane::BuildFrequenciesAvx2(0, 0, 15, 7, g));   // precision too low
}

TEST(RansTest, ReciprocalDivisionIsExact) {
  std::mt19937 rng(2);
  for (int pb : {8, 12}) {
    for (uint32_t f = 1; f <= (1u << pb); ++f) {
      const EncSymbol e = MakeEncSymbol(0, f, pb);
      auto check = [&](uint32_t x) {
        const uint32_t q = static_cast<uint32_t>((uint64_t{x} * e.rcp) >> e.rcp_shift);
        ASSERT_EQ(q, x / f) << "x " << x << " f " << f;
      };
      for (uint32_t x : {0u, 1u, f - 1, f, f + 1, kRansLow, e.x_max - 1, kRansHigh - 1, kRansHigh - f}) check(x);
      for (int i = 0; i < 64; ++i) check(rng() % kRansHigh);
      for (uint32_t m = 1; m < 8; ++m) {  // multiples of f near the top
        const uint64_t x = (uint64_t{kRansHigh} / f - m) * f;
        check(static_cast<uint32_t>(x));
        check(static_cast<uint32_t>(x - 1));
      }
    }
  }
}

// One lane, symbols from random models: decode(encode(s)) == s and the state returns
// to its start, for every precision.
TEST(RansTest, SingleLaneRoundTrip) {
  std::mt19937 rng(7);
  for (int pb = kMinProbBits; pb <= kMaxProbBits; ++pb) {
    const int a = 20;
    std::vector<uint32_t> freq(a), cum(a + 1, 0);
    uint32_t left = 1u << pb;
    for (int s = 0; s < a; ++s) {
      freq[s] = s == a - 1 ? left : 1 + rng() % (left - (a - 1 - s));
      left -= freq[s];
      cum[s + 1] = cum[s] + freq[s];
    }
    std::vector<int> syms(5000);
    for (auto& s : syms) s = static_cast<int>(rng() % a);
    std::vector<uint16_t> buf(syms.size() + 2);
    uint16_t* w = buf.data() + buf.size();
    uint32_t x = kRansLow;
    for (size_t i = syms.size(); i-- > 0;) w = EncodeStep(&x, MakeEncSymbol(cum[syms[i]], freq[syms[i]], pb), w);
    const uint16_t* r = w;
    for (size_t i = 0; i < syms.size(); ++i) {
      const uint32_t slot = x & ((1u << pb) - 1);
      int s = 0;
      while (cum[s + 1] <= slot) ++s;
      ASSERT_EQ(s, syms[i]) << "pb " << pb << " i " << i;
      x = freq[s] * (x >> pb) + slot - cum[s];
      if (x < kRansLow) x = (x << 16) | *r++;
      ASSERT_GE(x, kRansLow);
      ASSERT_LT(x, kRansHigh);
    }
    EXPECT_EQ(x, kRansLow);
    EXPECT_EQ(r, buf.data() + buf.size());
  }
}

TEST(Crc32cTest, KnownValues) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xe3069283u);
  EXPECT_EQ(Crc32c("", 0), 0u);
  const char* s = "The quick brown fox jumps over the lazy dog";
  EXPECT_EQ(Crc32c(s + 10, 33, Crc32c(s, 10)), Crc32c(s, 43));
}

}  // namespace
}  // namespace kvd::codec
