// fp8 serde (codec.h) bit-exact against torch's own casts (tools/codec/make_fp8_golden.py
// wrote the tables from torch 2.15): every bf16 and fp16 pattern, 4096 float32 inputs
// (specials, boundaries, random bit patterns), and every fp8 pattern back; plus the
// serde's framing (sizes, groups, refusals).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "codec/float_bits.h"

namespace kvd::codec {
namespace {

std::vector<uint8_t> Golden(const std::string& name) {
  std::ifstream f(std::string(KVD_SOURCE_DIR) + "/tests/data/codec/fp8_golden/" + name, std::ios::binary);
  EXPECT_TRUE(f.good()) << name;
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

bool IsNanFp8(uint8_t v, bool e4m3) { return e4m3 ? (v & 0x7f) == 0x7f : (v & 0x7f) > 0x7c; }

TEST(Fp8Test, EverySixteenBitPatternCastsLikeTorch) {
  for (bool e4m3 : {true, false}) {
    const std::string k = e4m3 ? "e4m3fn" : "e5m2";
    const auto bf = Golden("bf16_to_" + k + ".bin"), hf = Golden("fp16_to_" + k + ".bin");
    ASSERT_EQ(bf.size(), 65536u);
    ASSERT_EQ(hf.size(), 65536u);
    for (uint32_t p = 0; p < 65536; ++p) {
      ASSERT_EQ(FloatToFp8(Bf16ToFloat(static_cast<uint16_t>(p)), e4m3), bf[p]) << k << " bf16 0x" << std::hex << p;
      ASSERT_EQ(FloatToFp8(Fp16ToFloat(static_cast<uint16_t>(p)), e4m3), hf[p]) << k << " fp16 0x" << std::hex << p;
    }
  }
}

TEST(Fp8Test, Float32CasesCastLikeTorch) {
  const auto cases = Golden("fp32_cases.bin");
  ASSERT_EQ(cases.size(), 4096u * 4);
  for (bool e4m3 : {true, false}) {
    const auto want = Golden(std::string("fp32_to_") + (e4m3 ? "e4m3fn" : "e5m2") + ".bin");
    for (size_t i = 0; i < 4096; ++i) {
      float f;
      memcpy(&f, &cases[4 * i], 4);
      const uint8_t got = FloatToFp8(f, e4m3);
      if (std::isnan(f)) {  // torch keeps the NaN's sign; the payload is not specified
        ASSERT_TRUE(IsNanFp8(got, e4m3) && IsNanFp8(want[i], e4m3)) << i;
        continue;
      }
      ASSERT_EQ(got, want[i]) << (e4m3 ? "e4m3fn " : "e5m2 ") << i << " " << f;
    }
  }
}

TEST(Fp8Test, EveryFp8PatternCastsBackLikeTorch) {
  for (bool e4m3 : {true, false}) {
    const std::string k = e4m3 ? "e4m3fn" : "e5m2";
    const auto bf = Golden(k + "_to_bf16.bin"), hf = Golden(k + "_to_fp16.bin"), ff = Golden(k + "_to_fp32.bin");
    for (uint32_t v = 0; v < 256; ++v) {
      const float f = Fp8ToFloat(static_cast<uint8_t>(v), e4m3);
      uint16_t wb, wh;
      uint32_t wf;
      memcpy(&wb, &bf[2 * v], 2);
      memcpy(&wh, &hf[2 * v], 2);
      memcpy(&wf, &ff[4 * v], 4);
      if (std::isnan(f)) {
        ASSERT_TRUE(std::isnan(BitsFloat(wf))) << k << " " << v;
        ASSERT_EQ(FloatToBf16(f) & 0x7fc0, wb & 0x7fc0) << k << " " << v;
        continue;
      }
      ASSERT_EQ(FloatBits(f), wf) << k << " " << v;
      ASSERT_EQ(FloatToBf16(f), wb) << k << " " << v;
      ASSERT_EQ(FloatToFp16(f), wh) << k << " " << v;
    }
  }
}

TEST(Fp8Test, SerdeIsOneBytePerElementInObjectOrder) {
  ObjectLayout l;
  l.groups.push_back({2, 2, 4, 8, Dtype::kBfloat16});
  l.groups.push_back({1, 1, 4, 3, Dtype::kFloat32});
  EXPECT_EQ(Fp8EncodedBytes(l), 2u * 2 * 4 * 8 + 12);
  std::vector<uint8_t> obj(l.Bytes());
  const size_t n0 = 2 * 2 * 4 * 8;
  for (size_t i = 0; i < n0; ++i) {
    const uint16_t h = FloatToBf16(static_cast<float>(i) * 0.37f - 20);
    memcpy(&obj[2 * i], &h, 2);
  }
  for (size_t i = 0; i < 12; ++i) {
    const float f = static_cast<float>(i) * 1000 - 5000;
    memcpy(&obj[2 * n0 + 4 * i], &f, 4);
  }
  for (Fp8Kind k : {Fp8Kind::kE4m3fn, Fp8Kind::kE5m2}) {
    const bool e4m3 = k == Fp8Kind::kE4m3fn;
    std::vector<uint8_t> enc(Fp8EncodedBytes(l));
    ASSERT_TRUE(Fp8Encode(l, obj, k, enc).ok());
    for (size_t i = 0; i < n0; ++i) {
      uint16_t h;
      memcpy(&h, &obj[2 * i], 2);
      ASSERT_EQ(enc[i], FloatToFp8(Bf16ToFloat(h), e4m3)) << i;
    }
    for (size_t i = 0; i < 12; ++i) {
      float f;
      memcpy(&f, &obj[2 * n0 + 4 * i], 4);
      ASSERT_EQ(enc[n0 + i], FloatToFp8(f, e4m3)) << i;
    }
    std::vector<uint8_t> back(obj.size());
    ASSERT_TRUE(Fp8Decode(enc, l, k, back).ok());
    for (size_t i = 0; i < n0; ++i) {
      uint16_t h;
      memcpy(&h, &back[2 * i], 2);
      ASSERT_EQ(h, FloatToBf16(Fp8ToFloat(enc[i], e4m3))) << i;
    }
    // e4m3fn saturates the 5000 at 448; e5m2 keeps it to 2 bits of mantissa.
    float last;
    memcpy(&last, &back[2 * n0 + 4 * 11], 4);
    EXPECT_EQ(last, e4m3 ? 448.0f : 6144.0f);
  }
}

TEST(Fp8Test, SerdeRefusesWhatItCannotCast) {
  ObjectLayout l;
  l.groups.push_back({1, 1, 4, 132, Dtype::kUint8});
  std::vector<uint8_t> obj(l.Bytes()), enc(l.Bytes());
  EXPECT_FALSE(Fp8Encode(l, obj, Fp8Kind::kE4m3fn, enc).ok());
  l.groups[0].dtype = Dtype::kBfloat16;
  obj.resize(l.Bytes());
  std::vector<uint8_t> small(3);
  EXPECT_FALSE(Fp8Encode(l, obj, Fp8Kind::kE4m3fn, small).ok());
  EXPECT_FALSE(Fp8Decode(small, l, Fp8Kind::kE4m3fn, obj).ok());
  EXPECT_TRUE(Fp8KindFromName("float8_e4m3fn").ok());
  EXPECT_TRUE(Fp8KindFromName("torch.float8_e5m2").ok());
  EXPECT_FALSE(Fp8KindFromName("float8_e4m3fnuz").ok());
}

}  // namespace
}  // namespace kvd::codec
