// The GPU decoder's CPU reference: the host emulator of the kernel's warp algorithm
// (warp_decode.h, the code the CUDA build compiles into the kernel) decodes every kind of
// object exactly as codec::Decode does, refuses damaged streams, and the GPU entry point
// answers Unavailable where there is no GPU (the GPU itself is compared by
// kvd-codec-gpu-check in scripts/gpu-check.sh).
#include <gtest/gtest.h>

#include "codec/device_decode.h"
#include "codec/format.h"
#include "codec_test_util.h"

namespace kvd::codec {
namespace {

using test::KvSpec;

void ExpectEmulatorMatches(const KvSpec& s, uint32_t bins, uint32_t anchor = 0, uint32_t abins = 0) {
  const auto l = test::LayoutOf(s);
  const auto obj = test::MakeKv(s);
  CachegenOptions o;
  o.bins = BinSchedule::Uniform(bins);
  o.anchor_group = anchor;
  o.anchor_bins = abins;
  auto enc = Encode(l, obj, o);
  ASSERT_TRUE(enc.ok());
  std::vector<uint8_t> a(obj.size()), b(obj.size());
  ASSERT_TRUE(Decode(*enc, a, &l).ok());
  const Status st = EmulateDeviceDecode(*enc, b);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(a, b) << "bins " << bins << " anchors " << anchor;
}

TEST(DeviceDecodeTest, EmulatorEqualsTheCpuDecoder) {
  KvSpec s;
  for (uint32_t bins : {4u, 16u, 32u, 64u}) ExpectEmulatorMatches(s, bins);
  ExpectEmulatorMatches(s, 16, 10, 32);
  ExpectEmulatorMatches(s, 12, 3, 64);
  KvSpec f16;
  f16.dtype = Dtype::kFloat16;
  f16.hidden = 200;  // partial block
  ExpectEmulatorMatches(f16, 24);
  KvSpec f32;
  f32.dtype = Dtype::kFloat32;
  f32.hidden = 700;  // three streams
  f32.tokens = 40;
  ExpectEmulatorMatches(f32, 32, 5, 16);
  KvSpec one;
  one.tokens = 1;  // raw planes are byte copies
  ExpectEmulatorMatches(one, 16);
}

TEST(DeviceDecodeTest, PlanListsEveryStream) {
  KvSpec s;
  s.hidden = 600;  // 3 streams per plane
  const auto l = test::LayoutOf(s);
  auto enc = Encode(l, test::MakeKv(s), CachegenOptions{});
  ASSERT_TRUE(enc.ok());
  auto plan = PrepareDeviceDecode(*enc);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->jobs.size(), 4u * 3);
  EXPECT_TRUE(plan->copies.empty());
  EXPECT_EQ(plan->jobs[1].c0, 256u);
  EXPECT_EQ(plan->jobs[2].c1, 600u);
}

TEST(DeviceDecodeTest, DamagedStreamsAreRefused) {
  KvSpec s;
  const auto l = test::LayoutOf(s);
  auto enc = *Encode(l, test::MakeKv(s), CachegenOptions{});
  auto plan = PrepareDeviceDecode(enc);
  ASSERT_TRUE(plan.ok());
  std::vector<uint8_t> out(l.Bytes());
  // The plan is only made for verified objects...
  auto bad = enc;
  bad[bad.size() / 2] ^= 1;
  EXPECT_FALSE(PrepareDeviceDecode(bad).ok());
  // ...and a warp given a damaged stream anyway reports it.
  const auto& j = plan->jobs[0];
  bad = enc;
  bad[j.stream_offset + 130] ^= 0x80;
  EXPECT_FALSE(EmulateWarp(bad.data(), j, out.data()));
  EXPECT_TRUE(EmulateWarp(enc.data(), j, out.data()));
}

TEST(DeviceDecodeTest, GpuEntryPointWithoutAGpu) {
  KvSpec s;
  s.layers = 1;
  const auto l = test::LayoutOf(s);
  auto enc = *Encode(l, test::MakeKv(s), CachegenOptions{});
  std::vector<uint8_t> out(l.Bytes()), cpu(l.Bytes());
  const Status st = DecodeOnGpu(enc, out);
  if (st.ok()) {  // a GPU is present: it must agree with the CPU
    ASSERT_TRUE(Decode(enc, cpu, &l).ok());
    EXPECT_EQ(out, cpu);
  } else {
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  }
}

}  // namespace
}  // namespace kvd::codec
